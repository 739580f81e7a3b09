"""How the KV cache is laid out: one pool or a stream per sequence, and how many sequences.

The device can hold more conversations than there are slots: **spare sequences**. At most
`n_slots` sequences run requests at once; a conversation that comes back finds its sequence
still filled and continues there with no copy at all. Without spares, an idle conversation
must be copied to RAM before its slot can serve another one, and back again when it returns.

- With a stream per sequence (attention and sliding-window models), a slot's attention
  spans only its own cells, so an idle stream costs the others nothing but device memory
  (`--cache-vram`).
- Hybrid models (attention plus recurrent layers) get a stream per sequence too: a spare
  then costs its stream and one recurrent state. In one pool instead, idle conversations'
  cells would sit among the busy ones', and every step's attention would span them.
- In one pool (recurrent models; any model with one slot or `--kv-unified on`), a spare
  costs one recurrent state; its attention cells share the pool, and the least recently
  used idle sequence moves to RAM when the pool is full.
- Recurrent and hybrid models in one pool get two spare sequences per slot on a GPU, or with
  `--cache-vram SIZE` as many as SIZE holds recurrent states (at most 16 per slot, 64 in all).
- Attention models in one pool get spare sequences only with `--cache-vram SIZE`: idle
  conversations keep up to SIZE of cells in the pool, beyond the running ones', and
  conversations that share a prefix share its cells (a fork, or a load that writes only
  the tail after it). Every step's attention then spans those cells too: on the CPU a
  sequence next to 20K cells of others decoded 1.7x and prefilled 2.4x slower with flash
  attention (its kernel skips masked cells), 6.6x and 5.2x without
  (`scripts/bench_pool_layout.py`), so it is not the default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..llama_api import MemoryKind, Model, gpu_memory

log = logging.getLogger("warmslot.layout")

DEFAULT_MAX_CTX = 32768
# device memory left free when sizing spare streams: compute buffers, fragmentation, others
RESERVE_FRACTION = 0.10
RESERVE_BYTES = 1 << 30
# auto: spare streams at most, per slot and in all. An idle stream costs device memory only
# (the router keeps the busy ones together, see router.py); the caps keep the engine's
# per-step walk over its sequences short (llama.cpp allows 256 in one context)
MAX_SPARE_PER_SLOT = 16
MAX_SPARE = 64
# auto on the CPU, where the KV cache is in RAM: spare streams take at most this share of the
# prompt cache's RAM (--cache-ram), which keeps the rest, and at most CPU_SPARE_PER_SLOT per
# slot. A conversation kept in a stream comes back with no copy at all, one in the prompt
# cache with two (out and back in). The cap keeps a start short: llama.cpp clears every
# stream's cells when it makes the context, and on the CPU that is RAM written at startup.
CPU_SHARE_OF_CACHE_RAM = 4
CPU_SPARE_PER_SLOT = 3
LLAMA_MAX_SEQ = 256  # sequences one llama.cpp context takes, spares included


@dataclass(frozen=True, slots=True)
class KvLayout:
    unified: bool
    n_slots: int  # sequences that run requests (--parallel)
    n_seq: int  # all sequences: the slots, then the spare sequences
    n_ctx: int  # cells in all

    def __post_init__(self) -> None:
        assert self.n_seq >= self.n_slots >= 1
        assert self.unified or self.n_ctx % self.n_seq == 0, "every stream has the same size"

    @property
    def n_spare(self) -> int:
        return self.n_seq - self.n_slots


def kv_unified(setting: str, kind: MemoryKind, n_parallel: int) -> bool:
    """Whether the slots share one KV pool (`-kvu`) or each get a stream of n_ctx/n_parallel cells.

    A stream per slot is the default for attention and sliding-window models with several
    slots: a sequence's attention then spans only its own cells, its state is one contiguous
    copy, and an idle slot's cells cost the others nothing. Hybrid models get streams too,
    so that idle conversations can stay on the device in spare streams apart from the busy
    ones. A unified pool lets one slot use the whole context; it stays the default for one
    slot and for recurrent models, which have no attention cells."""
    if setting in ("on", "off"):
        return setting == "on"
    return n_parallel == 1 or kind is MemoryKind.RECURRENT


def plan_layout(
    model: Model,
    kind: MemoryKind,
    *,
    n_parallel: int,
    n_ctx: int,
    kv_unified_setting: str,
    cache_vram: int | None,
    type_k: str,
    type_v: str,
    on_gpu: bool,
    cache_ram: int = 0,
    spare_share: int = 1,
) -> KvLayout:
    """The layout for a model. `n_ctx` is the slots' cells in all (0: the model's training
    context, at most DEFAULT_MAX_CTX); `cache_vram` the device memory for spare sequences
    (None: auto, as many spare streams as free device memory holds after a margin, at
    most MAX_SPARE_PER_SLOT per slot; on the CPU as many as a quarter of `cache_ram` (the
    prompt cache's RAM) holds, at most CPU_SPARE_PER_SLOT per slot; two spare sequences per slot in one pool
    for recurrent and hybrid models on a GPU). A server of several models gives each model's
    auto spares 1/`spare_share` of the free device memory, so that the first model loaded
    leaves room for the others."""
    n_ctx = n_ctx or min(model.info.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
    unified = kv_unified(kv_unified_setting, kind, n_parallel)
    if unified:
        wanted = cache_vram > 0 if cache_vram is not None else on_gpu
        cap = min(MAX_SPARE, MAX_SPARE_PER_SLOT * n_parallel)
        if wanted and kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            spare = 2 * n_parallel  # a spare costs one recurrent state here, not a stream: be generous
            per_seq = model.recurrent_bytes_per_seq()
            if cache_vram and per_seq:  # a size: as many recurrent states as it holds
                spare = max(spare, min(cap, cache_vram // per_seq))
        elif cache_vram and kind is MemoryKind.ATTENTION:
            # idle conversations keep their cells in the pool, up to --cache-vram of them
            # (Prefixes.park_idle), and those that share a prefix share its cells: a spare is
            # only a sequence id, and the cells decide how many stay
            spare = cap
        else:
            spare = 0
        # (one sequence id more is left for the scratch sequence: loader._scratch_sequence)
        return KvLayout(True, n_parallel, n_parallel + min(spare, LLAMA_MAX_SEQ - 1 - n_parallel), n_ctx)
    per_slot = max(1, n_ctx // n_parallel)
    spare = _spare_streams(model, kind, n_parallel, per_slot, cache_vram, type_k, type_v, on_gpu, cache_ram, spare_share)
    n_seq = n_parallel + spare
    return KvLayout(False, n_parallel, n_seq, per_slot * n_seq)


def _spare_streams(model, kind, n_parallel, per_slot, cache_vram, type_k, type_v, on_gpu, cache_ram, spare_share) -> int:
    if cache_vram == 0:
        return 0
    if kind is MemoryKind.RECURRENT:
        if cache_vram:
            log.warning("--cache-vram keeps idle conversations in streams only on models with attention layers; ignored")
        return 0
    # NOTE: on attention memory an idle stream between busy ones may get a one-token filler
    # that is cut off after the step (see scheduler); sliding-window and hybrid memory cannot
    # be cut back anywhere, so they get none (the engine computes no filler budget for them)
    per_token = model.kv_bytes_per_token(type_k, type_v)
    if not per_token:
        return 0
    stream_bytes = stream_state_bytes(model, kind, per_slot, type_k, type_v)
    if cache_vram is not None:
        return min(cache_vram // stream_bytes, LLAMA_MAX_SEQ - n_parallel)
    if on_gpu:
        devices = gpu_memory()
        if not devices:
            return 0
        free = sum(d.free for d in devices)
        total = sum(d.total for d in devices)
        slots_bytes = stream_bytes * n_parallel
        budget = (free - slots_bytes - int(total * RESERVE_FRACTION) - RESERVE_BYTES) // max(1, spare_share)
        cap = MAX_SPARE_PER_SLOT * n_parallel
    else:
        budget = cache_ram // CPU_SHARE_OF_CACHE_RAM
        cap = CPU_SPARE_PER_SLOT * n_parallel
    return max(0, min(MAX_SPARE, cap, budget // stream_bytes))


def stream_state_bytes(model: Model, kind: MemoryKind, n_cells: int, type_k: str, type_v: str) -> int:
    """Bytes one sequence of `n_cells` takes: its KV cells, and its recurrent state on a hybrid."""
    recurrent = model.recurrent_bytes_per_seq() if kind is MemoryKind.HYBRID else 0
    return (model.kv_bytes_per_token(type_k, type_v) or 0) * n_cells + recurrent


def ram_spares_bytes(model: Model, kind: MemoryKind, layout: KvLayout, type_k: str, type_v: str) -> int:
    """RAM the spare streams of `layout` take on the CPU (their share of the prompt cache's)."""
    if layout.unified or not layout.n_spare:
        return 0
    return stream_state_bytes(model, kind, layout.n_ctx // layout.n_seq, type_k, type_v) * layout.n_spare
