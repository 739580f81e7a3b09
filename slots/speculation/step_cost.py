"""What verifying a draft costs, learned from the engine's own steps, and the draft length
that pays best for it (speculative.py)."""

from __future__ import annotations


class StepCost:
    """What verifying a draft costs, learned from the engine's own steps: a step with drafts
    takes (1 + fixed + per_token * drafted) times a step of the same slots without them.
    On 2 CPU cores every drafted token costs about a fifth of a step (a 17-token step took 4
    one-token steps); on an H100 a token costs little, while each step with drafts costs a
    fixed amount more inside llama_decode (scripts/bench_spec.py --verify-cost)."""

    DECAY = 0.97  # the weight of older verify steps in the fit, per step

    def __init__(self) -> None:
        self.plain: dict[int, float] = {}  # decoding slots -> seconds of a step without drafts (moving average)
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, n_slots: int, drafted: int, prefill: bool, seconds: float) -> None:
        if prefill or n_slots == 0:
            return
        if not drafted:
            old = self.plain.get(n_slots)
            self.plain[n_slots] = seconds if old is None else 0.9 * old + 0.1 * seconds
            return
        base = self.plain.get(n_slots)
        if not base:
            return
        x, y, d = float(drafted), seconds / base - 1.0, self.DECAY
        self._n, self._sx, self._sy = d * self._n + 1, d * self._sx + x, d * self._sy + y
        self._sxx, self._sxy = d * self._sxx + x * x, d * self._sxy + x * y

    def model(self) -> tuple[float, float] | None:
        """(fixed, per_token), in steps without drafts; None before three verify steps."""
        if self._n < 3:
            return None
        mx, my = self._sx / self._n, self._sy / self._n
        var = self._sxx / self._n - mx * mx
        if var > 1.0:
            per_token = max(0.0, (self._sxy / self._n - mx * my) / var)
            return max(0.0, my - per_token * mx), per_token
        return 0.0, max(0.0, my / mx)


def best_length(p: float, fixed: float, per_token: float, limit: int) -> int:
    """The draft length that emits the most tokens per unit of step time when each drafted
    token is accepted with probability p while all before it were: (1 + E[accepted]) /
    (1 + fixed + per_token * length); 0 when no length beats not drafting."""
    best, best_rate = 0, 1.0
    expected, run = 0.0, 1.0
    for length in range(1, limit + 1):
        run *= p
        expected += run
        rate = (1.0 + expected) / (1.0 + fixed + per_token * length)
        if rate > best_rate:
            best, best_rate = length, rate
    return best
