"""The engine: one thread that owns the llama context and runs N slots with continuous batching."""

from . import llama_api  # noqa: F401  (imports llama_cpp before numpy; see llama_api)
from .engine import Engine, EngineConfig, NotReady, QueueFull, Rejected
from .grammar import GrammarError, GrammarSpec
from .lifecycle import ShuttingDown
from .llama_api import MemoryKind, check_grammar
from .requests import EngineError, ErrorKind, Event, FinishReason, GenerateRequest, QueueSink, Result, Source, Usage
from .sampling import SamplingParams
from .snapshot import EngineInfo, EngineSnapshot
from .vocab import Vocab

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineInfo",
    "EngineSnapshot",
    "ErrorKind",
    "Event",
    "FinishReason",
    "GenerateRequest",
    "GrammarError",
    "GrammarSpec",
    "MemoryKind",
    "NotReady",
    "QueueFull",
    "QueueSink",
    "Rejected",
    "Result",
    "SamplingParams",
    "ShuttingDown",
    "Source",
    "Usage",
    "Vocab",
    "check_grammar",
]
