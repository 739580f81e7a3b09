"""`--fit` at load time: the engine's settings with what fit.py chose, and the capacity answer.

Runs on the engine thread before the model loads. Only the GGUF header and the vocabulary are
read (llama.cpp's vocab-only load gives the KV size per token); nothing is allocated.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from ..settings import EngineConfig
from .context_size import available_ram
from .fit import FitPlan, FitRequest, Headroom, ModelSizes, fit, headroom
from .gguf_tensors import NotGGUF, arch_numbers, read_header
from ..llama_api import LlamaError, gpu_memory, kv_bytes_per_token, placement

log = logging.getLogger("warmslot.engine")

# device memory the estimate sets aside for compute buffers and the output (logits) buffer
COMPUTE_RESERVE = 512 << 20


class CannotFit(LlamaError):
    """What the user set does not fit the devices, with the margin."""


def fit_settings(cfg: EngineConfig, on_gpu: bool) -> tuple[EngineConfig, FitPlan | None]:
    """`cfg` with the context, expert placement and GPU layers that --fit chose (on a GPU with
    --fit on; else `cfg` itself and None). Raises CannotFit when the values the user set
    cannot fit, naming the numbers."""
    if not cfg.fit or not on_gpu:
        return cfg, None
    devices = _fit_devices(cfg.placement)
    if not devices:
        return cfg, None
    plan = plan_for(cfg, tuple(d.free for d in devices))
    if plan is None:
        return cfg, None
    overrides = cfg.placement.tensor_overrides
    if not plan.fits:
        raise CannotFit(
            f"--fit: the model does not fit {', '.join(d.name for d in devices)} with a margin of "
            f"{cfg.fit_target >> 20} MiB per device: {plan.explain()}. Give a smaller --ctx-size, --cpu-moe or "
            f"--n-cpu-moe N, fewer --n-gpu-layers, or a smaller --fit-target (or --fit off to try anyway)"
        )
    log.info("--fit: %s%s", plan.explain(), f" (chose {'; '.join(plan.changed)})" if plan.changed else "")
    # the context stays 0 here: the loader takes plan.n_ctx and says it came from --fit
    fitted = dataclasses.replace(cfg, n_gpu_layers=plan.n_gpu_layers)
    if not overrides and plan.n_cpu_moe:
        fitted.placement = dataclasses.replace(cfg.placement, tensor_overrides=placement.expert_overrides(plan.n_cpu_moe))
    return fitted, plan


def plan_for(cfg: EngineConfig, free_bytes: tuple[int, ...]) -> FitPlan | None:
    """What --fit chooses for `cfg` on devices with `free_bytes` free; None when the GGUF's
    tensor table or layer count cannot be read (then nothing is adjusted)."""
    try:
        meta, tensors = read_header(cfg.model_path)
    except (OSError, NotGGUF) as exc:
        log.warning("--fit: cannot read the tensor table of %s (%s): nothing is adjusted", cfg.model_path, exc)
        return None
    number = arch_numbers(meta)  # the header's numbers: no vocabulary load
    n_layer, n_ctx_train = number("block_count") or 0, number("context_length") or 0
    per_token = kv_bytes_per_token(number, cfg.type_k, cfg.type_v)
    if not n_layer or not n_ctx_train:
        log.warning("--fit: %s gives no layer count or training context: nothing is adjusted", cfg.model_path)
        return None
    overrides = cfg.placement.tensor_overrides
    request = FitRequest(
        free_bytes=free_bytes, margin_bytes=cfg.fit_target, n_parallel=cfg.n_parallel,
        n_ctx_train=n_ctx_train, kv_bytes_per_token=per_token, n_ctx=cfg.n_ctx, n_ctx_min=cfg.fit_ctx,
        n_gpu_layers=None if cfg.n_gpu_layers_auto else cfg.n_gpu_layers,
        n_cpu_moe=_experts_in_ram(overrides, n_layer) if overrides else None,
        fixed_bytes=COMPUTE_RESERVE + (cfg.cache_vram or 0) + _projector_bytes(cfg),
    )
    return fit(ModelSizes.from_tensors(tensors, n_layer), request)


def _projector_bytes(cfg: EngineConfig) -> int:
    """--mmproj on the GPU: its weights (the file's size) come out of the device budget."""
    if not cfg.mmproj or not cfg.mmproj_offload:
        return 0
    try:
        return os.path.getsize(cfg.mmproj)
    except OSError:
        return 0  # the projector's own load reports the missing file


def _fit_devices(where: placement.Placement) -> list:
    """The GPUs the model is spread over: those of -dev, or with -sm none the --main-gpu."""
    devices = gpu_memory()
    if where.devices is not None:
        devices = [d for d in devices if d.name in where.devices]
    elif where.split_mode == "none":
        devices = devices[where.main_gpu:where.main_gpu + 1]
    return devices


def _experts_in_ram(overrides: tuple[tuple[str, str], ...], n_layer: int) -> int:
    """How many leading layers' experts the user's overrides keep in RAM, as fit.py counts
    them (every layer for --cpu-moe; for other -ot patterns: none is assumed moved)."""
    if (placement.EXPERTS_PATTERN, placement.CPU_BUFFER) in overrides:
        return n_layer
    in_ram = {pattern for pattern, buffer in overrides if buffer == placement.CPU_BUFFER}
    n = 0
    while n < n_layer and placement.expert_overrides(n + 1)[-1][0] in in_ram:  # --n-cpu-moe's pattern of layer n
        n += 1
    return n


def capacity_headroom(cfg: EngineConfig, *, on_device: bool, state_bytes: int, kv_bytes_per_token: int | None,
                      state_bytes_per_slot: int, n_ctx_slot: int, n_ctx_train: int) -> Headroom:
    """The capacity answer for the loaded server: where its sequences' state lives (free
    device memory, else available RAM less the prompt cache's budget), with --fit-target."""
    if on_device:
        free, where = sum(d.free for d in _fit_devices(cfg.placement)), "device memory"
    else:
        free, where = available_ram() - cfg.cache_ram, "RAM"
    return headroom(
        where=where, free_bytes=free, state_bytes=state_bytes, margin_bytes=cfg.fit_target,
        kv_bytes_per_token=kv_bytes_per_token, state_bytes_per_slot=state_bytes_per_slot, n_slots=cfg.n_parallel,
        n_ctx_slot=n_ctx_slot, n_ctx_train=n_ctx_train, cache_ram_bytes=cfg.cache_ram,
    )
