"""What a request asks of its sampler chain (`llama_api.Sampler` builds the chain)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..llama_api.grammar import GrammarSpec
from .reasoning_budget import BudgetState, ReasoningBudget


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

    def token_forcer(self) -> BudgetState | None:
        """A fresh reasoning budget for one request's draws (`llama_api.Sampler` asks it)."""
        return BudgetState(self.reasoning_budget) if self.reasoning_budget is not None else None

    def describe(self) -> str:
        """The settings in one line (the crash report names a running request's sampling)."""
        parts = [
            f"temperature={self.temperature:g}", f"top_k={self.top_k}", f"top_p={self.top_p:g}", f"min_p={self.min_p:g}",
            f"seed={self.seed}",
        ]
        if self.repeat_penalty != 1.0 or self.frequency_penalty or self.presence_penalty:
            parts.append(
                f"penalties=repeat {self.repeat_penalty:g} over {self.repeat_last_n}, "
                f"frequency {self.frequency_penalty:g}, presence {self.presence_penalty:g}"
            )
        if self.logit_bias:
            impossible = sum(1 for b in self.logit_bias.values() if b == float("-inf"))
            parts.append(f"logit_bias={len(self.logit_bias)} tokens ({impossible} at -inf)")
        if self.grammar is not None:
            g = self.grammar
            how = f"lazy, triggers {g.trigger_patterns + g.trigger_texts}"[:200] if g.lazy else "from the first token"
            parts.append(f"grammar={len(g.grammar)} chars ({how})")
        if self.reasoning_budget is not None:
            parts.append(f"reasoning_budget={self.reasoning_budget.budget}")
        return " ".join(parts)
