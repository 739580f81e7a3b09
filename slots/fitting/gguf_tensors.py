"""The tensor table of a GGUF file (names and sizes) and its scalar metadata, read without
loading the model.

`--fit` needs each layer's bytes before llama.cpp places anything. The header gives each
tensor's offset into the data section; data is stored in offset order, so a tensor's size is
the distance to the next one (alignment padding included, at most 31 bytes each). A server of
several models estimates what a model it has not loaded yet will take from the same table and
the metadata's numbers (`read_header`).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Callable

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"


class NotGGUF(ValueError):
    """The file is not a GGUF file this reader understands."""


def tensor_sizes(path: str | os.PathLike) -> dict[str, int]:
    """{tensor name: bytes} of a GGUF file, in file order. Raises NotGGUF or OSError."""
    return read_header(path)[1]


def read_header(path: str | os.PathLike) -> tuple[dict[str, int | float | bool | str], dict[str, int]]:
    """The scalar metadata ({key: value}; arrays left out) and the tensor table of a GGUF file.
    Raises NotGGUF or OSError."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _read(buf, len(buf))


def _read(buf, file_size: int) -> tuple[dict[str, int | float | bool | str], dict[str, int]]:
    if buf[:4] != b"GGUF":
        raise NotGGUF("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise NotGGUF(f"GGUF version {version} is not supported")
    pos = 24
    meta: dict[str, int | float | bool | str] = {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if kind in _SCALAR_FORMATS:
            (meta[key],) = struct.unpack_from(_SCALAR_FORMATS[kind], buf, pos)
        elif kind == _STRING:
            meta[key] = _string(buf, pos)[0]
        pos = _skip_value(buf, pos, kind)
    alignment = _integer(meta.get(_ALIGNMENT_KEY))
    alignment = alignment if alignment is not None and alignment > 0 else 32
    offsets: list[tuple[int, str]] = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims + 4  # dims, type
        (offset,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        offsets.append((offset, name))
    data_start = (pos + alignment - 1) // alignment * alignment
    ordered = sorted(offsets)
    ends = [o for o, _ in ordered[1:]] + [file_size - data_start]
    sizes = {name: end - offset for (offset, name), end in zip(ordered, ends)}
    return meta, {name: sizes[name] for _, name in offsets}


def arch_numbers(meta: dict[str, int | float | bool | str]) -> Callable[[str], int | None]:
    """`number(key)` over a header's metadata (`read_header`): the integer at
    `{architecture}.{key}`, None when it is absent or not one integer (arrays are left out of
    the metadata), as `kv_bytes_per_token` reads the head counts."""
    arch = meta.get("general.architecture", "")
    return lambda key: _integer(meta.get(f"{arch}.{key}"))


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _string(buf, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    return bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"), pos + n


def _skip_value(buf, pos: int, kind: int) -> int:
    if kind in _SCALARS:
        return pos + _SCALARS[kind]
    if kind == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if kind == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALARS:
            return pos + _SCALARS[item] * count
        for _ in range(count):
            pos = _skip_value(buf, pos, item)
        return pos
    raise NotGGUF(f"unknown GGUF value type {kind}")
