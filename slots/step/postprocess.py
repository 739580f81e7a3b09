"""After a decode: the token path of every request in the batch.

`Postprocess` accounts a prefill chunk (`after_prefill`), takes a sampled token into the
request's event (`on_token`: end of generation, logprobs, text with stop strings, max_tokens
and the slot's context), and ends what ends through the `Outbox`. Checkpoints due at a chunk's
end are remembered and taken after the events are flushed (`take_checkpoints`), when no
decode has run since. Engine thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..llama_api import Context, Model, SamplingFailed
from ..sampling.logprobs import token_logprob
from ..reuse.memory import SlotMemory
from .outbox import Outbox
from ..requests import EngineError, ErrorKind, FinishReason
from .scheduler import BatchEntry
from ..slot import Active, Slot
from ..stats import EngineStats

log = logging.getLogger("warmslot.engine")


class Postprocess:
    def __init__(self, model: Model, ctx: Context, memory: SlotMemory, outbox: Outbox, stats: EngineStats) -> None:
        self._model = model
        self._ctx = ctx
        self._memory = memory
        self._outbox = outbox
        self._stats = stats
        self._deferred: list[tuple[Slot, int, Any]] = []  # checkpoints to take after flushing

    def drop_checkpoints(self) -> None:
        """Forget the checkpoints due (their slots were reset)."""
        self._deferred.clear()

    def after_prefill(self, slot: Slot, entry: BatchEntry) -> bool:
        """Account a prefill chunk. True when the prompt is complete and a token is to be
        sampled from the chunk's last logits."""
        active = slot.active
        slot.tokens.extend(active.prompt[entry.start : entry.start + entry.n])
        n = slot.n_past
        active.report_progress(n)
        if n < len(active.prompt):
            if active.cuts and active.cuts[0] == n:
                active.cuts.pop(0)
                self._deferred.append((slot, n, None))
            return False
        # the prompt is in memory: its last token's logits are at out_index
        logits = self._ctx.logits(entry.out_index)
        if active.req.return_prompt_logits:
            active.event().prompt_logits = logits
        self._deferred.append((slot, n, logits))
        active.prefill_done = True
        if active.req.max_tokens == 0:
            self._outbox.finish(slot, FinishReason.LENGTH)
            return False
        return True

    def prompt_done_from_logits(self, slot: Slot, logits) -> None:
        """The whole prompt was reused with its saved last-token logits: sample from those."""
        active = slot.active
        self._stats.logits_reused += 1
        if active.req.return_prompt_logits:
            active.event().prompt_logits = logits.copy()
        active.prefill_done = True
        if active.req.max_tokens == 0:
            self._outbox.finish(slot, FinishReason.LENGTH)
            return
        try:
            token = active.sampler.sample_logits(logits)
        except SamplingFailed as failed:
            self.fail_sampling(slot, failed)
            return
        self.on_token(slot, token, logits)

    def sample(self, slot: Slot, row: int) -> int | None:
        """Sample the slot's next token from batch output `row` and take it (`on_token`);
        None when no token could be sampled and the request ended with an error."""
        try:
            token = slot.active.sampler.sample(self._ctx, row)
        except SamplingFailed as failed:
            self.fail_sampling(slot, failed)
            return None
        self.on_token(slot, token, row)
        return token

    def on_sample(self, slot: Slot, sampled: int | SamplingFailed, row: int) -> None:
        """What the step's sampling gave the slot (`BatchSampler.sample`): a token, or why none."""
        if isinstance(sampled, SamplingFailed):
            self.fail_sampling(slot, sampled)
        else:
            self.on_token(slot, sampled, row)

    def fail_sampling(self, slot: Slot, failed: SamplingFailed) -> None:
        """No token could be sampled (the sampler accepted nothing): the request ends with an
        error that names the cause and the reply token it was for; the other requests and
        the slot's memory are untouched."""
        active = slot.active
        n = len(active.generated)
        message = f"no token can be sampled for reply token {n} (0-based): {failed.detail}"
        if failed.cause.model_output:
            kind = ErrorKind.MODEL_OUTPUT
            message += "; the model's weights, their quantization or an adapter may be broken"
        else:
            kind = ErrorKind.INVALID
        log.warning("slot %d: request %s: %s", slot.id, active.req.id, message)
        self._outbox.finish(slot, FinishReason.STOP, EngineError(kind, message))

    def on_token(self, slot: Slot, token: int, row) -> None:
        """A sampled token; `row` is the batch output it was sampled from, or saved logits."""
        active = slot.active
        now = time.monotonic()
        if not active.generated:
            active.first_token_at = now
            self._stats.ttft.observe(now - active.req.submitted)
        else:
            self._stats.itl.observe(now - active.last_token_at)
        active.last_token_at = now
        active.generated.append(token)
        event = active.event()
        if self._model.is_eog(token) and not active.req.ignore_eos:
            self._outbox.finish(slot, FinishReason.STOP)
            return
        event.tokens.append(token)
        if active.req.logprobs is not None:
            logits = self._ctx.logits(row) if isinstance(row, int) else row
            event.logprobs.append(token_logprob(logits, active.req.sampling.logit_bias, token, active.req.logprobs))
        text = active.text.feed(self._model.token_piece(token, special=False))
        event.text += text
        if active.text.stopped_by is not None:
            self._outbox.finish(slot, FinishReason.STOP)
        elif active.text.cut_by_indent or self._out_of_time(active, text, now) or self._out_of_room(active, slot):
            self._outbox.finish(slot, FinishReason.LENGTH)
        else:
            active.pending = token

    @staticmethod
    def _out_of_time(active: Active, text: str, now: float) -> bool:
        """llama-server's t_max_predict_ms: generation has run longer and this token ends a line."""
        limit = active.req.t_max_predict_ms
        return limit > 0 and "\n" in text and (now - active.first_token_at) * 1000 > limit

    def _out_of_room(self, active: Active, slot: Slot) -> bool:
        """max_tokens reached, or the next token would not fit the slot's context."""
        limit = active.req.max_tokens
        return (limit is not None and len(active.generated) >= limit) or slot.n_past + 1 >= self._ctx.n_ctx_seq

    def take_checkpoints(self) -> None:
        for slot, n, logits in self._deferred:
            # no decode ran since the deferral, so the memory still ends at n (unless the
            # request failed and its slot was cleared)
            if slot.n_past == n:
                self._memory.checkpoint(slot, n, logits)
        self._deferred.clear()
