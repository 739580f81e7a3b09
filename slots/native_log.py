"""llama.cpp's log, as lines of Python logging."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

_native_log = logging.getLogger("llama.cpp")

# ggml log levels: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the last line
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class NativeLog:
    """Joins llama.cpp's log fragments into lines and forwards them to Python logging."""

    def __init__(self) -> None:
        self.level = logging.INFO
        self.parts: list[str] = []
        self.lock = threading.Lock()
        self.local = threading.local()  # `lines`: what a `tap` on this thread collects

    @contextlib.contextmanager
    def tap(self) -> Iterator[list[str]]:
        """Collect the lines llama.cpp logs on this thread inside the block, whatever their level
        and the Python log level (llama.cpp reports the buffers it allocates only in its log)."""
        outer = getattr(self.local, "lines", None)
        lines: list[str] = []
        self.local.lines = lines
        try:
            yield lines
        finally:
            self.local.lines = outer

    def write(self, level: int, text: str) -> None:
        with self.lock:
            if level != 5:
                self.level = _LEVELS.get(level, logging.INFO)
            self.parts.append(text)
            if not text.endswith("\n"):
                return
            line = "".join(self.parts).rstrip("\n")
            self.parts.clear()
        tapped = getattr(self.local, "lines", None)
        if line and tapped is not None:
            tapped.append(line)
        if line and _native_log.isEnabledFor(self.level):
            _native_log.log(self.level, "%s", line)
