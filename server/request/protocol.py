"""Parsing and validating OpenAI request bodies into typed parameters.

Every check raises `InvalidRequest` with `param` naming the field, so a client sees which
value was wrong. Unknown fields are ignored, as OpenAI's own clients send extras. Validating
`tools` converts each parameter schema to grammar rules (`gbnf.schema`), which can take a
while for large schemas: call it off the event loop.

The body's JSON is parsed in json_body.py and chat messages in chat_messages.py; their
names are importable from here as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from warmslot.slots import DraftLimits, SamplingParams

from .cache_hints import parse_cache_hints
from .chat_messages import ROLES, continues_final, parse_messages  # noqa: F401  (ROLES: importable from here)
from .json_body import parse_body  # noqa: F401  (importable from here)
from ..errors import InvalidRequest
from ..prompt.exact_turns import ExactTurn

MAX_STOP = 16
INT32_MAX = 2**31 - 1  # integers that reach llama.cpp as a C int


# -- field readers ------------------------------------------------------------------------


def _number(body: dict, name: str, default: float | None, lo: float | None = None, hi: float | None = None) -> float | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a finite number", param=name)
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
        # int() would also take " 5 ", "1_0" and other scripts' digits: only plain ASCII digits
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise InvalidRequest(f"'logit_bias' key {key!r} is not a token id", param="logit_bias")
        # NOTE: the length first: int() of thousands of digits raises past Python's digit limit
        if len(key.lstrip("0")) > len(str(n_vocab)):
            raise InvalidRequest(f"'logit_bias' key {key[:20]!r}... is outside the vocabulary (0..{n_vocab - 1})", param="logit_bias")
        token = int(key)
        if not 0 <= token < n_vocab:
            raise InvalidRequest(f"'logit_bias' token {token} is outside the vocabulary (0..{n_vocab - 1})", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) or not -100 <= bias <= 100:
            raise InvalidRequest("'logit_bias' values must be numbers between -100 and 100", param="logit_bias")
        out[token] = float(bias) if bias > -100 else float("-inf")
    return out


MAX_N = 128  # choices per request, whatever --max-n says
MAX_TOP_LOGPROBS = 20  # chat: top_logprobs, as OpenAI limits it
MAX_COMPLETION_LOGPROBS = 5  # completions: logprobs, as OpenAI limits it


def _unsupported(body: dict) -> None:
    if body.get("suffix"):
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.get("best_of") not in (None, 1):
        raise InvalidRequest("best_of is not supported; use n", param="best_of")


def _logprobs(body: dict, completion: bool) -> int | None:
    """How many alternatives each generated token reports (None: no logprobs). Completions
    take `logprobs` as that number; chat takes `logprobs: true` and `top_logprobs`."""
    if completion:
        return _integer(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    if not _boolean(body, "logprobs", False):
        if body.get("top_logprobs") not in (None, 0):
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return None
    return _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


MAX_DRAFT = 1024  # llama-server's bound on its draft sizes


def _draft_limits(body: dict) -> DraftLimits | None:
    """llama-server's per-request speculative-decoding fields: `speculative.n_max` (0 turns
    drafting off for this request), `speculative.n_min`, `speculative.p_min`. They narrow the
    server's --draft-max; None when the body sends none."""
    names = ("speculative.n_max", "speculative.n_min", "speculative.p_min")
    if all(body.get(name) is None for name in names):
        return None
    n_max = _integer(body, names[0], None, 0, MAX_DRAFT)
    n_min = _integer(body, names[1], None, 0, MAX_DRAFT)
    p_min = _number(body, names[2], None, 0.0, 1.0)
    if n_max is not None and n_min is not None and n_max and n_min > n_max:
        raise InvalidRequest("'speculative.n_min' must not exceed 'speculative.n_max'", param="speculative.n_min")
    return DraftLimits(n_max, n_min, p_min)


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
    n: int = 1  # choices, each sampled on its own from one evaluation of the prompt
    logprobs: int | None = None  # None: no logprobs; k: each token's and the k most likely
    echo: bool = False  # completions: the prompt text precedes each choice's text
    timeout: float | None = None  # seconds the request may take, waiting and running
    cache_key: str = ""  # prompt_cache_key: slot affinity
    session: str = ""  # the client's session (the Messages API: Claude Code's session id in metadata.user_id)
    keep_s: float | None = None  # prompt_cache_retention in seconds (0: never on disk; None: default)
    return_progress: bool = False  # a stream reports the prompt's evaluation (llama-server's prompt_progress)
    timings_per_token: bool = False  # a stream's chunks carry llama-server's timings so far
    n_indent: int = 0  # llama-server's (/completion, /infill): lines after the first need this indentation
    t_max_predict_ms: int = 0  # llama-server's: past this much generation, a newline ends the reply (0: no limit)
    lora: Any = None  # llama-server's per-request LoRA adapters, as sent (request/lora.py reads it against the loaded ones)


def parse_generation(
    body: dict, n_vocab: int, defaults: SamplingParams | None = None, *, completion: bool = False
) -> GenerationParams:
    """The generation parameters of a request; `defaults` (the server's) fill what it omits.
    `completion`: the body is a /v1/completions one (logprobs is a number there, echo exists)."""
    d = defaults or SamplingParams()
    _unsupported(body)
    echo = _boolean(body, "echo", False) if completion else False
    max_tokens = _integer(body, "max_completion_tokens", None, 1, INT32_MAX)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, INT32_MAX)
    sampling = SamplingParams(
        temperature=_number(body, "temperature", d.temperature, 0.0, 100.0),
        top_k=_integer(body, "top_k", d.top_k, 0, INT32_MAX),
        top_p=_number(body, "top_p", d.top_p, 0.0, 1.0),
        min_p=_number(body, "min_p", d.min_p, 0.0, 1.0),
        repeat_penalty=_number(body, "repeat_penalty", d.repeat_penalty, 0.0, 10.0),
        repeat_last_n=_integer(body, "repeat_last_n", d.repeat_last_n, 0, INT32_MAX),
        frequency_penalty=_number(body, "frequency_penalty", d.frequency_penalty, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", d.presence_penalty, -2.0, 2.0),
        seed=_integer(body, "seed", d.seed, -(2**63), 2**64 - 1),
        logit_bias=_logit_bias(body, n_vocab),
        speculative=_draft_limits(body),
    )
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and _boolean(options, "include_usage", False))
    salt = _string(body, "cache_salt") or _string(body, "user") or ""
    cache_key, keep_s = parse_cache_hints(body)
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
        n=_integer(body, "n", 1, 1, MAX_N),
        logprobs=_logprobs(body, completion),
        echo=echo,
        timeout=_timeout(body),
        cache_key=cache_key,
        keep_s=keep_s,
        return_progress=stream and _boolean(body, "return_progress", False),
        timings_per_token=stream and _boolean(body, "timings_per_token", False),
        lora=body.get("lora"),
    )


MAX_TIMEOUT = 7 * 24 * 3600.0
MIN_TIMEOUT = 0.001  # a shorter one could not even be measured


def _timeout(body: dict) -> float | None:
    value = _number(body, "timeout", None, None, None)
    if value is not None and not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise InvalidRequest(f"'timeout' must be a number of seconds from {MIN_TIMEOUT} to {MAX_TIMEOUT:.0f}", param="timeout")
    return value


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
    breakpoints: tuple[int, ...] = ()  # messages whose end is a checkpoint position (cache_control)
    add_generation_prompt: bool = True  # False: the prompt ends where the template leaves the last message
    continue_final: bool = False  # the reply continues the final assistant message (a prefill)
    grammar: str | None = None  # GBNF text that constrains the reply
    json_schema: dict | None = None  # a schema the reply is one JSON value of
    schema_param: str = "json_schema"  # the request field that holds `json_schema` (named in errors)
    hidden_tools: frozenset[str] = frozenset()  # tools the model may call that the prompt does not list
    exact_turns: dict[int, ExactTurn] = field(default_factory=dict)  # message index -> the turn as generated (exact_turns.py)


def parse_chat(body: dict, n_vocab: int, defaults: SamplingParams | None = None) -> ChatParams:
    messages = parse_messages(body.get("messages"))
    gen = parse_generation(body, n_vocab, defaults)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    add_generation_prompt = body.get("add_generation_prompt")
    if add_generation_prompt is not None and not isinstance(add_generation_prompt, bool):
        raise InvalidRequest("'add_generation_prompt' must be a boolean", param="add_generation_prompt")
    grammar, json_schema = body.get("grammar"), body.get("json_schema")
    if grammar is not None and (not isinstance(grammar, str) or not grammar.strip()):
        raise InvalidRequest("'grammar' must be GBNF text", param="grammar")
    if json_schema is not None and not isinstance(json_schema, dict):
        raise InvalidRequest("'json_schema' must be an object (a JSON schema)", param="json_schema")
    formats = response_format is not None and response_format.get("type") != "text"
    if sum(x is not None for x in (grammar, json_schema)) + formats > 1:
        raise InvalidRequest("send one of 'grammar', 'json_schema' and 'response_format'", param="grammar" if grammar is not None else "json_schema")
    continue_final = continues_final(messages, add_generation_prompt, _boolean(body, "continue_final_message", False))
    parts = body["messages"][-1].get("content")
    if continue_final and isinstance(parts, list):  # a prefill's text parts join as llama-server joins them
        messages[-1]["content"] = "\n\n".join(part["text"] for part in parts)
    return ChatParams(
        messages=messages,
        gen=gen,
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        parallel_tool_calls=_boolean(body, "parallel_tool_calls", True),
        response_format=response_format,
        template_kwargs=kwargs,
        add_generation_prompt=add_generation_prompt is not False,
        continue_final=continue_final,
        grammar=grammar,
        json_schema=json_schema,
    )


# -- completions --------------------------------------------------------------------------


@dataclass(slots=True)
class CompletionParams:
    prompt: str | list[int]  # the first (or only) prompt
    gen: GenerationParams
    prompts: list[str | list[int]] = field(default_factory=list)  # all of them (a batch)


MAX_PROMPTS = 64  # prompts in one /v1/completions batch


def _one_prompt(prompt: Any, n_vocab: int, param: str) -> str | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("'prompt' must not be empty", param=param)
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param=param)
        return prompt
    raise InvalidRequest("a prompt must be a non-empty string or an array of token ids", param=param)


def parse_completion(body: dict, n_vocab: int, defaults: SamplingParams | None = None) -> CompletionParams:
    """`prompt`: a string, an array of token ids, or a batch: an array of strings or of
    token-id arrays (choice i*n + j answers prompt i)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise InvalidRequest(f"'prompt' takes at most {MAX_PROMPTS} prompts", param="prompt")
        prompts = [_one_prompt(p, n_vocab, f"prompt[{i}]") for i, p in enumerate(prompt)]
    elif isinstance(prompt, (str, list)):
        prompts = [_one_prompt(prompt, n_vocab, "prompt")]
    else:
        raise InvalidRequest("'prompt' must be a string, an array of token ids, or an array of those", param="prompt")
    gen = parse_generation(body, n_vocab, defaults, completion=True)
    if gen.echo and gen.logprobs is not None:
        raise InvalidRequest(
            "echo with logprobs would need the prompt's log-probabilities, which are not computed; send one of them",
            param="echo",
        )
    return CompletionParams(prompt=prompts[0], gen=gen, prompts=prompts)
