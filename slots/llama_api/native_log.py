"""llama.cpp's log, as lines of Python logging."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from typing import Iterator

_native_log = logging.getLogger("llama.cpp")

# "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB", "llama_kv_cache: CUDA0 KV buffer
# size = ...", "sched_reserve: CPU compute buffer size = ...": what llama.cpp allocated, per buffer
_BUFFER_RE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
# "tensor blk.0.ffn_up_exps.weight (96 MiB q4_0) buffer type overridden to CPU": a tensor that
# -ot, --cpu-moe or --n-cpu-moe placed (llama.cpp says so at debug level only)
_OVERRIDE_RE = re.compile(r"tensor \S+ \((\d+) MiB [^)]*\) buffer type overridden to (\S+)")
_recording = threading.local()


@contextlib.contextmanager
def record_buffers() -> Iterator[list[tuple[str, str, int]]]:
    """Collect the (kind, buffer, bytes) lines llama.cpp logs while this thread loads a model
    or makes a context (kind "override": one tensor an override placed, its MiB rounded down). NOTE: llama.cpp has no API that tells how much memory each device
    holds; its log says it for every buffer, whatever the log level."""
    found: list[tuple[str, str, int]] = []
    _recording.found = found
    try:
        yield found
    finally:
        _recording.found = None

# ggml log levels: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the last line
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class NativeLog:
    """Joins llama.cpp's log fragments into lines and forwards them to Python logging."""

    def __init__(self) -> None:
        self.level = logging.INFO
        self.parts: list[str] = []
        self.lock = threading.Lock()

    def write(self, level: int, text: str) -> None:
        with self.lock:
            if level != 5:
                self.level = _LEVELS.get(level, logging.INFO)
            self.parts.append(text)
            if not text.endswith("\n"):
                return
            line = "".join(self.parts).rstrip("\n")
            self.parts.clear()
        found = getattr(_recording, "found", None)
        if found is not None and "buffer size" in line:
            match = _BUFFER_RE.search(line)
            if match:
                found.append((match.group(2), match.group(1), int(float(match.group(3)) * (1 << 20))))
        elif found is not None and "overridden to" in line:
            match = _OVERRIDE_RE.search(line)
            if match:
                found.append(("override", match.group(2), int(match.group(1)) << 20))
        if line and _native_log.isEnabledFor(self.level):
            _native_log.log(self.level, "%s", line)
