"""A tiny random-weight audio projector (``--mmproj``) for the tiny text models.

``write_tiny_audio_mmproj`` writes a GGUF that llama.cpp's libmtmd loads as an audio encoder
of projector type ``qwen2a`` (Qwen2-Audio's): a Whisper encoder and one linear projection.
It is the simplest audio projector libmtmd has: no stack factor, no extra projector norms,
and the mel filterbank is computed by libmtmd (16 kHz, 80 mel bins here), not stored.

The encoder, in words: libmtmd resamples the clip to 16 kHz mono, pads it with 30 s of
silence and cuts the log-mel spectrogram into windows of 3000 frames (30 s; a clip of up to
30 s is one window); each window is an audio chunk. A chunk's 80 x 3000 mel frames go
through a conv1d (kernel 3, 80 -> 32 channels) and a stride-2 conv1d (32 -> 32), both with
GELU, giving 1500 positions; a learned position embedding is added, then 2 pre-norm
transformer blocks (32 wide, 2 heads, FFN 64, GELU; K has no bias), an average pool of 2,
a final layer norm and a linear projection to the text model's width. So every chunk is
750 tokens at 750 positions, whatever the clip's length, wrapped by libmtmd in the text
``<|audio_bos|>`` ... ``<|audio_eos|>`` (tokenized as plain text: bytes in the tiny vocab).

The final layer norm keeps the embeddings O(1). The same seed gives a byte-identical file
(about 0.3 MB, most of it the 1500 position embeddings).

Usage::

    from tests.tiny_audio import write_tiny_audio_mmproj
    path = write_tiny_audio_mmproj(tmp_path / "audio-mmproj.gguf")   # with write_tiny_model(...)

Like ``tests.tiny_models``, this imports numpy: ``import llama_cpp`` first in a process
that loads models.
"""

from __future__ import annotations

import os
import pathlib

import gguf
import numpy as np

from tests.tiny_models import N_EMBD, RMS_EPS, _gguf_file, _Tensors

AUDIO = dict(n_mel=80, n_embd=32, n_ff=64, n_head=2, n_layer=2)
N_POS = 1500  # positions after the stride-2 conv: 3000 mel frames (30 s) a chunk


def write_tiny_audio_mmproj(
    path: str | os.PathLike, *, seed: int = 0, n_embd_text: int = N_EMBD, name: str = "tiny-audio-mmproj",
) -> pathlib.Path:
    """Write a random-weight ``qwen2a`` audio projector whose output width is `n_embd_text`
    (the tiny text models' by default); see the module docstring."""
    p = AUDIO
    e, n_mel = p["n_embd"], p["n_mel"]
    path = pathlib.Path(path)
    rng = np.random.default_rng(seed)
    with _gguf_file(path, "clip") as w:
        w.add_name(name)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_string("clip.projector_type", "qwen2a")
        w.add_bool("clip.has_vision_encoder", False)
        w.add_bool("clip.has_audio_encoder", True)
        for key, value in (
            ("num_mel_bins", n_mel), ("embedding_length", e), ("feed_forward_length", p["n_ff"]),
            ("projection_dim", n_embd_text), ("attention.head_count", p["n_head"]), ("block_count", p["n_layer"]),
        ):
            w.add_uint32(f"clip.audio.{key}", value)
        w.add_float32("clip.audio.attention.layer_norm_epsilon", RMS_EPS)
        t = _Tensors(w, rng)
        linear = t.linear

        def norm(name: str) -> None:
            t.layer_norm(name, e)

        def conv1d(i: int, n_in: int) -> None:
            # ggml {kernel, in, out} (torch's (out, in, kernel)); the bias is {1, out}, as
            # the converter writes it, so that it broadcasts over the frames
            std = np.float32(1.0 / np.sqrt(3 * n_in))
            t.put(f"a.conv1d.{i}.weight", rng.standard_normal((e, n_in, 3), dtype=np.float32) * std)
            t.put(f"a.conv1d.{i}.bias", np.zeros((e, 1), dtype=np.float32))

        conv1d(1, n_mel)
        conv1d(2, e)
        t.normal("a.position_embd.weight", 1.0, e, N_POS)
        for il in range(p["n_layer"]):
            linear(f"a.blk.{il}.attn_q", e, e)
            linear(f"a.blk.{il}.attn_k", e, e, bias=False)  # libmtmd asserts K has no bias
            linear(f"a.blk.{il}.attn_v", e, e)
            linear(f"a.blk.{il}.attn_out", e, e)
            norm(f"a.blk.{il}.ln1")
            norm(f"a.blk.{il}.ln2")
            linear(f"a.blk.{il}.ffn_up", e, p["n_ff"])
            linear(f"a.blk.{il}.ffn_down", p["n_ff"], e)
        norm("a.post_ln")
        linear("mm.a.fc", e, n_embd_text)
    return path
