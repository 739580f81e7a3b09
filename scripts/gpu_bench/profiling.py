"""Sampling warmslot with py-spy during a run, and where its engine thread's time goes.

py-spy writes collapsed stacks (`--format raw`): one line per distinct stack, frames joined by
`;`, the first naming the thread (`thread (TID): NAME`), then a space and the sample count.
It samples every thread, idle ones included (`--idle`), so that the engine thread's samples
add up to its wall-clock time: waiting for work or for the GPU shows up as a function like
any other. `--function` names frames by function rather than line.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ENGINE_THREAD = "warmslot-engine"
_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?::\s*(?P<name>.*))?$")
_LINE_NUMBER = re.compile(r":\d+\)$")


def find_py_spy(*interpreters: str) -> str | None:
    """py-spy on PATH, else beside this interpreter or one of `interpreters` (a virtualenv
    that is not activated, such as the one --python runs warmslot from)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for python in (sys.executable, *interpreters):
        beside = Path(python).parent / "py-spy"
        if beside.is_file():
            return str(beside)
    return None


class Profiler:
    """One `py-spy record` of a process, stopped early (and written) when the run ends first."""

    def __init__(self, binary: str, pid: int, seconds: float, rate: int, out: Path) -> None:
        self.out = out
        self.log = out.with_suffix(".log")
        self.cmd = [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                    "--rate", str(rate), "--format", "raw", "--threads", "--idle", "--function",
                    "--output", str(out)]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """End the recording (SIGINT makes py-spy write what it has) and describe it."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(5)
        info: dict[str, Any] = {"command": self.cmd, "exit_code": rc, "file": str(self.out)}
        log = self.log.read_text(errors="replace") if self.log.is_file() else ""
        if not self.out.is_file():
            info["error"] = "py-spy wrote no profile: " + log[-1500:]
        lagging = [line for line in log.splitlines() if "behind in sampling" in line]
        if lagging:  # py-spy could not keep its rate: the machine was short of CPU
            info["warning"] = lagging[-1].strip()
        return info


def record_profile(pid: int | None, seconds: float, rate: int, out: Path,
                   python: str = "") -> tuple[Profiler | None, dict[str, Any]]:
    """A started Profiler, or None and the reason in the note (py-spy missing, no process)."""
    binary = find_py_spy(*([python] if python else []))
    if binary is None:
        return None, {"skipped": "py-spy is not on PATH (pip install py-spy)"}
    if pid is None:
        return None, {"skipped": "no warmslot process"}
    profiler = Profiler(binary, pid, seconds, rate, out)
    try:
        profiler.start()
    except OSError as exc:
        return None, {"error": f"py-spy did not start: {exc}"}
    return profiler, {}


def stop_profile(profiler: Profiler | None, note: dict[str, Any]) -> dict[str, Any]:
    """End what record_profile started and summarise it; a note of one not started as is."""
    if profiler is None:
        return note
    note = profiler.stop()
    if "error" not in note:
        note["summary"] = summarise_profile_file(Path(note["file"]))
    return note


def function_name(frame: str) -> str:
    """`Engine._run (slots/engine.py:608)` -> `Engine._run (slots/engine.py)`."""
    return _LINE_NUMBER.sub(")", frame.strip())


def parse_collapsed(text: str) -> list[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, samples) per line of py-spy's raw output."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        m = _THREAD.match(frames[0])
        if m:
            thread = m.group("name") or m.group("tid")
            frames = frames[1:]
        else:
            thread = "?"
        stacks.append((thread, [function_name(f) for f in frames], int(count)))
    return stacks


def summarise_profile(text: str, thread: str = ENGINE_THREAD, top: int = 15) -> dict[str, Any]:
    """The `thread`'s samples by function: self (the innermost frame) and cumulative (anywhere
    on the stack, once per sample), as counts and shares of the thread's samples."""
    per_thread: Counter[str] = Counter()
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for name, frames, count in parse_collapsed(text):
        per_thread[name] += count
        if name != thread:
            continue
        total += count
        own[frames[-1] if frames else "(no Python frame)"] += count
        for fn in set(frames):
            cumulative[fn] += count

    def ranked(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": fn, "samples": n, "share": n / total} for fn, n in counter.most_common(top)]

    return {"thread": thread, "samples": total, "threads": dict(per_thread.most_common()),
            "self": ranked(own), "cumulative": ranked(cumulative)}


def summarise_profile_file(path: Path, thread: str = ENGINE_THREAD, top: int = 15) -> dict[str, Any]:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc}"}
    return summarise_profile(text, thread, top)
