"""Which LoRA adapter set a step decodes.

llama.cpp applies adapters to the whole context, so one `llama_decode` carries the
sequences of one adapter set only. With requests under several sets at work, the steps take
turns: each step goes to the set after the previous step's, in the order of each set's
oldest request (the set of the oldest request first), so no set waits more than one step per
other set. Requests under the same set share their steps as they always do.
"""

from __future__ import annotations

from typing import Sequence

from ..adapters.adapter_set import AdapterSet
from ..slot import Slot

__all__ = ["AdapterTurns", "next_turn"]


def next_turn(ready: Sequence[AdapterSet], last: AdapterSet | None) -> AdapterSet | None:
    """The set this step decodes: of the sets with work (`ready`, oldest request's set first,
    each once), the one after `last`, wrapping around; the first when `last` has none. None:
    nothing to decode."""
    assert len(set(ready)) == len(ready), "each set once"
    if not ready:
        return None
    if last in ready:
        return ready[(ready.index(last) + 1) % len(ready)]
    return ready[0]


class AdapterTurns:
    """The turn of each step, remembered from one step to the next. Engine thread only."""

    def __init__(self) -> None:
        self.last: AdapterSet | None = None

    def pick(self, slots: Sequence[Slot]) -> AdapterSet | None:
        """The set of this step among the slots' requests (None: no request runs)."""
        running = sorted((s.active for s in slots if s.active is not None), key=lambda a: a.admitted)
        ready = list(dict.fromkeys(a.req.adapters for a in running))
        chosen = next_turn(ready, self.last)
        if chosen is not None:
            self.last = chosen
        return chosen

    @staticmethod
    def runs(slot: Slot, adapters: AdapterSet) -> bool:
        """Whether the slot may take part in a step of `adapters` (an idle one may: fillers)."""
        return slot.active is None or slot.active.req.adapters == adapters
