"""A draft model for speculative decoding (`-md`): a small model of the same vocabulary that
guesses the target's next tokens greedily.

It has a llama context of its own with one sequence per target sequence. A slot's draft
sequence follows the slot's history by its longest common prefix: before drafting, the draft
sequence is cut where it leaves the slot's tokens (seq_rm) and only the rest is evaluated. A
request that returns to a slot holding its conversation, or a verified draft, costs the draft
model only the new tokens, as it costs the target; what a rejected draft left is cut at the
next draft. The draft sequence goes where the target's goes (slots/reuse/memory.py): saved with
the slot's contents into the prompt cache and from there to the disk tier (`save_state`),
loaded with them into whichever slot takes them back (`load_state`), and copied with a fork
(`fork`). So a conversation back from the RAM or disk tier, or a prompt that shares another
slot's prefix, costs the draft model only what the target evaluates too. (A slot file
carries no draft state: the draft sequence is then evaluated from where it differs.)

Drafting stops at --draft-max tokens, or before a token the draft model gives less than
--draft-p-min probability. The slots that draft in a step draft together (`draft_batch`):
their sequences catch up in one decode, and each drafted position of all of them is one.
The draft only proposes: the target's own sampler decides every token (speculative.py), so
a draft model's numerics, its memory kind or a cut that its memory refuses (then its
sequence is evaluated again from the start) change how many drafted tokens are accepted,
never the output. Engine thread only.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from warmslot.cache.prefix_trie import common_prefix
from warmslot.cache.entries import DraftState

from ..settings import EngineConfig
from ..llama_api import Batch, Context, ContextParams, LlamaError, Model, Placement
from ..sampling.logprobs import most_likely
from .mtp_draft import MtpDraft
from .spec_config import MTP
from ..stats import EngineStats

log = logging.getLogger("warmslot.speculative")


class DraftModel:
    def __init__(
        self, path: str, target: Model, *, n_seq: int, n_ctx: int, n_gpu_layers: int = -1, type_k: str = "f16",
        type_v: str = "f16", n_threads: int = 0, n_batch: int = 512, repack: bool | None = None,
        stats: EngineStats | None = None, devices: tuple[str, ...] | None = None, flash_attn: str = "auto",
    ) -> None:
        """`devices`: where its layers go (names from --list-devices; None: every GPU; (): the
        CPU). `flash_attn`: as the target's context has it."""
        placement = Placement(devices=devices) if devices is not None else None
        self.model = Model(path, n_gpu_layers=0 if devices == () else n_gpu_layers, repack=repack, placement=placement)
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
                type_v=type_v, kv_unified=True, flash_attn=flash_attn,
            ))
        except BaseException:
            self.model.close()
            raise
        # what a saved sequence must have been made with to load here (the state layout)
        self.fingerprint = f"draft:{self.model.info.fingerprint}:{type_k}:{type_v}:fa-{self.ctx.params.flash_attn}"
        self.batch = Batch(self.ctx.n_batch, n_seq)
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]  # what each draft sequence holds
        self.stats = stats or EngineStats()  # spec_drafter_tokens
        log.info("draft model %s (%s): %d slots share %d cells", self.model.info.name, self.model.info.arch, n_seq, self.ctx.n_ctx)

    def draft(self, seq: int, history: Sequence[int], limit: int, p_min: float) -> list[int]:
        """Up to `limit` tokens the draft model predicts after `history` (the slot's tokens
        and its pending one), greedily, while each is at least `p_min` likely."""
        return self.draft_batch([(seq, history, limit, p_min)])[0]

    def draft_batch(self, requests: Sequence[tuple[int, Sequence[int], int, float]]) -> list[list[int]]:
        """`draft` for several sequences at once, each request (seq, history, limit, p_min):
        the sequences catch up with their slots in one decode (where that fits a batch), and
        each further drafted token of all of them is one decode."""
        logits = self._follow_all([(seq, history) for seq, history, _, _ in requests])
        out: list[list[int]] = [[] for _ in requests]
        going = [i for i, row in enumerate(logits) if row is not None]
        while going:
            self.batch.clear()
            rows = []
            for i in going:
                seq, _, limit, p_min = requests[i]
                token, p = most_likely(logits[i])
                if p < p_min:
                    continue
                out[i].append(token)
                held = self.tokens[seq]
                if len(out[i]) < limit and not self.model.is_eog(token) and len(held) + 1 < self.ctx.n_ctx_seq:
                    rows.append((i, self.batch.add([token], len(held), seq, logits_last=True)))
            if not rows:
                break
            if self.ctx.decode(self.batch) != 0:
                for i, _ in rows:  # no room, or an error: these start over at their next draft
                    self._forget(requests[i][0])
                break
            for i, index in rows:
                logits[i] = self.ctx.logits(index)
                self.tokens[requests[i][0]].append(out[i][-1])
            going = [i for i, _ in rows]
        return out

    def _follow_all(self, wanted: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray | None]:
        """`_follow` for several sequences: one decode when all they lack fits a batch."""
        for seq, history in wanted:
            self._cut(seq, history)
        lacking = sum(len(history) - len(self.tokens[seq]) for seq, history in wanted)
        if len(wanted) == 1 or lacking > self.batch.capacity or any(len(h) >= self.ctx.n_ctx_seq for _, h in wanted):
            return [self._follow(seq, history) for seq, history in wanted]
        self.batch.clear()
        index = [
            self.batch.add(list(history[len(self.tokens[seq]):]), len(self.tokens[seq]), seq, logits_last=True)
            for seq, history in wanted
        ]
        if self.ctx.decode(self.batch) != 0:
            for seq, _ in wanted:
                self._forget(seq)
            return [None] * len(wanted)
        self.stats.spec_drafter_tokens["evaluated"] += lacking
        for seq, history in wanted:
            self.tokens[seq].extend(history[len(self.tokens[seq]):])
        return [self.ctx.logits(i) for i in index]

    def _cut(self, seq: int, history: Sequence[int]) -> None:
        """Cut the draft sequence to what it shares with `history`, less its last token at
        least (evaluated again for its logits)."""
        held = self.tokens[seq]
        keep = common_prefix(held, history)
        if keep == len(history):
            keep -= 1  # the last token is evaluated again for its logits
        if keep < len(held) and not self.ctx.seq_rm(seq, keep, -1):
            keep = 0
            self.ctx.seq_clear(seq)
        del held[keep:]

    def _forget(self, seq: int) -> None:
        self.ctx.seq_clear(seq)
        self.tokens[seq].clear()

    def _follow(self, seq: int, history: Sequence[int]) -> np.ndarray | None:
        """Bring the draft sequence to `history` (keep the common prefix, evaluate the rest);
        the logits after its last token."""
        self._cut(seq, history)
        held = self.tokens[seq]
        if len(history) >= self.ctx.n_ctx_seq:
            return None
        logits = None
        while len(held) < len(history):
            chunk = list(history[len(held) : len(held) + self.batch.capacity])
            logits = self._decode(seq, chunk, len(held))
            if logits is None:
                return None
            held.extend(chunk)
            self.stats.spec_drafter_tokens["evaluated"] += len(chunk)
        return logits

    def _decode(self, seq: int, tokens: list[int], pos: int) -> np.ndarray | None:
        self.batch.clear()
        index = self.batch.add(tokens, pos, seq, logits_last=True)
        if self.ctx.decode(self.batch) != 0:
            self._forget(seq)  # no room, or an error: start this sequence over at the next draft
            return None
        return self.ctx.logits(index)

    def after_decode(self, entries, batch) -> None:
        """The target decoded a batch: a draft model follows the slots when it drafts."""

    # -- where the target's sequence goes, the draft's goes ------------------------------

    def save_state(self, seq: int, tokens: Sequence[int]) -> DraftState | None:
        """A copy of the draft sequence, to go into a prompt cache entry of the slot's
        `tokens`; None when it holds nothing of them."""
        held = self.tokens[seq]
        if not common_prefix(held, tokens):
            return None
        return DraftState(tuple(held), self.ctx.state_get(seq, partial=False), fingerprint=self.fingerprint)

    def load_state(self, seq: int, saved: DraftState) -> None:
        """The draft sequence takes a cache entry's copy (the entry keeps it); one saved by
        another draft model or state layout is left alone."""
        if saved.fingerprint != self.fingerprint:
            return
        self.ctx.seq_clear(seq)
        if self.ctx.state_set(seq, saved.state, partial=False):
            self.tokens[seq][:] = saved.tokens
            self.stats.spec_drafter_tokens["restored"] += len(saved.tokens)
        else:
            log.warning("the draft model could not load a saved sequence of %d tokens; it evaluates it again", len(saved.tokens))
            self._forget(seq)

    def fork(self, donor: int, target: int, tokens: Sequence[int]) -> None:
        """The target slot took the donor's first tokens (`tokens`): the draft sequence takes
        what the donor's draft sequence holds of them (on attention memory, where a copy can
        stop anywhere; other memory evaluates the target's again)."""
        held = self.tokens[donor]
        keep = common_prefix(held, tokens)
        self._forget(target)
        if keep and self.ctx.memory_kind.truncatable:
            self.ctx.seq_cp(donor, target, 0, keep)
            self.tokens[target][:] = held[:keep]
            self.stats.spec_drafter_tokens["restored"] += keep

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def load_draft(cfg: EngineConfig, target: Model, ctx: Context, stats: EngineStats) -> "DraftModel | MtpDraft | None":
    """The drafter of `cfg.spec` that is a model: the draft model (-md), with one sequence
    per target sequence, or the target's own MTP layers (draft-mtp); None otherwise."""
    spec = cfg.spec
    if spec.type == MTP:
        return MtpDraft(target, ctx, stats)
    if spec.draft_model is None:
        return None
    return DraftModel(
        spec.draft_model, target, n_seq=ctx.n_seq_max, n_ctx=ctx.n_ctx, n_gpu_layers=spec.draft_gpu_layers,
        type_k=spec.draft_type_k, type_v=spec.draft_type_v, n_threads=cfg.n_threads, repack=cfg.repack, stats=stats,
        devices=spec.draft_devices, flash_attn=ctx.params.flash_attn,
    )


def _probe_tokens(n_vocab: int) -> list[int]:
    """A spread of token ids whose text both vocabularies must agree on."""
    return sorted({min(n_vocab - 1, i * n_vocab // 64) for i in range(64)})

