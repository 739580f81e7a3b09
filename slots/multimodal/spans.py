"""An image's place in a prompt: a run of placeholder token ids (see media.py).

The ids are negative, derived from the image's hash, different at every offset: the same
bytes give the same run, so token-prefix matching covers images unchanged.

A token's index in a prompt is its position in the model's memory, except in models with
M-RoPE positions (Qwen2-VL and later, Qwen3.5): there an image's tokens all sit at its first
position (with 2-D offsets of their own) and the image takes max(width, height) positions of
its token grid, fewer than its tokens. `Positions` maps indices to positions for the seq_rm,
seq_cp and decodes that name positions.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from ..llama_api.mtmd import MediaChunk

PLACEHOLDER_RANGE = (1 << 31) - 2  # placeholder ids are -1 .. -(2**31 - 2): int32, never a token


def placeholder_ids(media_id: str, n: int) -> list[int]:
    """The `n` ids an image's chunk stands for in a prompt: a function of its id (a hex hash)
    alone, different at every offset."""
    base = int(media_id[:15], 16)
    return [-(1 + (base + i) % PLACEHOLDER_RANGE) for i in range(n)]


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """One image's run in a prompt: [start, start + chunk.n_tokens)."""

    start: int
    chunk: MediaChunk

    @property
    def end(self) -> int:
        return self.start + self.chunk.n_tokens


class Positions:
    """Token index -> position in the model's memory, for a prompt with these image runs (and
    anything that follows the prompt). The same number, less what the images before the index
    save; an index inside an image maps to the image's first position."""

    __slots__ = ("_starts", "_ends", "_shifts")

    def __init__(self, media: Sequence[MediaSpan] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._shifts: list[int] = []  # positions saved by the runs up to and including this one
        saved = 0
        for span in media:
            if span.chunk.n_pos != span.chunk.n_tokens:
                saved += span.chunk.n_tokens - span.chunk.n_pos
                self._starts.append(span.start)
                self._ends.append(span.end)
                self._shifts.append(saved)

    @property
    def same(self) -> bool:
        """Every position is its token's index (no run of media takes fewer positions)."""
        return not self._ends

    def __call__(self, index: int) -> int:
        if not self._ends:
            return index
        k = bisect.bisect_right(self._ends, index)  # runs that end at or before the index
        before = self._shifts[k - 1] if k else 0
        if k < len(self._starts) and self._starts[k] < index:
            return self._starts[k] - before  # inside a run
        return index - before


SAME_POSITIONS = Positions()


def check_media(tokens: Sequence[int], media: Sequence[MediaSpan], *, has_projector: bool) -> str | None:
    """Why a prompt's media runs are not well formed (None: they are): in order, inside the
    prompt, each holding its placeholder ids, no negative id elsewhere, and text after the
    last one (the prompt's last token gives the logits)."""
    if media and not has_projector:
        return "the prompt has images but no projector is loaded (--mmproj)"
    at = 0
    for span in media:
        if span.start < at or span.end >= len(tokens):
            return "the prompt's image runs overlap or do not end before its last token"
        if any(t >= 0 for t in tokens[span.start : span.end]):
            return "an image run holds token ids"
        if any(t < 0 for t in tokens[at : span.start]):
            return "the prompt has negative token ids outside its images"
        at = span.end
    if any(t < 0 for t in tokens[at:]):
        return "the prompt has negative token ids outside its images"
    return None


def next_media_start(media: Sequence[MediaSpan], n_past: int) -> int | None:
    """The start of the first run at or after `n_past` (where a text chunk must stop)."""
    for span in media:
        if span.start >= n_past:
            return span.start
    return None
