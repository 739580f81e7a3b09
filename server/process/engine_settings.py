"""The engine's settings from the parsed flags: EngineConfig, with the model's placement over
devices and speculative decoding. The flags that set an engine field as they are come from the
table (flags.py, `sets="engine..."`); what is computed from the flags is here."""

from __future__ import annotations

import argparse
import os

from warmslot.slots import EngineConfig, SpecConfig, placement

from .flag_parser import copied
from .flag_values import AutoSize


def engine_config(a: argparse.Namespace, disk_size: int, parser: argparse.ArgumentParser) -> EngineConfig:
    """The engine's settings (refused with the flag's name where they do not go together)."""
    return EngineConfig(
        model_path=a.model or "",
        n_gpu_layers=-1 if a.n_gpu_layers is None else a.n_gpu_layers,
        n_gpu_layers_auto=a.n_gpu_layers is None,
        fit=a.fit == "on",
        fit_target=a.fit_target << 20,
        ctx_checkpoints=max(1, a.ctx_checkpoints),
        park_idle=not a.no_park_idle,
        cache_segments=not a.no_cache_segments,
        cache_ram_auto=isinstance(a.cache_ram, AutoSize),
        use_mmap=not a.no_mmap,
        repack=True if a.repack and not a.no_repack else None,
        cache_disk_size=disk_size,
        placement=placement_of(a),
        mmproj_offload=not a.no_mmproj_offload,
        spec=spec_config(a, parser),
        lora=lora_adapters(a, parser),
        **copied(a, "engine"),
    )


def lora_adapters(a: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[tuple[str, float], ...]:
    """--lora's adapters (scale 1), then --lora-scaled's, each file checked; every scale 0 with
    --lora-init-without-apply."""
    adapters = [pair for group in (*(a.lora or ()), *(a.lora_scaled or ())) for pair in group]
    for path, _ in adapters:
        if not os.path.isfile(path):
            parser.error(f"--lora: no such file: {path}")
    if a.lora_init_without_apply:
        adapters = [(path, 0.0) for path, _ in adapters]
    return tuple(adapters)


def placement_of(a: argparse.Namespace) -> placement.Placement:
    return placement.Placement(
        split_mode=a.split_mode, main_gpu=a.main_gpu, tensor_split=a.tensor_split or (), devices=a.device,
        rpc_servers=a.rpc or (), tensor_overrides=tensor_overrides_of(a),
    )


def tensor_overrides_of(a: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """-ot's overrides in the order given, then --cpu-moe's, then --n-cpu-moe's."""
    out = [pair for group in a.override_tensor or () for pair in group]
    if a.cpu_moe:
        out += placement.expert_overrides(None)
    if a.n_cpu_moe > 0:
        out += placement.expert_overrides(a.n_cpu_moe)
    return tuple(out)


def spec_config(a: argparse.Namespace, parser: argparse.ArgumentParser) -> SpecConfig:
    """Speculative decoding from its flags (refused with llama-server's names when out of range)."""
    kind = a.spec_type
    if kind == "draft-simple":
        kind = "draft"  # llama-server's name for a standalone draft model
    if a.model_draft and kind == "none":
        kind = "draft"  # -md alone turns it on, as in llama-server
    if a.model_draft and kind != "draft":
        parser.error(f"--spec-type {kind} drafts without a model: give it or -md, not both")
    if kind == "draft" and not a.model_draft:
        parser.error("--spec-type draft needs a draft model (-md)")
    if a.model_draft and not os.path.isfile(a.model_draft):
        parser.error(f"-md: no such file: {a.model_draft}")
    try:
        return SpecConfig(
            type=kind, draft_model=a.model_draft or None,
            draft_devices=a.device_draft if a.device_draft is not None else a.device,
            **copied(a, "engine.spec"),
        )
    except ValueError as exc:
        parser.error(str(exc))
