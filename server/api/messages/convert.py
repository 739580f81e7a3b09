"""An Anthropic Messages request in chat terms: the chat request it stands for.

- `system` (a string or text blocks) becomes the system message, and so does a message of
  role `system` (Claude Code sends some in the middle of a conversation);
- a user message's `tool_result` blocks become tool messages (in their order), its text
  blocks a user message;
- an assistant message's `thinking` blocks become its reasoning, its text its content, its
  `tool_use` blocks its tool calls (`input` as JSON text);
- `tools` (`input_schema`) become function tools, `tool_choice` auto/any/tool/none becomes
  auto/required/a named function/none, `disable_parallel_tool_use` turns parallel calls off;
  a tool with `defer_loading` is callable but not listed in the prompt, and a `tool_reference`
  block in a tool result (Claude Code's ToolSearch) shows that tool's definition there, as a
  `<function>` line in a `<functions>` block; server tools (a `type` such as
  `web_search_20250305`, run by Anthropic's service) are left out;
- `stop_sequences`, `max_tokens`, `temperature`, `top_p`, `top_k` are chat's sampling
  fields, `metadata.user_id` (less a session id in it) the tenant hint as `user` is in chat;
  `thinking`, `output_config.effort` and `output_config.format` are read by `options`;
- a block with `cache_control` marks the end of its message as a checkpoint position.

Claude Code's first system block, `x-anthropic-billing-header: cc_version=...; cch=...;`,
changes on every request. It is billing metadata for Anthropic's own service and means
nothing to a local model, so by default it is dropped (any block or line that starts with
it): left in, it would be the first text of the prompt, and every request would diverge at
its first tokens and recompute the whole prompt. `--keep-billing-header` keeps it verbatim.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from warmslot.slots import SamplingParams

from ...errors import InvalidRequest
from ...gbnf.limits import MAX_COUNT
from ...request.chat_messages import parse_messages
from ...request.protocol import MAX_STOP, ChatParams, parse_generation
from .options import ignored_fields, output_schema, reasoning

BILLING_HEADER = "x-anthropic-billing-header:"
_SKIPPED_TYPES = ("redacted_thinking",)  # opaque to any other model: nothing to render


@dataclass(slots=True)
class MessagesRequest:
    """A parsed /v1/messages (or count_tokens) request."""

    chat: ChatParams
    model: str
    budget: int  # the reasoning budget (-1: none)
    ignored: list[str] = field(default_factory=list)  # fields and tools accepted that change nothing


def parse_request(
    body: dict, n_vocab: int, defaults: SamplingParams | None, *, default_budget: int, keep_billing_header: bool,
    count_only: bool = False,
) -> MessagesRequest:
    """The chat request a Messages body stands for; `count_only`: a count_tokens body (no
    max_tokens). Every check names the field."""
    model = body.get("model")
    if count_only and model is None:  # a count is of the loaded model's tokens (llama-server asks no name)
        model = ""
    elif not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required (any name: the loaded model answers)", param="model")
    if not count_only and body.get("max_tokens") is None:
        raise InvalidRequest("'max_tokens' is required", param="max_tokens")
    system = _system(body.get("system"), keep_billing_header)
    tools = _tools(body.get("tools"))
    messages, breakpoints = _messages(body.get("messages"), tools.definitions)
    offset = 1 if system is not None else 0
    chat_messages = ([{"role": "system", "content": system}] if system is not None else []) + messages
    fields, session = _generation_body(body)
    gen = dataclasses.replace(parse_generation(fields, n_vocab, defaults), session=session)
    tool_choice, parallel = _tool_choice(body.get("tool_choice")), True
    if isinstance(body.get("tool_choice"), dict):
        parallel = not _flag(body["tool_choice"], "disable_parallel_tool_use", "tool_choice")
    parsed = parse_messages(chat_messages)
    last = parsed[-1]
    thinking = reasoning(body, default_budget)
    schema = output_schema(body)
    chat = ChatParams(
        messages=parsed,
        gen=gen,
        tools=tools.functions,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        breakpoints=tuple(i + offset for i in breakpoints),
        # a final assistant message is where the reply starts (Anthropic's prefill)
        continue_final=last["role"] == "assistant" and not last.get("tool_calls") and bool(last.get("content")),
        template_kwargs={} if thinking.enable_thinking is None else {"enable_thinking": thinking.enable_thinking},
        json_schema=_loosened(schema.schema) if schema is not None else None,
        schema_param=schema.param if schema is not None else "json_schema",
        hidden_tools=tools.hidden,
    )
    ignored = ignored_fields(body) + thinking.ignored + [f"tools: server tool {name}" for name in tools.server]
    return MessagesRequest(chat, model, thinking.budget, ignored)


def _generation_body(body: dict) -> tuple[dict, str]:
    """The chat-shaped fields `parse_generation` reads (their checks name the same fields,
    but for `stop_sequences`), and the client's session (`split_user_id`)."""
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise InvalidRequest("'stop_sequences' must be an array of strings", param="stop_sequences")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("'metadata' must be an object", param="metadata")
    user = (metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'metadata.user_id' must be a string", param="metadata.user_id")
    out = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stream", "cache_salt", "timeout") if k in body}
    if stops:
        if len(stops) > MAX_STOP:
            raise InvalidRequest(f"'stop_sequences' takes at most {MAX_STOP} strings", param="stop_sequences")
        out["stop"] = stops
    session = ""
    if user:
        out["user"], session = split_user_id(user)
    return out, session


_SESSION_SUFFIX = re.compile(r"_session_([0-9a-fA-F-]+)$")


def split_user_id(user_id: str) -> tuple[str, str]:
    """The user a `metadata.user_id` names, without the session, and the session ("" for
    none). Claude Code sends its session id in it (`{"device_id", "account_uuid",
    "session_id"}` as JSON, or `user_..._account_..._session_<uuid>`).
    - The user is the tenant hint: a tenant per session would make every new session
      recompute the ~20K-token system prompt and tools that all of a user's sessions share.
    - The session is the same for a main agent and its sub-agents, so the prompt cache keeps
      a session's other conversations while one of its requests runs or waits
      (warmslot.cache.lookahead)."""
    try:
        value = json.loads(user_id)
    except ValueError:
        found = _SESSION_SUFFIX.search(user_id)
        return _SESSION_SUFFIX.sub("", user_id), found.group(1) if found else ""
    if isinstance(value, dict):
        session = value.get("session_id")
        user = json.dumps({k: v for k, v in value.items() if k != "session_id"}, sort_keys=True)
        return user, session if isinstance(session, str) else ""
    return user_id, ""


def _flag(value: dict, name: str, where: str) -> bool:
    flag = value.get(name, False)
    if not isinstance(flag, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=f"{where}.{name}")
    return flag


# -- system and messages ----------------------------------------------------------------------


def is_billing_header(text: str) -> bool:
    return text.lstrip().startswith(BILLING_HEADER)


def _system(value: Any, keep_billing_header: bool) -> str | None:
    """The system text: a string, or text blocks joined as chat joins text parts; Claude
    Code's billing header dropped unless kept."""
    if value is None:
        return None
    if isinstance(value, str):
        lines = value.split("\n")
        if not keep_billing_header and lines and is_billing_header(lines[0]):
            value = "\n".join(lines[1:])
        return value
    if not isinstance(value, list):
        raise InvalidRequest("'system' must be a string or an array of text blocks", param="system")
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest("system blocks must be text blocks", param=f"system[{i}]")
        if keep_billing_header or not is_billing_header(block["text"]):
            texts.append(block["text"])
    return "\n".join(texts) if texts else None


def _messages(value: Any, definitions: dict[str, dict]) -> tuple[list[dict], list[int]]:
    """Chat messages, and the indices of those that end at a cache breakpoint.
    `definitions`: the tools by name, which `tool_reference` blocks show."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    out: list[dict] = []
    breakpoints: list[int] = []
    for i, message in enumerate(value):
        at = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest("each message must be an object", param=at)
        role = message.get("role")
        if role not in ("user", "assistant", "system"):  # system: Claude Code's mid-conversation system messages
            raise InvalidRequest("'role' must be user or assistant", param=f"{at}.role")
        content = message.get("content")
        if isinstance(content, str):
            blocks: list = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = content
        else:
            raise InvalidRequest("'content' must be a string or an array of content blocks", param=f"{at}.content")
        if role == "system":
            out.append({"role": "system", "content": _system_text(blocks, at)})
        else:
            out += _user(blocks, at, definitions) if role == "user" else [_assistant(blocks, at)]
        if any(isinstance(b, dict) and b.get("cache_control") for b in blocks) and out:
            breakpoints.append(len(out) - 1)
    return out, breakpoints


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequest("each content block must be an object with a 'type'", param=where)
    kind = block["type"]
    if kind == "document":
        raise InvalidRequest("document blocks are not supported: send the text, or images with --mmproj", param=where)
    return kind


def _image(block: dict, where: str) -> dict:
    """An image block as the chat image part it stands for (a data: URL or a URL), which the
    chat path checks and decodes like any other (a 400 without a projector)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest("an image block needs 'source'", param=f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise InvalidRequest("a base64 image source needs 'media_type' and 'data' (strings)", param=f"{where}.source")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise InvalidRequest("a url image source needs 'url' (a string)", param=f"{where}.source.url")
    else:
        raise InvalidRequest("an image source's 'type' is base64 or url", param=f"{where}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _system_text(blocks: list, at: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        where = f"{at}.content[{j}]"
        if _block_type(block, where) != "text":
            raise InvalidRequest("a system message holds only text blocks", param=f"{where}.type")
        texts.append(_text_of(block, where))
    return "\n".join(texts)


def _text_of(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest("a text block needs 'text' (a string)", param=f"{where}.text")
    return text


def _user(blocks: list, at: str, definitions: dict[str, dict]) -> list[dict]:
    """A user message's blocks: each tool_result a tool message, the text and images a user
    message (its parts in order; text alone joins as chat joins text parts)."""
    out: list[dict] = []
    parts: list[dict] = []

    def flush() -> None:
        if any(part["type"] != "text" for part in parts):
            out.append({"role": "user", "content": list(parts)})
        else:
            out.append({"role": "user", "content": "\n".join(part["text"] for part in parts)})
        parts.clear()

    for j, block in enumerate(blocks):
        where = f"{at}.content[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, where)})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            if parts:  # what comes before a result keeps its place
                flush()
            out.append(_tool_result(block, where, definitions))
        else:
            raise InvalidRequest(f"a user message cannot hold a {kind!r} block", param=f"{where}.type")
    if parts or not out:
        flush()
    return out


def _tool_result(block: dict, where: str, definitions: dict[str, dict]) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise InvalidRequest("a tool_result needs 'tool_use_id'", param=f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        parts: list[str] = []
        functions: list[str] = []  # a run of tool_reference blocks, shown as one <functions> block

        def close_functions() -> None:
            if functions:
                parts.append("<functions>\n" + "\n".join(functions) + "\n</functions>")
                functions.clear()

        for k, part in enumerate(content):
            kind = _block_type(part, f"{where}.content[{k}]")
            if kind == "tool_reference":
                functions.append(_function_line(part, f"{where}.content[{k}]", definitions))
                continue
            if kind != "text":
                raise InvalidRequest("tool_result content must be text or tool_reference blocks", param=f"{where}.content[{k}].type")
            close_functions()
            parts.append(_text_of(part, f"{where}.content[{k}]"))
        close_functions()
        content = "\n".join(parts)
    elif not isinstance(content, str):
        raise InvalidRequest("tool_result 'content' must be a string or text blocks", param=f"{where}.content")
    if _flag(block, "is_error", where):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _function_line(block: dict, where: str, definitions: dict[str, dict]) -> str:
    """A loaded tool's definition as ToolSearch describes its result: one `<function>` line
    of JSON (description, name, parameters)."""
    name = block.get("tool_name")
    if not isinstance(name, str):
        raise InvalidRequest("a tool_reference block needs 'tool_name' (a string)", param=f"{where}.tool_name")
    function = definitions.get(name, {"name": name})
    shown = {k: function[k] for k in ("description", "name", "parameters") if k in function}
    return "<function>" + json.dumps(shown, ensure_ascii=False) + "</function>"


def _assistant(blocks: list, at: str) -> dict:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        where = f"{at}.content[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise InvalidRequest("a thinking block needs 'thinking' (a string)", param=f"{where}.thinking")
            thoughts.append(thinking)
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind not in _SKIPPED_TYPES:
            raise InvalidRequest(f"an assistant message cannot hold a {kind!r} block", param=f"{where}.type")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_use(block: dict, where: str) -> dict:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise InvalidRequest("a tool_use block needs 'id' and 'name'", param=where)
    if not isinstance(arguments, dict):
        raise InvalidRequest("a tool_use block's 'input' must be an object", param=f"{where}.input")
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


# -- tools ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tools:
    """A request's `tools` in chat terms."""

    functions: list[dict] | None  # every callable tool, as chat function tools (None: no `tools`)
    hidden: frozenset[str] = frozenset()  # those with `defer_loading`: callable, not listed in the prompt
    server: list[str] = field(default_factory=list)  # server tools, left out (Anthropic's service runs them)

    @property
    def definitions(self) -> dict[str, dict]:
        return {t["function"]["name"]: t["function"] for t in self.functions or ()}


def _tools(value: Any) -> Tools:
    if value is None:
        return Tools(None)
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    out, hidden, server = [], set(), []
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest("each tool must be an object", param=at)
        name, schema = tool.get("name"), tool.get("input_schema")
        if tool.get("type") not in (None, "custom") and schema is None:
            server.append(str(tool.get("name") or tool.get("type")))  # web_search_20250305 and the like
            continue
        if not isinstance(name, str):
            raise InvalidRequest("a tool needs 'name'", param=f"{at}.name")
        if not isinstance(schema, dict):
            raise InvalidRequest("a tool needs 'input_schema' (an object)", param=f"{at}.input_schema")
        function = {"name": name, "parameters": _loosened(schema)}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if _flag(tool, "defer_loading", at):
            hidden.add(name)
        out.append({"type": "function", "function": function})
    return Tools(out, frozenset(hidden), server)


def _loosened(schema: Any) -> Any:
    """The schema without upper bounds a grammar cannot afford (`maxLength` or `maxItems`
    past `MAX_COUNT`): chat answers those with a 400, but Claude Code's own tools carry them
    (a `maxLength` of 524288), and no reply comes near such a bound."""
    if isinstance(schema, list):
        return [_loosened(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: _loosened(value) for key, value in schema.items()
        if not (key in ("maxLength", "maxItems") and isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT)
    }


def _tool_choice(value: Any) -> Any:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        if not isinstance(value.get("name"), str):
            raise InvalidRequest("tool_choice of type 'tool' needs 'name'", param="tool_choice.name")
        return {"type": "function", "function": {"name": value["name"]}}
    raise InvalidRequest("'tool_choice' must be an object of type auto, any, tool or none", param="tool_choice")
