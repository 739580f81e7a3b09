"""Streaming detokenization with stop strings.

`TextStream` turns token pieces into text that is safe to send:
- never half a UTF-8 character (incomplete trailing bytes wait for the next piece);
- never the start of a stop string that may still complete (it is held back until decided);
- nothing at or after a stop string once one matched.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""  # decoded text not yet emitted (a possible stop-string prefix)
        self.stopped_by: str | None = None

    def feed(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that can be emitted now."""
        if self.stopped_by is not None:
            return ""
        return self._release(self._held + self._decoder.decode(piece))

    def finish(self) -> str:
        """End of generation: flush held text (an unfinished stop-string prefix is real text)."""
        if self.stopped_by is not None:
            return ""
        pending = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return pending

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
