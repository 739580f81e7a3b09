"""A draft model for speculative decoding (`-md`): a small model of the same vocabulary that
guesses the target's next tokens greedily.

It has a llama context of its own with one sequence per target sequence. A slot's draft
sequence follows the slot's history by its longest common prefix: before drafting, the draft
sequence is cut where it leaves the slot's tokens (seq_rm) and only the rest is evaluated. A
request that returns to a slot holding its conversation, or a verified draft, costs the draft
model only the new tokens, as it costs the target; what a rejected draft left is cut at the
next draft. A request whose prompt the target took from the prompt cache into another slot
evaluates that slot's draft sequence from where it differs.

Drafting stops at --draft-max tokens, or before a token the draft model gives less than
--draft-p-min probability. The draft only proposes: the target's own sampler decides every
token (speculative.py), so a draft model's numerics, its memory kind or a cut that its memory
refuses (then its sequence is evaluated again from the start) change how many drafted tokens
are accepted, never the output. Engine thread only.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from warmslot.cache.prefix_trie import common_prefix

from .config import EngineConfig
from .llama_api import Batch, Context, ContextParams, LlamaError, Model
from .logprobs import most_likely
from .mtp_draft import MtpDraft
from .speculative import MTP

log = logging.getLogger("warmslot.speculative")


class DraftModel:
    def __init__(
        self, path: str, target: Model, *, n_seq: int, n_ctx: int, n_gpu_layers: int = -1, type_k: str = "f16",
        type_v: str = "f16", n_threads: int = 0, n_batch: int = 512, repack: bool | None = None,
    ) -> None:
        self.model = Model(path, n_gpu_layers=n_gpu_layers, repack=repack)
        try:
            if self.model.n_vocab != target.n_vocab or any(
                self.model.token_piece(t) != target.token_piece(t) for t in _probe_tokens(target.n_vocab)
            ):
                raise LlamaError(
                    f"the draft model {path} has another vocabulary than the model "
                    f"({self.model.n_vocab} tokens against {target.n_vocab}); speculative decoding needs the same one"
                )
            self.ctx = Context(self.model, ContextParams(
                n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_seq_max=n_seq, n_threads=n_threads, type_k=type_k,
                type_v=type_v, kv_unified=True, pinned_states=False,
            ))
        except BaseException:
            self.model.close()
            raise
        self.batch = Batch(self.ctx.n_batch, n_seq)
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]  # what each draft sequence holds
        self.evaluated = 0  # tokens the draft model evaluated to follow the slots (not drafting)
        log.info("draft model %s (%s): %d slots share %d cells", self.model.info.name, self.model.info.arch, n_seq, self.ctx.n_ctx)

    def draft(self, seq: int, history: Sequence[int], limit: int, p_min: float) -> list[int]:
        """Up to `limit` tokens the draft model predicts after `history` (the slot's tokens
        and its pending one), greedily, while each is at least `p_min` likely."""
        logits = self._follow(seq, history)
        if logits is None:
            return []
        held = self.tokens[seq]
        out: list[int] = []
        while True:
            token, p = most_likely(logits)
            if p < p_min:
                break
            out.append(token)
            if len(out) >= limit or self.model.is_eog(token) or len(held) + 1 >= self.ctx.n_ctx_seq:
                break
            logits = self._decode(seq, [token], len(held))
            if logits is None:
                break
            held.append(token)
        return out

    def _follow(self, seq: int, history: Sequence[int]) -> np.ndarray | None:
        """Bring the draft sequence to `history` (keep the common prefix, evaluate the rest);
        the logits after its last token."""
        held = self.tokens[seq]
        keep = common_prefix(held, history)
        if keep == len(history):
            keep -= 1  # the last token is evaluated again for its logits
        if keep < len(held) and not self.ctx.seq_rm(seq, keep, -1):
            keep = 0
            self.ctx.seq_clear(seq)
        del held[keep:]
        if len(history) >= self.ctx.n_ctx_seq:
            return None
        logits = None
        while len(held) < len(history):
            chunk = list(history[len(held) : len(held) + self.batch.capacity])
            logits = self._decode(seq, chunk, len(held))
            if logits is None:
                return None
            held.extend(chunk)
            self.evaluated += len(chunk)
        return logits

    def _decode(self, seq: int, tokens: list[int], pos: int) -> np.ndarray | None:
        self.batch.clear()
        index = self.batch.add(tokens, pos, seq, logits_last=True)
        if self.ctx.decode(self.batch) != 0:
            # no room, or an error: start this sequence over at the next draft
            self.ctx.seq_clear(seq)
            self.tokens[seq].clear()
            return None
        return self.ctx.logits(index)

    def after_decode(self, entries, batch) -> None:
        """The target decoded a batch: a draft model follows the slots when it drafts."""

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def load_draft(cfg: EngineConfig, target: Model, ctx: Context) -> "DraftModel | MtpDraft | None":
    """The drafter of `cfg.spec` that is a model: the draft model (-md), with one sequence
    per target sequence, or the target's own MTP layers (draft-mtp); None otherwise."""
    spec = cfg.spec
    if spec.type == MTP:
        return MtpDraft(target, ctx)
    if spec.draft_model is None:
        return None
    return DraftModel(
        spec.draft_model, target, n_seq=ctx.n_seq_max, n_ctx=ctx.n_ctx, n_gpu_layers=spec.draft_gpu_layers,
        type_k=spec.draft_type_k, type_v=spec.draft_type_v, n_threads=cfg.n_threads, repack=cfg.repack,
    )


def _probe_tokens(n_vocab: int) -> list[int]:
    """A spread of token ids whose text both vocabularies must agree on."""
    return sorted({min(n_vocab - 1, i * n_vocab // 64) for i in range(64)})

