"""The generation pipeline: everything between a parsed request and a rendered reply.

Every generation API (`server/api/`) is an adapter over it: the adapter parses its request
into chat or completion parameters, calls `start_chat` or `start_text`, and renders either
the whole `Reply` (`Generation.collect`) or the typed stream events through `sse_response`
with its own `Renderer`. Planning, submission of n >= 1 choices, output parsing, finish
rules, usage, reasoning tokens, disconnects, logging and the stream error contract live here
once.
"""

from .events import ChoiceEnd, ChoiceReply, Delta, End, Finish, PromptProgress, Reply, StreamEvent, total_usage
from .generation import Generation, start_chat, start_text
from .plan import ChatPlan, checkpoint_boundaries, plan_chat
from .sse import Renderer, SseItem, as_api_error, sse_response
from .submission import engine_error

__all__ = [
    "ChatPlan",
    "ChoiceEnd",
    "ChoiceReply",
    "Delta",
    "End",
    "Finish",
    "Generation",
    "PromptProgress",
    "Renderer",
    "Reply",
    "SseItem",
    "StreamEvent",
    "as_api_error",
    "checkpoint_boundaries",
    "engine_error",
    "plan_chat",
    "sse_response",
    "start_chat",
    "start_text",
    "total_usage",
]
