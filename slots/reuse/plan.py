"""Prefix reuse decisions: how much of a sequence's memory a new prompt can keep.

This is the one place that decides it. The rule that every prompt gets logits for its last
token is asserted here: either at least one prompt token is evaluated, or the logits of the
prompt's last token are restored from a checkpoint taken at that exact position.
"""

from __future__ import annotations

import dataclasses
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
    # --cache-reuse: chunks of the sequence after `keep` moved to follow it (plan_shifts);
    # the prompt's [keep, keep + shifted) is then not evaluated either
    shifts: tuple["ChunkMove", ...] = ()

    @property
    def shifted(self) -> int:
        """Prompt tokens that shifted chunks give (approximate: see plan_shifts)."""
        return sum(m.n for m in self.shifts)

    @property
    def kept(self) -> int:
        """Prompt tokens not evaluated: the exact prefix and the shifted chunks."""
        return self.keep + self.shifted


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


@dataclass(frozen=True, slots=True)
class ChunkMove:
    """`n` tokens of a sequence at [src, src + n) move to [dst, dst + n), dst < src: the
    cells between are removed and the chunk's positions shift by dst - src."""

    src: int
    dst: int
    n: int

    def __post_init__(self) -> None:
        assert 0 <= self.dst < self.src and self.n > 0, self


def plan_shifts(held: Sequence[int], prompt: Sequence[int], start: int, min_chunk: int) -> tuple[ChunkMove, ...]:
    """--cache-reuse: the chunks of `held` after `start` that the prompt repeats further on,
    each at least `min_chunk` tokens, moved to where the prompt has them.

    Both lists are equal up to `start` (the exact prefix kept). From there, the prompt's next
    token is looked for in `held`; a run of at least `min_chunk` equal tokens is a chunk, kept
    where it lands, and the search goes on after it in both; a shorter run is passed over.
    So a chunk only ever moves towards the start, and what is kept stays one prefix of the
    prompt (llama.cpp's memory holds no holes for a prefill to fill):

        held    [0, start) | gap | [src, src + n) chunk | ...
        prompt  [0, start) | [dst = start, dst + n) chunk | ...

    The prompt's last token is never taken (every prompt evaluates one). Pure: mutates
    nothing. The KV of a moved chunk was computed after other tokens than the prompt has
    before it: reusing it is an approximation (docs/reuse.md)."""
    held = held if isinstance(held, list) else list(held)
    prompt = prompt if isinstance(prompt, list) else list(prompt)
    assert min_chunk > 0 and common_prefix(held, prompt) == start < len(prompt)
    moves: list[ChunkMove] = []
    c, p, end = start, start, len(prompt) - 1  # c in held, p in the prompt; prompt[end] is evaluated
    while c < len(held) and p + min_chunk <= end:
        try:
            c = held.index(prompt[p], c)
        except ValueError:
            break
        if held[c : c + min_chunk] != prompt[p : p + min_chunk]:
            c += 1
            continue
        assert c > p  # start ends the common prefix, and c - p only grows
        n = min_chunk + common_prefix(held[c + min_chunk : c + end - p], prompt[p + min_chunk : end])
        moves.append(ChunkMove(c, p, n))
        c, p = c + n, p + n
    assert sum(m.n for m in moves) <= end - start
    return tuple(moves)


def with_shifts(plan: ReusePlan, held: Sequence[int], prompt: Sequence[int], min_chunk: int) -> ReusePlan:
    """`plan` with --cache-reuse's chunk moves after its exact prefix (`plan_shifts`), where
    it keeps the whole common prefix and nothing else: no checkpoint restored, no logits
    reused (0 `min_chunk`: off). Pure."""
    if min_chunk <= 0 or plan.restore is not None or plan.logits is not None or plan.keep != plan.matched:
        return plan
    shifts = plan_shifts(held, prompt, plan.keep, min_chunk)
    return dataclasses.replace(plan, shifts=shifts) if shifts else plan
