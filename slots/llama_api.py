"""The one seam between warmslot and llama.cpp.

Every ctypes call into llama-cpp-python's low-level API lives in this module. The rest of
the engine talks to the small typed classes below: `Model`, `Context`, `Batch`, `Sampler`.

Threading: a `Context` (and its `Batch` and `Sampler`s) belongs to the engine thread.
`Model.tokenize` and `Model.token_piece` only read the vocabulary and may be called from
worker threads, as llama.cpp's own server does.

NOTE: llama_cpp must be imported before numpy. With some numpy builds, loading a model
segfaults when numpy was imported first, so this module imports llama_cpp on its first line
and `slots/__init__.py` imports this module first.
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the module docstring)

import ctypes
import enum
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .grammar import GrammarError, GrammarSpec, shape_error
from .host_buffers import HostBuffers
from .native_log import NativeLog
from .sampling import SamplingParams

log = logging.getLogger("warmslot.llama")

_native = NativeLog()


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    _native.write(level, text.decode("utf-8", errors="replace"))


_backend_lock = threading.Lock()
_backend_ready = False


def init_backend() -> None:
    """Initialize llama.cpp once per process and route its log into Python logging."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


class _CudaHost:
    """ggml's CUDA host buffer type (page-locked memory), as `host_buffers.PinnedAllocator`."""

    def __init__(self, cuda: ctypes.CDLL, base: ctypes.CDLL) -> None:
        cuda.ggml_backend_cuda_host_buffer_type.restype = ctypes.c_void_p
        cuda.ggml_backend_cuda_host_buffer_type.argtypes = []
        base.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
        base.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        base.ggml_backend_buffer_get_base.restype = ctypes.c_void_p
        base.ggml_backend_buffer_get_base.argtypes = [ctypes.c_void_p]
        base.ggml_backend_buffer_free.restype = None
        base.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
        self.buft = cuda.ggml_backend_cuda_host_buffer_type()
        self.alloc = base.ggml_backend_buft_alloc_buffer
        self.base = base.ggml_backend_buffer_get_base
        self.free = base.ggml_backend_buffer_free

    def allocate(self, size: int) -> int:
        return self.alloc(self.buft, size) or 0

    def address(self, handle: int) -> int:
        return self.base(handle)

    def view(self, address: int, size: int):
        return (ctypes.c_uint8 * size).from_address(address)


def cuda_host_allocator() -> _CudaHost | None:
    """ggml's CUDA pinned host allocator, when llama.cpp was built with CUDA and sees a GPU."""
    if not llama_cpp.llama_supports_gpu_offload():
        return None
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        cuda = ctypes.CDLL(os.path.join(lib_dir, "libggml-cuda.so"))
        base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
        host = _CudaHost(cuda, base)
    except (OSError, AttributeError) as exc:
        log.info("no pinned host memory for states (%s)", exc)
        return None
    return host if host.buft else None


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    kind: str  # cpu, gpu, igpu or accel
    free: int  # bytes
    total: int


_DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel")  # enum ggml_backend_dev_type


def devices() -> list[Device]:
    """The devices ggml sees, with their free and total memory."""
    init_backend()
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        reg = ctypes.CDLL(os.path.join(lib_dir, "libggml.so"))  # the device registry
        base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))  # the device interface
        reg.ggml_backend_dev_count.restype = ctypes.c_size_t
        reg.ggml_backend_dev_get.restype = ctypes.c_void_p
        reg.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        base.ggml_backend_dev_type.restype = ctypes.c_int
        base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_name.restype = ctypes.c_char_p
        base.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_memory.restype = None
        base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    except (OSError, AttributeError) as exc:
        log.warning("cannot list devices (%s)", exc)
        return []
    out = []
    for i in range(reg.ggml_backend_dev_count()):
        dev = reg.ggml_backend_dev_get(i)
        kind = base.ggml_backend_dev_type(dev)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = base.ggml_backend_dev_name(dev).decode()
        out.append(Device(name, _DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else "other", free.value, total.value))
    return out


def gpu_memory() -> list[Device]:
    """The GPUs ggml sees (none without GPU offload)."""
    return [d for d in devices() if d.kind == "gpu"]


class MemoryKind(enum.Enum):
    """What the model's sequence memory is made of, which decides how a prefix is reused."""

    ATTENTION = "attention"  # any suffix can be removed
    SWA = "swa"  # sliding-window cache: positions before the window are gone
    RECURRENT = "recurrent"  # one state per sequence (Mamba, RWKV)
    HYBRID = "hybrid"  # attention layers plus recurrent layers

    @property
    def truncatable(self) -> bool:
        """True when `seq_rm(seq, n, -1)` is valid for any n the sequence holds."""
        return self is MemoryKind.ATTENTION


KV_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": 30,  # GGML_TYPE_BF16
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}

FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

PARTIAL_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

# token attributes of the tokens llama.cpp splits text around when parsing special tokens
_SPECIAL_ATTRS = (1 << 0) | (1 << 3) | (1 << 4)  # unknown, control, user-defined


# bytes per element of each KV cache type (block types: block bytes / 32 elements)
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
    "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32,
}


class LlamaError(RuntimeError):
    """llama.cpp refused an operation (a model that does not load, a context it cannot make)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: str
    arch: str
    name: str
    description: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_swa: int
    is_recurrent: bool
    is_hybrid: bool
    size_bytes: int
    n_params: int
    chat_template: str | None
    fingerprint: str


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(
        self,
        path: str,
        *,
        n_gpu_layers: int = -1,
        progress: Callable[[float], None] | None = None,
        vocab_only: bool = False,
    ) -> None:
        init_backend()
        if not os.path.isfile(path):
            raise LlamaError(f"model file not found: {path}")
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        self._progress_cb = None
        if progress is not None:

            def on_progress(value: float, user_data: ctypes.c_void_p) -> bool:
                progress(float(value))
                return True

            self._progress_cb = llama_cpp.llama_progress_callback(on_progress)
            params.progress_callback = self._progress_cb
        model = llama_cpp.llama_model_load_from_file(path.encode("utf-8"), params)
        if not model:
            raise LlamaError(f"llama.cpp could not load the model {path} (see the log above)")
        self.ptr = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._eog = np.fromiter(
            (bool(llama_cpp.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)),
            dtype=bool,
            count=self.n_vocab,
        )
        self.info = self._read_info(path)

    # -- metadata -------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def _read_info(self, path: str) -> ModelInfo:
        m = self.ptr
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(m, desc, len(desc))
        template = llama_cpp.llama_model_chat_template(m, None)
        arch = self.meta("general.architecture") or "unknown"
        stat = os.stat(path)
        info = dict(
            path=os.path.realpath(path),
            arch=arch,
            name=self.meta("general.name") or os.path.basename(path),
            description=desc.value.decode("utf-8", errors="replace"),
            n_vocab=self.n_vocab,
            n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(m)),
            n_embd=int(llama_cpp.llama_model_n_embd(m)),
            n_layer=int(llama_cpp.llama_model_n_layer(m)),
            n_swa=int(llama_cpp.llama_model_n_swa(m)),
            is_recurrent=bool(llama_cpp.llama_model_is_recurrent(m)),
            is_hybrid=bool(llama_cpp.llama_model_is_hybrid(m)),
            size_bytes=int(llama_cpp.llama_model_size(m)),
            n_params=int(llama_cpp.llama_model_n_params(m)),
            chat_template=template.decode("utf-8") if template else None,
        )
        digest = hashlib.sha256(
            repr((info["path"], stat.st_size, int(stat.st_mtime), arch, info["n_params"])).encode()
        ).hexdigest()[:16]
        return ModelInfo(**info, fingerprint=digest)

    def kv_bytes_per_token(self, type_k: str, type_v: str) -> int | None:
        """Bytes of attention KV cache one token takes in every layer, from the model's
        metadata; None when the metadata does not say (per-layer head counts, say)."""
        arch = self.info.arch

        def number(key: str) -> int | None:
            value = self.meta(f"{arch}.{key}")
            return int(value) if value is not None and value.strip().isdigit() else None

        n_layer, n_head, n_head_kv = number("block_count"), number("attention.head_count"), number("attention.head_count_kv")
        n_embd = number("embedding_length")
        if None in (n_layer, n_head, n_head_kv, n_embd) or n_head == 0:
            return None
        k_len = number("attention.key_length") or n_embd // n_head
        v_len = number("attention.value_length") or n_embd // n_head
        per_layer = n_head_kv * (k_len * KV_TYPE_BYTES[type_k] + v_len * KV_TYPE_BYTES[type_v])
        return int(n_layer * per_layer)

    # -- vocabulary (thread-safe: read-only) ------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:
                raise LlamaError("tokenization failed")
        return list(buf[:n])

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        """The bytes of one token. With special=False, control tokens render as b""."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        return b"".join(self.token_piece(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def is_special(self, token: int) -> bool:
        """Whether the tokenizer treats the token as special text (control, user-defined or
        unknown), i.e. splits raw text around it when parsing special tokens."""
        attr = int(llama_cpp.llama_vocab_get_attr(self.vocab, token))
        return bool(attr & _SPECIAL_ATTRS)

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token]) if 0 <= token < self.n_vocab else False

    def token_text(self, token: int) -> str:
        """The vocabulary's own text for a token (e.g. '<end_of_turn>')."""
        return (llama_cpp.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", errors="replace")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


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
    pinned_states: bool = True  # page-locked host memory for states when on a CUDA GPU
    pinned_limit: int = 16 << 30  # at most this much of it


def default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    # llama.cpp runs best on physical cores; hyper-threaded machines report twice as many
    return max(1, n // 2) if n >= 8 else max(1, n)


class Context:
    """A llama_context with one sequence per slot. Owned by the engine thread."""

    def __init__(self, model: Model, params: ContextParams) -> None:
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
        cp.no_perf = True
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
        self.unified = params.kv_unified
        self.n_threads = threads
        self.n_vocab = model.n_vocab
        self.memory_kind = classify_memory(model.info, params.swa_full)
        allocator = cuda_host_allocator() if params.pinned_states else None
        self.host = HostBuffers(allocator, limit=params.pinned_limit)

    def decode(self, batch: "Batch") -> int:
        """0 ok; 1 no KV space (memory is unchanged); other values are errors."""
        return int(llama_cpp.llama_decode(self.ptr, batch.struct(batch.n)))

    def synchronize(self) -> None:
        """Wait for the device to finish the work launched so far."""
        llama_cpp.llama_synchronize(self.ptr)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_clear(self, seq: int) -> None:
        ok = llama_cpp.llama_memory_seq_rm(self.mem, seq, -1, -1)
        assert ok, "removing a whole sequence never fails"

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_min(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq))

    def seq_pos_max(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq))

    def state_get(self, seq: int, *, partial: bool) -> np.ndarray:
        """A copy of a sequence's state: everything, or only its non-truncatable part."""
        flags = PARTIAL_ONLY if partial else 0
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, flags))
        buf = self.host.empty(size)
        ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_get_data_ext(self.ptr, ptr, size, seq, flags))
        if n == 0 and size > 0:
            raise LlamaError(f"could not read the state of sequence {seq}")
        return buf[:n]

    def state_set(self, seq: int, data: np.ndarray, *, partial: bool) -> bool:
        flags = PARTIAL_ONLY if partial else 0
        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_set_data_ext(self.ptr, ptr, data.nbytes, seq, flags))
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


def classify_memory(info: ModelInfo, swa_full: bool) -> MemoryKind:
    if info.is_hybrid:
        return MemoryKind.HYBRID
    if info.is_recurrent:
        return MemoryKind.RECURRENT
    if info.n_swa > 0 and not swa_full:
        return MemoryKind.SWA
    return MemoryKind.ATTENTION


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

    def add(self, tokens: Sequence[int], pos0: int, seq: int, *, logits_last: bool) -> int:
        """Append tokens at positions pos0.. for `seq`. Returns the batch index of the last one."""
        k = len(tokens)
        assert 0 < k <= self.free, (k, self.free)
        i, j = self.n, self.n + k
        self.token[i:j] = tokens
        self.pos[i:j] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq_ptrs[i:j] = self._seq_base + 4 * seq
        self.logits[i:j] = 0
        if logits_last:
            self.logits[j - 1] = 1
        self.n = j
        return j - 1

    def struct(self, n: int) -> llama_cpp.llama_batch:
        self._struct.n_tokens = n
        return self._struct


class Sampler:
    """A native llama.cpp sampler chain for one request."""

    _token_ids: np.ndarray | None = None

    def __init__(self, model: Model, params: SamplingParams) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        self.n_vocab = model.n_vocab
        try:
            for smpl in self._build(model, params):
                llama_cpp.llama_sampler_chain_add(self.ptr, smpl)
        except BaseException:
            self.close()
            raise

    def _build(self, model: Model, p: SamplingParams):
        if p.grammar is not None:
            yield self._grammar(model, p.grammar)
        if p.logit_bias:
            n = len(p.logit_bias)
            arr = (llama_cpp.llama_logit_bias * n)()
            for i, (tok, bias) in enumerate(p.logit_bias.items()):
                arr[i].token = tok
                arr[i].bias = bias
            yield llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, n, arr)
        if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            yield llama_cpp.llama_sampler_init_penalties(
                self.n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        if p.greedy:
            yield llama_cpp.llama_sampler_init_greedy()
            return
        if p.top_k > 0:
            yield llama_cpp.llama_sampler_init_top_k(p.top_k)
        if p.top_p < 1.0:
            yield llama_cpp.llama_sampler_init_top_p(p.top_p, 1)
        if p.min_p > 0.0:
            yield llama_cpp.llama_sampler_init_min_p(p.min_p, 1)
        yield llama_cpp.llama_sampler_init_temp(p.temperature)
        seed = llama_cpp.LLAMA_DEFAULT_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        yield llama_cpp.llama_sampler_init_dist(seed)

    @staticmethod
    def _grammar(model: Model, spec: GrammarSpec):
        error = shape_error(spec.grammar)
        if error is not None:
            raise GrammarError(error)
        smpl = _init_grammar(model, spec)
        if not smpl:
            raise GrammarError("llama.cpp could not parse the grammar")
        return smpl

    def sample(self, ctx: Context, index: int) -> int:
        """Sample from the logits of batch output `index`; the chain accepts the token."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, index))

    def sample_logits(self, logits: np.ndarray) -> int:
        """Sample from saved logits (same chain, same acceptance as `sample`)."""
        n = logits.shape[0]
        if Sampler._token_ids is None or Sampler._token_ids.shape[0] != n:
            Sampler._token_ids = np.arange(n, dtype=np.int32)
        data = np.zeros(n, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        data["id"] = Sampler._token_ids
        data["logit"] = logits
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=n,
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        assert 0 <= arr.selected < arr.size, "the chain ends in a selecting sampler"
        chosen = ctypes.cast(arr.data, ctypes.POINTER(llama_cpp.llama_token_data))[arr.selected]
        token = int(chosen.id)
        llama_cpp.llama_sampler_accept(self.ptr, token)
        return token

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


def trigger_tokens(model: Model, texts: Sequence[str]) -> list[int]:
    """The ids of the trigger texts that are exactly one token of the vocabulary."""
    ids = []
    for text in texts:
        tokens = model.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1:
            ids.append(tokens[0])
    return ids


def _init_grammar(model: Model | None, spec: GrammarSpec):
    """A native grammar sampler for `spec`, or NULL when llama.cpp rejects it. Without a model
    the grammar is compiled without a vocabulary, and trigger texts are left out."""
    vocab = model.vocab if model is not None else None
    text, root = spec.grammar.encode(), spec.root.encode()
    if not spec.lazy:
        return llama_cpp.llama_sampler_init_grammar(vocab, text, root)
    tokens = trigger_tokens(model, spec.trigger_texts) if model is not None else []
    patterns = [pattern.encode() for pattern in spec.trigger_patterns]
    pats = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
    toks = (llama_cpp.llama_token * max(1, len(tokens)))(*tokens)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, text, root, pats, len(patterns), toks, len(tokens))


def check_grammar(model: Model | None, spec: GrammarSpec) -> str | None:
    """Why llama.cpp would refuse `spec`, or None when it compiles (with `model`'s vocabulary,
    or none).

    A grammar beyond the limits of `grammar.shape_error` is refused without calling llama.cpp,
    whose compiler would otherwise run unbounded or overflow its stack. Thread-safe (it only
    reads the vocabulary); within the limits compiling takes up to a few tenths of a second,
    so call it off the event loop.
    """
    error = shape_error(spec.grammar)
    if error is not None:
        return error
    sampler = _init_grammar(model, spec)
    if not sampler:
        return "llama.cpp could not parse the grammar"
    llama_cpp.llama_sampler_free(sampler)
    return None
