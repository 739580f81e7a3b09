"""Drafts from the model's own multi-token-prediction layers (`--spec-type draft-mtp`).

A model trained with MTP (Qwen3.5 carries one block after its last layer) predicts the token
after next from two inputs: the next token's embedding and the trunk's last hidden state at
the position before. libllama runs that block in a context of its own whose KV cache holds
the block's attention over the sequence (llama_api/mtp.py). So the block must see every
position the target decodes, each as (token at p, the target's hidden state at p - 1):

- after every decode of the target (`after_decode`), the rows it decoded for each slot are
  fed to the MTP context, the first paired with the state the slot's last decode ended on.
  The MTP sequence is first cut where it leaves the slot's history: a request that returns
  to its slot costs the block only the new tokens, as it costs the target. The MTP sequence
  goes where the target's goes: into a prompt cache entry (and the disk tier) with the slot's
  contents, with the hidden states of the slot's last decode (`save_state`), back out of it
  (`load_state`), and into a fork's target (`fork`, where the pool is unified). Positions the
  target took from elsewhere (a slot file, a fork between streams) were never decoded here and
  have no hidden state: the block's attention goes without them (its drafts may be accepted
  less; the output never changes);
- drafting (`draft`) feeds (pending token, state at the last decoded position), takes the
  block's most likely token while it is at least --draft-p-min likely, and feeds that token
  with the block's own output state for the next, up to --draft-max tokens. What the drafts
  left in the MTP cache is cut by the next feed, which starts at the slot's next position.

Every emitted token is still sampled by the target (speculative.py): the block only proposes.
Requests with images or audio do not draft (their placeholder positions have no tokens).
Engine thread only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

import numpy as np

from warmslot.cache.prefix_trie import common_prefix
from warmslot.cache.entries import DraftState

from ..llama_api import Batch, Context, LlamaError, Model
from ..llama_api import mtp
from ..sampling.logprobs import most_likely
from ..stats import EngineStats

if TYPE_CHECKING:
    from ..step.scheduler import BatchEntry

log = logging.getLogger("warmslot.speculative")


class MtpDraft:
    def __init__(self, model: Model, target: Context, stats: EngineStats | None = None) -> None:
        n_layers = mtp.n_mtp_layers(model)
        if n_layers < 1:
            raise LlamaError(
                f"--spec-type draft-mtp: the model {model.info.name or model.info.arch} carries no MTP layers"
            )
        if n_layers > 1:
            raise LlamaError(f"--spec-type draft-mtp: models with {n_layers} chained MTP heads are not supported (one is)")
        self.model = model
        self.target = target
        mtp.share_hidden_states(target)
        self.mtp = mtp.MtpContext(model, target)
        self.n_embd = self.mtp.n_embd
        p = target.params  # what a saved sequence must have been made with to load here
        self.fingerprint = f"mtp:{model.info.fingerprint}:{p.type_k}:{p.type_v}:fa-{p.flash_attn}:{'u' if p.kv_unified else 's'}"
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        n = target.n_seq_max
        self.held: list[list[int]] = [[] for _ in range(n)]  # the tokens each MTP sequence holds, by position
        self.owner: list[object] = [None] * n  # the request whose tokens those are
        self.states: list[tuple[int, np.ndarray] | None] = [None] * n  # (first position, the target's states from there)
        self.stats = stats or EngineStats()  # spec_drafter_tokens
        log.info("MTP drafts: %d MTP layer(s) of the model, %d slots", n_layers, n)

    # -- following the target -----------------------------------------------------------

    def after_decode(self, entries: Sequence["BatchEntry"], batch: Batch) -> None:
        """Feed the MTP block what the target's last decode evaluated (its hidden states are
        read before the next decode replaces them)."""
        n = batch.n
        rows = mtp.hidden_rows(self.target, n, self.n_embd)
        seqs = batch.seq_ids(n)
        self.mtp.clear()
        for entry in entries:
            slot = entry.slot
            if entry.filler or slot.active is None:
                continue
            seq = slot.id
            if slot.active.req.media:
                self._forget(seq)
                continue
            at = np.flatnonzero(seqs == seq)
            if len(at) != entry.n:
                self._forget(seq)
                continue
            r0 = int(at[0])
            pos0 = int(batch.pos[r0])
            self._follow(seq, slot.active, slot.tokens, pos0)
            state = self.states[seq]
            first = self._state_at(seq, pos0 - 1) if state is not None else None
            tokens = batch.token[r0 : r0 + entry.n]
            for i in range(entry.n):
                self.mtp.add(int(tokens[i]), pos0 + i, seq, rows[r0 + i - 1] if i else (self._zero if first is None else first))
            self.held[seq].extend(int(t) for t in tokens)
            self.states[seq] = (pos0, rows[r0 : r0 + entry.n].copy())
            self.stats.spec_drafter_tokens["evaluated"] += entry.n
        if self.mtp.n and self.mtp.process() != 0:
            log.warning("the MTP block could not follow a decode; its sequences start over")
            for entry in entries:
                self._forget(entry.slot.id)

    def _follow(self, seq: int, owner: object, tokens: Sequence[int], pos0: int) -> None:
        """Cut the MTP sequence to what it shares with the slot's first pos0 tokens."""
        held = self.held[seq]
        if self.owner[seq] is not owner:  # another request: compare once
            self.owner[seq] = owner
            keep = common_prefix(held, tokens[:pos0])
        else:  # the same request: its history before pos0 is what it was
            keep = min(len(held), pos0)
        if keep < len(held):
            self.mtp.seq_rm(seq, keep, -1)
            del held[keep:]
        if len(held) < pos0:  # taken from a cache: no states for these positions
            held.extend(tokens[len(held) : pos0])
            self.states[seq] = None  # nor is the last one kept here this history's
        self.mtp.seq_rm(seq, pos0, -1)  # what a draft left there

    def _state_at(self, seq: int, pos: int) -> np.ndarray | None:
        state = self.states[seq]
        if state is None:
            return None
        first, rows = state
        i = pos - first
        return rows[i] if 0 <= i < len(rows) else None

    def _forget(self, seq: int) -> None:
        self.mtp.seq_clear(seq)
        self.held[seq].clear()
        self.owner[seq] = None
        self.states[seq] = None

    # -- where the target's sequence goes, the MTP sequence goes ---------------------------

    def save_state(self, seq: int, tokens: Sequence[int]) -> DraftState | None:
        """A copy of the MTP sequence and the hidden states it goes on from, to go into a
        prompt cache entry of the slot's `tokens`; None when it holds nothing of them."""
        held = self.held[seq]
        if not common_prefix(held, tokens):
            return None
        state = self.states[seq]
        extra = () if state is None else (np.array([state[0]], dtype=np.int64), state[1])
        return DraftState(tuple(held), self.mtp.ctx.state_get(seq, partial=False), extra, self.fingerprint)

    def load_state(self, seq: int, saved: DraftState) -> None:
        """The MTP sequence takes a cache entry's copy (the entry keeps it); one saved with
        another model or state layout is left alone."""
        if saved.fingerprint != self.fingerprint:
            return
        self._forget(seq)
        if self.mtp.ctx.state_set(seq, saved.state, partial=False):
            self.held[seq][:] = saved.tokens
            self.states[seq] = (int(saved.extra[0][0]), saved.extra[1]) if saved.extra else None
            self.stats.spec_drafter_tokens["restored"] += len(saved.tokens)
        else:
            log.warning("the MTP block could not load a saved sequence of %d tokens", len(saved.tokens))
            self._forget(seq)

    def fork(self, donor: int, target: int, tokens: Sequence[int]) -> None:
        """The target slot took the donor's first tokens (`tokens`): the MTP sequence takes
        what the donor's holds of them, where the pool is unified (a copy between streams
        waits for a decode of the target context, which the block never runs)."""
        self._forget(target)
        held = self.held[donor]
        keep = common_prefix(held, tokens)
        if keep and self.mtp.ctx.unified:
            self.mtp.ctx.seq_cp(donor, target, 0, keep)
            self.held[target][:] = held[:keep]
            self.states[target] = self.states[donor]
            self.stats.spec_drafter_tokens["restored"] += keep

    # -- drafting -----------------------------------------------------------------------

    def draft_batch(self, requests: Sequence[tuple[int, Sequence[int], int, float]]) -> list[list[int]]:
        """`draft` for each request (seq, history, limit, p_min), one after another."""
        return [self.draft(*request) for request in requests]

    def draft(self, seq: int, history: Sequence[int], limit: int, p_min: float) -> list[int]:
        """Up to `limit` tokens after `history` (the slot's tokens and its pending one)."""
        pos = len(history) - 1
        state = self._state_at(seq, pos - 1)
        if state is None or limit <= 0 or len(self.held[seq]) < pos:
            return []
        # what an earlier draft or a rejected token left at pos and past it goes first
        self.mtp.seq_rm(seq, pos, -1)
        del self.held[seq][pos:]
        token, out = int(history[-1]), []
        while len(out) < limit:
            self.mtp.clear()
            index = self.mtp.add(token, pos, seq, state, logits=True)
            if self.mtp.process() != 0:
                break
            token, p = most_likely(self.mtp.logits(index))
            if p < p_min:
                break
            out.append(token)
            if self.model.is_eog(token) or pos + 2 >= self.target.n_ctx_seq:
                break
            state, pos = self.mtp.hidden(index), pos + 1
        return out

    def close(self) -> None:
        self.mtp.close()

