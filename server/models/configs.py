"""Each model's config: the server's command line with the model's own flags after it, parsed
by the same parser (so a model takes any flag a single-model server takes), then the model's
part of it (`MODEL_FIELDS`) over the server's config."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

from warmslot.cache.shared_budget import SharedBudget

from ..process.config import ServerConfig, parse_config
from ..process.flags import FLAGS
from .catalog import CatalogError, ModelSpec, read_models_dir, read_models_file

# the fields of ServerConfig a model's flags may set: the rest is the whole server's
MODEL_FIELDS = (
    "engine", "alias", "aliases", "chat_template", "chat_template_kwargs", "n_predict", "sampling", "tool_format",
    "reasoning_format", "reasoning_default", "reasoning_budget", "tags", "max_n",
)


def read_catalog(config: ServerConfig) -> list[ModelSpec]:
    """The models of --models-dir and --models-file. Raises CatalogError."""
    specs = read_models_dir(config.models_dir) if config.models_dir else []
    if config.models_file:
        specs = read_models_file(config.models_file, specs)
    if not specs:
        raise CatalogError(f"no model found in {config.models_dir or config.models_file}")
    if config.models_default and config.models_default not in {spec.name for spec in specs}:
        raise CatalogError(f"--models-default: no model named {config.models_default!r}")
    return specs


def model_configs(config: ServerConfig, argv: list[str]) -> list[tuple[ModelSpec, ServerConfig]]:
    """Each model of the catalog with its config (`argv`: the server's command line). Raises
    CatalogError naming the model whose flags do not parse."""
    out = []
    specs = read_catalog(config)
    # the server's --cache-ram and --cache-disk-size are one budget each for the models that keep them
    pool = SharedBudget(config.engine.cache_ram) if config.engine.cache_ram > 0 else None
    disk_pool = SharedBudget(config.engine.cache_disk_size) if config.engine.cache_disk else None
    for spec in specs:
        _check_fields(spec)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                own, _ = parse_config([*argv, "-m", spec.path, *spec.args])
        except SystemExit:
            reason = err.getvalue().strip().splitlines()[-1:] or ["refused"]
            raise CatalogError(f"model {spec.name}: {reason[0]}") from None
        out.append((spec, _model_config(config, spec, own, len(specs), pool, disk_pool)))
    return out


def _check_fields(spec: ModelSpec) -> None:
    by_name = {n: flag for flag in FLAGS for n in flag.names}
    for arg in spec.args:
        flag = by_name.get(arg)
        field = flag.field if flag is not None else None
        if flag is not None and field is not None and field.split(".")[0] not in MODEL_FIELDS:
            raise CatalogError(f"model {spec.name}: {arg} is set for the whole server, not per model")


def _sets(spec: ModelSpec, dest: str) -> bool:
    """Whether the model's own flags give `dest` (the server's command line and environment
    give every model the same)."""
    names = next(flag.names for flag in FLAGS if flag.dest == dest)
    return any(arg.split("=", 1)[0] in names for arg in spec.args)


def _model_config(config: ServerConfig, spec: ModelSpec, own: ServerConfig, n_models: int, ram: SharedBudget | None,
                  disk: SharedBudget | None) -> ServerConfig:
    """`own`'s model fields over the server's config: named by the spec, its other names as
    patterns, its disk tier in a folder of its own, the server's RAM and disk budgets shared
    with the other models that keep them (a model given a size of its own has its own), the
    device memory of automatic spare sequences shared out among the models (each model's
    caches stay while it is unloaded), unloaded by the registry (no sleep)."""
    spec.patterns = [name for name in own.aliases if name != spec.name]
    engine = own.engine
    if engine.cache_disk and engine.cache_disk == config.engine.cache_disk:
        engine = dataclasses.replace(engine, cache_disk=os.path.join(engine.cache_disk, spec.name))
        # NOTE: decided by whether the model's own flags set a size, not by comparing sizes: an
        # automatic size is read from the free space (and memory) at each parse, which moves
        if disk is not None and not _sets(spec, "cache_disk_size"):
            engine = dataclasses.replace(engine, shared_disk=disk, cache_disk_size=config.engine.cache_disk_size)
    if ram is not None and not _sets(spec, "cache_ram"):
        engine = dataclasses.replace(engine, shared_ram=ram, cache_ram=config.engine.cache_ram)
    if engine.cache_vram is None:  # the first model loaded must not take the device memory of the others
        engine = dataclasses.replace(engine, spare_share=n_models)
    # pinning stalls every model's CUDA calls: with several, only on demand and while all are idle
    engine = dataclasses.replace(engine, pinned_at_load=0)
    if spec.keep_alive is None:
        spec.keep_alive = config.sleep_idle_s if config.sleep_idle_s > 0 else float("inf")
    fields = {name: getattr(own, name) for name in MODEL_FIELDS}
    fields.update(engine=engine, alias=spec.name, aliases=[spec.name, *spec.patterns], sleep_idle_s=-1.0)
    return dataclasses.replace(config, **fields)
