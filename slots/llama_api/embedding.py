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
    generation context. Every sequence of a batch is pooled on its own; the memory is
    cleared before each batch. Use it from one thread."""

    def __init__(
        self, model: Model, *, n_ctx: int, n_seq: int, pooling: str, n_threads: int = 0, flash_attn: str = "off"
    ) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        # a non-causal model attends over its whole input at once: one ubatch per batch
        cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = n_seq
        cp.kv_unified = True
        cp.embeddings = True
        cp.pooling_type = POOLING[pooling]
        cp.n_threads = cp.n_threads_batch = n_threads or default_threads()
        cp.no_perf = True
        cp.flash_attn_type = FLASH_ATTN[flash_attn]
        ptr = llama_cpp.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LlamaError("llama.cpp could not create the embedding context (see the log above)")
        self.ptr = ptr
        # llama.cpp pads the context; a batch holds at most n_ubatch tokens (one ubatch)
        self.n_ctx = min(int(llama_cpp.llama_n_ctx(ptr)), int(llama_cpp.llama_n_ubatch(ptr)))
        self.n_seq = n_seq
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model.ptr)) or model.info.n_embd
        self.pooling = _NAMES.get(int(llama_cpp.llama_pooling_type(ptr)), pooling)
        self._batch = Batch(self.n_ctx, n_seq)

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

    def pooled(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One pooled vector per input (the context's pooling must not be "none")."""
        self._decode(inputs)
        out = []
        for seq in range(len(inputs)):
            ptr = llama_cpp.llama_get_embeddings_seq(self.ptr, seq)
            if not ptr:
                raise LlamaError("llama.cpp returned no pooled embedding")
            out.append(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy())
        return out

    def per_token(self, tokens: Sequence[int]) -> np.ndarray:
        """One vector per token of one input (pooling "none"), shape (len(tokens), n_embd)."""
        self._decode([tokens])
        rows = [llama_cpp.llama_get_embeddings_ith(self.ptr, i) for i in range(len(tokens))]
        return np.stack([np.ctypeslib.as_array(r, shape=(self.n_embd,)).copy() for r in rows])

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
