"""Loading: the model, the KV layout, the context and the objects that work on them.

`open_model` runs on the engine thread, once per load, before the engine serves; everything
it returns belongs to that thread except `vocab` and `info`, which any thread may use.
`reuse_parts` then builds what moves and reuses the slots' contents on it, once the
speculative drafter is known (the engine's `Loaded` holds it all: engine/loaded.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import time
from dataclasses import dataclass
from typing import Callable

from warmslot.cache.checkpoints import CheckpointList
from warmslot.cache.demand import Demand
from warmslot.cache import segments
from warmslot.cache.disk import DiskCache
from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache

from ..fitting import host_buffers
from ..fitting.capacity import Capacity, buffers_by_device, device_memory, overridden_tensors
from ..settings import EngineConfig
from warmslot.slots.fitting.context_size import (
    ContextChoice,
    ContextSource,
    available_ram,
    choose_context,
    device_budget,
    physical_memory,
    ram_budget,
)
from .embedding_worker import Embedder, Reranker
from ..fitting.fit import FitPlan
from ..fitting.fit_settings import capacity_headroom, fit_settings
from ..fitting.layout import LLAMA_MAX_SEQ, KvLayout, plan_layout, ram_spares_bytes, stream_state_bytes
from ..llama_api import (
    Batch, Context, ContextParams, MemoryKind, Model, classify_memory, cuda_host_allocator, gpu_memory, supports_gpu_offload,
)
from ..llama_api.mtmd import Projector, ProjectorParams
from ..reuse.memory import SlotMemory
from ..llama_api.native_log import record_buffers
from ..sampling.parallel import BatchSampler, sampling_threads
from ..reuse.prefix import Prefixes
from ..reuse.tiers.disk import DiskTier
from ..reuse.router import Router
from ..slot import Slot
from .snapshot import EngineInfo
from ..stats import EngineStats
from ..vocab import Vocab

log = logging.getLogger("warmslot.engine")



__all__ = ["ModelParts", "flash_attn_setting", "open_model", "physical_memory", "reuse_parts"]


@dataclass(slots=True)
class ModelParts:
    """The model, its context and what is built on them before the engine's parts."""

    model: Model
    layout: KvLayout
    ctx: Context
    batch: Batch
    sampling: BatchSampler
    slots: list[Slot]
    cache: PromptCache | None
    filler_budget: int  # cells a micro-batch is worth (streams of attention memory); 0: no fillers
    vocab: Vocab
    info: EngineInfo
    disk: DiskTier | None = None
    embedder: Embedder | None = None
    reranker: Reranker | None = None  # --reranking
    projector: Projector | None = None  # --mmproj
    cfg: EngineConfig | None = None  # as fitted (the parts of `reuse_parts` read it)
    can_fork: bool = True  # whether a slot may copy another's sequence (see reuse_parts)
    scratch: int | None = None  # a sequence id beside the slots' (see _scratch_sequence)
    reload: EngineConfig | None = None  # what loads the same parts again (the context and placement chosen)
    on_gpu: bool = False  # layers run on a GPU: a decode is launched, not run, by llama_decode
    staging_bytes: int = 0  # on the CPU: RAM kept for whole states in passing (Staging), beside the prompt cache's


def open_model(
    cfg: EngineConfig, stats: EngineStats, progress: Callable[[float], None], wake=None,
    kept: tuple[PromptCache | None, DiskTier | None] | None = None, demand: Demand | None = None,
) -> ModelParts:
    """Load the model and build the parts on it. `wake(fn)` runs fn on the engine thread
    (the disk tier's reads report back through it). `kept`: the prompt cache and disk tier of
    an earlier load of the same parts (a server waking from sleep), used as they are.
    `demand`: what the engine knows about demand, for a new prompt cache."""
    started = time.monotonic()
    with host_buffers.loading():  # no arena of another model pins meanwhile
        cfg, plan = fit_settings(cfg, _offloads(cfg))
        phases = {"fit": time.monotonic() - started}
        with record_buffers() as buffers:
            parts = _load(cfg, stats, progress, buffers, wake, plan, kept, phases, demand)
        parts.info = _with_capacity(parts, cfg, buffers, plan)
    log.info("capacity:\n%s", parts.info.capacity.table())
    total = time.monotonic() - started
    phases["the rest"] = total - sum(phases.values())
    log.info("loaded in %.2f s (%s)", total, ", ".join(f"{name} {s:.2f} s" for name, s in phases.items()))
    context = parts.info.context
    parts.reload = dataclasses.replace(cfg, fit=False, n_ctx=context.n_ctx if context is not None else cfg.n_ctx)
    return parts


def _offloads(cfg: EngineConfig) -> bool:
    return cfg.n_gpu_layers != 0 and cfg.placement.offloads and supports_gpu_offload()


# On the CPU, llama.cpp's flash attention decodes several times slower once the context is
# deep, and a batch of a few tokens (a verified draft) slower still; at prefill it is within
# about a third either way. On 2 cores (SmolLM2 135M, llama-bench): one token at depth 4096,
# 36.7 tokens/s without it against 12.0 with it, at 8192 18.0 against 5.8; 512 tokens at depth
# 4096, 96.7 against 116.9. On a 0.6B attention-only model (the Qwen3 0.6B shape, 2 cores,
# scripts/bench_flash_attn_cpu.py) it decodes faster only near the start of a context: 0.79x
# the time per token at 256 tokens of depth, 1.11x at 1K, 1.97x at 4K, and 256 tokens
# prefilled at 4K take 1.34x (SmolLM2 the same way: 0.95x, 1.50x, 1.58x; prefill 1.28x). An
# agent's turn decodes far more than it prefills once its prefix is reused, so "auto" on the
# CPU is off, while the attention scores it then keeps for a micro-batch (n_ubatch x n_ctx x
# n_head floats) stay within an eighth of the RAM. A quantized V cache needs flash attention.
# Sliding-window models get no exception, though most of their layers attend to a window of a
# few hundred cells: on Gemma 3 270M, 2 CPU cores, flash attention on decodes at 0.96-1.08x
# llama-server's speed against 0.90-0.91x off. But with it the CPU sums one token's V in half
# precision and a batch's in single precision, tile by tile: a Gemma 3 conversation back from
# the prompt cache had logits up to 3.6 from a cold run's (0.54-0.74 off, where the matrix
# kernels' own batch-shape differences remain), and on an AVX-512 EPYC it answered otherwise
# than cold (greedy). Off, its greedy answer was the cold run's in every trial.
FLASH_OFF_RAM_SHARE = 8


def flash_attn_setting(cfg: EngineConfig, n_head: int, on_gpu: bool, n_ctx: int) -> str:
    """--flash-attn as the context gets it: "auto" resolved on the CPU (see above)."""
    if cfg.flash_attn != "auto" or on_gpu or cfg.type_v not in ("f16", "f32", "bf16"):
        return cfg.flash_attn
    scores = cfg.n_ubatch * n_ctx * max(1, n_head) * 4
    if scores > physical_memory() // FLASH_OFF_RAM_SHARE:
        log.info("flash attention: llama.cpp's choice (without it the attention scores of a batch would take %.1f GiB)", scores / (1 << 30))
        return "auto"
    log.info("flash attention: off (it decodes slower on the CPU; the attention scores of a batch take %.0f MiB)", scores / (1 << 20))
    return "off"


def _context_choice(cfg: EngineConfig, model: Model, on_gpu: bool, plan: FitPlan | None) -> ContextChoice:
    """--ctx-size, or for 0 what --fit chose, else the training context if it fits the memory
    the server can see."""
    per_token = model.kv_bytes_per_token(cfg.type_k, cfg.type_v)
    if plan is not None and cfg.n_ctx <= 0 and per_token:
        choice = ContextChoice(plan.n_ctx, ContextSource.FIT, model.info.n_ctx_train, plan.budget_bytes, "free device memory")
        log.info("context: %s", choice.describe())
        return choice
    devices = gpu_memory() if on_gpu and cfg.n_ctx <= 0 else []
    if devices:
        budget, where = sum(device_budget(d.free, d.total) for d in devices), "free device memory"
    else:
        mapped = model.info.size_bytes if cfg.use_mmap else 0  # mapped weights count as available RAM
        budget, where = ram_budget(available_ram(), physical_memory(), cfg.cache_ram + mapped), "available RAM"
    choice = choose_context(cfg.n_ctx, model.info.n_ctx_train, per_token, budget, cfg.n_parallel, where)
    log.info("context: %s", choice.describe())
    return choice


def _load(
    cfg: EngineConfig, stats: EngineStats, progress: Callable[[float], None], buffers, wake, plan: FitPlan | None, kept,
    phases: dict[str, float], demand: Demand | None,
) -> ModelParts:
    """The parts; `phases` gets the seconds of the slow steps (weights, context)."""
    filler_budget = 0
    log.info("loading %s", cfg.model_path)
    started = time.monotonic()
    model = Model(
        cfg.model_path, n_gpu_layers=cfg.n_gpu_layers, progress=progress, use_mmap=cfg.use_mmap, use_mlock=cfg.use_mlock,
        placement=cfg.placement, repack=cfg.repack, load_mtp=cfg.spec.type == "draft-mtp",
    )
    phases["weights"] = time.monotonic() - started
    info = model.info
    on_gpu = _offloads(cfg)
    choice = _context_choice(cfg, model, on_gpu, plan)
    kind = classify_memory(info, cfg.swa_full)
    layout = plan_layout(
        model, kind, n_parallel=cfg.n_parallel, n_ctx=choice.n_ctx,
        kv_unified_setting=cfg.kv_unified, cache_vram=cfg.cache_vram, type_k=cfg.type_k, type_v=cfg.type_v,
        on_gpu=on_gpu, cache_ram=cfg.cache_ram, spare_share=cfg.spare_share,
    )
    # auto on the CPU: the spare streams are RAM taken from the prompt cache's budget
    spares_ram = ram_spares_bytes(model, kind, layout, cfg.type_k, cfg.type_v) if not on_gpu and cfg.cache_vram is None else 0
    if spares_ram and cfg.shared_ram is None:
        cfg = dataclasses.replace(cfg, cache_ram=max(0, cfg.cache_ram - spares_ram))
    unified = layout.unified
    per_token = model.kv_bytes_per_token(cfg.type_k, cfg.type_v)
    scratch = _scratch_sequence(cfg, kind, layout)
    # a sequence's whole state, as the pinned arena's chunks hold it (HostBuffers.hold_states)
    whole = stream_state_bytes(model, kind, layout.n_ctx if unified else layout.n_ctx // layout.n_seq, cfg.type_k, cfg.type_v)
    # on the CPU, the buffer that whole states pass through on their way to and from segments
    # (Staging) stays between copies, so they write into memory already mapped: up to a whole
    # state, beside the prompt cache's budget as the pinned one is on a GPU (pinned_limit),
    # and no more than a quarter of that budget where that exceeds Staging.KEEP_UNPINNED
    staging_ram = min(whole, max(host_buffers.Staging.KEEP_UNPINNED, cfg.cache_ram // 4)) if not on_gpu and _segments_on(cfg, kind) else 0
    # page-locked host memory for states on a CUDA GPU: the prompt cache, every slot's
    # checkpoints, the staging buffer (a whole state) and some slack; never most of the RAM
    pinned_limit = min(cfg.cache_ram + cfg.n_parallel * cfg.checkpoint_bytes + min(whole, 16 << 30) + (2 << 30), physical_memory() * 3 // 4)
    params = ContextParams(
        n_ctx=layout.n_ctx,
        n_batch=max(cfg.n_batch, layout.n_seq),
        n_ubatch=cfg.n_ubatch,
        n_seq_max=layout.n_seq + (scratch is not None),
        n_threads=cfg.n_threads,
        n_threads_batch=cfg.n_threads_batch,
        flash_attn=flash_attn_setting(cfg, model.n_head, on_gpu, layout.n_ctx),
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        swa_full=cfg.swa_full,
        kv_unified=unified,
        n_rs_seq=cfg.spec.snapshots_for(kind),
    )
    if not on_gpu and unified and kind is MemoryKind.ATTENTION and layout.n_spare and params.flash_attn == "off":
        log.warning(
            "one KV pool that keeps idle conversations (--kv-unified with --cache-vram), on the CPU "
            "without flash attention: every step's attention multiplies the idle conversations' cells. "
            "16 agents on -np 4 took 1.40-1.79x the time of a stream per slot this way, 0.73-0.93x with "
            "-fa on (docs/state-segments.md, one pool or a stream per slot)")
    started = time.monotonic()
    ctx = Context(model, params, host=host_buffers.HostBuffers(cuda_host_allocator() if on_gpu else None, limit=pinned_limit))
    phases["context"] = time.monotonic() - started
    batch = Batch(ctx.n_batch, ctx.n_seq_max)
    sampling = BatchSampler(ctx, sampling_threads(cfg.n_parallel))
    host = ctx.host
    if host.pinned:  # in the background, once the model serves
        # chunks that hold a whole sequence's state: a state larger than every chunk never
        # finds pinned room, and its copies run at a fraction of the bus speed
        host.hold_states(whole)  # (unknown: no room kept ahead)
        host.pin_soon(min(cfg.pinned_at_load, cfg.cache_ram + (1 << 30)))
    slots = [
        Slot(i, CheckpointList(cfg.ctx_checkpoints, cfg.checkpoint_bytes)) for i in range(layout.n_seq)
    ]
    kind = ctx.memory_kind
    # a saved state records the KV layout (one pool, or its stream count); states on disk
    # also outlive the llama.cpp build that wrote them
    fingerprint = (  # flash attention too: without it llama.cpp stores V transposed
        f"{info.fingerprint}:{cfg.type_k}:{cfg.type_v}:fa-{params.flash_attn}:{int(cfg.swa_full)}:{'u' if unified else layout.n_seq}"
        f":llama-cpp-python-{_library_version()}"
    )
    if kept is not None and kept[0] is not None and kept[0].fingerprint == fingerprint:
        cache, disk = kept
    else:
        if kept is not None and kept[0] is not None:
            log.warning("the state layout changed (%s); the prompt cache starts empty", fingerprint)
        cache, disk = _cache_tiers(cfg, ctx, stats, fingerprint, kind, wake, demand)
    if cache is not None and cache.shared is not None:
        cache.reserved = spares_ram  # held out of the shared budget (set again at every load)
    if cache is not None:  # entries sharing a prefix store it once (cache/segments.py), in this context's host memory
        cache.place_segments(ctx.host.empty if _segments_on(cfg, kind) else None)
    # NOTE: a fork between streams is copied at the next decode, after a sliding-window
    # checkpoint restore into the target would already have been written: no forks there
    can_fork = unified or kind is not MemoryKind.SWA
    if not unified and kind is MemoryKind.ATTENTION and per_token:
        filler_budget = info.size_bytes // per_token
    log.info(
        "model %s (%s, %s memory%s): %d slots, context %d tokens %s%s, batch %d/%d, %d threads",
        info.name,
        info.arch,
        ctx.memory_kind.value,
        f", window {info.n_swa}" if ctx.memory_kind is MemoryKind.SWA else "",
        cfg.n_parallel,
        ctx.n_ctx,
        f"in one pool (up to {ctx.n_ctx_seq} per slot)" if unified else f"as a stream of {ctx.n_ctx_seq} per slot",
        f", {layout.n_spare} spare streams keep idle conversations in the KV cache" if layout.n_spare else "",
        ctx.n_batch,
        ctx.n_ubatch,
        ctx.n_threads,
    )
    vocab = Vocab(model)
    engine_info = EngineInfo(
        model_name=info.name, model_path=info.path, arch=info.arch, description=info.description,
        fingerprint=info.fingerprint, n_params=info.n_params, size_bytes=info.size_bytes, n_vocab=info.n_vocab,
        n_ctx_train=info.n_ctx_train, chat_template=info.chat_template, memory=kind, n_slots=cfg.n_parallel,
        n_seq=layout.n_seq, kv_unified=unified, n_ctx=ctx.n_ctx, n_ctx_slot=ctx.n_ctx_seq,
        kv_bytes_per_token=per_token, context=choice, pinned_limit=pinned_limit if host.pinned else 0,
        state_fingerprint=fingerprint,
    )
    # inputs of up to --batch-size tokens (within the training context) on a second context
    embedder = Embedder(
        model, pooling=cfg.pooling, n_ctx=min(info.n_ctx_train, max(cfg.n_batch, 512)), n_threads=cfg.n_threads,
        flash_attn=cfg.flash_attn,
    ) if cfg.embeddings else None
    reranker = Reranker(
        model, n_ctx=min(info.n_ctx_train, max(cfg.n_batch, 512)), n_threads=cfg.n_threads, flash_attn=cfg.flash_attn,
    ) if cfg.reranking else None
    projector = _projector(cfg, model, on_gpu, stats)
    return ModelParts(
        model, layout, ctx, batch, sampling, slots, cache, filler_budget, vocab, engine_info, disk,
        embedder, reranker, projector, cfg=cfg, can_fork=can_fork, scratch=scratch, on_gpu=on_gpu,
        staging_bytes=staging_ram if cache is not None else 0,
    )


def reuse_parts(parts: ModelParts, stats: EngineStats, drafter=None, demand: Demand | None = None) -> tuple[SlotMemory, Router, Prefixes]:
    """What moves sequence state (`memory`, with the speculative drafter's sequences when it
    keeps them), decides where a prompt comes from (`router`) and applies that (`prefixes`)."""
    cfg, model, ctx, slots, cache, disk = parts.cfg, parts.model, parts.ctx, parts.slots, parts.cache, parts.disk
    kind, unified, layout, can_fork = ctx.memory_kind, parts.layout.unified, parts.layout, parts.can_fork
    memory = SlotMemory(ctx, model, cache, stats, drafter=drafter, scratch=parts.scratch, staging_bytes=parts.staging_bytes)
    router = Router(slots, cache, memory.cutter, kind.truncatable, can_fork, n_busy_max=cfg.n_parallel, contiguous=not unified, disk=disk,
                    quick_tokens=cfg.quick_tokens, stats=stats, demand=demand, shift_min=_shift_min(cfg, ctx))
    prefixes = Prefixes(
        slots, memory, cache, ctx, model, stats,
        park=cfg.park_idle, n_spare=layout.n_spare, checkpoint_every=cfg.checkpoint_every, disk=disk, demand=demand,
        shifts=cfg.cache_reuse > 0, pool_cells=_pool_cells(cfg, model, kind, layout),
    )
    return memory, router, prefixes


def _pool_cells(cfg: EngineConfig, model, kind: MemoryKind, layout: KvLayout) -> int | None:
    """In one pool of attention memory with spare sequences (--cache-vram SIZE): the cells
    idle conversations may keep in it, SIZE over a token's KV bytes (None: not that layout)."""
    per_token = model.kv_bytes_per_token(cfg.type_k, cfg.type_v)
    if not (layout.unified and layout.n_spare and kind is MemoryKind.ATTENTION and cfg.cache_vram and per_token):
        return None
    return cfg.cache_vram // per_token


def _shift_min(cfg: EngineConfig, ctx) -> int:
    """--cache-reuse's chunk size where this model's memory can move chunks (else 0: off,
    said once here)."""
    if cfg.cache_reuse <= 0:
        return 0
    why = ctx.shift_refusal()
    if why is not None:
        log.warning("--cache-reuse %d has no effect on this model: %s; prefixes are reused whole", cfg.cache_reuse, why)
        return 0
    log.info("--cache-reuse %d: chunks of at least %d tokens that moved in a slot's prompt are shifted (approximate KV)",
             cfg.cache_reuse, cfg.cache_reuse)
    return cfg.cache_reuse


def _scratch_sequence(cfg: EngineConfig, kind: MemoryKind, layout: KvLayout) -> int | None:
    """The id of a sequence that no slot runs, in one pool of attention memory where entries
    are stored as segments (None elsewhere): a save tags the cells that the prompt cache
    lacks as that sequence's too and reads only those (SlotMemory._read_scratch). In one
    pool of attention memory a sequence more costs no KV memory."""
    wanted = layout.unified and kind is MemoryKind.ATTENTION and _segments_on(cfg, kind)
    return layout.n_seq if wanted and layout.n_seq < LLAMA_MAX_SEQ else None


def _segments_on(cfg: EngineConfig, kind: MemoryKind) -> bool:
    """Whether the prompt cache and the disk tier store entries as segments: not on recurrent
    memory, whose state is one cell."""
    return cfg.cache_segments and kind is not MemoryKind.RECURRENT


def _parser(kind: MemoryKind):
    """The parser of this memory kind's sequence states (cache/segments.py)."""
    return functools.partial(segments.parse, recurrent=kind is MemoryKind.HYBRID)


def _cache_tiers(cfg: EngineConfig, ctx: Context, stats: EngineStats, fingerprint: str, kind: MemoryKind, wake, demand: Demand | None):
    """The RAM prompt cache (--cache-ram) and the disk tier behind it (--cache-disk), which
    keeps what the cache evicts (`DiskTier.put`)."""
    disk: DiskTier | None = None

    def spill(entry: CacheEntry) -> None:  # the disk tier is built below, on the cache
        disk.put(entry)

    cache = PromptCache(
        cfg.cache_ram, fingerprint, kind.truncatable, shared=cfg.shared_ram, demand=demand, parse=_parser(kind),
        on_evict=spill if cfg.cache_disk else None,
    ) if cfg.cache_ram > 0 else None
    if cfg.cache_disk:
        if cache is None:
            raise ValueError("--cache-disk keeps what the RAM prompt cache evicts: it needs --cache-ram above 0")
        store = DiskCache(cfg.cache_disk, cfg.cache_disk_size, fingerprint, kind.truncatable, allocate=ctx.host.empty,
                          shared=cfg.shared_disk, parse=_parser(kind), write_segments=_segments_on(cfg, kind))
        disk = DiskTier(store, cache, stats, (cfg.ctx_checkpoints, cfg.checkpoint_bytes), wake)
    return cache, disk


def _projector(cfg: EngineConfig, model: Model, on_gpu: bool, stats: EngineStats) -> Projector | None:
    """--mmproj: the vision or audio projector beside the model."""
    if not cfg.mmproj:
        return None
    log.info("loading the projector %s", cfg.mmproj)
    projector = Projector(cfg.mmproj, model, ProjectorParams(
        use_gpu=cfg.mmproj_offload and on_gpu, n_threads=cfg.n_threads,
        image_min_tokens=cfg.image_min_tokens, image_max_tokens=cfg.image_max_tokens,
    ), on_preprocess=stats.count_preprocessed)
    if not projector.modalities:
        projector.close()
        raise ValueError(f"{cfg.mmproj}: the projector has neither a vision nor an audio encoder")
    return projector


def _with_capacity(parts: ModelParts, cfg: EngineConfig, buffers: list[tuple[str, str, int]], plan: FitPlan | None) -> EngineInfo:
    """The engine's info with its capacity table, from what llama.cpp allocated."""
    info = parts.info
    recurrent = buffers_by_device(buffers, "RS")
    on_device = _offloads(cfg)
    state = {**{d: 0 for d in recurrent}, **buffers_by_device(buffers, "KV")}
    for device, size in recurrent.items():
        state[device] += size
    per_slot = sum(recurrent.values()) // info.n_seq if recurrent else 0
    answer = capacity_headroom(
        cfg, on_device=on_device, state_bytes=sum(n for d, n in state.items() if (d != "CPU") == on_device),
        kv_bytes_per_token=info.kv_bytes_per_token, state_bytes_per_slot=per_slot, n_ctx_slot=info.n_ctx_slot,
        n_ctx_train=info.n_ctx_train,
    )
    cache = parts.cache  # its budget: less the CPU's spare streams; a shared one's total
    cache_ram = (cache.shared.total - cache.reserved if cache.shared is not None else cache.budget) if cache is not None else cfg.cache_ram
    capacity = Capacity(
        context=info.context, n_slots=info.n_slots, n_seq=info.n_seq, n_ctx_slot=info.n_ctx_slot,
        weights_bytes=buffers_by_device(buffers, "model") or {"unknown": info.size_bytes},
        kv_bytes=buffers_by_device(buffers, "KV"),
        kv_bytes_per_token=info.kv_bytes_per_token,
        recurrent_bytes_per_slot=sum(recurrent.values()) // info.n_seq if recurrent else None,
        compute_bytes=buffers_by_device(buffers, "compute"),
        checkpoints_per_slot=cfg.ctx_checkpoints, checkpoint_bytes_per_slot=cfg.checkpoint_bytes,
        cache_ram_bytes=cache_ram, cache_ram_auto=cfg.cache_ram_auto,
        spares_ram_bytes=cfg.cache_ram - cache_ram, staging_ram_bytes=parts.staging_bytes,
        pinned_bytes=parts.ctx.host.allocated_bytes, pinned_limit_bytes=info.pinned_limit,
        device_memory=device_memory(buffers),
        embeddings_bytes=sum(e.memory_bytes for e in (parts.embedder, parts.reranker) if e is not None),
        projector=("device" if cfg.mmproj_offload and cfg.n_gpu_layers != 0 and supports_gpu_offload() else "CPU") if parts.projector else "",
        projector_bytes=parts.projector.size_bytes if parts.projector is not None else 0,
        modalities=parts.projector.modalities if parts.projector is not None else (),
        overridden=overridden_tensors(buffers), headroom=answer, fit=plan, unified=info.kv_unified, n_ctx=info.n_ctx,
    )
    return dataclasses.replace(info, capacity=capacity, device_memory=capacity.device_memory)


def _library_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
