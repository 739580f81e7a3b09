"""OpenAI's prompt-cache hints: `prompt_cache_key` and `prompt_cache_retention`.

- `prompt_cache_key` (a string): requests with the same key prefer the slot that last served
  one of them (within the tenant), so related conversations land where their prefix is.
- `prompt_cache_retention`: whether the conversation may go to the disk tier and for how
  long. `"in-memory"` (or `"in_memory"`): RAM only, never written to disk. `"24h"`, or any
  duration such as `"30m"`, `"7d"`, `"3600s"`: written to disk when it leaves RAM and deleted
  that long after its last use. Absent or null: the server's default, kept on disk until the
  budget needs the room (least recently used first).
"""

from __future__ import annotations

import re

from ..errors import InvalidRequest

MAX_KEY = 1024  # characters of a prompt_cache_key
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_cache_hints(body: dict) -> tuple[str, float | None]:
    """(prompt_cache_key, retention in seconds: 0.0 RAM only, None the server's default).
    Raises InvalidRequest naming the field."""
    key = body.get("prompt_cache_key")
    if key is None:
        key = ""
    if not isinstance(key, str) or len(key) > MAX_KEY:
        raise InvalidRequest(f"'prompt_cache_key' must be a string of at most {MAX_KEY} characters", param="prompt_cache_key")
    return key, parse_retention(body.get("prompt_cache_retention"))


def parse_retention(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("in-memory", "in_memory"):
            return 0.0
        m = _DURATION.match(text)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)) * _UNIT[m.group(2)]
    raise InvalidRequest(
        "'prompt_cache_retention' must be \"in-memory\" or a duration such as \"24h\", \"30m\" or \"7d\"",
        param="prompt_cache_retention",
    )
