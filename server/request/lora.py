"""LoRA adapters as requests name them: llama-server's `lora` field (per request) and the body
of POST /lora-adapters (the server's default), both a list of `{"id": N, "scale": X}`.

An adapter the list leaves out runs at scale 0, as in llama-server. Where llama-server skips
an entry it cannot read, warmslot answers 400 naming it: a typo in an id would otherwise run
the request on another set of adapters than the client meant, silently.
"""

from __future__ import annotations

import math
from typing import Sequence

from warmslot.slots import AdapterInfo, AdapterSet

from ..errors import InvalidRequest

__all__ = ["adapter_set", "parse_lora"]

MAX_SCALE = 1e6  # beyond any adapter's use; keeps the scales finite in llama.cpp's float32


def parse_lora(value, n_adapters: int, param: str = "lora") -> dict[int, float]:
    """id -> scale from a `lora` list (an id given twice: the last scale). 400 for a list that
    is not one of objects with an integer `id` of a loaded adapter and a number `scale`."""
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be an array of objects with 'id' and 'scale'", param=param)
    out: dict[int, float] = {}
    for k, entry in enumerate(value):
        where = f"{param}[{k}]"
        if not isinstance(entry, dict):
            raise InvalidRequest(f"'{where}' must be an object with 'id' and 'scale'", param=param)
        i, scale = entry.get("id"), entry.get("scale")
        if not isinstance(i, int) or isinstance(i, bool):
            raise InvalidRequest(f"'{where}.id' must be an integer (GET /lora-adapters lists the ids)", param=param)
        if not 0 <= i < n_adapters:
            loaded = f"ids 0 to {n_adapters - 1}" if n_adapters else "none (start the server with --lora)"
            raise InvalidRequest(f"'{where}.id': no LoRA adapter {i}; the loaded adapters are {loaded}", param=param)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or abs(scale) > MAX_SCALE:
            raise InvalidRequest(f"'{where}.scale' must be a finite number", param=param)
        out[i] = float(scale)
    return out


def adapter_set(requested: dict[int, float] | None, defaults: Sequence[float], adapters: Sequence[AdapterInfo]) -> AdapterSet:
    """The set a request runs under: its own `lora`, or the server's default scales where it
    sent none or an empty list (llama-server reads `"lora": []` so too)."""
    scales = requested if requested else dict(enumerate(defaults))
    return AdapterSet.of(scales, adapters)
