#!/usr/bin/env python3
"""Random-weight GGUF models with the shapes of real ones, for GPU benchmarks.

Each file has the real architecture, hyperparameters and tensor shapes of the model it is
named after, every large matrix in Q4_0, and the real Qwen tokenizer and chat template copied
from a vocab-only GGUF. The weights are random, so the text is nonsense, but every matmul, KV
cache byte and recurrent state has its real size: prefill and decode cost what they cost on
the real model at Q4_0, and no download is needed.

============ ======== =======================================================================
name         arch     shape (ggml order {ne0, ne1}; E = n_embd, F = n_ff)
============ ======== =======================================================================
qwen3-8b     qwen3    E 4096, 36 layers, 32 heads / 8 KV heads of 128, F 12288, QK-norm
qwen35-27b   qwen35   E 5120, 64 layers: layer il is full attention when (il+1) % 4 == 0
                      (24 heads / 4 KV of 256, gated query), else Gated DeltaNet (16 key heads,
                      48 value heads, head dims 128, conv kernel 4); F 17408; mrope 64 of 256
qwen35-9b    qwen35   E 4096, 32 layers, 16 heads / 4 KV, 16 key / 32 value heads, F 12288
gemma3-4b    gemma3   E 2560, 34 layers, 8 heads / 4 KV of 256, F 10240, sliding window 1024
                      on 5 of every 6 layers (il % 6 < 5), the 6th global
gemma3-270m  gemma3   E 640, 18 layers, 4 heads / 1 KV of 256, F 2048, sliding window 512 on
                      5 of every 6 layers (the embedded default's shape)
qwen3-30b-a3b qwen3moe E 2048, 48 layers, 32 heads / 4 KV of 128, QK-norm; 128 experts of
                      F 768 per layer, 8 used (``ffn_{gate,up,down}_exps`` {E, 768, 128}),
                      an F32 router ``ffn_gate_inp`` {E, 128}; context 262144 (as the 2507 release)
============ ======== =======================================================================

``--scale tiny`` keeps the architecture, the layer pattern, the head dimensions, the
tokenizer and the template, but shrinks E to 256, F to 512 and the head counts (and the
sliding window to 128), so the same code runs on a CPU in seconds. ``--scale micro`` (qwen3-8b,
qwen35-9b and gemma3-4b) shrinks the head dimensions too, to E 64: the tests' template
families run Claude Code's 20K-token prompts on it. ``--layers N`` overrides
the layer count; the attention / DeltaNet / sliding-window pattern is kept.

Tokenizer: every ``tokenizer.*`` key of the vocab file (``ggml-vocab-qwen35.gguf`` from
llama.cpp's ``models/``: gpt2 BPE, pre-tokenizer ``qwen35``, 151,936 tokens, merges, special
ids, a ChatML chat template) is copied; n_vocab is its token count, and ``token_embd`` and
``output`` are {E, n_vocab}. A vocab file without a template gets ``FALLBACK_CHAT_TEMPLATE``.
Without ``--vocab``, the file comes from the pinned llama-cpp-python sdist (``vocab.py``).

Weights: Q4_0 blocks are written directly (32 weights in 18 bytes: a float16 scale ``d``,
then 16 bytes of 4-bit values q, weight = d * (q - 8)). The nibbles are uniform random and
``d`` is chosen per matrix so that a projection keeps unit variance (weight std
gain / sqrt(ne0)); RMS norm weights are 1, so activations stay O(1) through any number of
layers. The output rows of control and user-defined tokens (the ``<|...|>`` specials and
padding) have d = 0: their logit is always 0 while the other logits spread with std 3, so
greedy decoding never picks a special token and generation never ends by itself. Each block's
``d`` gets a random sign (as ggml's own quantizer gives it): with one sign for all, the
-1/2 mean of q - 8 would push every projection's outputs the same way, and that shared
direction would grow through the layers until every position predicts the same token. One
random buffer per tensor role (and shape) is reused by every layer, so writing is disk-bound. Small
tensors (norms, ``ssm_a``, ``ssm_dt.bias``, ``ssm_conv1d`` and the {E, value heads}
``ssm_alpha`` / ``ssm_beta`` projections) are F32. The same name, scale and
layer count give a byte-identical file.

Usage::

    python scripts/bench_models.py --model qwen35-27b --vocab PATH --out qwen35-27b.gguf
    python scripts/bench_models.py --model qwen3-8b --scale tiny --layers 4 --out tiny.gguf
    python scripts/bench_models.py --model qwen35-27b --dry-run      # shapes and size only

An existing ``--out`` file whose ``warmslot.bench.spec`` key records the same parameters is
kept as is. From Python: ``write_bench_model(name, out, vocab, scale="real", layers=None)``.

Note: this module imports numpy (through ``gguf``). A process that also loads models through
``llama_cpp`` must ``import llama_cpp`` first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import struct
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import gguf
import numpy as np

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from scripts.vocab import VocabUnavailable, qwen35_vocab  # noqa: E402

VOCAB_NAME = "ggml-vocab-qwen35.gguf"
SPEC_KEY = "warmslot.bench.spec"
GENERATOR_VERSION = 1
SEED = 0

Q4_0 = gguf.GGMLQuantizationType.Q4_0
F32 = gguf.GGMLQuantizationType.F32
QK4_0 = 32  # weights per Q4_0 block
Q4_0_BLOCK_BYTES = 18  # float16 d + 16 bytes of nibbles
ALIGNMENT = 32  # GGUF default data alignment
# std of (q - 8) for q uniform in 0..15
NIBBLE_STD = float(np.sqrt((16**2 - 1) / 12.0))

# A template with tool support, used only when the vocab file has none.
FALLBACK_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- if message.get('tool_calls') %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set f = tc['function'] if tc.get('function') else tc %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# --------------------------------------------------------------------------
# shapes


@dataclass(frozen=True)
class Shape:
    """Hyperparameters of one benchmark model (real or tiny)."""

    name: str
    arch: str
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float = 1e-6
    # qwen35
    n_rot: int | None = None  # rope.dimension_count (partial rotary); None: head_dim
    rope_sections: tuple[int, ...] = ()
    full_attention_interval: int = 0
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0  # DeltaNet key and value head size
    ssm_group_count: int = 0  # DeltaNet key heads
    ssm_time_step_rank: int = 0  # DeltaNet value heads
    mtp: int = 0  # multi-token-prediction blocks after the last layer (Qwen3.5 has one)
    # gemma3
    sliding_window: int = 0
    sliding_window_pattern: int = 0  # layer il uses the window when il % pattern < pattern - 1
    rope_freq_base_swa: float = 0.0
    rope_scaling_linear: float = 0.0  # linear rope scaling factor of the global layers
    # qwen3moe
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0

    @property
    def ssm_inner_size(self) -> int:
        return self.ssm_state_size * self.ssm_time_step_rank

    def is_recurrent(self, il: int) -> bool:
        return self.arch == "qwen35" and (il + 1) % self.full_attention_interval != 0

    def is_swa(self, il: int) -> bool:
        p = self.sliding_window_pattern
        return self.sliding_window > 0 and (p == 0 or il % p < p - 1)


MODELS: dict[str, Shape] = {
    # qwen3-8b's context is the YaRN-extended 131072 (native: 40960), so that benchmark
    # histories longer than 40K fit in llama-server as well
    "qwen3-8b": Shape(
        name="qwen3-8b", arch="qwen3", n_embd=4096, n_layer=36, n_ff=12288,
        n_head=32, n_head_kv=8, head_dim=128, n_ctx_train=131072, rope_freq_base=1e6,
    ),
    # the small model beside it (Claude Code's side requests): Qwen3-0.6B's shape
    "qwen3-0.6b": Shape(
        name="qwen3-0.6b", arch="qwen3", n_embd=1024, n_layer=28, n_ff=3072,
        n_head=16, n_head_kv=8, head_dim=128, n_ctx_train=40960, rope_freq_base=1e6,
    ),
    "qwen35-27b": Shape(
        name="qwen35-27b", arch="qwen35", n_embd=5120, n_layer=64, n_ff=17408,
        n_head=24, n_head_kv=4, head_dim=256, n_ctx_train=262144, rope_freq_base=1e7,
        n_rot=64, rope_sections=(11, 11, 10, 0), full_attention_interval=4,
        ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=48,
    ),
    "qwen35-9b": Shape(
        name="qwen35-9b", arch="qwen35", n_embd=4096, n_layer=32, n_ff=12288,
        n_head=16, n_head_kv=4, head_dim=256, n_ctx_train=262144, rope_freq_base=1e7,
        n_rot=64, rope_sections=(11, 11, 10, 0), full_attention_interval=4,
        ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=32,
    ),
    "gemma3-4b": Shape(
        name="gemma3-4b", arch="gemma3", n_embd=2560, n_layer=34, n_ff=10240,
        n_head=8, n_head_kv=4, head_dim=256, n_ctx_train=131072, rope_freq_base=1e6,
        sliding_window=1024, sliding_window_pattern=6, rope_freq_base_swa=1e4,
        rope_scaling_linear=8.0,
    ),
    # the embedded default's shape (Gemma 3 270M); with --vocab pointing at that GGUF, its
    # 262,144-token vocabulary too, so the output matrix costs what it costs there
    "gemma3-270m": Shape(
        name="gemma3-270m", arch="gemma3", n_embd=640, n_layer=18, n_ff=2048,
        n_head=4, n_head_kv=1, head_dim=256, n_ctx_train=32768, rope_freq_base=1e6,
        sliding_window=512, sliding_window_pattern=6, rope_freq_base_swa=1e4,
    ),
    "qwen3-30b-a3b": Shape(
        name="qwen3-30b-a3b", arch="qwen3moe", n_embd=2048, n_layer=48, n_ff=6144,
        n_head=32, n_head_kv=4, head_dim=128, n_ctx_train=262144, rope_freq_base=1e7,
        n_expert=128, n_expert_used=8, n_ff_exp=768,
    ),
}

# --scale tiny: same arch, pattern, head dims and rope; smaller widths, head counts and layers
TINY: dict[str, dict[str, Any]] = {
    "qwen3-8b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 1, "n_layer": 4},
    "qwen3-0.6b": {"n_embd": 128, "n_ff": 256, "n_head": 2, "n_head_kv": 1, "n_layer": 2},
    "qwen35-27b": {"n_embd": 256, "n_ff": 512, "n_head": 3, "n_head_kv": 1, "n_layer": 8,
                   "ssm_group_count": 2, "ssm_time_step_rank": 6},
    "qwen35-9b": {"n_embd": 256, "n_ff": 512, "n_head": 2, "n_head_kv": 1, "n_layer": 8,
                  "ssm_group_count": 2, "ssm_time_step_rank": 4},
    "gemma3-4b": {"n_embd": 256, "n_ff": 512, "n_head": 2, "n_head_kv": 1, "n_layer": 6, "sliding_window": 128},
    "gemma3-270m": {"n_embd": 128, "n_ff": 256, "n_head": 2, "n_head_kv": 1, "n_layer": 6, "sliding_window": 128},
    "qwen3-30b-a3b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 1, "n_layer": 4, "n_expert": 8,
                      "n_expert_used": 2, "n_ff_exp": 128},
}

# --scale micro: narrower still, head dims too (the tests' template families: a 20K-token
# prompt prefills in seconds on two CPU cores)
MICRO: dict[str, dict[str, Any]] = {
    "qwen3-8b": {"n_embd": 64, "n_ff": 128, "n_head": 2, "n_head_kv": 1, "head_dim": 32, "n_layer": 4},
    "qwen35-9b": {"n_embd": 64, "n_ff": 128, "n_head": 1, "n_head_kv": 1, "head_dim": 64, "n_layer": 8,
                  "ssm_state_size": 32, "ssm_group_count": 1, "ssm_time_step_rank": 2},
    "gemma3-4b": {"n_embd": 64, "n_ff": 128, "n_head": 1, "n_head_kv": 1, "head_dim": 64, "n_layer": 6,
                  "sliding_window": 128},
}

SCALES = ("real", "tiny", "micro")


def resolve_shape(name: str, scale: str = "real", layers: int | None = None, mtp: bool = False) -> Shape:
    """The Shape of model `name` at `scale`, with `layers` layers if given, and its MTP block
    (`mtp`, Qwen3.5 shapes only)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES}")
    shape = MODELS[name]
    if scale == "tiny":
        shape = replace(shape, **TINY[name])
    if scale == "micro":
        if name not in MICRO:
            raise ValueError(f"--scale micro: only {', '.join(sorted(MICRO))}")
        shape = replace(shape, **MICRO[name])
    if layers is not None:
        if layers < 1:
            raise ValueError("layers must be >= 1")
        shape = replace(shape, n_layer=int(layers))
    if mtp:
        if shape.arch != "qwen35":
            raise ValueError("--mtp: only the Qwen3.5 shapes carry an MTP block")
        shape = replace(shape, mtp=1)
    return shape


# --------------------------------------------------------------------------
# tensor plan


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: name, shape in ggml order {ne0, ne1, ...}, type and how to fill it.

    Tensors with the same `role` and shape share one buffer (every layer gets the same bytes).
    Q4_0 roles: `gain` sets the weight std to gain / sqrt(ne0). F32 roles: `fill` names the
    initializer."""

    name: str
    ne: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    role: str
    gain: float = 1.0
    fill: str = ""

    @property
    def nbytes(self) -> int:
        n = int(np.prod(self.ne))
        if self.qtype == Q4_0:
            return n // QK4_0 * Q4_0_BLOCK_BYTES
        return n * 4


def _q(name: str, ne0: int, ne1: int, role: str, gain: float = 1.0) -> TensorSpec:
    if ne0 % QK4_0:
        raise ValueError(f"{name}: ne0={ne0} is not a multiple of {QK4_0}")
    return TensorSpec(name, (ne0, ne1), Q4_0, role, gain=gain)


def _f(name: str, ne: tuple[int, ...], fill: str, role: str | None = None) -> TensorSpec:
    return TensorSpec(name, ne, F32, role or f"f32:{fill}", fill=fill)


def tensor_plan(s: Shape, n_vocab: int) -> list[TensorSpec]:
    """Every tensor the llama.cpp loader of `s.arch` expects, in file order."""
    E, F, hd = s.n_embd, s.n_ff, s.head_dim
    q_dim, kv_dim = hd * s.n_head, hd * s.n_head_kv
    # gemma3 multiplies the embeddings by sqrt(E): rows of std 1/sqrt(E) keep them at unit rms
    embd_gain = 1.0 if s.arch == "gemma3" else float(np.sqrt(E))
    plan = [
        _q("token_embd.weight", E, n_vocab, "token_embd", gain=embd_gain),
        _f("output_norm.weight", (E,), "ones"),
        _q("output.weight", E, n_vocab, "output", gain=3.0),
    ]
    for il in range(s.n_layer):
        b = f"blk.{il}"
        plan.append(_f(f"{b}.attn_norm.weight", (E,), "ones"))
        if s.arch == "qwen35" and s.is_recurrent(il):
            key_dim = s.ssm_state_size * s.ssm_group_count
            value_dim = s.ssm_inner_size
            conv_dim = 2 * key_dim + value_dim
            nv = s.ssm_time_step_rank
            plan += [
                _f(f"{b}.post_attention_norm.weight", (E,), "ones"),
                _q(f"{b}.attn_qkv.weight", E, conv_dim, "attn_qkv"),
                _q(f"{b}.attn_gate.weight", E, value_dim, "attn_gate"),
                _f(f"{b}.ssm_conv1d.weight", (s.ssm_conv_kernel, conv_dim), "conv1d"),
                _f(f"{b}.ssm_dt.bias", (nv,), "dt_bias"),
                _f(f"{b}.ssm_a", (nv,), "ssm_a"),
                _f(f"{b}.ssm_beta.weight", (E, nv), "proj", role="ssm_beta"),
                _f(f"{b}.ssm_alpha.weight", (E, nv), "proj", role="ssm_alpha"),
                _f(f"{b}.ssm_norm.weight", (s.ssm_state_size,), "ones"),
                _q(f"{b}.ssm_out.weight", value_dim, E, "ssm_out"),
            ]
        else:
            q_out = 2 * q_dim if s.arch == "qwen35" else q_dim  # qwen35: query + its gate
            if s.arch == "qwen35":
                plan.append(_f(f"{b}.post_attention_norm.weight", (E,), "ones"))
            plan += [
                _q(f"{b}.attn_q.weight", E, q_out, "attn_q"),
                _q(f"{b}.attn_k.weight", E, kv_dim, "attn_k"),
                _q(f"{b}.attn_v.weight", E, kv_dim, "attn_v"),
                _q(f"{b}.attn_output.weight", q_dim, E, "attn_output"),
                _f(f"{b}.attn_q_norm.weight", (hd,), "ones"),
                _f(f"{b}.attn_k_norm.weight", (hd,), "ones"),
            ]
            if s.arch == "gemma3":
                plan.append(_f(f"{b}.post_attention_norm.weight", (E,), "ones"))
        if s.arch in ("qwen3", "gemma3", "qwen3moe"):
            plan.append(_f(f"{b}.ffn_norm.weight", (E,), "ones"))
        if s.arch == "qwen3moe":
            Fe, n = s.n_ff_exp, s.n_expert
            plan += [
                _f(f"{b}.ffn_gate_inp.weight", (E, n), "proj", role="ffn_gate_inp"),
                TensorSpec(f"{b}.ffn_gate_exps.weight", (E, Fe, n), Q4_0, "ffn_gate_exps"),
                TensorSpec(f"{b}.ffn_down_exps.weight", (Fe, E, n), Q4_0, "ffn_down_exps"),
                TensorSpec(f"{b}.ffn_up_exps.weight", (E, Fe, n), Q4_0, "ffn_up_exps"),
            ]
            continue
        plan += [
            _q(f"{b}.ffn_gate.weight", E, F, "ffn_gate"),
            _q(f"{b}.ffn_up.weight", E, F, "ffn_up"),
            _q(f"{b}.ffn_down.weight", F, E, "ffn_down"),
        ]
        if s.arch == "gemma3":
            plan.append(_f(f"{b}.post_ffw_norm.weight", (E,), "ones"))
    for il in range(s.n_layer, s.n_layer + s.mtp):  # Qwen3.5's MTP block: a full-attention layer
        b = f"blk.{il}"
        plan += [
            _f(f"{b}.attn_norm.weight", (E,), "ones"),
            _f(f"{b}.post_attention_norm.weight", (E,), "ones"),
            _q(f"{b}.attn_q.weight", E, 2 * q_dim, "attn_q"),
            _q(f"{b}.attn_k.weight", E, kv_dim, "attn_k"),
            _q(f"{b}.attn_v.weight", E, kv_dim, "attn_v"),
            _q(f"{b}.attn_output.weight", q_dim, E, "attn_output"),
            _f(f"{b}.attn_q_norm.weight", (hd,), "ones"),
            _f(f"{b}.attn_k_norm.weight", (hd,), "ones"),
            _q(f"{b}.ffn_gate.weight", E, F, "ffn_gate"),
            _q(f"{b}.ffn_up.weight", E, F, "ffn_up"),
            _q(f"{b}.ffn_down.weight", F, E, "ffn_down"),
            _q(f"{b}.nextn.eh_proj.weight", 2 * E, E, "eh_proj"),
            _f(f"{b}.nextn.enorm.weight", (E,), "ones"),
            _f(f"{b}.nextn.hnorm.weight", (E,), "ones"),
            _f(f"{b}.nextn.shared_head_norm.weight", (E,), "ones"),
        ]
    return plan


# --------------------------------------------------------------------------
# metadata


def find_vocab(vocab: str | os.PathLike | None = None) -> pathlib.Path:
    """The vocab GGUF: `vocab` if given, else llama.cpp's VOCAB_NAME from the pinned sdist."""
    if vocab is not None:
        p = pathlib.Path(vocab)
        if not p.is_file():
            raise FileNotFoundError(f"vocab file not found: {p}")
        return p
    try:
        return qwen35_vocab()
    except VocabUnavailable as exc:
        raise FileNotFoundError(f"{exc}\npass --vocab PATH") from exc


# GGUF value types (gguf.GGUFValueType)
_T = gguf.GGUFValueType
_SCALAR_FMT = {
    _T.UINT8: "<B", _T.INT8: "<b", _T.UINT16: "<H", _T.INT16: "<h", _T.UINT32: "<I", _T.INT32: "<i",
    _T.FLOAT32: "<f", _T.BOOL: "<?", _T.UINT64: "<Q", _T.INT64: "<q", _T.FLOAT64: "<d",
}


@dataclass
class KV:
    """One metadata entry: its value (bytes for strings, the item count for string arrays, a
    numpy array for numeric arrays) and its bytes in the file, key included."""

    key: str
    vtype: gguf.GGUFValueType
    value: Any
    raw: bytes


def read_kv(path: pathlib.Path, stop_at: str | None = None) -> dict[str, KV]:
    """The metadata of a little-endian GGUF file, in file order.

    Reads only the KV section, so a multi-GiB model costs nothing; with `stop_at`, stops after
    that key."""
    with open(path, "rb") as fh:
        head = fh.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        size = 16 << 20  # a 150K-token vocabulary takes about 6 MiB
        while True:
            fh.seek(0)
            buf = fh.read(size)
            try:
                return _parse_kv(buf, n_kv, stop_at)
            except (struct.error, IndexError):
                if len(buf) < size:
                    raise ValueError(f"{path}: truncated GGUF metadata") from None
                size *= 4


def _parse_kv(buf: bytes, n_kv: int, stop_at: str | None) -> dict[str, KV]:
    mv = memoryview(buf)
    off = 24
    out: dict[str, KV] = {}

    def string(off: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", buf, off)
        off += 8
        if off + n > len(buf):
            raise IndexError
        return bytes(mv[off : off + n]), off + n

    for _ in range(n_kv):
        start = off
        key, off = string(off)
        (vt,) = struct.unpack_from("<I", buf, off)
        off += 4
        vtype = _T(vt)
        if vtype == _T.STRING:
            val, off = string(off)
        elif vtype == _T.ARRAY:
            sub_i, count = struct.unpack_from("<IQ", buf, off)
            off += 12
            sub = _T(sub_i)
            if sub == _T.STRING:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", buf, off)
                    off += 8 + n
                if off > len(buf):
                    raise IndexError
                val = count
            elif sub in _SCALAR_FMT:
                dt = np.dtype(_SCALAR_FMT[sub])
                if off + dt.itemsize * count > len(buf):
                    raise IndexError
                val = np.frombuffer(buf, dtype=dt, count=count, offset=off).copy()
                off += dt.itemsize * count
            else:
                raise ValueError(f"nested GGUF arrays are not supported ({key!r})")
        else:
            fmt = _SCALAR_FMT[vtype]
            (val,) = struct.unpack_from(fmt, buf, off)
            off += struct.calcsize(fmt)
        k = key.decode("utf-8")
        out[k] = KV(k, vtype, val, bytes(mv[start:off]))
        if k == stop_at:
            break
    return out


def _str(b: str | bytes) -> bytes:
    b = b.encode("utf-8") if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: Any) -> bytes:
    """One metadata entry: str -> STRING, bool -> BOOL, int -> UINT32, float -> FLOAT32,
    list of int -> ARRAY of INT32."""
    if isinstance(value, (str, bytes)):
        body = struct.pack("<I", _T.STRING) + _str(value)
    elif isinstance(value, bool):
        body = struct.pack("<I?", _T.BOOL, value)
    elif isinstance(value, int):
        body = struct.pack("<II", _T.UINT32, value)
    elif isinstance(value, float):
        body = struct.pack("<If", _T.FLOAT32, value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        body = struct.pack("<IIQ", _T.ARRAY, _T.INT32, len(value)) + np.asarray(value, dtype="<i4").tobytes()
    else:
        raise TypeError(f"{key}: unsupported metadata value {value!r}")
    return _str(key) + body


@dataclass
class Vocab:
    """The ``tokenizer.*`` entries of a vocab GGUF, kept as their bytes."""

    path: pathlib.Path
    sha256: str
    entries: list[KV]
    n_vocab: int
    token_types: np.ndarray
    chat_template: str | None


def read_vocab(path: pathlib.Path) -> Vocab:
    """Every ``tokenizer.*`` entry of a GGUF file."""
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entries = [kv for key, kv in read_kv(path).items() if key.startswith("tokenizer.")]
    by_key = {kv.key: kv for kv in entries}
    if "tokenizer.ggml.tokens" not in by_key:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    n_vocab = int(by_key["tokenizer.ggml.tokens"].value)
    if "tokenizer.ggml.token_type" in by_key:
        token_types = np.asarray(by_key["tokenizer.ggml.token_type"].value, dtype=np.int32)
    else:
        token_types = np.full(n_vocab, int(gguf.TokenType.NORMAL), dtype=np.int32)
    template = by_key.get("tokenizer.chat_template")
    chat_template = template.value.decode("utf-8") if template is not None else None
    return Vocab(path, sha, entries, n_vocab, token_types, chat_template)


def with_template(vocab: Vocab, template: str) -> Vocab:
    """`vocab` with `template` as its chat template (its hash part of the vocabulary's)."""
    entries = [e for e in vocab.entries if e.key != "tokenizer.chat_template"]
    raw = _kv("tokenizer.chat_template", template)
    entry = KV("tokenizer.chat_template", gguf.GGUFValueType.STRING, template.encode(), raw)
    sha = hashlib.sha256((vocab.sha256 + template).encode()).hexdigest()
    return replace(vocab, entries=[*entries, entry], chat_template=template, sha256=sha)


def with_control_tokens(vocab: Vocab, texts: Sequence[str]) -> Vocab:
    """`vocab` with `texts` as control tokens, in place of its last normal tokens: a template
    family whose markers (Mistral's ``[INST]``, ``[TOOL_CALLS]``) are single special tokens
    in the model it stands for, though not in the vocabulary file it borrows. Text around a
    marker then tokenizes apart from it, as with the real model."""
    reader = gguf.GGUFReader(vocab.path)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]) for i in field.data]
    scores_field = reader.fields.get("tokenizer.ggml.scores")
    scores = [float(scores_field.parts[i][0]) for i in scores_field.data] if scores_field else [0.0] * len(tokens)
    types = vocab.token_types.copy()
    normal = np.flatnonzero(types == int(gguf.TokenType.NORMAL))
    for at, text in zip(normal[-len(texts):], texts):
        tokens[at], scores[at], types[at] = text.encode("utf-8"), 0.0, int(gguf.TokenType.CONTROL)
    rewritten = {
        "tokenizer.ggml.tokens": struct.pack("<IIQ", _T.ARRAY, _T.STRING, len(tokens)) + b"".join(_str(t) for t in tokens),
        "tokenizer.ggml.scores": struct.pack("<IIQ", _T.ARRAY, _T.FLOAT32, len(scores)) + np.asarray(scores, dtype="<f4").tobytes(),
        "tokenizer.ggml.token_type": struct.pack("<IIQ", _T.ARRAY, _T.INT32, len(types)) + np.asarray(types, dtype="<i4").tobytes(),
    }
    entries = [KV(e.key, e.vtype, e.value, _str(e.key) + rewritten[e.key]) if e.key in rewritten else e for e in vocab.entries]
    sha = hashlib.sha256((vocab.sha256 + "\0".join(texts)).encode()).hexdigest()
    return replace(vocab, entries=entries, token_types=types, sha256=sha)


def spec_string(s: Shape, vocab: Vocab, scale: str) -> str:
    """What the file is: recorded under SPEC_KEY, compared to decide whether to rewrite it."""
    return json.dumps(
        {"model": s.name, "scale": scale, "layers": s.n_layer, "vocab_sha256": vocab.sha256,
         "seed": SEED, "version": GENERATOR_VERSION} | ({"mtp": s.mtp} if s.mtp else {}),
        sort_keys=True,
    )


def metadata(s: Shape, vocab: Vocab, scale: str) -> list[bytes]:
    """The metadata entries of the file: general.*, the hyperparameters, then the tokenizer."""
    a = s.arch
    kv = {
        "general.architecture": a,
        "general.name": f"bench-{s.name}" + ("" if scale == "real" else f"-{scale}"),
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_0),
        "general.quantization_version": int(gguf.GGML_QUANT_VERSION),
        SPEC_KEY: spec_string(s, vocab, scale),
        f"{a}.context_length": s.n_ctx_train,
        f"{a}.embedding_length": s.n_embd,
        f"{a}.block_count": s.n_layer + s.mtp,
        f"{a}.feed_forward_length": s.n_ff,
        f"{a}.attention.head_count": s.n_head,
        f"{a}.attention.head_count_kv": s.n_head_kv,
        f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(s.rms_eps),
        f"{a}.rope.freq_base": float(s.rope_freq_base),
        f"{a}.rope.dimension_count": s.n_rot or s.head_dim,
    }
    if s.arch == "qwen35":
        kv |= {
            f"{a}.rope.dimension_sections": list(s.rope_sections),
            f"{a}.full_attention_interval": s.full_attention_interval,
            f"{a}.ssm.conv_kernel": s.ssm_conv_kernel,
            f"{a}.ssm.state_size": s.ssm_state_size,
            f"{a}.ssm.group_count": s.ssm_group_count,
            f"{a}.ssm.time_step_rank": s.ssm_time_step_rank,
            f"{a}.ssm.inner_size": s.ssm_inner_size,
        } | ({f"{a}.nextn_predict_layers": s.mtp} if s.mtp else {})
    if s.sliding_window:
        kv |= {
            f"{a}.attention.sliding_window": s.sliding_window,
            f"{a}.attention.sliding_window_pattern": s.sliding_window_pattern,
            f"{a}.rope.freq_base_swa": float(s.rope_freq_base_swa),
        }
    if s.n_expert:
        kv |= {
            f"{a}.expert_count": s.n_expert,
            f"{a}.expert_used_count": s.n_expert_used,
            f"{a}.expert_feed_forward_length": s.n_ff_exp,
        }
    if s.rope_scaling_linear:
        kv |= {f"{a}.rope.scaling.type": "linear", f"{a}.rope.scaling.factor": float(s.rope_scaling_linear)}
    entries = [_kv(k, v) for k, v in kv.items()]
    entries += [e.raw for e in vocab.entries]
    if vocab.chat_template is None:
        entries.append(_kv("tokenizer.chat_template", FALLBACK_CHAT_TEMPLATE))
    return entries


def header_bytes(s: Shape, vocab: Vocab, scale: str, plan: list[TensorSpec]) -> bytes:
    """Everything before the tensor data: header, metadata, tensor infos, padding."""
    entries = metadata(s, vocab, scale)
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(plan), len(entries)), *entries]
    offset = 0
    for t in plan:
        parts.append(_str(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne)
                     + struct.pack("<IQ", int(t.qtype), offset))
        offset += _pad(t.nbytes)
    head = b"".join(parts)
    return head + bytes(_pad(len(head)) - len(head))


def _pad(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


# --------------------------------------------------------------------------
# tensor data


class _Buffers:
    """One buffer per (role, shape), built on first use and shared by every layer."""

    def __init__(self, vocab: Vocab):
        self.rng = np.random.default_rng(SEED)
        self.vocab = vocab
        self.cache: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def get(self, t: TensorSpec) -> np.ndarray:
        key = (t.role, t.ne)
        if key not in self.cache:
            self.cache[key] = self._q4_0(t) if t.qtype == Q4_0 else self._f32(t)
        return self.cache[key]

    def _q4_0(self, t: TensorSpec) -> np.ndarray:
        ne0, ne1 = t.ne[0], int(np.prod(t.ne[1:]))  # an expert tensor {ne0, ne1, n_expert}: rows of all experts
        nb = ne0 // QK4_0
        d = np.full(ne1, t.gain / (NIBBLE_STD * np.sqrt(ne0)), dtype=np.float16)
        if t.role == "output":
            # control and user-defined tokens: logit 0, below the top of the others
            d[self.vocab.token_types[:ne1] != int(gguf.TokenType.NORMAL)] = 0
        # d gets a random sign per block (as ggml's quantizer gives it: d = max / -8): q - 8 has
        # mean -1/2, so one sign for all would add the same offset to every output and a shared
        # direction would grow from layer to layer until every position gives the same token
        d = np.broadcast_to(d[:, None], (ne1, nb)).copy()
        d[self._bits(ne1 * nb).reshape(ne1, nb)] *= -1
        buf = np.empty((ne1, nb, Q4_0_BLOCK_BYTES), dtype=np.uint8)
        buf[:, :, :2] = d.view(np.uint8).reshape(ne1, nb, 2)
        nibbles = np.frombuffer(self.rng.bytes(ne1 * nb * 16), dtype=np.uint8)
        buf[:, :, 2:] = nibbles.reshape(ne1, nb, 16)
        return buf.reshape(ne1, nb * Q4_0_BLOCK_BYTES)

    def _bits(self, n: int) -> np.ndarray:
        """n random booleans."""
        return np.unpackbits(np.frombuffer(self.rng.bytes((n + 7) // 8), dtype=np.uint8))[:n].astype(bool)

    def _f32(self, t: TensorSpec) -> np.ndarray:
        shape = tuple(reversed(t.ne))
        if t.fill == "ones":
            return np.ones(shape, dtype=np.float32)
        if t.fill == "proj":  # a small F32 projection from ne0 inputs, unit gain
            return self.rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(t.ne[0]))
        if t.fill == "conv1d":
            return self.rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(t.ne[0]))
        if t.fill == "dt_bias":
            # decay per token = exp(ssm_a * softplus(alpha + dt_bias)): carries context for a while
            return np.full(shape, -2.0, dtype=np.float32)
        if t.fill == "ssm_a":
            return -self.rng.uniform(0.5, 4.0, shape).astype(np.float32)
        raise ValueError(f"unknown fill {t.fill!r}")


# --------------------------------------------------------------------------
# writing


def plan_size(s: Shape, vocab: Vocab, scale: str, plan: list[TensorSpec]) -> tuple[int, int]:
    """(bytes before the tensor data, tensor data bytes): their sum is the file size."""
    return len(header_bytes(s, vocab, scale, plan)), sum(_pad(t.nbytes) for t in plan)


def read_spec(path: pathlib.Path) -> str | None:
    """The SPEC_KEY value of an existing GGUF file, or None."""
    try:
        kv = read_kv(path, stop_at=SPEC_KEY).get(SPEC_KEY)
    except (OSError, ValueError):
        return None
    return kv.value.decode("utf-8") if kv is not None and kv.vtype == _T.STRING else None


def _fmt_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n:,} B)"


def dry_run(name: str, vocab: str | os.PathLike | None = None, scale: str = "real",
            layers: int | None = None, *, verbose: bool = True, out=sys.stdout, mtp: bool = False) -> int:
    """Print every tensor's shape and type and the file size; return the size in bytes."""
    s = resolve_shape(name, scale, layers, mtp)
    v = read_vocab(find_vocab(vocab))
    plan = tensor_plan(s, v.n_vocab)
    meta, data = plan_size(s, v, scale, plan)
    if verbose:
        for t in plan:
            print(f"{t.name:36s} {t.qtype.name:5s} {list(t.ne)!s:18s} {t.nbytes:>13,d}", file=out)
    by_type: dict[str, int] = {}
    for t in plan:
        by_type[t.qtype.name] = by_type.get(t.qtype.name, 0) + t.nbytes
    n_params = sum(int(np.prod(t.ne)) for t in plan)
    print(f"{name} ({scale}, {s.n_layer} layers, arch {s.arch}, n_vocab {v.n_vocab}): "
          f"{len(plan)} tensors, {n_params / 1e9:.3f} B params", file=out)
    for k, n in sorted(by_type.items()):
        print(f"  {k:5s} {_fmt_size(n)}", file=out)
    print(f"  tensor data {_fmt_size(data)} (the size llama-bench reports)", file=out)
    print(f"  metadata {meta:,} B; file {_fmt_size(meta + data)}", file=out)
    return meta + data


def write_bench_model(name: str, out: str | os.PathLike, vocab: str | os.PathLike | None = None,
                      scale: str = "real", layers: int | None = None, *, force: bool = False,
                      quiet: bool = False, mtp: bool = False, chat_template: str | None = None,
                      control_tokens: Sequence[str] = ()) -> pathlib.Path:
    """Write benchmark model `name` at `scale` to `out` and return its path. `chat_template`
    replaces the vocab file's template and `control_tokens` are added to its vocabulary (the
    tests' template families).

    An existing `out` recording the same parameters (SPEC_KEY) is kept unless `force`."""
    t0 = time.perf_counter()
    out = pathlib.Path(out)
    s = resolve_shape(name, scale, layers, mtp)
    v = read_vocab(find_vocab(vocab))
    if chat_template is not None:
        v = with_template(v, chat_template)
    if control_tokens:
        v = with_control_tokens(v, control_tokens)
    spec = spec_string(s, v, scale)
    if out.is_file() and not force and read_spec(out) == spec:
        if not quiet:
            print(f"{out}: up to date ({_fmt_size(out.stat().st_size)}), kept")
        return out

    plan = tensor_plan(s, v.n_vocab)
    out.parent.mkdir(parents=True, exist_ok=True)
    need = sum(_pad(t.nbytes) for t in plan)
    free = shutil.disk_usage(out.parent).free + (out.stat().st_size if out.is_file() else 0)
    if need > free:
        raise OSError(f"{out.parent}: {_fmt_size(free)} free, the model needs {_fmt_size(need)}")

    tmp = out.with_name(out.name + ".partial")
    bufs = _Buffers(v)
    try:
        with open(tmp, "wb") as fh:
            fh.write(header_bytes(s, v, scale, plan))
            for t in plan:
                data = bufs.get(t)
                assert data.nbytes == t.nbytes, t.name
                data.tofile(fh)
                fh.write(bytes(_pad(t.nbytes) - t.nbytes))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not quiet:
        dt = time.perf_counter() - t0
        size = out.stat().st_size
        print(f"{out}: {name} ({scale}, {s.n_layer} layers) {_fmt_size(size)} in {dt:.1f} s "
              f"({size / 2**30 / max(dt, 1e-9):.2f} GiB/s)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a random-weight Q4_0 GGUF with the shapes of a real model.")
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--scale", choices=SCALES, default="real")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (keeps the layer pattern)")
    ap.add_argument("--vocab", default=None, help=f"vocab-only GGUF with the tokenizer (default: {VOCAB_NAME} "
                    "from the pinned llama-cpp-python sdist, cached under ~/.cache/warmslot)")
    ap.add_argument("--out", help="output .gguf (kept if it already records the same parameters)")
    ap.add_argument("--force", action="store_true", help="rewrite --out even if it is up to date")
    ap.add_argument("--mtp", action="store_true", help="with a Qwen3.5 shape: add its MTP block (--spec-type draft-mtp)")
    ap.add_argument("--dry-run", action="store_true", help="print tensor shapes, types and the file size; write nothing")
    ap.add_argument("--summary", action="store_true", help="with --dry-run: totals only, no per-tensor lines")
    args = ap.parse_args(argv)
    try:
        if args.dry_run:
            dry_run(args.model, args.vocab, args.scale, args.layers, verbose=not args.summary, mtp=args.mtp)
            return 0
        if not args.out:
            ap.error("--out is required unless --dry-run")
        write_bench_model(args.model, args.out, args.vocab, args.scale, args.layers, force=args.force, mtp=args.mtp)
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
