"""What the engine hands back to requests: their events, and the end of a request.

Events are held during a step and handed to each request's sink once per step (`flush`),
so a busy stream costs one thread hop per step rather than one per token. `finish` ends a
request: it fills in the usage, counts the outcome, closes the sampler and frees the slot
at once (the request hears of it at the next `flush`). Engine thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

from ..requests import EngineError, Event, FinishReason, Sink, Usage
from ..reuse.sessions import Sessions
from ..slot import Slot
from ..stats import EngineStats

log = logging.getLogger("warmslot.engine")


class Outbox:
    def __init__(self, stats: EngineStats, on_finish: Callable[[Slot], None] | None = None) -> None:
        self.stats = stats
        self._pending: list[tuple[Sink, list[Event]]] = []  # finished requests' events
        self.on_finish = on_finish  # a request ends well (its slot still holds it)
        self.sessions = Sessions()  # client sessions at work: their requests end here

    def finish(self, slot: Slot, reason: FinishReason, error: EngineError | None = None) -> None:
        """End the slot's request with `reason`, or with `error` when given; frees the slot."""
        active = slot.active
        event = active.event()
        if error is None and reason is not FinishReason.ABORT:
            event.text += active.text.finish()
        now = time.monotonic()
        reuse = active.reuse
        usage = Usage(
            prompt_tokens=len(active.prompt),
            cached_tokens=reuse.cached,
            completion_tokens=len(active.generated),
            source=reuse.source,
            queue_s=active.admitted - active.req.submitted,
            prefill_s=(active.first_token_at or now) - active.admitted,
            decode_s=now - active.first_token_at if active.first_token_at else 0.0,
            ttft_s=(active.first_token_at - active.req.submitted) if active.first_token_at else 0.0,
            draft_tokens=active.n_drafted,
            draft_accepted=active.n_accepted,
            shifted_tokens=reuse.shifted,
        )
        event.usage = usage
        if error is not None:
            event.error = error
            self.stats.requests[error.kind.value] += 1
        else:
            event.finish = reason
            event.stop_sequence = active.text.stopped_by
            self.stats.requests[reason.value] += 1
        self.stats.add_prompt(reuse.source.value, reuse.cached, usage.computed_tokens, reuse.shifted or 0)
        self.stats.generated_tokens += len(active.generated)
        self.stats.max_sequence = max(self.stats.max_sequence, len(active.prompt) + len(active.generated))
        active.sampler.close()
        if self.on_finish is not None and error is None and reason is not FinishReason.ABORT:
            self.on_finish(slot)
        slot.last_used = now
        self.sessions.finished(active.req.scope, active.req.session)
        self._pending.append((active.req.sink, active.events))
        slot.active = None

    def flush(self, slots: Sequence[Slot], *, awaited_only: bool = False) -> None:
        """Hand this step's events to their sinks: one push per request per step.
        `awaited_only`: only what a client waits on (see `_awaited`); the rest stays for the
        next flush."""
        for slot in slots:
            active = slot.active
            if active is not None and active.events and (not awaited_only or _awaited(active)):
                self._pending.append((active.req.sink, active.events))
                active.events = []
        for sink, events in self._pending:
            try:
                sink.push(events)
            except Exception:  # noqa: BLE001 - a broken sink must not stop the engine
                log.exception("a request's sink failed")
        self._pending.clear()


def _awaited(active) -> bool:
    """Whether a request's held events hold what its client waits on: its start, an error,
    or its first tokens (none of its tokens went out yet). A request's end is handed over at
    once anyway (`finish`)."""
    events = active.events
    if any(ev.started or ev.error is not None for ev in events):
        return True
    held = sum(len(ev.tokens) for ev in events)
    return 0 < held and held >= len(active.generated)
