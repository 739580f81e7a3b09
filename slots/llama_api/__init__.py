"""The one seam between warmslot and llama.cpp.

Every ctypes call into llama-cpp-python's low-level API lives in this package. The rest of
the engine talks to the small typed classes below: `Model`, `Context`, `Batch`, `Sampler`.

Threading: a `Context` (and its `Batch` and `Sampler`s) belongs to the engine thread.
`Model.tokenize` and `Model.token_piece` only read the vocabulary and may be called from
worker threads, as llama.cpp's own server does.

NOTE: llama_cpp must be imported before numpy. With some numpy builds, loading a model
segfaults when numpy was imported first, so this package imports llama_cpp on its first line
and `slots/__init__.py` imports this package first.
"""

import llama_cpp  # noqa: F401,I001  (must precede numpy, see above)

from .backend import Device, LlamaError, cuda_host_allocator, devices, ggml_build, gpu_memory, init_backend, supports_gpu_offload, system_info
from .context import Batch, Context, ContextParams, default_threads
from .placement import Placement
from .model import KV_TYPE_BYTES, KV_TYPES, FimTokens, MemoryKind, Model, ModelInfo, classify_memory, kv_bytes_per_token, model_params
from .sampler import ChainParams, GrammarError, GrammarSpec, NoToken, Sampler, SamplingFailed, TokenForcer, check_grammar, trigger_tokens

__all__ = [
    "Batch", "ChainParams", "Context", "ContextParams", "Device", "FimTokens", "Placement",
    "GrammarError", "NoToken", "SamplingFailed", "TokenForcer", "GrammarSpec", "KV_TYPES", "KV_TYPE_BYTES",
    "LlamaError", "MemoryKind", "Model", "ModelInfo", "Sampler", "check_grammar", "classify_memory", "kv_bytes_per_token",
    "model_params",
    "cuda_host_allocator", "default_threads", "devices", "ggml_build", "gpu_memory", "init_backend", "supports_gpu_offload",
    "system_info", "trigger_tokens",
]
