"""How much CPU the benchmark's own processes and everything else use, for CPU benchmarks.

On a shared machine other processes can steal the cores a benchmark relies on (llama.cpp
threads degrade badly when oversubscribed). These helpers measure how much CPU everything
*else* used during a request, and can wait until the machine is quiet before one. Linux only
(/proc); elsewhere they measure nothing and never wait.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_jiffies() -> tuple[int, int] | None:
    """(busy, steal) jiffies summed over all CPUs, from /proc/stat."""
    line = _read_text("/proc/stat").split("\n", 1)[0]
    if not line.startswith("cpu "):
        return None
    v = [int(x) for x in line.split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    return user + nice + system + irq + softirq, steal


def _group_jiffies(pgids: set[int], pids: set[int]) -> int:
    """utime+stime of every process whose process group is in pgids or whose pid is in pids."""
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        text = _read_text(f"/proc/{entry}/stat")
        if not text:
            continue
        # the command name may contain spaces: split after its closing parenthesis
        rest = text[text.rfind(")") + 2:].split()
        try:
            pgrp = int(rest[2])
            utime, stime = int(rest[11]), int(rest[12])
        except (IndexError, ValueError):
            continue
        if pgrp in pgids or int(entry) in pids:
            total += utime + stime
    return total


class CpuMonitor:
    """CPU used by this benchmark (its own process and the servers' process groups) and by the rest.

    `with CpuMonitor(pgids) as m: ...` then `m.result` is a dict with, in CPUs (cores busy on
    average): `ours`, `foreign` (everything else, including the kernel) and `steal` (time the
    hypervisor gave to other guests), over `wall_s` seconds. Linux only; elsewhere result is None.
    """

    def __init__(self, pgids: Iterable[int] = ()) -> None:
        self.pgids = set(pgids)
        self.pids = {os.getpid()}
        self.result: dict[str, float] | None = None
        self._start: tuple | None = None

    def _sample(self) -> tuple | None:
        sysj = _system_jiffies()
        if sysj is None:
            return None
        return time.perf_counter(), sysj[0], sysj[1], _group_jiffies(self.pgids, self.pids)

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float] | None:
        end = self._sample()
        if self._start is None or end is None:
            return None
        wall = end[0] - self._start[0]
        if wall <= 0:
            return None
        busy = (end[1] - self._start[1]) / _CLK_TCK
        steal = (end[2] - self._start[2]) / _CLK_TCK
        ours = (end[3] - self._start[3]) / _CLK_TCK
        self.result = {
            "wall_s": round(wall, 3),
            "ours": round(ours / wall, 3),
            "foreign": round(max(0.0, busy - ours) / wall, 3),
            "steal": round(steal / wall, 3),
        }
        return self.result

    def __enter__(self) -> CpuMonitor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def foreign_load(pgids: Iterable[int] = (), window: float = 1.0) -> float | None:
    """CPUs used by other processes over the next `window` seconds."""
    with CpuMonitor(pgids) as m:
        time.sleep(window)
    return m.result["foreign"] if m.result else None


def wait_for_idle(
    pgids: Iterable[int] = (),
    *,
    threshold: float = 0.15,
    quiet_windows: int = 2,
    window: float = 1.0,
    timeout: float = 900.0,
    log=None,
) -> dict[str, Any]:
    """Block until other processes use less than `threshold` CPUs for `quiet_windows` windows in a row.

    Gives up after `timeout` seconds. Returns {"waited_s", "foreign" (last window), "idle" (bool)}.
    """
    pgids = list(pgids)
    t0 = time.monotonic()
    quiet = 0
    last = None
    announced = False
    while True:
        last = foreign_load(pgids, window)
        if last is None:  # not measurable here
            return {"waited_s": 0.0, "foreign": None, "idle": True}
        quiet = quiet + 1 if last < threshold else 0
        if quiet >= quiet_windows:
            return {"waited_s": round(time.monotonic() - t0, 1), "foreign": last, "idle": True}
        if time.monotonic() - t0 > timeout:
            return {"waited_s": round(time.monotonic() - t0, 1), "foreign": last, "idle": False}
        if log and not announced and quiet == 0:
            log(f"  waiting for other processes to go quiet (they use {last:.2f} CPUs) ...")
            announced = True
