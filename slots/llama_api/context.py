"""A llama_context with one sequence per slot, and the batch it decodes."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
import os
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from .backend import LlamaError
from .model import FLASH_ATTN, KV_TYPES, PARTIAL_ONLY, MemoryKind, Model, classify_memory

# rope types whose positions are not one number per token (vision models' M-RoPE)
_MULTI_ROPE = (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE, llama_cpp.LLAMA_ROPE_TYPE_VISION)

@dataclass(slots=True)
class ContextParams:
    n_ctx: int
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = 0  # 0: choose from the CPU count
    n_threads_batch: int = 0
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False
    kv_unified: bool = True  # one KV pool for all sequences; False: a stream of n_ctx/n_seq_max cells each
    # recurrent state snapshots per sequence: seq_rm may take back this many of its last
    # tokens without a state copy (llama.cpp's n_rs_seq; 0 where the model has no support)
    n_rs_seq: int = 0


def default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    # llama.cpp runs best on physical cores; hyper-threaded machines report twice as many
    return max(1, n // 2) if n >= 8 else max(1, n)


class HostMemory(Protocol):
    """Host memory for sequence states (the engine's pinned arena, `fitting.host_buffers`)."""

    def empty(self, size: int) -> np.ndarray:
        """An uninitialized uint8 array of `size` bytes."""

    def close(self) -> None:
        """Its context is gone."""


class OrdinaryMemory:
    """Host memory of plain numpy arrays: a context whose states need no page-locked memory."""

    pinned = False

    def empty(self, size: int) -> np.ndarray:
        return np.empty(size, dtype=np.uint8)

    def close(self) -> None:
        pass


class Context:
    """A llama_context with one sequence per slot. Owned by the engine thread."""

    def __init__(
        self, model: Model, params: ContextParams, *, host: HostMemory | None = None, ctx_type: int = 0, other: "Context | None" = None,
    ) -> None:
        """`host`: where its states are copied by default (None: ordinary memory); the
        context owns it from here, and closes it with itself, or at once if it cannot be made.
        `ctx_type` and `other`: libllama's context type, and the context it is made
        against (an MTP context and its target; see mtp.py)."""
        self.host = host if host is not None else OrdinaryMemory()
        try:
            self._make(model, params, ctx_type, other)
        except BaseException:
            self.close()
            raise

    def _make(self, model: Model, params: ContextParams, ctx_type: int, other: "Context | None") -> None:
        self.model = model
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = min(params.n_ubatch, params.n_batch)
        cp.n_seq_max = params.n_seq_max
        threads = params.n_threads or default_threads()
        cp.n_threads = threads
        cp.n_threads_batch = params.n_threads_batch or threads
        cp.flash_attn_type = FLASH_ATTN[params.flash_attn]
        cp.type_k = KV_TYPES[params.type_k]
        cp.type_v = KV_TYPES[params.type_v]
        cp.swa_full = params.swa_full
        cp.kv_unified = params.kv_unified
        cp.n_rs_seq = params.n_rs_seq
        cp.no_perf = True
        if ctx_type:
            cp.ctx_type = ctx_type
            cp.ctx_other = other.ptr if other is not None else None
        ctx = llama_cpp.llama_init_from_model(model.ptr, cp)
        if not ctx:
            raise LlamaError("llama.cpp could not create the context (out of memory? see the log above)")
        self.ptr = ctx
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.params = params
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(ctx))
        self.n_seq_max = int(llama_cpp.llama_n_seq_max(ctx))
        self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(ctx))  # 0 where the model's memory has none
        # sequences that a seq_rm took back to a snapshot: llama.cpp switches them to it at
        # their next decode, and until then a seq_cp from them would copy the state before it
        self._rolled_back: set[int] = set()
        self.unified = params.kv_unified
        self.n_threads = threads
        self.n_vocab = model.n_vocab
        self.memory_kind = classify_memory(model.info, params.swa_full)

    def decode(self, batch: "Batch") -> int:
        """0 ok; 1 no KV space (memory is unchanged); other values are errors."""
        rc = int(llama_cpp.llama_decode(self.ptr, batch.struct(batch.n)))
        if rc == 0 and self._rolled_back:
            self._rolled_back.difference_update(batch.seq_ids(batch.n).tolist())
        return rc

    def synchronize(self) -> None:
        """Wait for the device to finish the work launched so far."""
        llama_cpp.llama_synchronize(self.ptr)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        ok = bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))
        if ok and self.n_rs_seq and p0 > 0:
            self._rolled_back.add(seq)  # (or nothing was there to take back: harmless)
        return ok

    def seq_clear(self, seq: int) -> None:
        ok = llama_cpp.llama_memory_seq_rm(self.mem, seq, -1, -1)
        assert ok, "removing a whole sequence never fails"
        self._rolled_back.discard(seq)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src in self._rolled_back:  # make the snapshot the state itself first
            self.state_set(src, self.state_get(src, partial=True), partial=True)
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the sequence's cells at positions [p0, p1) by `delta` (their keys rotated to
        the new positions at the next decode). Only where `shift_refusal()` is None."""
        llama_cpp.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def shift_refusal(self) -> str | None:
        """Why cells of a sequence cannot be moved to other positions (`seq_add`), in words;
        None when they can: attention memory without a sliding window, which llama.cpp can
        shift, with one position per token."""
        if self.memory_kind is not MemoryKind.ATTENTION:
            return f"its memory is {self.memory_kind.value}, not plain attention"
        if self.model.info.n_swa > 0:
            return "its attention has a sliding window"
        if not llama_cpp.llama_memory_can_shift(self.mem):
            return "llama.cpp cannot shift its memory"
        if llama_cpp.llama_model_rope_type(self.model.ptr) in _MULTI_ROPE:
            return "its positions are multimodal (M-RoPE)"
        return None

    def seq_pos_min(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq))

    def state_size(self, seq: int) -> int:
        """Bytes of a sequence's whole state (what state_get copies)."""
        return int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, 0))

    def state_get(self, seq: int, *, partial: bool, empty: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
        """A copy of a sequence's state: everything, or only its non-truncatable part, in
        `empty(n)` (default: its host memory)."""
        flags = PARTIAL_ONLY if partial else 0
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, flags))
        buf = (empty or self.host.empty)(size)
        ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_get_data_ext(self.ptr, ptr, size, seq, flags))
        if n == 0 and size > 0:
            raise LlamaError(f"could not read the state of sequence {seq}")
        return buf[:n]

    def state_set(self, seq: int, data: np.ndarray, *, partial: bool) -> bool:
        flags = PARTIAL_ONLY if partial else 0
        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_set_data_ext(self.ptr, ptr, data.nbytes, seq, flags))
        self._rolled_back.discard(seq)
        return n > 0

    def prepare_outputs(self, index: int) -> None:
        """Settle the outputs of the last decode (llama.cpp reorders its rows on the first
        read), so that other threads may then read rows side by side."""
        llama_cpp.llama_get_logits_ith(self.ptr, index)

    def logits(self, index: int) -> np.ndarray:
        """A copy of the logits of the batch output at `index`."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
        if getattr(self, "host", None) is not None:
            self.host.close()


class Batch:
    """A llama_batch whose arrays are numpy buffers, so chunks are written without Python loops."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.n = 0
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        # each token points at one entry of `seq_values`, the constant array 0..n_seq_max-1
        self.seq_values = np.arange(n_seq_max, dtype=np.int32)
        self.seq_ptrs = np.zeros(capacity, dtype=np.uintp)
        self._seq_base = self.seq_values.ctypes.data
        self._struct = llama_cpp.llama_batch()
        s = self._struct
        s.token = self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        s.embd = ctypes.POINTER(ctypes.c_float)()
        s.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        s.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        s.seq_id = ctypes.cast(self.seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id)))
        s.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    @property
    def free(self) -> int:
        return self.capacity - self.n

    def clear(self) -> None:
        self.n = 0

    def add(self, tokens: Sequence[int], pos0: int, seq: int, *, logits_last: bool, logits_all: bool = False) -> int:
        """Append tokens at positions pos0.. for `seq`. Returns the batch index of the last one.
        `logits_all`: logits for every token (a draft to verify), not only the last."""
        k = len(tokens)
        assert 0 < k <= self.free, (k, self.free)
        i, j = self.n, self.n + k
        self.token[i:j] = tokens
        self.pos[i:j] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq_ptrs[i:j] = self._seq_base + 4 * seq
        self.logits[i:j] = 1 if logits_all else 0
        if logits_last:
            self.logits[j - 1] = 1
        self.n = j
        return j - 1

    def seq_ids(self, n: int) -> np.ndarray:
        """The sequence id of each of the first n tokens."""
        return (self.seq_ptrs[:n] - self._seq_base) // 4

    def struct(self, n: int) -> llama_cpp.llama_batch:
        self._struct.n_tokens = n
        return self._struct
