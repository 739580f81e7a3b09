"""A tiny LoRA adapter GGUF for the tiny attention model (tests/tiny_models.py, arch llama).

llama.cpp reads an adapter as a GGUF of `general.type` "adapter", `adapter.type` "lora",
`adapter.lora.alpha`, the base model's architecture, and a pair of tensors per adapted
weight: `<weight>.lora_a` of {n_in, rank} and `<weight>.lora_b` of {rank, n_out} (ggml
order), so that the weight becomes W + scale * alpha / rank * B A. The values are large
enough that the adapter changes the greedy tokens at scale 1 (and at 0 the model is the base
one, exactly).
"""

from __future__ import annotations

import os
import pathlib

import gguf
import numpy as np

from tests.tiny_models import LLAMA, N_EMBD

RANK = 4


def write_tiny_lora(path: str | os.PathLike, *, seed: int = 1, task_name: str = "") -> pathlib.Path:
    """Write an adapter for ``write_tiny_model("attention", ...)``; return its path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hd, nh, n_ff = LLAMA["head_dim"], LLAMA["n_head"], LLAMA["n_ff"]
    w = gguf.GGUFWriter(str(path), "llama")
    try:
        w.add_type("adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(RANK))
        if task_name:
            w.add_string("adapter.lora.task_name", task_name)
        for il in range(LLAMA["n_layer"]):
            for name, n_in, n_out in ((f"blk.{il}.attn_q.weight", N_EMBD, hd * nh),
                                      (f"blk.{il}.attn_output.weight", hd * nh, N_EMBD),
                                      (f"blk.{il}.ffn_up.weight", N_EMBD, n_ff)):
                a = rng.standard_normal((RANK, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
                b = rng.standard_normal((n_out, RANK), dtype=np.float32) * np.float32(2.0 / np.sqrt(RANK))
                w.add_tensor(f"{name}.lora_a", a)
                w.add_tensor(f"{name}.lora_b", b)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path
