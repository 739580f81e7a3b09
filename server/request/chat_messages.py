"""Chat messages, parsed and validated: roles, text and media content, assistant tool calls,
and whether the reply continues the final message (a prefill)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from ..prompt.media import IMAGES_KEY, MEDIA_MARKER, audio_part, image_part

ROLES = ("system", "developer", "user", "assistant", "tool")


def continues_final(messages: list[dict], add_generation_prompt: bool | None = None, continue_final_message: bool = False) -> bool:
    """Whether the reply continues the final message: an assistant message at the end is a
    prefill (its text is where the reply starts, as llama-server and Anthropic's API take it;
    vLLM's `continue_final_message` says so explicitly). One that only calls tools is a turn
    like any other."""
    if add_generation_prompt and continue_final_message:
        raise InvalidRequest("'add_generation_prompt' and 'continue_final_message' cannot both be true", param="continue_final_message")
    last = messages[-1]
    if len(messages) > 1 and last["role"] == "assistant" and messages[-2]["role"] == "assistant":
        raise InvalidRequest("the messages end with two assistant messages: merge them, the reply continues the last one", param="messages")
    prefill = last["role"] == "assistant" and not last.get("tool_calls") and isinstance(last.get("content"), str)
    if continue_final_message and not prefill:
        raise InvalidRequest("'continue_final_message' needs a final assistant message with text", param="continue_final_message")
    return prefill and add_generation_prompt is not False or continue_final_message


def _content(value: Any, where: str, images: list | None = None) -> str | None:
    """A message's content as text; image and audio parts become media markers in it, their
    media appended to `images` (None: media are refused)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "input_audio") and images is not None:
                images.append((image_part if kind == "image_url" else audio_part)(part, f"{where}.content[{i}]"))
                parts.append(MEDIA_MARKER)
                continue
            if kind in ("audio", "file", "video_url", "input_video"):
                raise InvalidRequest(f"content of type {kind!r} is not supported: this server takes text, images and audio", param=f"{where}.content[{i}]")
            if kind != "text" or not isinstance(part.get("text"), str):
                kind = kind if isinstance(part, dict) else type(part).__name__
                raise InvalidRequest(f"content part of type {kind!r} is not supported; send text parts", param=f"{where}.content[{i}]")
            parts.append(part["text"])
        return "\n".join(parts)
    raise InvalidRequest("'content' must be a string, an array of text parts, or null", param=f"{where}.content")


def _tool_calls(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list):
        raise InvalidRequest("'tool_calls' must be an array", param=f"{where}.tool_calls")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}.tool_calls[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest("a tool call needs function.name", param=at)
        args = fn.get("arguments", "{}")
        raw = None
        if isinstance(args, str):
            try:
                parsed = json.loads(args) if args.strip() else {}
                raw = args.strip() if isinstance(parsed, dict) else None
            except json.JSONDecodeError:
                parsed = args  # keep what the client sent; the template renders it as text
        elif isinstance(args, dict):
            parsed = args
        else:
            raise InvalidRequest("function.arguments must be a JSON string", param=f"{at}.function.arguments")
        # templates get the arguments as an object (as they were trained); the injected
        # Hermes form keeps the client's exact text (`raw_arguments`)
        calls.append({
            "id": call.get("id") or f"call_{i}",
            "type": "function",
            "function": {"name": fn["name"], "arguments": parsed, "raw_arguments": raw},
        })
    return calls


def parse_messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequest("each message must be an object", param=where)
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"'role' must be one of {', '.join(ROLES)}", param=f"{where}.role")
        images: list = []
        clean: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _content(msg.get("content"), where, images if role == "user" else None)}
        if images:
            clean[IMAGES_KEY] = images
        if role == "assistant" and msg.get("tool_calls"):
            clean["tool_calls"] = _tool_calls(msg["tool_calls"], where)
        if role == "assistant" and isinstance(msg.get("reasoning_content"), str):
            clean["reasoning_content"] = msg["reasoning_content"]
        if role == "tool":
            clean["tool_call_id"] = msg.get("tool_call_id") if isinstance(msg.get("tool_call_id"), str) else ""
        if isinstance(msg.get("name"), str):
            clean["name"] = msg["name"]
        if clean["content"] is None and role in ("user", "system", "developer", "tool"):
            raise InvalidRequest("'content' is required for this role", param=f"{where}.content")
        out.append(clean)
    return out
