"""How a flag's text becomes its value where a plain int or float does not say it: sizes in
llama-server's units (a bare number is MiB), `auto`, and the device placement lists."""

from __future__ import annotations

import argparse
import os
import re

from warmslot.slots import physical_memory, placement

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
SIZE_HELP = "a bare number is MiB, as in llama-server (8192: 8 GiB); or give a unit: 8GiB, 512MiB, 2G, 4096B"
DISK_AUTO_MAX = 64 << 30


class AutoSize(int):
    """A size that 'auto' chose (an int; the capacity table says it was automatic)."""


def parse_size(text: str) -> int:
    """Bytes from a size flag. A bare number is MiB, as llama-server reads --cache-ram
    ('8192': 8 GiB); a unit makes it explicit: '8GiB', '512MiB', '2G', '4096B' (K/M/G/T are
    powers of 1024, B is bytes). 'auto' (for --cache-ram): a quarter of the physical memory,
    at most 32 GiB, at least 1 GiB."""
    if str(text).strip().lower() == "auto":
        return AutoSize(max(1 << 30, min(32 << 30, physical_memory() // 4)))
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} ({SIZE_HELP})")
    value, unit, suffix = float(m.group(1)), m.group(2).lower(), m.group(3)
    if not unit and not suffix:
        unit = "m"  # NOTE: llama-server's size flags take MiB
    return int(value * (1024 ** " kmgt".index(unit or " ")))


def parse_vram(text: str) -> int | None:
    """--cache-vram: a size, or 'auto' (None: the engine decides from free device memory)."""
    return None if str(text).strip().lower() == "auto" else parse_size(text)


def parse_disk_size(text: str, directory: str | None) -> int:
    """--cache-disk-size: a size in --cache-ram's units, or 'auto': half of the space free on
    the directory's file system now, at most 64 GiB."""
    if str(text).strip().lower() != "auto":
        return parse_size(text)
    probe = os.path.abspath(directory or ".")
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return max(1 << 20, min(DISK_AUTO_MAX, st.f_bavail * st.f_frsize // 2))


def _argument(parse):
    """An argparse type from a parser that raises ValueError, keeping its message."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


parse_tensor_split = _argument(placement.parse_tensor_split)
parse_device_names = _argument(placement.parse_device_names)
parse_rpc_servers = _argument(placement.parse_rpc_servers)
parse_tensor_overrides = _argument(placement.parse_tensor_overrides)


def _lora_files(text: str) -> tuple[tuple[str, float], ...]:
    """--lora: comma-separated adapter files, each at scale 1."""
    paths = [p.strip() for p in str(text).split(",") if p.strip()]
    if not paths:
        raise ValueError("--lora needs an adapter file")
    return tuple((path, 1.0) for path in paths)


def _lora_scaled(text: str) -> tuple[tuple[str, float], ...]:
    """--lora-scaled: FNAME:SCALE, comma-separated, as llama-server writes it."""
    out = []
    for item in (i.strip() for i in str(text).split(",") if i.strip()):
        path, sep, scale = item.rpartition(":")
        try:
            value = float(scale)
        except ValueError:
            value = None
        if not sep or not path or value is None:
            raise ValueError(f"--lora-scaled takes FNAME:SCALE (e.g. adapter.gguf:0.5), not {item!r}")
        out.append((path, value))
    if not out:
        raise ValueError("--lora-scaled needs FNAME:SCALE")
    return tuple(out)


parse_lora_files = _argument(_lora_files)
parse_lora_scaled = _argument(_lora_scaled)
