"""The engine: one thread that owns the llama context and runs N slots with continuous batching.

This package's namespace is the engine's one import surface for the HTTP side: `server/`
imports from `warmslot.slots`, never from its submodules.
"""

from . import llama_api  # noqa: F401  (imports llama_cpp before numpy; see llama_api)
from . import slot_files
from .settings import EngineConfig
from .adapters.adapter_set import NO_ADAPTERS, AdapterInfo, AdapterSet
from .fitting.context_size import available_ram, physical_memory
from .fitting.gguf_tensors import NotGGUF, arch_numbers as gguf_arch_numbers, read_header as read_gguf_header
from .crash_report import hold_sent_aborts, report_crashes, report_crashes_of
from .engine.embedding_worker import InputTooLong
from .engine import Engine
from .llama_api.grammar import GrammarError, GrammarSpec
from .sampling.json_schema import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES, SchemaConverter
from .llama_api import FimTokens, LlamaError, MemoryKind, Placement, check_grammar, ggml_build, gpu_memory, model_params, placement, supports_gpu_offload
from .llama_api.model import kv_bytes_per_token
from .llama_api.chat_builtin import apply_builtin_chat_template, builtin_chat_templates
from .llama_api.mtmd import MediaError
from .sampling.logprobs import TokenLogprob
from .multimodal.spans import MediaSpan, placeholder_ids
from .sampling.reasoning_budget import ReasoningBudget
from .requests import (
    EngineError, ErrorKind, Event, FinishReason, GenerateRequest, NotReady, Progress, QueueFull, QueueSink, Rejected, Result,
    Reuse, ShuttingDown, Source, Usage,
)
from .sampling.params import DraftLimits, SamplingParams
from .engine.snapshot import EngineInfo, EngineSnapshot, tenant_hash
from .speculation.spec_config import SPEC_TYPES, SpecConfig
from .stats import PROMPT_SOURCES, CopyCause
from .vocab import Vocab, VocabClosed

__all__ = [
    "NO_ADAPTERS",
    "PRIMITIVE_RULES",
    "PROMPT_SOURCES",
    "SPEC_TYPES",
    "RESERVED_NAMES",
    "STRING_FORMAT_RULES",
    "AdapterInfo",
    "AdapterSet",
    "CopyCause",
    "DraftLimits",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineInfo",
    "EngineSnapshot",
    "ErrorKind",
    "Event",
    "FimTokens",
    "FinishReason",
    "GenerateRequest",
    "GrammarError",
    "GrammarSpec",
    "InputTooLong",
    "LlamaError",
    "MediaError",
    "MediaSpan",
    "MemoryKind",
    "NotGGUF",
    "NotReady",
    "Placement",
    "Progress",
    "QueueFull",
    "QueueSink",
    "ReasoningBudget",
    "Rejected",
    "Result",
    "Reuse",
    "SamplingParams",
    "SchemaConverter",
    "ShuttingDown",
    "Source",
    "SpecConfig",
    "TokenLogprob",
    "Usage",
    "Vocab",
    "VocabClosed",
    "apply_builtin_chat_template",
    "available_ram",
    "builtin_chat_templates",
    "check_grammar",
    "ggml_build",
    "gpu_memory",
    "kv_bytes_per_token",
    "model_params",
    "placeholder_ids",
    "physical_memory",
    "gguf_arch_numbers", "read_gguf_header",
    "supports_gpu_offload",
    "hold_sent_aborts",
    "report_crashes",
    "report_crashes_of",
    "placement",
    "slot_files",
    "tenant_hash",
]
