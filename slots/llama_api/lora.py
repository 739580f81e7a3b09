"""LoRA adapters: loaded on a model, applied to a context.

llama.cpp applies adapters per context, not per sequence: whatever set `apply_adapters`
gave last is what every sequence of the next `llama_decode` runs under. The engine therefore
decodes one adapter set per step (slots/step/adapter_turns.py).

An adapter lives as long as its model; `LoraAdapter.close` frees it earlier (before the
model is freed, never after).
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
from typing import Sequence

from .backend import LlamaError
from .context import Context
from .model import Model

__all__ = ["LoraAdapter", "apply_adapters"]

META_BUFFER = 4096  # bytes read of one metadata value (a task name or a prompt prefix)


class LoraAdapter:
    """One LoRA adapter GGUF loaded on `model` (its architecture and tensor shapes must match)."""

    def __init__(self, model: Model, path: str) -> None:
        self.path = path
        ptr = llama_cpp.llama_adapter_lora_init(model.ptr, path.encode())
        if not ptr:
            raise LlamaError(
                f"failed to load the LoRA adapter {path}: not a LoRA adapter GGUF for this model's architecture "
                "and tensor shapes (llama.cpp's log above says which)"
            )
        self.ptr = ptr

    def meta(self, key: str) -> str:
        """A metadata value as text ("" when the adapter has no such key)."""
        buf = ctypes.create_string_buffer(META_BUFFER)
        n = int(llama_cpp.llama_adapter_meta_val_str(self.ptr, key.encode(), buf, META_BUFFER))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else ""

    def invocation_tokens(self) -> tuple[int, ...]:
        """An activated LoRA's (aLoRA) invocation tokens; () for a plain adapter."""
        n = int(llama_cpp.llama_adapter_get_alora_n_invocation_tokens(self.ptr))
        if n == 0:
            return ()
        tokens = llama_cpp.llama_adapter_get_alora_invocation_tokens(self.ptr)
        return tuple(int(tokens[i]) for i in range(n))

    def close(self) -> None:
        if self.ptr is not None:
            llama_cpp.llama_adapter_lora_free(self.ptr)
            self.ptr = None


def apply_adapters(ctx: Context, adapters: Sequence[LoraAdapter], scales: Sequence[float]) -> None:
    """Make `adapters` at `scales` the context's adapter set (an empty sequence: none). Takes
    effect at the next decode; llama.cpp rebuilds nothing when the set is unchanged."""
    assert len(adapters) == len(scales)
    n = len(adapters)
    ptrs = (llama_cpp.llama_adapter_lora_p_ctypes * max(n, 1))(*[a.ptr for a in adapters])
    values = (ctypes.c_float * max(n, 1))(*scales)
    rc = int(llama_cpp.llama_set_adapters_lora(ctx.ptr, ptrs if n else None, n, values if n else None))
    if rc != 0:
        raise LlamaError(f"llama_set_adapters_lora failed ({rc})")
