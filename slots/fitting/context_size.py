"""The context size when `--ctx-size` is 0.

Like llama-server, `--ctx-size` is the KV cells of all slots together (a slot gets
`--ctx-size / --parallel` of them with a stream per slot, up to all of them in one pool).
With 0 the server takes the model's training context when its KV cache fits in the memory it
can see (free device memory on a GPU, available RAM on a CPU), else the largest context that
fits, and logs which.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("warmslot.engine")

GRANULE = 256  # llama.cpp pads a context to a multiple of 256 cells
FALLBACK_CTX = 32768  # when the KV bytes per token are unknown
# memory left free: compute buffers, fragmentation, other processes
RESERVE_FRACTION = 0.10
RESERVE_BYTES = 1 << 30


class ContextSource(enum.Enum):
    FLAG = "flag"  # --ctx-size N
    TRAINING = "training"  # the model's training context fits
    MEMORY = "memory"  # the largest context that fits the memory
    FALLBACK = "fallback"  # the KV size per token is unknown: the training context, at most FALLBACK_CTX
    FIT = "fit"  # --fit chose it with the model's weights and the margin (fit.py)


@dataclass(frozen=True, slots=True)
class ContextChoice:
    n_ctx: int  # cells of all slots together
    source: ContextSource
    n_ctx_train: int
    budget_bytes: int | None = None  # the memory the KV cache could take
    where: str = ""  # "device" or "RAM"

    def describe(self) -> str:
        if self.source is ContextSource.FLAG:
            return f"{self.n_ctx} tokens (--ctx-size)"
        if self.source is ContextSource.TRAINING:
            return f"{self.n_ctx} tokens, the model's training context (it fits in {_gib(self.budget_bytes)} of {self.where})"
        if self.source is ContextSource.MEMORY:
            return (f"{self.n_ctx} tokens, the largest that fits in {_gib(self.budget_bytes)} of {self.where} "
                    f"(the model was trained on {self.n_ctx_train}; give --ctx-size to choose)")
        if self.source is ContextSource.FIT:
            return (f"{self.n_ctx} tokens, chosen by --fit to fit {_gib(self.budget_bytes)} of {self.where} with the "
                    f"weights (the model was trained on {self.n_ctx_train})")
        return f"{self.n_ctx} tokens (the KV size per token is unknown: the training context, at most {FALLBACK_CTX})"

    def to_json(self) -> dict:
        return {"n_ctx": self.n_ctx, "source": self.source.value, "n_ctx_train": self.n_ctx_train,
                "budget_bytes": self.budget_bytes, "where": self.where}


def _gib(n: int | None) -> str:
    return f"{(n or 0) / (1 << 30):.1f} GiB"


def choose_context(requested: int, n_ctx_train: int, kv_bytes_per_token: int | None,
                   budget_bytes: int, n_parallel: int, where: str) -> ContextChoice:
    """The cells of all slots: `requested` when given, else the training context when
    `kv_bytes_per_token * n_ctx_train` fits `budget_bytes`, else the largest multiple of
    GRANULE cells per slot that fits (at least one GRANULE per slot)."""
    train = n_ctx_train or FALLBACK_CTX
    if requested > 0:
        return ContextChoice(requested, ContextSource.FLAG, train)
    if not kv_bytes_per_token:
        return ContextChoice(min(train, FALLBACK_CTX), ContextSource.FALLBACK, train)
    if kv_bytes_per_token * train <= budget_bytes:
        return ContextChoice(train, ContextSource.TRAINING, train, budget_bytes, where)
    per_slot = max(0, budget_bytes) // kv_bytes_per_token // n_parallel
    per_slot = max(GRANULE, per_slot // GRANULE * GRANULE)
    return ContextChoice(min(train, per_slot * n_parallel), ContextSource.MEMORY, train, budget_bytes, where)


def available_ram() -> int:
    """Bytes of RAM available to new allocations (MemAvailable), else the physical RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def device_budget(free: int, total: int) -> int:
    """What a KV cache may take of a device with `free` of `total` bytes."""
    return free - int(total * RESERVE_FRACTION) - RESERVE_BYTES


def ram_budget(available: int, physical: int, reserved: int) -> int:
    """What a KV cache may take of the RAM: what is available, less what the server has
    promised elsewhere (`reserved`: the prompt cache budget, memory-mapped weights)."""
    return available - reserved - int(physical * RESERVE_FRACTION) - RESERVE_BYTES
