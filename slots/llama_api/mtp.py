"""libllama's multi-token-prediction (MTP) interface, which llama-cpp-python does not bind.

A model that carries MTP layers (Qwen3.5's one block after the last layer) predicts the token
after next from the next token's embedding and the trunk's last hidden state. libllama runs
that block in a context of its own (`LLAMA_CONTEXT_TYPE_MTP`, created against the target's
context), fed through the extended batch API (`llama_batch_ext`: a token, its position and a
row of hidden state) and `llama_process`. The target hands out its hidden states once
`llama_set_embeddings_nextn` asks for them: one row per token of the last decode (unmasked),
or per output (masked, the MTP context's own). Those two functions are in libllama's staging
header (C++ linkage), so they are looked up by their mangled names.
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes

import numpy as np

from .backend import LlamaError
from .context import Context, ContextParams
from .model import Model

CONTEXT_TYPE_MTP = 1  # enum llama_context_type
PROCESS_DECODE = 1  # enum llama_process_type

_lib = llama_cpp.llama_cpp._lib


class _Embd(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(ctypes.c_float)), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]


def _bind(name: str, restype, *argtypes):
    fn = getattr(_lib, name, None)
    if fn is None:
        return None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_p = ctypes.c_void_p
_set_nextn = _bind("_Z26llama_set_embeddings_nextnP13llama_contextbb", None, _p, ctypes.c_bool, ctypes.c_bool)
_get_nextn = _bind("_Z26llama_get_embeddings_nextnP13llama_context", ctypes.POINTER(ctypes.c_float), _p)
_get_nextn_ith = _bind("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", ctypes.POINTER(ctypes.c_float), _p, ctypes.c_int32)
_n_layer_nextn = _bind("llama_model_n_layer_nextn", ctypes.c_int32, _p)
_ctx_other = _bind("_Z19llama_get_ctx_otherP13llama_context", _p, _p)
_batch_init = _bind("llama_batch_ext_init", _p, _p)
_batch_free = _bind("llama_batch_ext_free", None, _p)
_batch_clear = _bind("llama_batch_ext_clear", None, _p)
_batch_add_token = _bind("llama_batch_ext_add_token", ctypes.c_int32, _p, ctypes.c_int32, ctypes.c_int32)
_batch_set_pos = _bind("llama_batch_ext_set_pos", ctypes.c_bool, _p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32))
_batch_set_embd = _bind("llama_batch_ext_set_embd_token", ctypes.c_bool, _p, ctypes.c_int32, _Embd)
_batch_set_logits = _bind("llama_batch_ext_set_output_logits", ctypes.c_bool, _p, ctypes.c_int32, ctypes.c_bool)
_process = _bind("llama_process", ctypes.c_int32, _p, ctypes.c_int, _p)

AVAILABLE = all(f is not None for f in (
    _set_nextn, _get_nextn, _get_nextn_ith, _n_layer_nextn, _ctx_other, _batch_init, _batch_free, _batch_clear, _batch_add_token,
    _batch_set_pos, _batch_set_embd, _batch_set_logits, _process,
))


def _address(ptr) -> int | None:
    return ptr if isinstance(ptr, int) or ptr is None else ctypes.cast(ptr, ctypes.c_void_p).value


def n_mtp_layers(model: Model) -> int:
    """The MTP layers the model file carries (0: none, or a libllama without the interface)."""
    return int(_n_layer_nextn(model.ptr)) if AVAILABLE else 0


def share_hidden_states(target: Context) -> None:
    """Make every decode of `target` keep each token's last hidden state (`hidden_rows`)."""
    _set_nextn(target.ptr, True, False)


def hidden_rows(target: Context, n: int, n_embd: int) -> np.ndarray:
    """The hidden states of the first n tokens of the target's last decode (a view, valid
    until its next decode): row i is the state after the batch's token i."""
    ptr = _get_nextn(target.ptr)
    if not ptr:
        raise LlamaError("the context kept no hidden states")
    return np.ctypeslib.as_array(ptr, shape=(n, n_embd))


class MtpContext:
    """The MTP block's context: its own KV cache (the MTP layer's attention), one sequence per
    target sequence, fed one row per token: (token at p, the target's hidden state at p - 1)."""

    def __init__(self, model: Model, target: Context) -> None:
        if not AVAILABLE:
            raise LlamaError("this libllama does not export the MTP interface")
        p = target.params
        self.ctx = Context(model, ContextParams(
            n_ctx=p.n_ctx, n_batch=target.n_batch, n_ubatch=target.n_ubatch, n_seq_max=p.n_seq_max,
            n_threads=target.n_threads, n_threads_batch=p.n_threads_batch, flash_attn=p.flash_attn,
            type_k=p.type_k, type_v=p.type_v, kv_unified=p.kv_unified,
        ), ctx_type=CONTEXT_TYPE_MTP, other=target)
        if _ctx_other(self.ctx.ptr) == _address(target.ptr):
            self.ctx.close()
            raise LlamaError("this model's MTP layers share the model's KV cache, which is not supported")
        _set_nextn(self.ctx.ptr, True, True)
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model.ptr))
        self.n_vocab = model.n_vocab
        self._batch = _batch_init(self.ctx.ptr)
        if not self._batch:
            self.ctx.close()
            raise LlamaError("llama.cpp could not make an extended batch")
        self._pos = (ctypes.c_int32 * 4)()
        self._n = 0

    def clear(self) -> None:
        _batch_clear(self._batch)
        self._n = 0

    def add(self, token: int, pos: int, seq: int, hidden: np.ndarray, *, logits: bool = False) -> int:
        """One row: `token` at `pos` of `seq`, with the hidden state (n_embd floats, copied)
        of the position before. Returns its index in the batch."""
        idx = int(_batch_add_token(self._batch, seq, token))
        if idx < 0:
            raise LlamaError(f"the MTP batch refused a token ({idx})")
        self._pos[0] = pos
        row = np.ascontiguousarray(hidden, dtype=np.float32)
        ok = _batch_set_pos(self._batch, idx, self._pos) and _batch_set_embd(
            self._batch, idx, _Embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        )
        if logits:
            ok = ok and _batch_set_logits(self._batch, idx, True)
        if not ok:
            raise LlamaError("the MTP batch refused a row")
        self._n += 1
        return idx

    @property
    def n(self) -> int:
        return self._n

    def process(self) -> int:
        """Decode the rows added since `clear` (0: ok, as llama_decode)."""
        return int(_process(self.ctx.ptr, PROCESS_DECODE, self._batch)) if self._n else 0

    def logits(self, index: int) -> np.ndarray:
        return self.ctx.logits(index)

    def hidden(self, index: int) -> np.ndarray:
        """The MTP block's own hidden state at output `index` (a copy): the state the next
        drafted token is fed with."""
        ptr = _get_nextn_ith(self.ctx.ptr, index)
        if not ptr:
            raise LlamaError("the MTP context kept no hidden state for that row")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return self.ctx.seq_rm(seq, p0, p1)

    def seq_clear(self, seq: int) -> None:
        self.ctx.seq_clear(seq)

    def close(self) -> None:
        if getattr(self, "_batch", None):
            _batch_free(self._batch)
            self._batch = None
        self.ctx.close()


__all__ = ("AVAILABLE", "MtpContext", "hidden_rows", "n_mtp_layers", "share_hidden_states")
