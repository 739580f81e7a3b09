"""Parsing and validating OpenAI request bodies into typed parameters.

Every check raises `InvalidRequest` with `param` naming the field, so a client sees which
value was wrong. Unknown fields are ignored, as OpenAI's own clients send extras.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from warmslot.slots.llama_api import SamplingParams

from .errors import InvalidRequest

MAX_STOP = 16
ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_body(raw: bytes) -> dict:
    if not raw:
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


# -- field readers ------------------------------------------------------------------------


def _number(body: dict, name: str, default: float | None, lo: float | None = None, hi: float | None = None) -> float | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{name}' must be a number", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InvalidRequest(f"'{name}' must be between {lo} and {hi}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise InvalidRequest(f"'{name}' must be {bounds}", param=name)
    return value


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=name)
    return value


def _string(body: dict, name: str, default: str | None = None) -> str | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest("'stop' must be a string or a list of strings", param="stop")
    if len(value) > MAX_STOP:
        raise InvalidRequest(f"'stop' takes at most {MAX_STOP} strings", param="stop")
    return tuple(s for s in value if s)


def _logit_bias(body: dict, n_vocab: int) -> dict[int, float]:
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'logit_bias' must be an object mapping token ids to biases", param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"'logit_bias' key {key!r} is not a token id", param="logit_bias") from None
        if not 0 <= token < n_vocab:
            raise InvalidRequest(f"'logit_bias' token {token} is outside the vocabulary (0..{n_vocab - 1})", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidRequest("'logit_bias' values must be numbers between -100 and 100", param="logit_bias")
        out[token] = float(bias) if bias > -100 else float("-inf")
    return out


def _unsupported(body: dict) -> None:
    n = _integer(body, "n", 1, 1)
    if n != 1:
        raise InvalidRequest("only n=1 is supported", param="n")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    if body.get("echo"):
        raise InvalidRequest("echo is not supported", param="echo")
    if body.get("suffix"):
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.get("best_of") not in (None, 1):
        raise InvalidRequest("best_of is not supported", param="best_of")


# -- shared generation parameters -----------------------------------------------------------


@dataclass(slots=True)
class GenerationParams:
    sampling: SamplingParams
    max_tokens: int | None  # None: until the slot's context is full
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    tenant_hint: str  # cache_salt or user
    explain_cache: bool  # return the cache explanation in the body
    cache_prompt: bool  # false: reuse nothing for this request (a cold baseline)


def parse_generation(body: dict, n_vocab: int, default_max_tokens: int | None) -> GenerationParams:
    _unsupported(body)
    max_tokens = _integer(body, "max_completion_tokens", None, 0)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 0)
    if max_tokens is None:
        max_tokens = default_max_tokens
    sampling = SamplingParams(
        temperature=_number(body, "temperature", 0.8, 0.0, 100.0),
        top_k=_integer(body, "top_k", 40, 0),
        top_p=_number(body, "top_p", 0.95, 0.0, 1.0),
        min_p=_number(body, "min_p", 0.05, 0.0, 1.0),
        repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.0, 10.0),
        repeat_last_n=_integer(body, "repeat_last_n", 64, 0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=_integer(body, "seed", None),
        logit_bias=_logit_bias(body, n_vocab),
    )
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and _boolean(options, "include_usage", False))
    salt = _string(body, "cache_salt") or _string(body, "user") or ""
    return GenerationParams(
        sampling=sampling,
        max_tokens=max_tokens,
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        ignore_eos=_boolean(body, "ignore_eos", False),
        tenant_hint=salt,
        explain_cache=_boolean(body, "warmslot_explain", False),
        cache_prompt=_boolean(body, "cache_prompt", True),
    )


# -- chat ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ChatParams:
    messages: list[dict]
    gen: GenerationParams
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    template_kwargs: dict = field(default_factory=dict)


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
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
        clean: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _content(msg.get("content"), where)}
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


def parse_chat(body: dict, n_vocab: int, default_max_tokens: int | None) -> ChatParams:
    messages = parse_messages(body.get("messages"))
    gen = parse_generation(body, n_vocab, default_max_tokens)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    return ChatParams(
        messages=messages,
        gen=gen,
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        parallel_tool_calls=_boolean(body, "parallel_tool_calls", True),
        response_format=response_format,
        template_kwargs=kwargs,
    )


# -- completions --------------------------------------------------------------------------


@dataclass(slots=True)
class CompletionParams:
    prompt: str | list[int]
    gen: GenerationParams


def parse_completion(body: dict, n_vocab: int, default_max_tokens: int | None) -> CompletionParams:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("'prompt' must not be empty", param="prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param="prompt")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise InvalidRequest("only one prompt per request is supported", param="prompt")
    else:
        raise InvalidRequest("'prompt' must be a string or an array of token ids", param="prompt")
    return CompletionParams(prompt=prompt, gen=parse_generation(body, n_vocab, default_max_tokens))
