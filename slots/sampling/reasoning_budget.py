"""`--reasoning-budget N`: after N tokens of thinking the end tag is forced, as llama-server
does it.

The budget counts the tokens generated after the start tag (`<think>`, or from the first
token when the prompt already opened the block). When it runs out, the next tokens are the
forced ones (the end tag, `</think>`) whatever the model prefers; after that the reply goes on
freely, and a new start tag gets a new budget. A budget of 0 ends thinking at once. The
state machine works on token ids, so it runs on the engine thread next to the sampler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    start: tuple[int, ...]  # tokens of the start tag
    end: tuple[int, ...]  # tokens of the end tag: a natural end
    forced: tuple[int, ...]  # tokens forced when the budget runs out
    budget: int  # tokens of thinking allowed, 0 or more
    inside: bool = False  # the prompt opened the block: counting starts at the first token

    def __post_init__(self) -> None:
        assert self.budget >= 0 and self.start and self.end and self.forced


class Phase(enum.Enum):
    IDLE = "idle"  # not thinking
    COUNTING = "counting"
    FORCING = "forcing"
    DONE = "done"


class BudgetState:
    """One request's way through its budget: ask `forced_token` before sampling, tell
    `accept` the token that was chosen."""

    def __init__(self, spec: ReasoningBudget) -> None:
        self.spec = spec
        self.recent: list[int] = []
        self.phase = Phase.IDLE
        self.remaining = spec.budget
        self.position = 0
        if spec.inside:
            self._open()

    def forced_token(self) -> int | None:
        return self.spec.forced[self.position] if self.phase is Phase.FORCING else None

    def accept(self, token: int) -> None:
        self.recent = (self.recent + [token])[-max(len(self.spec.start), len(self.spec.end)):]
        if self.phase in (Phase.IDLE, Phase.DONE):
            if self._ends_with(self.spec.start):
                self._open()
        elif self.phase is Phase.COUNTING:
            if self._ends_with(self.spec.end):
                self.phase = Phase.DONE
                return
            self.remaining -= 1
            if self.remaining <= 0:
                self._force()
        else:
            self.position += 1
            if self.position >= len(self.spec.forced):
                self.phase = Phase.DONE
                self.recent = []

    def _open(self) -> None:
        self.remaining = self.spec.budget
        self.recent = []
        if self.remaining <= 0:
            self._force()
        else:
            self.phase = Phase.COUNTING

    def _force(self) -> None:
        self.phase = Phase.FORCING
        self.position = 0

    def _ends_with(self, seq: tuple[int, ...]) -> bool:
        return len(self.recent) >= len(seq) and tuple(self.recent[-len(seq):]) == seq
