"""A stall monitor for a warmslot server under a benchmark: put this folder first on
PYTHONPATH and name a file in $GCMON, and every `python -m warmslot.server` started then
appends to it each wait of over 80 ms of a thread that wakes every 10 ms (it needs the GIL,
so a thread that holds the GIL, or waits for the process's memory map while holding it,
shows here) and each garbage collection of over 10 ms. Other processes are left alone."""

import gc
import os
import sys
import threading
import time

if os.environ.get("GCMON") and "warmslot.server" in " ".join(sys.orig_argv):
    _out = open(os.environ["GCMON"], "a", buffering=1)
    _out.write(f"{time.time():.3f} pid {os.getpid()} start\n")
    _started = [0.0]

    def _collected(phase: str, info: dict) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        took = time.perf_counter() - _started[0]
        if took > 0.01:
            _out.write(f"{time.time():.3f} pid {os.getpid()} gc gen{info['generation']} {took * 1000:.1f} ms\n")

    def _watch() -> None:
        last = time.perf_counter()
        while True:
            time.sleep(0.01)
            now = time.perf_counter()
            if now - last > 0.08:
                _out.write(f"{time.time():.3f} pid {os.getpid()} stall {1000 * (now - last):.0f} ms\n")
            last = now

    gc.callbacks.append(_collected)
    threading.Thread(target=_watch, name="stall-monitor", daemon=True).start()
