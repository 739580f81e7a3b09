"""What the engine knows about demand, for those that weigh what to keep: the router and the
prefixes (which idle slot gives up its contents), and the prompt cache (which entry goes).

One object answers (the engine's, `warmslot.slots.engine.demand.EngineDemand`), given to
each of them when it is built. Its answers are read on the engine thread, between or inside
steps; `later` may be called from any thread.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, Sequence

__all__ = ["Demand"]


class Demand(Protocol):
    def waiting(self) -> Sequence[Any]:
        """The requests waiting for a slot, next first (`warmslot.slots.requests.GenerateRequest`)."""

    def upcoming(self) -> Iterable[tuple[str, Sequence[int]]]:
        """The prompts (tenant, tokens) of the requests waiting for a slot, next first."""

    def sessions(self) -> Iterable[tuple[str, str]]:
        """The client sessions (tenant, session) at work: a request of theirs runs or ended a
        moment ago (warmslot.slots.reuse.sessions)."""

    def waiting_sessions(self) -> Iterable[tuple[str, str]]:
        """The client sessions (tenant, session) of the requests waiting for a slot, next first."""

    def on_device(self) -> Iterable[tuple[str, Sequence[int]]]:
        """What the device's sequences hold (tenant, tokens), those that hold anything."""

    def later(self, fn: Callable[[], None]) -> None:
        """Any thread: run fn on the engine thread between steps (a prompt cache whose shared
        budget shrank gives entries back there)."""
