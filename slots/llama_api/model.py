"""A loaded GGUF model, its metadata and vocabulary, and what its memory is made of."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
import enum
import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .backend import LlamaError, init_backend
from .grammar_templates import GrammarTemplates
from .placement import Placement, PlacementParams

log = logging.getLogger("warmslot.llama")

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


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The vocabulary's fill-in-the-middle tokens (llama_vocab_fim_*); -1 where it has none.
    `pre`, `suf` and `mid` make a FIM prompt; `rep` (repository name) and `sep` (file
    separator) make the repository-level layout where the vocabulary has them."""

    pre: int = -1
    suf: int = -1
    mid: int = -1
    pad: int = -1
    rep: int = -1
    sep: int = -1

    def missing(self) -> list[str]:
        """Which of the three a FIM prompt needs the vocabulary lacks (empty: it can infill)."""
        return [name for name, token in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid)) if token < 0]


# bytes per element of each KV cache type (block types: block bytes / 32 elements)
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
    "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32,
}


def kv_bytes_per_token(number: Callable[[str], int | None], type_k: str, type_v: str) -> int | None:
    """Bytes of attention KV cache one token takes in every layer, from the architecture's
    metadata numbers (`number("block_count")`: the value of `{arch}.block_count`, None when
    absent or not one number); None when they do not say."""
    n_layer, n_head, n_head_kv = number("block_count"), number("attention.head_count"), number("attention.head_count_kv")
    n_embd = number("embedding_length")
    if None in (n_layer, n_head, n_head_kv, n_embd) or n_head == 0:
        return None
    k_len = number("attention.key_length") or n_embd // n_head
    v_len = number("attention.value_length") or n_embd // n_head
    per_layer = n_head_kv * (k_len * KV_TYPE_BYTES[type_k] + v_len * KV_TYPE_BYTES[type_v])
    return int(attention_layers(number) * per_layer)


def attention_layers(number: Callable[[str], int | None]) -> int:
    """Layers with a KV cache: every layer, or every `full_attention_interval`-th one of a
    hybrid that says so in its metadata (Qwen3.5, Qwen3-Next: the others are recurrent)."""
    n_layer = number("block_count") or 0
    interval = number("full_attention_interval")
    return n_layer // interval if interval else n_layer


def recurrent_bytes_per_seq(number: Callable[[str], int | None]) -> int:
    """Bytes of one sequence's recurrent state (convolution and SSM state, f32, as llama.cpp
    keeps them) in a model whose metadata gives its SSM sizes; 0 when it does not."""
    d_conv, d_inner, d_state = number("ssm.conv_kernel"), number("ssm.inner_size"), number("ssm.state_size")
    if not d_inner or not d_state:
        return 0
    n_group = number("ssm.group_count") or 0
    n_layer = number("block_count") or 0
    recurrent_layers = n_layer - attention_layers(number) if number("full_attention_interval") else n_layer
    conv = max(0, (d_conv or 0) - 1) * (d_inner + 2 * n_group * d_state)
    return 4 * (conv + d_state * d_inner) * recurrent_layers


def load_mode(use_mmap: bool, use_mlock: bool) -> int:
    """llama.cpp's one load mode for --no-mmap (read the weights into memory instead of
    mapping the file) and --mlock (keep them in RAM, never paged out)."""
    if use_mlock:
        return llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if use_mmap else llama_cpp.LLAMA_LOAD_MODE_MLOCK
    return llama_cpp.LLAMA_LOAD_MODE_AUTO if use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE


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


def amx_in_vm() -> bool:
    """Whether the CPU advertises AMX inside a virtual machine. Tile instructions can fault
    there (the guest's extended state lacks the tile data), and llama.cpp's AMX buffer type
    then ends the process with SIGILL at the first matrix product."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_tile" in flags and "hypervisor" in flags


def model_params(repack: bool | None = None):
    """llama.cpp's default model parameters, with weight repacking (its CPU extra buffer
    types: AMX, interleaved quants) only when `repack` is True (--repack).

    Repacked weights are multiplied by kernels that sum a batch of tokens in another order
    than one token alone: a token then gets other logits decoded in a batch than decoded by
    itself, and a conversation that comes back from the prompt cache (its new tokens decoded
    alone) can answer otherwise than the same prompt decoded cold. On 2 cores of an AMD EPYC
    with AVX-512, Gemma 3 270M (Q4_K) answered a conversation back from the prompt cache
    otherwise than cold, and pooled a batch of inputs up to 0.015 away from each alone; and
    gave no speed for it: llama-bench gave 603 against 636 prompt and 74 against 79
    generated tokens/s with repacking than without. Every model
    this process decodes with is loaded so."""
    params = llama_cpp.llama_model_default_params()
    if repack and amx_in_vm():
        log.warning("--repack: the CPU offers AMX inside a virtual machine, where AMX tiles can fault")
    params.use_extra_bufts = bool(repack)
    return params


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(
        self,
        path: str,
        *,
        n_gpu_layers: int = -1,
        progress: Callable[[float], None] | None = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        placement: Placement | None = None,
        repack: bool | None = None,
        load_mtp: bool = False,
    ) -> None:
        """`load_mtp`: load the multi-token-prediction layers a model carries (mtp.py).
        `placement`: split mode, tensor split, devices and RPC servers (default: llama.cpp's).
        `repack`: llama.cpp's CPU buffer types that repack weights (AMX, interleaved quants);
        None: off (see `model_params`)."""
        init_backend()
        self.grammars = GrammarTemplates()  # compiled once per grammar, copied per request
        if not os.path.isfile(path):
            raise LlamaError(f"model file not found: {path}")
        params = model_params(repack)
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.load_mode = load_mode(use_mmap, use_mlock)
        params.load_mtp = load_mtp
        self._placement = None
        if placement is not None:
            self._placement = PlacementParams(placement)  # the arrays params point to
            self._placement.apply(params)
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
        # each token's bytes, as asked for: with special tokens rendered, and without
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self.sep = int(llama_cpp.llama_vocab_sep(self.vocab))
        self.add_sep = bool(llama_cpp.llama_vocab_get_add_sep(self.vocab))
        v = self.vocab
        self.fim = FimTokens(
            int(llama_cpp.llama_vocab_fim_pre(v)), int(llama_cpp.llama_vocab_fim_suf(v)), int(llama_cpp.llama_vocab_fim_mid(v)),
            int(llama_cpp.llama_vocab_fim_pad(v)), int(llama_cpp.llama_vocab_fim_rep(v)), int(llama_cpp.llama_vocab_fim_sep(v)),
        )
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

    def named_template(self, name: str) -> str | None:
        """A named template of the model's metadata (`tokenizer.chat_template.NAME`), or None."""
        template = llama_cpp.llama_model_chat_template(self.ptr, name.encode())
        return template.decode("utf-8") if template else None

    @property
    def n_head(self) -> int:
        """Attention heads of the first layer (0 for a model without attention)."""
        return int(llama_cpp.llama_model_n_head(self.ptr))

    def kv_bytes_per_token(self, type_k: str, type_v: str) -> int | None:
        """Bytes of attention KV cache one token takes in every layer, from the model's
        metadata; None when the metadata does not say (per-layer head counts, say)."""
        return kv_bytes_per_token(self._number, type_k, type_v)

    def recurrent_bytes_per_seq(self) -> int:
        """Bytes of one sequence's recurrent state, from the metadata (0: none, or unknown)."""
        return recurrent_bytes_per_seq(self._number) if self.info.is_recurrent or self.info.is_hybrid else 0

    def _number(self, key: str) -> int | None:
        value = self.meta(f"{self.info.arch}.{key}")
        return int(value) if value is not None and value.strip().isdigit() else None

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
        """The bytes of one token. With special=False, control tokens render as b"". An id
        outside the vocabulary (an image's placeholder) renders as b"" too.

        NOTE: a reply that carries its prompt's text (/completion's `prompt`) renders every
        prompt token: through ctypes, 18K tokens took 50 ms of the event loop's thread. A
        token's bytes never change, so each is read from llama.cpp once (a dict's set is
        atomic, so threads that race write the same bytes)."""
        pieces = self._pieces[special]
        piece = pieces.get(token)
        if piece is None:
            piece = pieces[token] = self._read_piece(token, special)
        return piece

    def longest_piece(self) -> int:
        """Bytes of the vocabulary's longest token (special tokens as text), at least 1: one
        llama.cpp call per token into one buffer, nothing kept (about 0.6 s of a CPU core for
        a 262K vocabulary)."""
        buf = ctypes.create_string_buffer(256)
        to_piece, vocab, longest = llama_cpp.llama_token_to_piece, self.vocab, 1
        for token in range(self.n_vocab):
            n = abs(to_piece(vocab, token, buf, len(buf), 0, True))  # < 0: the piece is longer than buf
            if n > longest:
                longest = n
        return longest

    def _read_piece(self, token: int, special: bool) -> bytes:
        if not 0 <= token < self.n_vocab:
            return b""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        pieces, out = self._pieces[special], []
        for token in tokens:
            piece = pieces.get(token)
            if piece is None:
                piece = pieces[token] = self._read_piece(token, special)
            out.append(piece)
        return b"".join(out).decode("utf-8", errors="replace")

    def is_special(self, token: int) -> bool:
        """Whether the tokenizer treats the token as special text (control, user-defined or
        unknown), i.e. splits raw text around it when parsing special tokens."""
        attr = int(llama_cpp.llama_vocab_get_attr(self.vocab, token))
        return bool(attr & _SPECIAL_ATTRS)

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token."""
        return [int(t) for t in np.flatnonzero(self._eog)]

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token]) if 0 <= token < self.n_vocab else False

    def token_text(self, token: int) -> str:
        """The vocabulary's own text for a token (e.g. '<end_of_turn>')."""
        return (llama_cpp.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", errors="replace")

    def close(self) -> None:
        if getattr(self, "grammars", None) is not None:
            self.grammars.clear()  # they point at the vocabulary
        if getattr(self, "ptr", None):
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


def classify_memory(info: ModelInfo, swa_full: bool) -> MemoryKind:
    if info.is_hybrid:
        return MemoryKind.HYBRID
    if info.is_recurrent:
        return MemoryKind.RECURRENT
    if info.n_swa > 0 and not swa_full:
        return MemoryKind.SWA
    return MemoryKind.ATTENTION
