"""Log-probabilities of generated tokens.

OpenAI and llama-server report them from the model's own distribution: the softmax of the
logits after the request's logit bias, before temperature, top-k, top-p, min-p and any
grammar. The native sampler chain never exposes that row, so for a request that asks, the
engine copies the row it sampled from (a vocabulary-sized copy per token, only for such
requests) and computes a log-softmax here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and, if asked for, the most likely alternatives."""

    token: int
    logprob: float  # -inf for a token the logit bias banned
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def most_likely(logits: np.ndarray) -> tuple[int, float]:
    """The most likely token of a row of logits and its probability (a drafter's pick)."""
    token = int(np.argmax(logits))
    return token, float(1.0 / np.exp(logits - logits[token]).sum())


def log_softmax(logits: np.ndarray, bias: dict[int, float] | None = None) -> np.ndarray:
    """The log-probabilities of a row of logits with `bias` added (float64: sums over a large
    vocabulary lose digits in float32)."""
    row = logits.astype(np.float64)
    if bias:
        ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        row[ids] += np.fromiter(bias.values(), dtype=np.float64, count=len(bias))
    top = row.max()
    with np.errstate(divide="ignore"):
        return row - (top + np.log(np.exp(row - top).sum()))


def token_logprob(logits: np.ndarray, bias: dict[int, float] | None, token: int, n_top: int) -> TokenLogprob:
    """`token`'s log-probability in the biased distribution of `logits`, with the `n_top` most
    likely tokens (ties broken by token id, so the answer does not depend on the sort)."""
    lp = log_softmax(logits, bias)
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        k = min(n_top, lp.shape[0])
        ids = np.argpartition(-lp, k - 1)[:k]
        ids = sorted(ids.tolist(), key=lambda t: (-lp[t], t))
        top = tuple((int(t), float(lp[t])) for t in ids)
    return TokenLogprob(int(token), float(lp[token]), top)
