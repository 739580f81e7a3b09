"""What the loaded server holds where: the capacity table logged at start-up, and shown in
/props and /engine.

Buffer sizes come from llama.cpp's own accounting of each buffer it allocated (see
`llama_api.native_log.record_buffers`), grouped by device: llama.cpp's CPU buffer types (`CPU_Mapped`,
`CPU_REPACK`, `CUDA_Host`, ...) all live in host memory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .context_size import ContextChoice
from .fit import FitPlan, Headroom


def _device(buffer: str) -> str:
    """The device a llama.cpp buffer lives on: CUDA0 for CUDA0, CPU for CPU_Mapped or CUDA_Host."""
    if buffer.startswith("CPU") or buffer.endswith("_Host"):
        return "CPU"
    return buffer


def buffers_by_device(records: list[tuple[str, str, int]], kind: str) -> dict[str, int]:
    """Bytes per device of one kind of buffer (model, KV, RS, compute, output). A compute
    buffer that is reserved again replaces the previous size; the others add up."""
    per_buffer: dict[str, int] = defaultdict(int)
    for k, buffer, size in records:
        if k != kind:
            continue
        per_buffer[buffer] = size if kind == "compute" else per_buffer[buffer] + size
    out: dict[str, int] = defaultdict(int)
    for buffer, size in per_buffer.items():
        out[_device(buffer)] += size
    return dict(out)


def overridden_tensors(records: list[tuple[str, str, int]]) -> dict[str, int]:
    """How many tensors -ot, --cpu-moe or --n-cpu-moe placed on each device."""
    out: dict[str, int] = defaultdict(int)
    for kind, buffer, _ in records:
        if kind == "override":
            out[_device(buffer)] += 1
    return dict(out)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What one llama.cpp buffer type (a device such as CUDA0 or RPC0[host:port], or a host
    buffer such as CUDA_Host or CPU_Mapped) holds."""

    device: str
    model_bytes: int = 0
    state_bytes: int = 0  # KV cache and recurrent state of every sequence


def device_memory(records: list[tuple[str, str, int]]) -> tuple[DeviceMemory, ...]:
    """Model and state (KV and recurrent) bytes by buffer type, in the order llama.cpp made them
    (a sliding-window model has two KV caches, a hybrid one a KV cache and a recurrent one)."""
    model: dict[str, int] = defaultdict(int)
    state: dict[str, int] = defaultdict(int)
    for kind, buffer, size in records:
        if kind == "model":
            model[buffer] += size
        elif kind in ("KV", "RS"):
            state[buffer] += size
    names = list(dict.fromkeys([*model, *state]))
    return tuple(DeviceMemory(n, model.get(n, 0), state.get(n, 0)) for n in names)


@dataclass(frozen=True, slots=True)
class Capacity:
    context: ContextChoice
    n_slots: int
    n_seq: int  # sequences, spares included
    n_ctx_slot: int
    weights_bytes: dict[str, int]  # per device
    kv_bytes: dict[str, int]  # KV cache buffers per device
    kv_bytes_per_token: int | None  # attention KV of one token in every layer (from the metadata)
    recurrent_bytes_per_slot: int | None  # None: the model has no recurrent state
    compute_bytes: dict[str, int]
    checkpoints_per_slot: int
    checkpoint_bytes_per_slot: int
    cache_ram_bytes: int
    cache_ram_auto: bool
    pinned_bytes: int
    pinned_limit_bytes: int  # 0: no pinned memory (no CUDA device)
    notes: tuple[str, ...] = field(default_factory=tuple)
    spares_ram_bytes: int = 0  # on the CPU: what the spare streams took of the prompt cache's RAM
    staging_ram_bytes: int = 0  # on the CPU: the most RAM kept for whole states in passing, beside it
    device_memory: tuple[DeviceMemory, ...] = ()  # model and state bytes by buffer type
    embeddings_bytes: int = 0  # most the embedding and reranking contexts' buffers take (0: both off)
    projector: str = ""  # --mmproj: where its weights are ("" without one)
    projector_bytes: int = 0  # its file's size
    modalities: tuple[str, ...] = ()  # what its encoders take: "vision", "audio"
    overridden: dict[str, int] = field(default_factory=dict)  # tensors placed by -ot/--cpu-moe, per device
    headroom: Headroom | None = None  # what the server could hold, with the margin
    fit: FitPlan | None = None  # what --fit settled (None: it did not run)
    unified: bool = False  # one pool of KV cells for every sequence (else a stream each)
    n_ctx: int = 0  # KV cells in all

    def tokens_held(self) -> str:
        """What each tier holds counted in tokens: the device's cells (in one pool a prefix
        that sequences share takes its cells once; a stream holds its own copy), and the
        tokens of KV the prompt cache's RAM holds (a prefix that entries share, once)."""
        if self.unified:
            device = f"{self.n_ctx} cells in one pool, a prefix that sequences share held once"
        else:
            device = f"{self.n_ctx_slot} cells in each of {self.n_seq} streams, a shared prefix held in each"
        if self.cache_ram_bytes and self.kv_bytes_per_token:
            ram = f"about {self.cache_ram_bytes // self.kv_bytes_per_token} tokens of KV in RAM, a shared prefix held once"
        else:
            ram = "none in RAM"
        return f"{device}; {ram}"

    @property
    def checkpoint_budget_bytes(self) -> int:
        return self.checkpoint_bytes_per_slot * self.n_seq

    def state_bytes(self) -> dict[str, int]:
        """The KV cache and recurrent state of every sequence (spares included), per device."""
        state: dict[str, int] = defaultdict(int)
        for d in self.device_memory:
            state[_device(d.device)] += d.state_bytes
        return dict(state) if state else dict(self.kv_bytes)

    def held_bytes(self) -> dict[str, int]:
        """What the loaded model holds per device (CPU: host memory), as llama.cpp allocated
        it: the weights, the state of every sequence and the compute buffers, with the
        projector's weights where --mmproj put them (the embedding contexts are not counted)."""
        held: dict[str, int] = defaultdict(int)
        for sizes in (self.weights_bytes, self.state_bytes(), self.compute_bytes):
            for device, n in sizes.items():
                held[device] += n
        if self.projector_bytes:
            gpus = {d: n for d, n in self.weights_bytes.items() if d != "CPU"}
            where = max(gpus, key=gpus.__getitem__) if self.projector == "device" and gpus else "CPU"
            held[where] += self.projector_bytes
        return dict(held)

    def to_json(self) -> dict:
        return {
            "context": self.context.to_json(),
            "n_ctx_slot": self.n_ctx_slot,
            "n_slots": self.n_slots,
            "n_seq": self.n_seq,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "recurrent_bytes_per_slot": self.recurrent_bytes_per_slot,
            "compute_bytes": self.compute_bytes,
            "checkpoints_per_slot": self.checkpoints_per_slot,
            "checkpoint_bytes_per_slot": self.checkpoint_bytes_per_slot,
            "checkpoint_budget_bytes": self.checkpoint_budget_bytes,
            "cache_ram_bytes": self.cache_ram_bytes,
            "cache_ram": "auto" if self.cache_ram_auto else "flag",
            "spares_ram_bytes": self.spares_ram_bytes,
            "staging_ram_bytes": self.staging_ram_bytes,
            "pinned_bytes": self.pinned_bytes,
            "pinned_limit_bytes": self.pinned_limit_bytes,
            "device_memory": [{"device": d.device, "model_bytes": d.model_bytes, "state_bytes": d.state_bytes}
                              for d in self.device_memory],
            "embeddings_bytes": self.embeddings_bytes,
            "projector_bytes": self.projector_bytes,
            "modalities": list(self.modalities),
            "overridden_tensors": self.overridden,
            "headroom": self.headroom.to_json() if self.headroom is not None else None,
            "fit": self.fit.to_json() if self.fit is not None else None,
            "unified": self.unified,
            "n_ctx": self.n_ctx,
        }

    def rows(self) -> list[tuple[str, str]]:
        """(what, how much) lines of the start-up table."""
        rows = [
            ("context", f"{self.context.describe()}; {self.n_ctx_slot} per slot, {self.n_slots} slots"
                        + (f" and {self.n_seq - self.n_slots} spare sequences" if self.n_seq > self.n_slots else "")),
            ("weights", _per_device(self.weights_bytes)),
            ("KV cache", _per_device(self.kv_bytes) + (f"; {_size(self.kv_bytes_per_token)} per token" if self.kv_bytes_per_token else "")),
            ("tokens held", self.tokens_held()),
        ]
        if self.recurrent_bytes_per_slot is not None:
            rows.append(("recurrent state", f"{_size(self.recurrent_bytes_per_slot)} per sequence"))
        if len(self.device_memory) > 1:  # several devices: where the state of the sequences lives
            rows.append(("by device", "; ".join(
                f"{d.device} model {_size(d.model_bytes)}, state {_size(d.state_bytes)}" for d in self.device_memory)))
        rows += [
            ("compute buffers", _per_device(self.compute_bytes)),
            ("checkpoints", f"up to {self.checkpoints_per_slot} and {_size(self.checkpoint_bytes_per_slot)} per sequence, "
                            f"{_size(self.checkpoint_budget_bytes)} in all"),
            ("prompt cache (RAM)", "off" if not self.cache_ram_bytes else
             _size(self.cache_ram_bytes) + (" (auto: a quarter of the RAM, at most 32 GiB)" if self.cache_ram_auto else "")
             + (f", after {_size(self.spares_ram_bytes)} for the spare sequences" if self.spares_ram_bytes else "")
             + (f"; beside it up to {_size(self.staging_ram_bytes)} kept for whole states in passing"
                if self.staging_ram_bytes and self.cache_ram_bytes else "")),
            ("pinned host memory", f"{_size(self.pinned_bytes)}, up to {_size(self.pinned_limit_bytes)}"
             if self.pinned_limit_bytes else "none (no CUDA device)"),
        ]
        if self.overridden:
            rows.append(("tensor overrides", ", ".join(f"{n} tensors on {d}" for d, n in sorted(self.overridden.items()))
                         + " (-ot, --cpu-moe, --n-cpu-moe)"))
        if self.fit is not None:
            rows.append(("--fit", self.fit.explain() + (f"; chose {'; '.join(self.fit.changed)}" if self.fit.changed else "")))
        if self.headroom is not None:
            rows.append(("can hold", self.headroom.describe()))
        if self.embeddings_bytes:
            rows.append(("embeddings", f"up to {_size(self.embeddings_bytes)} (KV cache, outputs and compute of one batch of inputs)"))
        if self.projector_bytes:
            takes = " and ".join("images" if m == "vision" else m for m in self.modalities)
            rows.append(("projector", f"{_size(self.projector_bytes)} of weights ({self.projector}) for {takes}, compute buffer in the log"))
        return rows + [("note", note) for note in self.notes]

    def table(self) -> str:
        width = max(len(what) for what, _ in self.rows())
        return "\n".join(f"  {what:<{width}}  {value}" for what, value in self.rows())


def _size(n: int | None) -> str:
    n = n or 0
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _per_device(sizes: dict[str, int]) -> str:
    if not sizes:
        return "none"
    return ", ".join(f"{device} {_size(n)}" for device, n in sorted(sizes.items()))
