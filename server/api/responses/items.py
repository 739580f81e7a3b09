"""The Responses API in terms of chat: request items to chat messages, output to items.

A /v1/responses request becomes the chat request it stands for: `instructions` a system
message first, `input` messages as messages, `function_call` items as the assistant's tool
calls, `function_call_output` items as tool messages, `reasoning` items as the next assistant
message's reasoning. The conversion is the inverse of how an answer becomes output items,
so a conversation sent through /v1/chat/completions and through /v1/responses renders to the
same tokens, and switching endpoints keeps the prefix cache warm.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from warmslot.slots import SamplingParams

from ...errors import InvalidRequest
from ..bodies import shifted_field
from ...prompt.exact_turns import ExactTurn
from ...prompt.media import PARAM_KEY
from ...output.parsed import ParsedMessage
from ...request.protocol import GenerationParams, parse_generation
from .tools import ResponsesTools, parse_tools, tool_choice

TEXT_PART_TYPES = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
EXACT_KEY = "_exact_turn"  # a chat message's ExactTurn (the turn as generated), never sent to a template
Verify = Callable[[object], "ExactTurn | None"]  # a reasoning item's encrypted_content -> its turn


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(slots=True)
class ResponsesParams:
    """A parsed /v1/responses request, in chat terms where chat has the same thing."""

    messages: list[dict]  # chat-form messages of `input` (raw, as a chat client would send them)
    instructions: str | None
    gen: GenerationParams
    tools: ResponsesTools  # chat-form function tools, namespaced ones and those left out
    tool_choice: Any  # chat-form tool_choice
    parallel_tool_calls: bool
    response_format: dict | None  # chat-form response_format
    previous_response_id: str | None
    store: bool
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats
    encrypted_reasoning: bool = False  # include: reasoning.encrypted_content
    ignored_blobs: list[str] = field(default_factory=list)  # reasoning items whose encrypted_content did not verify


def _string(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)
    return value


def parse_responses(
    body: dict, n_vocab: int, defaults: SamplingParams | None = None, verify: Verify | None = None,
) -> ResponsesParams:
    """A /v1/responses body; `verify` reads reasoning items' encrypted_content (None: ignored).
    Unknown fields (Codex's `client_metadata`, ...) are ignored, as chat ignores them."""
    for name in ("conversation", "prompt", "background"):
        if body.get(name):
            raise InvalidRequest(f"'{name}' is not supported; send 'input' (and 'previous_response_id')", param=name)
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise InvalidRequest("'include' must be an array of strings", param="include")
    chat_body = {k: v for k, v in body.items() if k not in ("n", "logprobs", "top_logprobs", "max_tokens", "echo")}
    chat_body["max_tokens"] = body.get("max_output_tokens")
    chat_body["max_completion_tokens"] = None
    if LOGPROBS_INCLUDE in include or body.get("top_logprobs"):
        chat_body.update(logprobs=True, top_logprobs=body.get("top_logprobs"))
    gen = parse_generation(chat_body, n_vocab, defaults)
    tools = parse_tools(body.get("tools"))
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object", param="text")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise InvalidRequest("'store' must be a boolean", param="store")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidRequest("'metadata' must be an object", param="metadata")
    echo = {
        "instructions": _string(body, "instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": metadata,
        "parallel_tool_calls": parallel,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {"effort": None, "summary": None},
        "temperature": gen.sampling.temperature,
        "text": {"format": (text or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or ("auto" if tools.chat else "none"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs"),
        "top_p": gen.sampling.top_p,
        "truncation": "disabled",
        "user": _string(body, "user"),
        "store": store,
    }
    if tools.left_out:
        echo["warmslot"] = {"tools_left_out": tools.left_out}
    ignored: list[str] = []
    messages = input_messages(body.get("input"), tools, verify, ignored)
    if ignored:
        echo.setdefault("warmslot", {})["encrypted_content_ignored"] = ignored
    return ResponsesParams(
        messages=messages,
        instructions=echo["instructions"],
        gen=gen,
        tools=tools,
        tool_choice=tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=parallel,
        response_format=_response_format(text),
        previous_response_id=_string(body, "previous_response_id"),
        store=store,
        echo=echo,
        encrypted_reasoning=ENCRYPTED_INCLUDE in include,
        ignored_blobs=ignored,
    )


# -- request items to chat messages -----------------------------------------------------------


def _text(content: Any, at: str) -> str:
    """The text of an item's content: a string, or text parts joined as chat joins them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("'content' must be a string or an array of text parts", param=f"{at}.content")
    return "\n".join(_part_text(part, f"{at}.content[{i}]") for i, part in enumerate(content))


def _part_text(part: Any, where: str, send: str = "text parts", refusal: bool = True) -> str:
    """The text of one content part (a text part's text, a refusal's words if allowed)."""
    kind = part.get("type") if isinstance(part, dict) else None
    text = part.get("text") if kind in TEXT_PART_TYPES else part.get("refusal") if kind == "refusal" and refusal else None
    if not isinstance(text, str):
        raise InvalidRequest(f"content part of type {kind!r} is not supported; send {send}", param=where)
    return text


_MEDIA_PARTS = ("input_image", "input_audio")


def _content(content: Any, at: str, images: bool) -> Any:
    """A message's content: its text, or, with `input_image` or `input_audio` parts in a user
    message, chat's text, `image_url` and `input_audio` parts (each naming its own field for
    errors)."""
    if not (images and isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _MEDIA_PARTS for p in content)):
        return _text(content, at)
    parts: list[dict] = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        if not (isinstance(part, dict) and part.get("type") in _MEDIA_PARTS):
            parts.append({"type": "text", "text": _part_text(part, where, "text, image or audio parts", refusal=False)})
            continue
        if part["type"] == "input_audio":  # the same shape as chat's
            parts.append({"type": "input_audio", "input_audio": part.get("input_audio"), PARAM_KEY: where})
            continue
        url = part.get("image_url")
        if not isinstance(url, str):
            raise InvalidRequest("an input_image needs 'image_url', a data: URL ('file_id' is not supported)", param=f"{where}.image_url")
        parts.append({"type": "image_url", "image_url": {"url": url}, PARAM_KEY: f"{where}.image_url"})
    return parts


class _Reasoning:
    """Reasoning items waiting for the assistant message they open: their text, and the turn
    an encrypted_content carries (the whole turn as generated)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.turn: ExactTurn | None = None

    def __bool__(self) -> bool:
        return bool(self.texts) or self.turn is not None

    def attach(self, message: dict) -> None:
        if self.texts:
            message["reasoning_content"] = "\n".join(self.texts)
        if self.turn is not None:
            message[EXACT_KEY] = self.turn
        self.texts, self.turn = [], None


def input_messages(
    value: Any, tools: ResponsesTools | None = None, verify: Verify | None = None, ignored: list[str] | None = None,
) -> list[dict]:
    """`input` as chat messages. A reasoning item's encrypted_content that `verify` reads puts
    its turn on the assistant message it opens (`EXACT_KEY`); one it cannot read is named in
    `ignored`."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty array of items", param="input")
    tools = tools or ResponsesTools(None)
    out: list[dict] = []
    reasoning = _Reasoning()
    for i, item in enumerate(value):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest("each input item must be an object", param=at)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequest("'role' must be user, system, developer or assistant", param=f"{at}.role")
            message = {"role": role, "content": _content(item.get("content"), at, images=role == "user")}
            if role == "assistant":
                reasoning.attach(message)
            out.append(message)
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.texts.append(_text(parts, at))
            blob = item.get("encrypted_content")
            if blob is not None:
                turn = verify(blob) if verify is not None else None
                if turn is None and ignored is not None:
                    ignored.append(at)
                reasoning.turn = turn or reasoning.turn
        elif kind == "function_call":
            out.append(_function_call(item, at, out, reasoning, tools))
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise InvalidRequest("a function_call_output needs 'call_id'", param=f"{at}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(output, at)})
        else:
            raise InvalidRequest(f"input items of type {kind!r} are not supported", param=f"{at}.type")
    return [m for m in out if m is not None]


def _function_call(item: dict, at: str, out: list[dict], reasoning: _Reasoning, tools: ResponsesTools) -> dict | None:
    """A function_call item: a tool call of the assistant message just before it (the same
    turn), or a new assistant message. Returns the message to append, None if merged. A call
    of a namespaced function names it as the model was offered it."""
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
        raise InvalidRequest("a function_call needs 'name', 'call_id' and 'arguments' (a JSON string)", param=at)
    namespace = item.get("namespace")
    name = tools.offered_name(name, namespace if isinstance(namespace, str) else None)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant" and not reasoning:
        last.setdefault("tool_calls", []).append(call)
        return None
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    reasoning.attach(message)
    return message


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def chat_messages(instructions: str | None, history: list[dict], messages: list[dict]) -> list[dict]:
    """The whole conversation as chat messages: instructions first, then what came before
    (`previous_response_id`), then this request's input."""
    system = [{"role": "system", "content": instructions}] if instructions else []
    return system + history + messages


# -- output to items ----------------------------------------------------------------------


def reasoning_item(item_id: str, text: str, status: str = "completed", encrypted: str | None = None) -> dict[str, Any]:
    """A reasoning item; one with no text (only a signed turn) has no content parts."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    item = {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def text_part(text: str, logprobs: list | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(item_id: str, text: str, logprobs: list | None, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text, logprobs)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: dict[str, str], arguments: str, status: str = "completed") -> dict[str, Any]:
    """A function_call item; `name`: its `name` (and `namespace`), from ResponsesTools.call_fields."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, **name, "arguments": arguments, "status": status}


def output_items(
    parsed: ParsedMessage, logprobs: list | None, tools: ResponsesTools, encrypted: str | None = None,
) -> list[dict[str, Any]]:
    """A whole answer's output items: reasoning (always, carrying the signed turn, when
    `encrypted` is given), the message, then the function calls."""
    items = []
    if parsed.reasoning_content or encrypted is not None:
        items.append(reasoning_item(new_id("rs"), parsed.reasoning_content or "", encrypted=encrypted))
    if parsed.content or not parsed.tool_calls:
        items.append(message_item(new_id("msg"), parsed.content or "", logprobs))
    items += [call_item(new_id("fc"), c.id, tools.call_fields(c.name), c.arguments) for c in parsed.tool_calls]
    return items


def items_message(items: list[dict], tools: ResponsesTools, turn: ExactTurn | None = None) -> dict:
    """The chat assistant message that output items stand for (what a chat client sends
    back): the inverse of `output_items`, with the turn as generated (`EXACT_KEY`)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for item in items:
        if item["type"] == "reasoning":
            if item["content"]:
                message["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            message["content"] = "".join(p["text"] for p in item["content"])
        else:
            name = tools.offered_name(item["name"], item.get("namespace"))
            call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}
            message.setdefault("tool_calls", []).append(call)
    if message["content"] is None and not message.get("tool_calls"):
        message["content"] = ""
    if turn is not None:
        message[EXACT_KEY] = turn
    return message


def usage_body(usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0,
                                 **shifted_field(usage, "shifted_tokens")},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_body(
    resp_id: str, created: int, model: str, params: ResponsesParams, *, status: str, output: list[dict],
    usage: dict | None = None, error: dict | None = None, incomplete: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": model,
        "output": output,
        "previous_response_id": params.previous_response_id,
        "usage": usage,
    }
    body.update(params.echo)
    return body
