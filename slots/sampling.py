"""What a request asks of its sampler chain (`llama_api.Sampler` builds the chain)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .grammar import GrammarSpec
from .reasoning_budget import ReasoningBudget


@dataclass(frozen=True, slots=True)
class DraftLimits:
    """A request's own speculative-decoding limits (llama-server's `speculative.*` fields);
    None: the server's. They narrow the server's settings: n_max 0 turns drafting off."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: GrammarSpec | None = None
    reasoning_budget: ReasoningBudget | None = None  # force the end of thinking after N tokens
    speculative: DraftLimits | None = None  # None: the server's speculative-decoding settings

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
