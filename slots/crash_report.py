"""What the process was doing when llama.cpp aborted it: the running requests.

The engine's slots are the registry: a request is in its slot from admission until it ends,
so listing the slots costs nothing while the server runs. `report_crashes(engine)` has the
abort handler (`llama_api.abort_hook`) list them when the process dies: each running
request's id (the response ids carry it: `chatcmpl-<id>`, `msg_<id>`, `resp_<id>`), the
route it came through, its slot, its prompt and generated tokens and its sampling settings,
then the ids of the requests waiting for a slot.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from .llama_api.abort_hook import hold_sent_aborts, on_abort

__all__ = ["hold_sent_aborts", "report_crashes", "report_crashes_of", "running_requests"]

if TYPE_CHECKING:
    from .engine import Engine


HEADER = "the process is aborting (SIGABRT); the requests it was running:"


def running_requests(engine: "Engine") -> list[str]:
    """One line per running request, then one for those waiting. Reads only: it runs in a
    signal handler while the engine thread is stopped wherever the abort found it."""
    lines = [HEADER]
    for slot in list(engine.running()):
        active = slot.active
        if active is None:
            continue
        req = active.req
        lines.append(
            f"  request {req.id} via {req.origin or '(no route)'} in slot {slot.id}: {len(req.tokens)} prompt tokens, "
            f"{len(active.generated)} generated; {req.sampling.describe()}"
        )
    if len(lines) == 1:
        lines.append("  none")
    waiting = [req.id for req in list(engine.admission.waiting)]
    if waiting:
        lines.append(f"  waiting for a slot: {', '.join(waiting)}")
    return lines


def report_crashes(engine: "Engine") -> None:
    """Name `engine`'s requests in the log if llama.cpp aborts the process (process-wide)."""
    on_abort(lambda: running_requests(engine))


def report_crashes_of(engines: Callable[[], list["Engine"]]) -> None:
    """Name the requests of each engine `engines()` gives (a server with several models), each
    engine's under its model file, if llama.cpp aborts the process (process-wide)."""

    def report() -> list[str]:
        lines = [HEADER]
        for engine in engines():
            lines.append(f"  {os.path.basename(engine.config.model_path)}:")
            lines += running_requests(engine)[1:]
        return lines

    on_abort(report)
