"""What each model of a server with several takes, and whether they fit together: the view of
GET /models/capacity.

A loaded model's memory is measured: llama.cpp's own accounting of the buffers it allocated,
as its capacity table shows them (`Capacity.held_bytes`: weights, the KV cache and recurrent
state of every sequence, spares included, and the compute buffers). A model unloaded after a
load (sleeping) shows what it took at its last load. A model never loaded is estimated from its
GGUF file: the tensor table's bytes (and the projector file's), plus the KV cache of its
configured context from the metadata's head counts (and `--cache-vram`, the most its spare
sequences take); its compute buffers are not counted, nor its KV cache when no `--ctx-size`
is set (the context is chosen at load) or when it has recurrent layers (their state is known
once loaded).

Whether the models fit together is answered where their memory lives: device memory when a
model offloads to a GPU, else RAM. The room is what is free there now plus what the loaded
models hold, less the margin (`--fit-target`, on each device) and, in RAM, the prompt caches'
budgets, as the capacity table's `can hold` line counts it.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import struct
from dataclasses import dataclass

from warmslot.slots import NotGGUF, available_ram, gpu_memory, kv_bytes_per_token, supports_gpu_offload
from warmslot.slots import gguf_arch_numbers as arch_numbers, read_gguf_header as read_header

from .registry import ModelEntry, Models, ModelState

MEASURED = "measured"  # loaded: what llama.cpp allocated
LAST_LOAD = "measured at its last load"  # unloaded now
ESTIMATED = "estimated"  # never loaded: from its GGUF file
DEVICE = "device"  # an estimate's device memory, before llama.cpp says which GPU
HELD = (ModelState.LOADED, ModelState.UNLOADING)  # states whose memory is allocated
RECURRENT_KEY = re.compile(r"\.(ssm|wkv|shortconv)\.")  # metadata of recurrent layers


@dataclass(frozen=True)
class ModelMemory:
    """One model's memory, measured or estimated (`source`)."""

    name: str
    state: str
    source: str
    held_bytes: dict[str, int]  # by device: "CPU" is host memory, "device" a GPU not yet chosen
    weights_bytes: int
    state_bytes: int | None  # KV cache and recurrent state; None: not known before a load
    compute_bytes: int | None  # None: not known before a load
    n_ctx: int | None  # KV cells in all; None: chosen at load
    n_slots: int
    n_spare: int | None  # spare sequences (their KV is in state_bytes); None: chosen at load
    cache_ram_bytes: int  # the RAM prompt cache's budget (it stays while the model is unloaded)
    not_counted: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(self.held_bytes.values())

    def to_json(self) -> dict:
        return {
            "model": self.name, "state": self.state, "source": self.source, "held_bytes": self.held_bytes,
            "total_bytes": self.total_bytes, "weights_bytes": self.weights_bytes, "state_bytes": self.state_bytes,
            "compute_bytes": self.compute_bytes, "n_ctx": self.n_ctx, "n_slots": self.n_slots, "n_spare": self.n_spare,
            "cache_ram_bytes": self.cache_ram_bytes, "not_counted": list(self.not_counted),
        }


def model_memory(entry: ModelEntry) -> ModelMemory:
    """What the model takes: measured once it has loaded, else estimated from its file."""
    engine, cfg = entry.host.engine, entry.host.config.engine
    capacity = engine.info.capacity if engine.info is not None else None
    state = entry.state.value
    if capacity is not None:
        return ModelMemory(
            entry.name, state, MEASURED if entry.state in HELD else LAST_LOAD,
            capacity.held_bytes(), sum(capacity.weights_bytes.values()), sum(capacity.state_bytes().values()),
            sum(capacity.compute_bytes.values()), capacity.context.n_ctx,
            capacity.n_slots, capacity.n_seq - capacity.n_slots, cfg.cache_ram,
            ("embedding contexts",) if capacity.embeddings_bytes else (),
        )
    offloads = cfg.n_gpu_layers != 0 and cfg.placement.offloads and supports_gpu_offload()
    weights, kv, not_counted = estimate(cfg.model_path, cfg.mmproj or "", cfg.n_ctx, cfg.type_k, cfg.type_v, cfg.cache_vram, offloads)
    where = DEVICE if offloads else "CPU"
    return ModelMemory(
        entry.name, state, ESTIMATED, {where: weights + (kv or 0)}, weights, kv, None, cfg.n_ctx or None,
        cfg.n_parallel, None, cfg.cache_ram, not_counted,
    )


@functools.lru_cache(maxsize=256)
def estimate(path: str, mmproj: str, n_ctx: int, type_k: str, type_v: str, cache_vram: int | None = None,
             offloads: bool = False) -> tuple[int, int | None, tuple[str, ...]]:
    """(weights bytes, KV cache bytes or None, what is not counted) of a model not loaded yet,
    from its GGUF files (every part of a split one) and its projector's (pure: files only).
    The KV cache is the slots' `n_ctx` cells, plus `--cache-vram` for spare sequences; spares
    are chosen at load on a GPU without --cache-vram, and on the CPU come out of the prompt
    cache's RAM, which is counted apart (see layout.py)."""
    try:
        meta, tensors = read_header(path)
        weights = sum(tensors.values()) + sum(sum(read_header(p)[1].values()) for p in _other_parts(path))
    except (OSError, NotGGUF, struct.error) as exc:  # a missing, foreign or truncated file: its load says why
        return 0, None, (f"the model file ({exc or type(exc).__name__})",)
    if mmproj:
        weights += os.path.getsize(mmproj) if os.path.isfile(mmproj) else 0
    arch = meta.get("general.architecture", "")
    number = arch_numbers(meta)
    not_counted = ["compute buffers"]
    per_token = kv_bytes_per_token(number, type_k, type_v)
    kv = None
    if any(RECURRENT_KEY.search(key) for key in meta if key.startswith(f"{arch}.")):
        not_counted.append("KV cache and recurrent state (recurrent layers: known once loaded)")
    elif not n_ctx:
        not_counted.append("KV cache (no --ctx-size: the context is chosen at load)")
    elif per_token is None:
        not_counted.append("KV cache (the metadata does not give its size)")
    else:
        kv = per_token * n_ctx + (cache_vram or 0)
        if offloads and cache_vram is None:
            not_counted.append("spare sequences (chosen at load from the free device memory)")
    return weights, kv, tuple(not_counted)


def _other_parts(path: str) -> list[str]:
    """The other files of a split GGUF (`-00001-of-00003.gguf`), none for a whole one."""
    found = re.search(r"-0*1-of-(\d+)\.gguf$", path)
    if not found:
        return []
    stem = path[: found.start()]
    return sorted(p for p in glob.glob(glob.escape(stem) + "-*-of-" + found.group(1) + ".gguf") if p != path)


@dataclass(frozen=True)
class Together:
    """Whether every model fits at once where their memory lives."""

    where: str  # "device memory" or "RAM"
    free_bytes: int  # free there now
    held_bytes: int  # what the loaded models hold there (it comes back when they unload)
    margin_bytes: int  # --fit-target (each device's), plus the prompt caches' budgets in RAM
    need_bytes: int  # every model's memory there, as counted
    at_once: int  # the most models that fit at once, counting the largest first
    models_max: int
    estimated: tuple[str, ...]  # the models whose memory is an estimate
    not_counted: tuple[str, ...]  # what their estimates leave out

    @property
    def room_bytes(self) -> int:
        return max(0, self.free_bytes + self.held_bytes - self.margin_bytes)

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.room_bytes

    def summary(self, n_models: int) -> str:
        room = f"{_gib(self.room_bytes)} of {self.where} is there after the margin" + (
            " and the prompt caches' budgets" if self.where == "RAM" else "")
        if self.fits:
            line = (f"all {n_models} models fit in {self.where} together: they take {_gib(self.need_bytes)}, "
                    f"{room}, {_gib(self.room_bytes - self.need_bytes)} to spare")
            if self.models_max < n_models:
                line += f"; --models-max {self.models_max} has them take turns all the same"
        else:
            line = f"the {n_models} models do not fit in {self.where} together: they take {_gib(self.need_bytes)} and {room}; "
            at_once = "one fits at a time" if self.at_once == 1 else f"any {self.at_once} of them fit at once"
            if self.at_once == 0:
                line += "not even the largest fits alone"
            elif self.models_max <= self.at_once:
                line += f"{at_once}, and --models-max {self.models_max} has them take turns"
            else:
                line += f"{at_once}, but --models-max {self.models_max} lets more load: --models-max {self.at_once} has them take turns"
        if self.estimated:
            line += f" (estimated for {', '.join(self.estimated)}, not counting {', '.join(self.not_counted)})"
        return line

    def to_json(self, n_models: int) -> dict:
        return {
            "where": self.where, "free_bytes": self.free_bytes, "held_bytes": self.held_bytes,
            "margin_bytes": self.margin_bytes, "room_bytes": self.room_bytes, "need_bytes": self.need_bytes,
            "fits": self.fits, "at_once": self.at_once, "models_max": self.models_max,
            "estimated": list(self.estimated), "not_counted": list(self.not_counted), "summary": self.summary(n_models),
        }


def together(models: Models, memories: list[ModelMemory]) -> Together:
    """Whether the models fit together (reads the devices' free memory, or the RAM's)."""
    gpus = gpu_memory()
    on_device = bool(gpus) and any(d != "CPU" for m in memories for d in m.held_bytes)
    margin = max(entry.host.config.engine.fit_target for entry in models.entries.values())

    def there(m: ModelMemory) -> int:
        return sum(n for d, n in m.held_bytes.items() if (d != "CPU") == on_device)

    if on_device:
        where, free, margin = "device memory", sum(d.free for d in gpus), margin * len(gpus)
    else:
        where, free, margin = "RAM", available_ram(), margin + ram_budgets(models)
    held = sum(there(m) for m in memories if m.source == MEASURED and ModelState(m.state) in HELD)
    need = [there(m) for m in memories]
    at_once = most_at_once(need, max(0, free + held - margin))
    estimates = [m for m in memories if m.source == ESTIMATED]
    not_counted = dict.fromkeys(part.split(" (")[0] for m in estimates for part in m.not_counted)
    return Together(where, free, held, margin, sum(need), at_once, models.max_loaded,
                    tuple(m.name for m in estimates), tuple(not_counted))


def ram_budgets(models: Models) -> int:
    """The RAM the models' prompt caches may take: a budget they share counted once."""
    total, pools = 0, {}
    for entry in models.entries.values():
        engine = entry.host.config.engine
        if engine.shared_ram is not None:
            pools[id(engine.shared_ram)] = engine.shared_ram.total
        else:
            total += engine.cache_ram
    return total + sum(pools.values())


def most_at_once(sizes: list[int], room: int) -> int:
    """The most models that fit in `room` at once whichever they are: the largest first (pure)."""
    at_once, taken = 0, 0
    for n in sorted(sizes, reverse=True):
        if taken + n > room:
            break
        taken, at_once = taken + n, at_once + 1
    return at_once


def capacity_view(models: Models) -> dict:
    """The body of GET /models/capacity (reads files and the devices: run it off the loop)."""
    memories = [model_memory(entry) for entry in models.entries.values()]
    answer = together(models, memories)
    return {"object": "list", "data": [m.to_json() for m in memories], "together": answer.to_json(len(memories))}


def table(view: dict) -> str:
    """The view as the lines logged at start-up: a model a line, then whether they fit."""
    lines = []
    width = max(len(m["model"]) for m in view["data"])
    for m in view["data"]:
        where = ", ".join(f"{d} {_gib(n)}" for d, n in sorted(m["held_bytes"].items())) or "none"
        line = f"  {m['model']:<{width}}  {m['state']}, {where} ({m['source']}), RAM cache {_gib(m['cache_ram_bytes'])}"
        if m["not_counted"]:
            line += f"; not counted: {', '.join(m['not_counted'])}"
        lines.append(line)
    return "\n".join([*lines, "  " + view["together"]["summary"]])


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"
