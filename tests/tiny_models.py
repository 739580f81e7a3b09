"""Tiny random-weight GGUF models, one per memory kind.

The engine's prefix-reuse tests need real llama.cpp models whose memory
behaves like the big ones (plain KV cache, sliding-window KV cache,
recurrent state, hybrid KV + recurrent state) but that load and run in
milliseconds.  This module writes such models with the ``gguf`` package:

========== ========= ==================================================
kind       arch      memory
========== ========= ==================================================
attention  llama     KV cache; any suffix can be removed
swa        gemma3    iSWA cache: 4 local layers (window 8), 2 global
recurrent  mamba2    recurrent state only
hybrid     qwen35    3 Gated DeltaNet layers + 1 full-attention layer
moe        qwen3moe  KV cache; each layer's FFN is 4 experts, 2 used
mrope      qwen3vl   KV cache, M-RoPE positions (an image takes fewer positions than tokens)
========== ========= ==================================================

``write_tiny_model(kind, path, poison="nan")`` (or ``"inf"``) writes a model of any kind whose
logits cannot be sampled: all NaN, or a +inf and a -inf in every row (``POISONS``).

``write_tiny_mmproj`` writes a vision projector (a 2-layer CLIP ViT with a LLaVA MLP
projector) whose output width matches every kind: ``--mmproj`` with any of them.
``moe`` and ``mrope`` are not among ``KINDS`` (their memory is plain attention): the tests of
expert placement and of M-RoPE images ask for them by name. ``write_tiny_mmproj(projector="qwen2vl")``
writes a Qwen2-VL vision tower instead, whose images take max(width, height) positions in
models with M-RoPE positions (``mrope``, ``hybrid``) where they have width x height tokens.

``write_tiny_model_with_vocab(path, vocab)`` writes the attention kind with a real tokenizer
copied from a llama.cpp vocabulary file (``ggml-vocab-*.gguf``): the /infill tests use
deepseek-coder's, which has fill-in-the-middle tokens.

All models of ``write_tiny_model`` share a byte-level ``gpt2`` BPE vocabulary of 264 tokens: the
256 bytes (token id == byte value), 4 merged tokens (``Ġt``, ``he``,
``in``, ``Ġthe``), and the specials ``<|bos|>`` (260), ``<|endoftext|>`` (261, EOS),
``<|im_start|>`` (262) and ``<|im_end|>`` (263), with a ChatML template.
Any text tokenizes and detokenizes losslessly.

Weights are F32, drawn from ``numpy.random.default_rng(seed)`` and scaled
so that activations stay finite and greedy decoding does not collapse onto
one token; norm weights are 1.  The output layer only favours printable
ASCII, newline and the merged tokens (see ``_OUTPUT_MASK``): greedy
decoding produces ASCII text and never emits EOS, so generation runs until
``max_tokens`` unless EOS is biased.  The same kind and seed give a
byte-identical file.

Usage::

    from tests.tiny_models import write_tiny_model, KINDS
    path = write_tiny_model("hybrid", tmp_path / "hybrid.gguf", seed=0)

    python tests/tiny_models.py OUT_DIR [--seed N]   # writes OUT_DIR/tiny-<kind>.gguf

Note: this module imports numpy (through ``gguf``).  A process that also
loads models through ``llama_cpp`` must ``import llama_cpp`` *before*
importing this module (or numpy), otherwise the native library may fail to
load or misbehave.  Generating files needs no ``llama_cpp`` at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
from typing import Callable

import gguf
import numpy as np

KINDS = ("attention", "swa", "recurrent", "hybrid")

ARCHS = {
    "moe": "qwen3moe",
    "attention": "llama",
    "swa": "gemma3",
    "recurrent": "mamba2",
    "hybrid": "qwen35",
    "hybrid-mtp": "qwen35",
    "mrope": "qwen3vl",
}

# --------------------------------------------------------------------------
# vocabulary

N_BYTES = 256
MERGES = ["Ġ t", "h e", "i n", "Ġt he"]
MERGED = [m.replace(" ", "") for m in MERGES]
SPECIALS = ["<|bos|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_ID = N_BYTES + len(MERGED)  # 260
EOS_ID = BOS_ID + 1  # 261
IM_START_ID = BOS_ID + 2  # 262
IM_END_ID = BOS_ID + 3  # 263
N_VOCAB = N_BYTES + len(MERGED) + len(SPECIALS)  # 264

# Tokens the output layer can favour: printable ASCII, newline and the merged tokens.
# The others (specials, control and non-ASCII bytes) get all-zero output rows, so their
# logit is always 0 while the favoured ones have a spread of about 1.8 and a maximum
# around +5: greedy decoding yields ASCII text and never stops by itself (bias EOS to
# test stopping); sampling at temperature 1 picks one of the others about 4% of the
# time (EOS about 0.03%).
_OUTPUT_MASK = np.zeros(N_VOCAB, dtype=bool)
_OUTPUT_MASK[32:127] = True
_OUTPUT_MASK[ord("\n")] = True
_OUTPUT_MASK[N_BYTES : N_BYTES + len(MERGED)] = True

# Models whose logits cannot be sampled (``write_tiny_model(..., poison=...)``):
# "nan": the output norm's weights are NaN, so every logit is NaN (as after a broken
# quantization or an fp16 overflow); "inf": every row has +inf for one of INF_TOKENS and
# -inf for the other, the rest finite.
POISONS = ("nan", "inf")
INF_TOKENS = (ord("a"), ord("b"))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _add_vocab(w: gguf.GGUFWriter) -> None:
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(N_BYTES)] + MERGED + SPECIALS
    types = [gguf.TokenType.NORMAL] * (N_BYTES + len(MERGED)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    assert len(tokens) == N_VOCAB
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_eot_token_id(IM_END_ID)
    w.add_pad_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


# --------------------------------------------------------------------------
# shared hyperparameters

N_EMBD = 64
N_CTX_TRAIN = 4096
RMS_EPS = 1e-6


class _Tensors:
    """Adds F32 tensors; shapes are given in ggml order {ne0, ne1}."""

    def __init__(self, w: gguf.GGUFWriter, rng: np.random.Generator, matrix_dtype=np.float32, poison: str | None = None):
        self.w = w
        self.rng = rng
        self.matrix_dtype = matrix_dtype  # of the projection weights (mat)
        self.poison = poison  # one of POISONS: logits no sampler can use

    def put(self, name: str, arr: np.ndarray, dtype=np.float32) -> None:
        self.w.add_tensor(name, np.ascontiguousarray(arr, dtype=dtype))

    def mat(self, name: str, ne0: int, ne1: int, gain: float = 1.0) -> None:
        """Weight of a projection from ne0 inputs to ne1 outputs."""
        std = gain / np.sqrt(ne0)
        self.put(name, self.rng.standard_normal((ne1, ne0), dtype=np.float32) * np.float32(std), self.matrix_dtype)

    def ones(self, name: str, *ne: int) -> None:
        self.put(name, np.ones(tuple(reversed(ne)), dtype=np.float32))

    def normal(self, name: str, std: float, *ne: int) -> None:
        self.put(name, self.rng.standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(std))

    def embeddings(self, embd_std: float = 1.0, out_gain: float = 3.0) -> None:
        self.normal("token_embd.weight", embd_std, N_EMBD, N_VOCAB)
        norm = np.ones(N_EMBD, dtype=np.float32)
        out = self.rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32) * np.float32(out_gain / np.sqrt(N_EMBD))
        out[~_OUTPUT_MASK] = 0.0
        if self.poison == "nan":  # every logit NaN, as after a bad quantization
            norm[:] = np.nan
        elif self.poison == "inf":
            # the normed state's first component times 1e30 times +-1e30 overflows: one of
            # INF_TOKENS gets +inf and the other -inf in every row (its sign decides which);
            # the other tokens' rows ignore that component and stay finite
            norm[0] = 1e30
            out[:, 0] = 0.0
            out[INF_TOKENS[0], 0], out[INF_TOKENS[1], 0] = 1e30, -1e30
        self.put("output_norm.weight", norm)
        self.put("output.weight", out)

    def linear(self, name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        """A projector's linear layer: `name`.weight, and a zero `name`.bias."""
        self.mat(f"{name}.weight", n_in, n_out)
        if bias:
            self.put(f"{name}.bias", np.zeros(n_out, dtype=np.float32))

    def layer_norm(self, name: str, n: int) -> None:
        self.ones(f"{name}.weight", n)
        self.put(f"{name}.bias", np.zeros(n, dtype=np.float32))

    def ffn(self, il: int, n_ff: int) -> None:
        self.mat(f"blk.{il}.ffn_gate.weight", N_EMBD, n_ff)
        self.mat(f"blk.{il}.ffn_up.weight", N_EMBD, n_ff)
        self.mat(f"blk.{il}.ffn_down.weight", n_ff, N_EMBD)


def _common_kv(w: gguf.GGUFWriter, kind: str, n_layer: int, n_vocab: int = N_VOCAB) -> None:
    w.add_name(f"tiny-{kind}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(n_vocab)


# --------------------------------------------------------------------------
# attention: llama

LLAMA = dict(n_layer=4, n_head=4, n_head_kv=2, head_dim=16, n_ff=128)



def _attention(t, il: int, hd: int, nh: int, nkv: int) -> None:
    """Layer il's attention norm and its Q, K, V and output projections."""
    t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
    t.mat(f"blk.{il}.attn_q.weight", N_EMBD, hd * nh, gain=2.0)
    t.mat(f"blk.{il}.attn_k.weight", N_EMBD, hd * nkv, gain=2.0)
    t.mat(f"blk.{il}.attn_v.weight", N_EMBD, hd * nkv)
    t.mat(f"blk.{il}.attn_output.weight", hd * nh, N_EMBD)

def _heads(w: gguf.GGUFWriter, p: dict) -> None:
    """The attention heads' hyperparameters: query and KV head counts, key and value widths."""
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])


def _qk_norm_attention(t, il: int, hd: int, nh: int, nkv: int) -> None:
    """Layer il's attention with per-head Q and K norms (qwen3), and its FFN norm."""
    _attention(t, il, hd, nh, nkv)
    t.ones(f"blk.{il}.attn_q_norm.weight", hd)
    t.ones(f"blk.{il}.attn_k_norm.weight", hd)
    t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)


def _write_llama(w: gguf.GGUFWriter, t: _Tensors) -> None:
    p = LLAMA
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    _common_kv(w, "attention", p["n_layer"])
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)

    t.embeddings()
    for il in range(p["n_layer"]):
        _attention(t, il, hd, nh, nkv)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        t.ffn(il, p["n_ff"])


# --------------------------------------------------------------------------
# swa: gemma3 (layers il % 3 < 2 use the sliding window, every third is global)

GEMMA3 = dict(n_layer=6, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, sliding_window=8, swa_pattern=3)


def _write_gemma3(w: gguf.GGUFWriter, t: _Tensors) -> None:
    p = GEMMA3
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    _common_kv(w, "swa", p["n_layer"])
    w.add_feed_forward_length(p["n_ff"])
    _heads(w, p)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(p["sliding_window"])
    w.add_sliding_window_pattern(p["swa_pattern"])

    # the graph multiplies the embeddings by sqrt(n_embd)
    t.embeddings(embd_std=1.0 / np.sqrt(N_EMBD))
    for il in range(p["n_layer"]):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        t.mat(f"blk.{il}.attn_q.weight", N_EMBD, hd * nh)
        t.mat(f"blk.{il}.attn_k.weight", N_EMBD, hd * nkv)
        t.mat(f"blk.{il}.attn_v.weight", N_EMBD, hd * nkv)
        t.mat(f"blk.{il}.attn_output.weight", hd * nh, N_EMBD)
        t.ones(f"blk.{il}.attn_q_norm.weight", hd)
        t.ones(f"blk.{il}.attn_k_norm.weight", hd)
        t.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        t.ffn(il, p["n_ff"])
        t.ones(f"blk.{il}.post_ffw_norm.weight", N_EMBD)


# --------------------------------------------------------------------------
# recurrent: mamba2

MAMBA2 = dict(n_layer=3, d_inner=128, d_state=16, n_group=1, head_dim=16, d_conv=4)


def _write_mamba2(w: gguf.GGUFWriter, t: _Tensors) -> None:
    p = MAMBA2
    d_inner, d_state, n_group, d_conv = p["d_inner"], p["d_state"], p["n_group"], p["d_conv"]
    n_head = d_inner // p["head_dim"]
    conv_dim = d_inner + 2 * n_group * d_state
    d_in_proj = d_inner + conv_dim + n_head

    _common_kv(w, "recurrent", p["n_layer"])
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)

    t.embeddings()
    rng = t.rng
    for il in range(p["n_layer"]):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        t.mat(f"blk.{il}.ssm_in.weight", N_EMBD, d_in_proj)
        t.normal(f"blk.{il}.ssm_conv1d.weight", 1.0 / np.sqrt(d_conv), d_conv, conv_dim)
        t.put(f"blk.{il}.ssm_conv1d.bias", np.zeros(conv_dim, dtype=np.float32))
        # softplus(dt_bias) = dt in [0.01, 0.1], as in Mamba's initialisation
        dt = np.exp(rng.uniform(np.log(0.01), np.log(0.1), n_head))
        t.put(f"blk.{il}.ssm_dt.bias", np.log(np.expm1(dt)))
        # A = -exp(A_log), A_log = log(U(1, 16))
        t.put(f"blk.{il}.ssm_a", -rng.uniform(1.0, 16.0, (n_head, 1)))
        t.ones(f"blk.{il}.ssm_d", 1, n_head)
        t.ones(f"blk.{il}.ssm_norm.weight", d_inner // n_group, n_group)
        t.mat(f"blk.{il}.ssm_out.weight", d_inner, N_EMBD)


# --------------------------------------------------------------------------
# hybrid: qwen35 (layer il is full attention when (il + 1) % interval == 0)

QWEN35 = dict(
    n_layer=4, full_attention_interval=4, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
    rope_sections=[2, 1, 1, 0], n_ff=128,
    d_state=16, n_group=2, dt_rank=4, d_conv=4,
)


def _qwen35_attention(t, il: int, hd: int, nh: int, nkv: int) -> None:
    """A qwen35 full-attention layer's projections (its query carries a gate) and Q/K norms."""
    t.mat(f"blk.{il}.attn_q.weight", N_EMBD, 2 * hd * nh)
    t.mat(f"blk.{il}.attn_k.weight", N_EMBD, hd * nkv)
    t.mat(f"blk.{il}.attn_v.weight", N_EMBD, hd * nkv)
    t.mat(f"blk.{il}.attn_output.weight", hd * nh, N_EMBD)
    t.ones(f"blk.{il}.attn_q_norm.weight", hd)
    t.ones(f"blk.{il}.attn_k_norm.weight", hd)


def _write_qwen35(w: gguf.GGUFWriter, t: _Tensors, mtp: bool = False) -> None:
    """`mtp`: with a multi-token-prediction block after the last layer (Qwen3.5's one MTP
    layer: a full-attention block fed the next token's embedding and the trunk's hidden state)."""
    p = QWEN35
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    d_state, n_group, dt_rank, d_conv = p["d_state"], p["n_group"], p["dt_rank"], p["d_conv"]
    key_dim = d_state * n_group
    value_dim = d_state * dt_rank  # == ssm.inner_size; head_v_dim == head_k_dim == d_state
    conv_dim = 2 * key_dim + value_dim
    interval = p["full_attention_interval"]

    _common_kv(w, "hybrid-mtp" if mtp else "hybrid", p["n_layer"] + mtp)
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_feed_forward_length(p["n_ff"])
    _heads(w, p)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(p["n_rot"])
    w.add_rope_dimension_sections(p["rope_sections"])
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_group)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_ssm_inner_size(value_dim)
    w.add_full_attention_interval(interval)

    t.embeddings()
    rng = t.rng
    for il in range(p["n_layer"]):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        t.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        if (il + 1) % interval == 0:
            _qwen35_attention(t, il, hd, nh, nkv)
        else:
            t.mat(f"blk.{il}.attn_qkv.weight", N_EMBD, conv_dim)
            t.mat(f"blk.{il}.attn_gate.weight", N_EMBD, value_dim)
            t.normal(f"blk.{il}.ssm_conv1d.weight", 1.0 / np.sqrt(d_conv), d_conv, conv_dim)
            # decay per token = exp(ssm_a * softplus(alpha + ssm_dt)): slow enough to carry context
            t.put(f"blk.{il}.ssm_dt.bias", np.full(dt_rank, -2.0, dtype=np.float32))
            t.put(f"blk.{il}.ssm_a", -rng.uniform(0.5, 4.0, dt_rank))
            t.mat(f"blk.{il}.ssm_beta.weight", N_EMBD, dt_rank)
            t.mat(f"blk.{il}.ssm_alpha.weight", N_EMBD, dt_rank)
            t.ones(f"blk.{il}.ssm_norm.weight", d_state)
            t.mat(f"blk.{il}.ssm_out.weight", value_dim, N_EMBD)
        t.ffn(il, p["n_ff"])
    if mtp:
        il = p["n_layer"]
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        t.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        _qwen35_attention(t, il, hd, nh, nkv)
        t.ffn(il, p["n_ff"])
        t.mat(f"blk.{il}.nextn.eh_proj.weight", 2 * N_EMBD, N_EMBD)
        t.ones(f"blk.{il}.nextn.enorm.weight", N_EMBD)
        t.ones(f"blk.{il}.nextn.hnorm.weight", N_EMBD)
        t.ones(f"blk.{il}.nextn.shared_head_norm.weight", N_EMBD)


# --------------------------------------------------------------------------
# moe: qwen3moe (the tensors llama-server's --cpu-moe keeps in RAM: blk.N.ffn_{gate,up,down}_exps)

QWEN3MOE = dict(n_layer=4, n_head=4, n_head_kv=2, head_dim=16, n_expert=4, n_expert_used=2, n_ff_exp=64)


def _write_qwen3moe(w: gguf.GGUFWriter, t: _Tensors) -> None:
    p = QWEN3MOE
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    n_expert, n_ff = p["n_expert"], p["n_ff_exp"]
    _common_kv(w, "moe", p["n_layer"])
    w.add_feed_forward_length(n_ff)
    w.add_expert_feed_forward_length(n_ff)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(p["n_expert_used"])
    _heads(w, p)
    w.add_rope_freq_base(1000000.0)

    t.embeddings()
    for il in range(p["n_layer"]):
        _qk_norm_attention(t, il, hd, nh, nkv)
        t.mat(f"blk.{il}.ffn_gate_inp.weight", N_EMBD, n_expert, gain=2.0)
        # ggml order {ne0, ne1, n_expert}: one projection per expert
        t.normal(f"blk.{il}.ffn_gate_exps.weight", 1.0 / np.sqrt(N_EMBD), N_EMBD, n_ff, n_expert)
        t.normal(f"blk.{il}.ffn_up_exps.weight", 1.0 / np.sqrt(N_EMBD), N_EMBD, n_ff, n_expert)
        t.normal(f"blk.{il}.ffn_down_exps.weight", 1.0 / np.sqrt(n_ff), n_ff, N_EMBD, n_expert)


# --------------------------------------------------------------------------
# mrope: qwen3vl (qwen3's attention with interleaved M-RoPE: image tokens have 2-D positions)

QWEN3VL = dict(n_layer=4, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, rope_sections=[4, 2, 2, 0])


def _write_qwen3vl(w: gguf.GGUFWriter, t: _Tensors) -> None:
    p = QWEN3VL
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    _common_kv(w, "mrope", p["n_layer"])
    w.add_feed_forward_length(p["n_ff"])
    _heads(w, p)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_dimension_count(hd)
    w.add_rope_dimension_sections(p["rope_sections"])

    t.embeddings()
    for il in range(p["n_layer"]):
        _qk_norm_attention(t, il, hd, nh, nkv)
        t.ffn(il, p["n_ff"])


_WRITERS: dict[str, Callable[[gguf.GGUFWriter, _Tensors], None]] = {
    "moe": _write_qwen3moe,
    "attention": _write_llama,
    "swa": _write_gemma3,
    "recurrent": _write_mamba2,
    "hybrid": _write_qwen35,
    "hybrid-mtp": lambda w, t: _write_qwen35(w, t, mtp=True),
    "mrope": _write_qwen3vl,
}

HPARAMS = {"attention": LLAMA, "swa": GEMMA3, "recurrent": MAMBA2, "hybrid": QWEN35, "hybrid-mtp": QWEN35, "moe": QWEN3MOE, "mrope": QWEN3VL}


@contextlib.contextmanager
def _gguf_file(path: pathlib.Path, arch: str):
    """A GGUF writer for `path` (its folder made); what the block adds is written when it
    ends without an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    try:
        yield w
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def write_tiny_model(kind: str, path: str | os.PathLike, *, seed: int = 0, poison: str | None = None) -> pathlib.Path:
    """Write the tiny model of ``kind`` (one of ``KINDS``, or ``moe``) to ``path`` and return the path.
    ``poison`` (one of ``POISONS``) writes a model whose every row of logits cannot be sampled."""
    if kind not in _WRITERS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {tuple(_WRITERS)}")
    if poison is not None and poison not in POISONS:
        raise ValueError(f"unknown poison {poison!r}; expected one of {POISONS}")
    path = pathlib.Path(path)
    with _gguf_file(path, ARCHS[kind]) as w:
        _WRITERS[kind](w, _Tensors(w, np.random.default_rng(seed), poison=poison))
        _add_vocab(w)
    return path


def write_tiny_model_with_vocab(path: str | os.PathLike, vocab: str | os.PathLike, *, seed: int = 0) -> pathlib.Path:
    """The attention kind (llama) with a real tokenizer: every ``tokenizer.*`` entry of a llama.cpp
    vocabulary file (``ggml-vocab-*.gguf``, e.g. a code model's with fill-in-the-middle tokens).
    Its output layer favours no token (the vocabulary's are not bytes): greedy text is any of
    them, an end-of-generation token as likely as another."""
    reader = gguf.GGUFReader(str(vocab))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    p = LLAMA
    hd, nh, nkv = p["head_dim"], p["n_head"], p["n_head_kv"]
    path = pathlib.Path(path)
    with _gguf_file(path, "llama") as w:
        t = _Tensors(w, np.random.default_rng(seed))
        _common_kv(w, "vocab", p["n_layer"], n_vocab)
        w.add_feed_forward_length(p["n_ff"])
        _heads(w, p)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(10000.0)
        t.normal("token_embd.weight", 1.0, N_EMBD, n_vocab)
        t.ones("output_norm.weight", N_EMBD)
        t.mat("output.weight", N_EMBD, n_vocab, gain=3.0)
        for il in range(p["n_layer"]):
            _attention(t, il, hd, nh, nkv)
            t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
            t.ffn(il, p["n_ff"])
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                kind = field.types[0]
                w.add_key_value(key, field.contents(), kind, field.types[-1] if kind is gguf.GGUFValueType.ARRAY else None)
    return path


# --------------------------------------------------------------------------
# vision projector: a CLIP ViT with a LLaVA MLP projector ("mlp"), the simplest type libmtmd
# loads: 32x32 images in 8x8 patches give 16 image tokens of N_EMBD (any tiny model's width)

MMPROJ = dict(image_size=32, patch_size=8, n_embd=32, n_ff=64, n_head=2, n_layer=2)


def write_tiny_mmproj(
    path: str | os.PathLike, *, seed: int = 0, shape: dict | None = None, n_embd_text: int = N_EMBD, name: str = "tiny-mmproj",
    projector: str = "mlp", f16: bool = False,
) -> pathlib.Path:
    """Write a random-weight vision projector (``--mmproj``), by default of the tiny models'
    size; `shape` (MMPROJ's keys) and `n_embd_text` give another one (the benchmarks' real
    shapes). `projector` is "mlp" (a CLIP encoder and LLaVA's MLP projector: 16 tokens an image)
    or "qwen2vl" (Qwen2-VL's tower: two patch convolutions, 2-D rotary positions, 2x2 patches
    merged into a token; images are resized to at least 8 tokens, 16x16 pixels each). `f16`
    stores the projection and patch weights in F16, as published projectors are."""
    if projector not in ("mlp", "qwen2vl"):
        raise ValueError(f"unknown projector {projector!r}")
    merger = projector == "qwen2vl"
    p = shape or MMPROJ
    e, size, patch = p["n_embd"], p["image_size"], p["patch_size"]
    path = pathlib.Path(path)
    rng = np.random.default_rng(seed)
    with _gguf_file(path, "clip") as w:
        w.add_name(name)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
        w.add_string("clip.projector_type", "qwen2vl_merger" if merger else "mlp")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.has_llava_projector", not merger)
        w.add_bool("clip.use_gelu", True)
        for key, value in (
            ("image_size", size), ("patch_size", patch), ("embedding_length", e), ("feed_forward_length", p["n_ff"]),
            ("projection_dim", n_embd_text), ("attention.head_count", p["n_head"]), ("block_count", p["n_layer"]),
        ):
            w.add_uint32(f"clip.vision.{key}", value)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", RMS_EPS)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        t = _Tensors(w, rng, np.float16 if f16 else np.float32)
        linear = t.linear

        def norm(name: str) -> None:
            t.layer_norm(name, e)

        def patch_embd(name: str) -> None:
            std = np.float32(1.0 / np.sqrt(3 * patch * patch))
            t.put(name, t.rng.standard_normal((e, 3, patch, patch), dtype=np.float32) * std, t.matrix_dtype)

        patch_embd("v.patch_embd.weight")
        if merger:
            patch_embd("v.patch_embd.weight.1")
        else:
            n_patches = (size // patch) ** 2
            t.normal("v.class_embd", 0.1, e)
            t.normal("v.position_embd.weight", 0.1, e, n_patches + 1)
            norm("v.pre_ln")
        for il in range(p["n_layer"]):
            for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
                linear(f"v.blk.{il}.{name}", e, e)
            norm(f"v.blk.{il}.ln1")
            norm(f"v.blk.{il}.ln2")
            linear(f"v.blk.{il}.ffn_up", e, p["n_ff"])
            linear(f"v.blk.{il}.ffn_down", p["n_ff"], e)
        if merger:
            norm("v.post_ln")
            linear("mm.0", 4 * e, 4 * e)  # the 2x2 patches of a token, concatenated
            linear("mm.2", 4 * e, n_embd_text)
        else:
            linear("mm.0", e, n_embd_text)
            linear("mm.2", n_embd_text, n_embd_text)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write tiny random-weight GGUF models, one per memory kind.")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", choices=tuple(_WRITERS), action="append", help="only this kind (repeatable)")
    args = ap.parse_args(argv)
    for kind in args.kind or KINDS:
        path = write_tiny_model(kind, pathlib.Path(args.out_dir) / f"tiny-{kind}.gguf", seed=args.seed)
        print(f"{kind:10s} {ARCHS[kind]:8s} {path.stat().st_size:8d} B  {path}")
    path = write_tiny_mmproj(pathlib.Path(args.out_dir) / "tiny-mmproj.gguf", seed=args.seed)
    print(f"{'mmproj':10s} {'clip':8s} {path.stat().st_size:8d} B  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
