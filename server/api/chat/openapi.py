"""The chat completion routes in /openapi.json: the request the parser accepts
(`request.protocol`) and the completion the handler answers."""

from __future__ import annotations

from typing import Any

from ...openapi_schemas import ENVELOPE, GENERATION, MESSAGE, TOOL, TOOL_CALL, generation, input_tokens, nullable, ref

_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "tools": nullable({"type": "array", "items": TOOL}),
        "tool_choice": nullable({"oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            }},
        ]}),
        "parallel_tool_calls": nullable({"type": "boolean"}),
        "response_format": nullable({
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                "schema": {"type": "object"},
                "json_schema": {"type": "object", "properties": {
                    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                    "schema": {"type": "object"},
                    "strict": {"type": "boolean"},
                }},
            },
        }),
        "chat_template_kwargs": nullable({"type": "object"}),
        "add_generation_prompt": nullable({"type": "boolean"}),
        "continue_final_message": nullable({"type": "boolean", "description": "the reply continues the final assistant message (a final assistant message is continued anyway unless add_generation_prompt is false)"}),
        "grammar": nullable({"type": "string", "description": "GBNF text the reply follows"}),
        "json_schema": nullable({"type": "object", "description": "a JSON schema the reply is one value of"}),
        "logprobs": nullable({"type": "boolean"}),
        "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20}),
        **GENERATION,
    },
}

_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        **ENVELOPE,
        "object": {"type": "string", "enum": ["chat.completion"]},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"type": "integer"},
                "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"]},
                "logprobs": {"type": "object", "nullable": True},
                "message": {"type": "object", "required": ["role", "content"], "properties": {
                    "role": {"type": "string", "enum": ["assistant"]},
                    "content": nullable({"type": "string"}),
                    "reasoning_content": {"type": "string"},
                    "tool_calls": {"type": "array", "items": {**TOOL_CALL, "required": ["id", "type", "function"]}},
                }},
            },
        }},
    },
}

SCHEMAS = {"ChatCompletionRequest": _REQUEST, "ChatCompletion": _COMPLETION}


def paths() -> dict[str, Any]:
    chat = generation("ChatCompletionRequest", "ChatCompletion", "a chat completion (OpenAI API)")
    count = input_tokens(ref("ChatCompletionRequest"))
    return {
        "/v1/chat/completions": chat, "/chat/completions": chat,
        "/v1/chat/completions/input_tokens": count, "/chat/completions/input_tokens": count,
    }
