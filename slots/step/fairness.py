"""Sharing one KV pool between the slots that run requests.

With a stream per slot (attention and sliding-window models with several slots), each slot
owns `--ctx-size / --parallel` cells and no request can take another's. In one unified pool
(recurrent and hybrid models, `-kvu`, or one slot) a request may grow past its fair share,
`--ctx-size / --parallel` cells, while no one else needs them. When a batch does not fit the
pool and nothing idle is left to move out, the generation holding the most cells beyond its
share ends with finish_reason "length" (it keeps all it generated) before a newer request
would fail.

NOTE: pausing that generation (saving its state, resuming it when cells free up) would keep
its output going, but a resumed request needs its sampler, grammar and stop-string state
kept outside a slot and a second admission path; ending it is a bound that is simple to
state and to test. A prompt larger than the share is not cut: it was admitted knowing its
size, and ending it would waste all its prefill.
"""

from __future__ import annotations

from typing import Sequence

from ..slot import Slot


def fair_share(n_cells: int, n_slots: int) -> int:
    return n_cells // max(1, n_slots)


def longest_over_share(slots: Sequence[Slot], n_cells: int, n_slots: int) -> Slot | None:
    """The generating slot that holds the most cells beyond its fair share, if any."""
    share = fair_share(n_cells, n_slots)
    over = [s for s in slots if s.active is not None and s.active.prefill_done and s.n_past > share]
    return max(over, key=lambda s: s.n_past, default=None)
