"""A llama context with embeddings on: pooled vectors, or one vector per token."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

from typing import Sequence

import numpy as np

from .context import Batch, default_threads
from .backend import LlamaError
from .model import FLASH_ATTN, Model

POOLING = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
_NAMES = {value: name for name, value in POOLING.items()}


def model_pooling(model: Model) -> str:
    """The pooling the model's metadata declares ("none" for most generative models)."""
    value = model.meta(f"{model.info.arch}.pooling_type")
    return _NAMES.get(int(value), "none") if value is not None and value.strip().isdigit() else "none"


class EmbeddingContext:
    """Its own context on a shared model, so computing embeddings never touches the
    generation context. Several inputs share a decode, each its own sequence, pooled on its
    own; the memory is cleared before each decode. Use it from one thread."""

    def __init__(
        self, model: Model, *, n_ctx: int, n_seq: int, pooling: str, n_threads: int = 0, flash_attn: str = "off", chunk: int = 0
    ) -> None:
        """`chunk` > 0 (a causal model only): inputs are decoded `chunk` tokens at a time and
        pooled here from their token vectors.

        NOTE: llama.cpp makes every token of an embedding batch an output, and a generative
        model computes its logits for each: 2,000 tokens of a 262k vocabulary took 4 GB of
        buffers, kept for the context's life. In chunks those buffers hold `chunk` tokens."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        # a non-causal model attends over its whole input at once: one ubatch per batch
        cp.n_batch = cp.n_ubatch = chunk or n_ctx
        cp.n_seq_max = n_seq
        cp.kv_unified = True
        cp.embeddings = True
        cp.pooling_type = POOLING["none" if chunk else pooling]
        cp.n_threads = cp.n_threads_batch = n_threads or default_threads()
        cp.no_perf = True
        cp.flash_attn_type = FLASH_ATTN[flash_attn]
        ptr = llama_cpp.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LlamaError("llama.cpp could not create the embedding context (see the log above)")
        self.ptr = ptr
        self.chunk = chunk
        # llama.cpp pads the context; a batch holds at most n_ubatch tokens (one ubatch)
        self.n_ctx = min(int(llama_cpp.llama_n_ctx(ptr)), n_ctx if chunk else int(llama_cpp.llama_n_ubatch(ptr)))
        self.n_seq = n_seq
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model.ptr)) or model.info.n_embd
        self.pooling = pooling if chunk else _NAMES.get(int(llama_cpp.llama_pooling_type(ptr)), pooling)
        self._batch = Batch(chunk or self.n_ctx, n_seq)
        self.decodes = 0  # llama_decode calls so far

    def _decode(self, inputs: Sequence[Sequence[int]]) -> None:
        assert 0 < len(inputs) <= self.n_seq and sum(map(len, inputs)) <= self.n_ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ptr), True)
        batch = self._batch
        batch.clear()
        for seq, tokens in enumerate(inputs):
            batch.add(tokens, 0, seq, logits_last=True)
            batch.logits[batch.n - len(tokens) : batch.n] = 1  # every token is an output
        if int(llama_cpp.llama_decode(self.ptr, batch.struct(batch.n))) != 0:
            raise LlamaError("llama_decode failed on the embedding context")
        self.decodes += 1

    def groups(self, inputs: Sequence[Sequence[int]]) -> list[range]:
        """Consecutive runs of `inputs` that one decode holds together: at most `n_seq`
        inputs and one batch of tokens (`chunk` tokens on a causal model). An input longer
        than that is a group of its own, decoded in chunks."""
        budget = self.chunk or self.n_ctx
        out: list[range] = []
        start, used = 0, 0
        for i, tokens in enumerate(inputs):
            n = len(tokens)
            if i > start and (used + n > budget or i - start >= self.n_seq):
                out.append(range(start, i))
                start, used = i, 0
            used += n
        if len(inputs) > start:
            out.append(range(start, len(inputs)))
        return out

    def pooled(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One pooled vector per input, all decoded together (`inputs` is one of `groups`)."""
        if self.chunk and (len(inputs) > 1 or len(inputs[0]) <= self.chunk):
            return self._pooled_together(inputs)
        if self.chunk:
            return [self._pooled_in_chunks(inputs[0])]
        self._decode(inputs)
        return [np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy() for ptr in self._pooled_rows(len(inputs))]

    def scores(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """Rank pooling: the first value of each input's pooled output (a classifier's score;
        a model without a classifier head gives its last hidden state's first value)."""
        self._decode(inputs)
        return [float(ptr[0]) for ptr in self._pooled_rows(len(inputs))]

    def _pooled_rows(self, n: int) -> list:
        """llama.cpp's pooled output of sequences 0..n-1 of the last decode."""
        rows = [llama_cpp.llama_get_embeddings_seq(self.ptr, seq) for seq in range(n)]
        if not all(rows):
            raise LlamaError("llama.cpp returned no pooled output")
        return rows

    def _pooled_together(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Short inputs of a causal model in one decode, each its own sequence, pooled here."""
        self._decode(inputs)
        out, offset = [], 0
        for tokens in inputs:
            rows = self._rows(offset, len(tokens))
            offset += len(tokens)
            out.append(self._pool(rows.astype(np.float64).sum(axis=0), rows[0], rows[-1], len(tokens)))
        return out

    def _rows(self, offset: int, n: int) -> np.ndarray:
        return np.stack([
            np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(self.ptr, offset + i), shape=(self.n_embd,)) for i in range(n)
        ])

    def _pool(self, total: np.ndarray, first: np.ndarray, last: np.ndarray, n: int) -> np.ndarray:
        if self.pooling == "cls":
            return first.astype(np.float32)
        if self.pooling == "last":
            return last.astype(np.float32)
        return (total / n).astype(np.float32)

    def _pooled_in_chunks(self, tokens: Sequence[int]) -> np.ndarray:
        """One input decoded `chunk` tokens at a time, its token vectors pooled on the way."""
        assert 0 < len(tokens) <= self.n_ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ptr), True)
        batch = self._batch
        total = np.zeros(self.n_embd, dtype=np.float64)
        first = last = None
        for start in range(0, len(tokens), self.chunk):
            part = tokens[start : start + self.chunk]
            batch.clear()
            batch.add(part, start, 0, logits_last=True)
            batch.logits[: batch.n] = 1
            if int(llama_cpp.llama_decode(self.ptr, batch.struct(batch.n))) != 0:
                raise LlamaError("llama_decode failed on the embedding context")
            self.decodes += 1
            rows = self._rows(0, len(part))
            total += rows.astype(np.float64).sum(axis=0)
            if first is None:
                first = rows[0].copy()
            last = rows[-1].copy()
        return self._pool(total, first, last, len(tokens))

    def per_token(self, tokens: Sequence[int]) -> np.ndarray:
        """One vector per token of one input (pooling "none"), shape (len(tokens), n_embd);
        decoded `chunk` tokens at a time on a causal model."""
        assert 0 < len(tokens) <= self.n_ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ptr), True)
        step = self.chunk or self.n_ctx
        parts = []
        for start in range(0, len(tokens), step):
            part = tokens[start : start + step]
            self._batch.clear()
            self._batch.add(part, start, 0, logits_last=True)
            self._batch.logits[: self._batch.n] = 1
            if int(llama_cpp.llama_decode(self.ptr, self._batch.struct(self._batch.n))) != 0:
                raise LlamaError("llama_decode failed on the embedding context")
            self.decodes += 1
            parts.append(self._rows(0, len(part)).copy())
        return np.concatenate(parts)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
