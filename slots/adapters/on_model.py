"""The LoRA adapters loaded on the model, and the one set applied to the context.

Loaded once per model load (`ModelAdapters.load`), freed before the model; `apply` makes a
step's set the context's, calling llama.cpp only when it changes. Engine thread only.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Sequence

from ..llama_api import Context, Model
from ..llama_api.lora import LoraAdapter, apply_adapters
from .adapter_set import NO_ADAPTERS, AdapterInfo, AdapterSet

log = logging.getLogger("warmslot.engine")

__all__ = ["ModelAdapters", "file_digest"]


def file_digest(path: str) -> str:
    """Names an adapter file in cache scopes: its resolved path, size and modification time
    (cheap at load, unlike hashing the contents; a file rewritten in place gets a new one)."""
    st = os.stat(path)
    text = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class ModelAdapters:
    """The adapters of --lora and --lora-scaled, in their order (an adapter's id is its index)."""

    def __init__(self, adapters: Sequence[LoraAdapter], infos: Sequence[AdapterInfo]) -> None:
        self._adapters = list(adapters)
        self.infos: tuple[AdapterInfo, ...] = tuple(infos)
        self.applied: AdapterSet = NO_ADAPTERS  # the context's set (none after the context is made)

    @classmethod
    def load(cls, model: Model, paths: Sequence[str]) -> "ModelAdapters":
        """Load each adapter file on `model` (LlamaError naming the file that fails)."""
        loaded: list[LoraAdapter] = []
        try:
            for path in paths:
                loaded.append(LoraAdapter(model, path))
        except BaseException:
            for adapter in loaded:
                adapter.close()
            raise
        infos = [
            AdapterInfo(i, a.path, file_digest(a.path), a.meta("adapter.lora.task_name"),
                        a.meta("adapter.lora.prompt_prefix"), a.invocation_tokens())
            for i, a in enumerate(loaded)
        ]
        for info in infos:
            log.info("LoRA adapter %d: %s%s", info.id, info.path, f" (task {info.task_name})" if info.task_name else "")
        return cls(loaded, infos)

    def __len__(self) -> int:
        return len(self._adapters)

    def apply(self, ctx: Context, adapters: AdapterSet) -> None:
        """Make `adapters` the context's set for the next decode (nothing when it already is)."""
        if adapters == self.applied:
            return
        # only the set's adapters: one at scale 0 would still cost its matrix products
        apply_adapters(ctx, [self._adapters[i] for i, _ in adapters.scales], [s for _, s in adapters.scales])
        self.applied = adapters

    def close(self) -> None:
        """Free the adapters (before the model; the context may have been freed already)."""
        for adapter in self._adapters:
            adapter.close()
        self._adapters = []
