"""Images (and audio clips: all said of images here holds for them) in a prompt, and how
their prefixes are reused.

A prompt with images is still a list of token ids: each image's chunk stands in it as a run
of placeholder ids derived from the image's hash (`placeholder_ids`), as many as the
embeddings it decodes into. The same bytes give the same run, so the slots, the trie and the
RAM and disk tiers match prefixes through images without knowing about them, and a reused
run is never encoded again. The ids are negative, so they never meet a real token.

When a slot's prefill reaches a run, `MediaPrefill` (called once per step, before the batch
is planned) encodes the image, or takes its embeddings from a small cache of recent
encodes, and decodes them into the slot's sequence in one go; the scheduler's text chunks
stop at a run's start. Engine thread only.
"""

from __future__ import annotations

import collections
import logging
from typing import Sequence

import numpy as np

from ..llama_api import Context, LlamaError
from ..llama_api.mtmd import Projector
from ..multimodal.spans import MediaSpan
from ..reuse.memory import SlotMemory
from .outbox import Outbox
from ..requests import EngineError, ErrorKind, FinishReason
from ..slot import Slot
from ..stats import EngineStats

log = logging.getLogger("warmslot.engine")

class EmbeddingCache:
    """The embeddings of recent encodes by image id, LRU, at most `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._entries: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    def get(self, media_id: str) -> np.ndarray | None:
        """The embeddings, marked most recently used; None when absent."""
        embd = self._entries.get(media_id)
        if embd is not None:
            self._entries.move_to_end(media_id)
        return embd

    def put(self, media_id: str, embd: np.ndarray) -> None:
        """Keep `embd` (evicting the least recently used); one larger than the limit is not kept."""
        if embd.nbytes > self.limit or media_id in self._entries:
            return
        self._entries[media_id] = embd
        self.bytes += embd.nbytes
        while self.bytes > self.limit:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
        assert self.bytes == sum(e.nbytes for e in self._entries.values())


class MediaPrefill:
    def __init__(
        self, projector: Projector, ctx: Context, memory: SlotMemory, outbox: Outbox, stats: EngineStats,
        *, truncatable: bool, cache_bytes: int = 64 << 20,
    ) -> None:
        self.projector = projector
        self._ctx = ctx
        self._memory = memory
        self._outbox = outbox
        self._stats = stats
        self._truncatable = truncatable
        self.embeddings = EmbeddingCache(cache_bytes)

    def run(self, slots: Sequence[Slot]) -> list[tuple[Slot, int]]:
        """Decode the runs that prefilling slots have reached. Returns the (slot, position)
        pairs where a run ended at a checkpoint position, for the caller to checkpoint."""
        due: list[tuple[Slot, int]] = []
        for slot in slots:
            active = slot.active
            while active is not None and not active.prefill_done and active.req.media:
                try:
                    span = self._span_at(slot)
                    if span is None:
                        break
                    self._prefill(slot, span)
                except LlamaError as exc:
                    log.error("slot %d: %s", slot.id, exc)
                    self._outbox.finish(slot, FinishReason.STOP, EngineError(ErrorKind.INTERNAL, str(exc)))
                    self._memory.clear(slot)
                    break
                cuts = active.cuts
                if cuts and cuts[0] == slot.n_past:
                    due.append((slot, slot.n_past))
                while cuts and cuts[0] <= slot.n_past:
                    cuts.pop(0)  # positions inside the run: it is decoded whole
        return due

    def _span_at(self, slot: Slot) -> MediaSpan | None:
        """The run the slot's prefill is at; a slot whose memory ends inside a run (never
        expected: runs are decoded whole) is cut back to the run's start."""
        n = slot.n_past
        for span in slot.active.req.media:
            if span.start == n:
                return span
            if span.start < n < span.end:
                if not self._truncatable:
                    raise LlamaError("the slot's memory ends inside an image and cannot be cut back")
                self._ctx.seq_rm(slot.id, slot.pos(span.start), -1)
                del slot.tokens[span.start :]
                return span
        return None

    def _prefill(self, slot: Slot, span: MediaSpan) -> None:
        chunk = span.chunk
        embd = self.embeddings.get(chunk.media_id)
        if embd is None:
            embd = self.projector.encode(chunk)
            self._stats.media_encodes += 1
            self.embeddings.put(chunk.media_id, embd)
        else:
            self._stats.media_embeddings_reused += 1
        end = self.projector.decode(self._ctx, chunk, embd, slot.pos(slot.n_past), slot.id)
        if end != slot.pos(span.end):
            raise LlamaError(f"libmtmd ended the image at position {end}, where the prompt's positions put {slot.pos(span.end)}")
        slot.tokens.extend(slot.active.prompt[span.start : span.end])
        slot.active.report_progress(slot.n_past)
        self._stats.media_tokens += chunk.n_tokens
        log.debug("slot %d: image %s decoded at [%d, %d)", slot.id, chunk.media_id[:12], span.start, span.end)
