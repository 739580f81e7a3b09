"""Prefix reuse decisions: how much of a sequence's memory a new prompt can keep.

This is the one place that decides it. The rule that every prompt gets logits for its last
token is asserted here: either at least one prompt token is evaluated, or the logits of the
prompt's last token are restored from a checkpoint taken at that exact position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from warmslot.cache.checkpoints import Checkpoint, CheckpointList
from warmslot.cache.prefix_trie import common_prefix


@dataclass(frozen=True, slots=True)
class ReusePlan:
    """Applying it: restore `restore` (if any), cut the sequence back to `keep`, then
    evaluate prompt[keep:] (or sample from `logits` when keep == len(prompt))."""

    matched: int  # common prefix of the prompt and the sequence's tokens
    keep: int  # tokens kept in memory; the prompt's [0, keep) is not evaluated
    restore: Checkpoint | None = None
    logits: np.ndarray | None = None
    reason: str = ""  # why keep < matched, in words


def plan_reuse(
    held: Sequence[int],
    checkpoints: CheckpointList,
    prompt: Sequence[int],
    can_cut: Callable[[int], bool],
) -> ReusePlan:
    """Decide how much of a sequence holding `held` a new `prompt` keeps.

    `can_cut(n)` says whether the memory can be cut back to n tokens directly (always on
    attention memory; within the window on SWA; never on recurrent state). Pure: mutates
    nothing.
    """
    matched = common_prefix(held, prompt)
    plan = _plan(held, checkpoints, prompt, matched, can_cut)
    # [prompt logits] every prompt evaluates a token or restores its last token's logits
    assert plan.keep < len(prompt) or (plan.keep == len(prompt) and plan.logits is not None), plan
    assert plan.keep <= matched
    return plan


def _plan(held, checkpoints, prompt, matched, can_cut) -> ReusePlan:
    n = matched
    if n == len(prompt):
        # an exact repeat: reusable whole when the prompt's last logits were kept
        ck = checkpoints.at(n)
        if ck is not None and ck.logits is not None:
            if n == len(held) or can_cut(n):
                return ReusePlan(matched, n, None, ck.logits)
            if ck.data is not None:
                return ReusePlan(matched, n, ck, ck.logits)
        n = len(prompt) - 1
    if n == len(held) or can_cut(n):
        return ReusePlan(matched, n)
    ck = checkpoints.newest_at_or_before(n, with_state=True)
    if ck is not None:
        return ReusePlan(matched, ck.n_tokens, ck, reason=f"restored the checkpoint at token {ck.n_tokens}")
    return ReusePlan(matched, 0, reason=f"no checkpoint at or before token {n}; the memory cannot be cut back")
