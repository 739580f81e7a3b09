"""Streaming detokenization with stop strings.

`TextStream` turns token pieces into text that is safe to send:
- never half a UTF-8 character (incomplete trailing bytes wait for the next piece);
- never the start of a stop string that may still complete (it is held back until decided);
- nothing at or after a stop string once one matched;
- with `n_indent` (llama-server's, for code completion): nothing from the first line after a
  newline that is indented less (`IndentLimit`).
"""

from __future__ import annotations

import codecs
from typing import Sequence


class IndentLimit:
    """llama-server's `n_indent`: every line after the first newline of the reply must start
    with at least `n` spaces or tabs. The first line that does not (a blank line included)
    ends the reply just before its first other character; the first line, which continues
    the line the cursor is on, is never checked."""

    def __init__(self, n: int) -> None:
        assert n > 0
        self.n = n
        self._column: int | None = None  # None: on the first line or on a line that passed; else its indent so far

    def cut(self, text: str) -> int | None:
        """Read the next text of the reply; the offset in it where the reply ends, or None."""
        for i, ch in enumerate(text):
            if self._column is None:
                if ch == "\n":
                    self._column = 0
            elif ch in " \t":
                self._column += 1
                if self._column >= self.n:
                    self._column = None  # indented enough: the rest of the line is free
            else:
                return i  # the line's first other character comes before column n
        return None


class TextStream:
    def __init__(self, stop: Sequence[str] = (), n_indent: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""  # decoded text not yet emitted (a possible stop-string prefix)
        self.stopped_by: str | None = None
        self._indent = IndentLimit(n_indent) if n_indent > 0 else None
        self.cut_by_indent = False  # a line indented less than n_indent ended the text

    @property
    def ended(self) -> bool:
        return self.stopped_by is not None or self.cut_by_indent

    def feed(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that can be emitted now."""
        if self.ended:
            return ""
        return self._limit(self._release(self._held + self._decoder.decode(piece)))

    def finish(self) -> str:
        """End of generation: flush held text (an unfinished stop-string prefix is real text)."""
        if self.ended:
            return ""
        pending = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return self._limit(pending)

    def _limit(self, text: str) -> str:
        """`text` up to where a line indented less than n_indent starts (all of it when none does)."""
        cut = self._indent.cut(text) if self._indent is not None else None
        if cut is None:
            return text
        self.cut_by_indent = True
        self.stopped_by = None  # a stop string found in this text came after the cut
        self._held = ""
        return text[:cut]

    def _release(self, pending: str) -> str:
        if not self._stop:
            self._held = ""
            return pending
        cut = self._first_stop(pending)
        if cut is not None:
            index, stop = cut
            self.stopped_by = stop
            self._held = ""
            out = pending[:index]
            return out
        keep = self._partial_stop_suffix(pending)
        out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        return out

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            i = text.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        return best

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
