"""`--fit`: settle what the user left unset so that everything fits the devices with a margin.

llama-server's `--fit on` (its default) adjusts the arguments the user did not give to the
free device memory; `--fit-target` is the margin left free on each device and `--fit-ctx` the
smallest context it may choose. Here the order is fixed and every step is a pure function of
sizes, so it is tested without a GPU (tests/engine/test_fit.py):

1. the context: the training context, else the largest that fits, never below `--fit-ctx`;
2. expert offload: the experts of the first N layers stay in RAM (`--n-cpu-moe N`), the
   smallest N that fits;
3. GPU layers: the fewest layers leave the device (`-ngl`).

A value the user set is never changed; when what the user set cannot fit, `FitPlan.fits` is
False and the server refuses to start with the numbers (`FitPlan.explain`).

Device bytes are estimated from the GGUF's tensor sizes (`ModelSizes`), the KV bytes per token
and a fixed reserve (compute buffers, the projector, device memory for spare sequences).
llama.cpp offloads the last `-ngl` layers, counting the output layer as the last one; its KV
cache lives with its layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .context_size import GRANULE

EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate|gate_up)_exps\.")
LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
INPUT_TENSORS = ("token_embd.", "per_layer_token_embd.")  # llama.cpp keeps the input layer on the CPU


@dataclass(frozen=True, slots=True)
class ModelSizes:
    """Bytes of a model's weights by where llama.cpp may put them."""

    layer_bytes: tuple[int, ...]  # each repeating layer without its experts
    expert_bytes: tuple[int, ...]  # each layer's experts (0 for a dense layer)
    output_bytes: int  # output layer and norm (offloaded with the first GPU layer)
    input_bytes: int  # token embeddings (always on the CPU)

    @property
    def n_layer(self) -> int:
        return len(self.layer_bytes)

    @property
    def is_moe(self) -> bool:
        return any(self.expert_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes) + sum(self.expert_bytes) + self.output_bytes + self.input_bytes

    @classmethod
    def from_tensors(cls, tensors: dict[str, int], n_layer: int) -> "ModelSizes":
        """From {tensor name: bytes} (a GGUF's tensor table)."""
        layers, experts = [0] * n_layer, [0] * n_layer
        output = inputs = 0
        for name, size in tensors.items():
            expert, layer = EXPERT_TENSOR.match(name), LAYER_TENSOR.match(name)
            if expert and int(expert.group(1)) < n_layer:
                experts[int(expert.group(1))] += size
            elif layer and int(layer.group(1)) < n_layer:
                layers[int(layer.group(1))] += size
            elif name.startswith(INPUT_TENSORS):
                inputs += size
            else:
                output += size
        return cls(tuple(layers), tuple(experts), output, inputs)


@dataclass(frozen=True, slots=True)
class FitRequest:
    """What the user set (None or 0: left to --fit) and what the devices offer."""

    free_bytes: tuple[int, ...]  # free memory of each device the model is spread over
    margin_bytes: int  # --fit-target, left free on each device
    n_parallel: int
    n_ctx_train: int
    kv_bytes_per_token: int | None  # all layers; None: unknown (the context is not fitted)
    n_ctx: int = 0  # --ctx-size; 0: --fit chooses
    n_ctx_min: int = 4096  # --fit-ctx
    n_gpu_layers: int | None = None  # -ngl; None: --fit chooses (all, if they fit)
    n_cpu_moe: int | None = None  # --cpu-moe / --n-cpu-moe / -ot; None: --fit chooses
    fixed_bytes: int = 0  # device memory that does not depend on the choices (compute buffers, ...)
    state_bytes_per_slot: int = 0  # recurrent state of one sequence (on the device)

    @property
    def budget_bytes(self) -> int:
        return sum(self.free_bytes) - self.margin_bytes * len(self.free_bytes)


@dataclass(frozen=True, slots=True)
class FitPlan:
    n_ctx: int
    n_cpu_moe: int  # leading layers whose experts stay in RAM
    n_gpu_layers: int  # llama.cpp's count: n_layer + 1 is every layer and the output
    device_bytes: int  # the estimate of what the devices hold with these settings
    budget_bytes: int  # free device memory less the margins
    fits: bool
    changed: tuple[str, ...] = field(default_factory=tuple)  # what --fit chose, in words

    def explain(self) -> str:
        return (f"{_gib(self.device_bytes)} on the devices with a context of {self.n_ctx}, "
                f"the experts of {self.n_cpu_moe} layers in RAM and {self.n_gpu_layers} layers offloaded; "
                f"{_gib(self.budget_bytes)} is free after the margin")

    def to_json(self) -> dict:
        return {"n_ctx": self.n_ctx, "n_cpu_moe": self.n_cpu_moe, "n_gpu_layers": self.n_gpu_layers,
                "device_bytes": self.device_bytes, "budget_bytes": self.budget_bytes, "fits": self.fits,
                "changed": list(self.changed)}


def device_bytes(sizes: ModelSizes, req: FitRequest, n_ctx: int, n_cpu_moe: int, n_gpu_layers: int) -> int:
    """What the devices hold: the offloaded layers (their experts unless kept in RAM), their
    share of the KV cache, the output layer once any layer is offloaded, and the fixed part."""
    n_layer = sizes.n_layer
    first = max(0, n_layer + 1 - n_gpu_layers)  # the first layer on a device (n_layer: the output)
    on_device = range(first, n_layer)
    kv_per_layer = (req.kv_bytes_per_token or 0) * n_ctx / max(1, n_layer)
    total = sum(sizes.layer_bytes[il] + (sizes.expert_bytes[il] if il >= n_cpu_moe else 0) for il in on_device)
    total += kv_per_layer * len(on_device)
    total += req.state_bytes_per_slot * req.n_parallel if len(on_device) else 0
    total += sizes.output_bytes if n_gpu_layers >= 1 else 0
    return int(total + req.fixed_bytes)


def fit(sizes: ModelSizes, req: FitRequest) -> FitPlan:
    """The settings that fit `req.budget_bytes`: the context, then the experts, then the layers."""
    n_layer = sizes.n_layer
    ngl = n_layer + 1 if req.n_gpu_layers is None or req.n_gpu_layers < 0 else min(req.n_gpu_layers, n_layer + 1)
    moe = min(req.n_cpu_moe, n_layer) if req.n_cpu_moe is not None else 0
    budget = req.budget_bytes
    changed: list[str] = []

    def need(ctx: int, moe: int, ngl: int) -> int:
        return device_bytes(sizes, req, ctx, moe, ngl)

    ctx = req.n_ctx or req.n_ctx_train
    if not req.n_ctx and need(ctx, moe, ngl) > budget:
        ctx = _largest_context(sizes, req, moe, ngl, budget)
        changed.append(f"context {ctx} (the model was trained on {req.n_ctx_train})")
    if req.n_cpu_moe is None and sizes.is_moe and need(ctx, moe, ngl) > budget:
        moe = next((n for n in range(n_layer + 1) if need(ctx, n, ngl) <= budget), n_layer)
        changed.append(f"the experts of {moe} of {n_layer} layers in RAM")
    if req.n_gpu_layers is None and need(ctx, moe, ngl) > budget:
        ngl = next((n for n in range(ngl, -1, -1) if need(ctx, moe, n) <= budget), 0)
        changed.append(f"{ngl} of {n_layer + 1} layers on the devices")
    used = need(ctx, moe, ngl)
    return FitPlan(ctx, moe, ngl, used, budget, used <= budget, tuple(changed))


def _largest_context(sizes: ModelSizes, req: FitRequest, moe: int, ngl: int, budget: int) -> int:
    """The largest context of whole granules per slot that fits, not below --fit-ctx nor
    above the training context."""
    floor = min(req.n_ctx_min, req.n_ctx_train)
    if not req.kv_bytes_per_token:
        return floor
    spare = budget - device_bytes(sizes, req, 0, moe, ngl)
    on_device = min(sizes.n_layer, max(0, ngl))
    per_token = req.kv_bytes_per_token * on_device / max(1, sizes.n_layer)
    if per_token <= 0:
        return req.n_ctx_train
    per_slot = int(max(0, spare) / per_token) // req.n_parallel // GRANULE * GRANULE
    return max(floor, min(req.n_ctx_train, per_slot * req.n_parallel))


# -- the capacity answer -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Headroom:
    """What the server can hold where its sequences' state lives, with the margin."""

    where: str  # "device" or "RAM"
    budget_bytes: int  # state memory: free now, plus what the state already holds, less the margin
    margin_bytes: int
    max_ctx_slot: int  # the largest context per slot for this --parallel (capped at the training context)
    max_slots: int  # the most slots at this context per slot
    cache_ram_bytes: int  # what the RAM prompt cache gets

    def describe(self) -> str:
        return (f"up to {self.max_ctx_slot} tokens per slot at this --parallel, or up to {self.max_slots} slots "
                f"at this context, in {_gib(self.budget_bytes)} of {self.where} after a margin of "
                f"{_gib(self.margin_bytes)}; the prompt cache gets {_gib(self.cache_ram_bytes)} of RAM")

    def to_json(self) -> dict:
        return {"where": self.where, "budget_bytes": self.budget_bytes, "margin_bytes": self.margin_bytes,
                "max_ctx_slot": self.max_ctx_slot, "max_slots": self.max_slots, "cache_ram_bytes": self.cache_ram_bytes}


def headroom(*, where: str, free_bytes: int, state_bytes: int, margin_bytes: int, kv_bytes_per_token: int | None,
             state_bytes_per_slot: int, n_slots: int, n_ctx_slot: int, n_ctx_train: int,
             cache_ram_bytes: int) -> Headroom:
    """The largest context per slot for `n_slots` slots and the most slots of `n_ctx_slot`
    tokens that fit `free_bytes + state_bytes - margin_bytes` (`state_bytes`: what the KV
    cache and recurrent state hold now, which a new layout would reuse)."""
    budget = max(0, free_bytes + state_bytes - margin_bytes)
    per_token = kv_bytes_per_token or 0
    per_slot_budget = budget // max(1, n_slots) - state_bytes_per_slot
    if per_token:
        max_ctx = min(n_ctx_train, max(0, per_slot_budget) // per_token // GRANULE * GRANULE)
    else:
        max_ctx = n_ctx_train if per_slot_budget >= 0 else 0
    slot_bytes = n_ctx_slot * per_token + state_bytes_per_slot
    max_slots = budget // slot_bytes if slot_bytes else n_slots
    return Headroom(where, budget, margin_bytes, int(max_ctx), int(max_slots), cache_ram_bytes)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
