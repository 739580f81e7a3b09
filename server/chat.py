"""Chat templates and prompt building.

A chat request becomes tokens in three steps:

1. **Render** the messages (and tools) with the chat template: the GGUF's own, a file or
   built-in name given with --chat-template, or a built-in chosen by architecture. Jinja runs
   sandboxed. A template that knows no tools gets them injected as a Hermes-style system
   prompt, with tool calls and tool results turned into text (see `inject_tools`).
2. **Split** the text into segments: template glue, and each message's content.
3. **Tokenize** each segment on its own (and cache the result). Glue and assistant content
   parse special tokens; user, system and tool content do not, so text such as
   "<start_of_turn>" typed by a user stays text.

Tokenizing segments separately keeps a conversation's token prefix stable from turn to turn:
a new message never changes how the previous ones tokenize. It also gives the token offset
where each message's content starts, which the engine uses as checkpoint positions.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidRequest

log = logging.getLogger("warmslot.chat")

BUILTIN_TEMPLATES = ("gemma", "chatml", "llama3", "mistral")


def builtin_source(name: str) -> str:
    return resources.files("server").joinpath("templates", f"{name}.jinja").read_text("utf-8")


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    source: str
    bos_token: str = ""
    eos_token: str = ""

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.source

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, extra: dict | None = None) -> str:
        template = _compiled(self.source)
        variables = dict(extra or {})
        variables.update(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            return template.render(**variables)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}", param="messages") from exc


_compile_lock = threading.Lock()
_compile_cache: dict[str, jinja2.Template] = {}


def _compiled(source: str) -> jinja2.Template:
    with _compile_lock:
        template = _compile_cache.get(source)
        if template is None:
            template = _environment().from_string(source)
            _compile_cache[source] = template
        return template


def choose_template(spec: str | None, gguf_template: str | None, arch: str, vocab_has: "callable") -> tuple[str, str]:
    """(name, source) of the template to use. `spec` is --chat-template: a file or a built-in
    name. Without it: the GGUF's template, else a built-in chosen by architecture."""
    if spec:
        if os.path.isfile(spec):
            with open(spec, encoding="utf-8") as f:
                return spec, f.read()
        if spec in BUILTIN_TEMPLATES:
            return spec, builtin_source(spec)
        raise ValueError(f"--chat-template {spec!r} is neither a file nor one of {', '.join(BUILTIN_TEMPLATES)}")
    if gguf_template:
        return "gguf", gguf_template
    name = _template_for_arch(arch, vocab_has)
    log.warning("the model has no chat template; using the built-in %r template for arch %s", name, arch)
    return name, builtin_source(name)


def _template_for_arch(arch: str, vocab_has) -> str:
    if arch.startswith("gemma"):
        return "gemma"
    if vocab_has("<|start_header_id|>"):
        return "llama3"
    if vocab_has("[INST]"):
        return "mistral"
    return "chatml"


# -- tools for templates that know none ---------------------------------------------------

TOOL_PROMPT = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def hermes_call_text(function: dict) -> str:
    """A tool call as the injected tool prompt asks for it. The arguments keep the client's
    own JSON text when it sent one, so a call echoed back renders exactly as generated."""
    raw = function.get("raw_arguments")
    args = raw if isinstance(raw, str) else _tojson(function["arguments"])
    return "<tool_call>\n" + '{"name": ' + json.dumps(function["name"], ensure_ascii=False) + ', "arguments": ' + args + "}\n</tool_call>"


def inject_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Rewrite a conversation for a template without tool support (Hermes-style):
    tools go into the system prompt, assistant tool calls become <tool_call> blocks and tool
    results become user turns wrapped in <tool_response>. Consecutive tool results merge into
    one user turn. Keeps each message's original index under "_index"."""
    out: list[dict] = []
    if tools:
        listing = "\n".join(_tojson(t) for t in tools)
        prompt = TOOL_PROMPT.format(tools=listing)
        if messages and messages[0]["role"] == "system":
            first = dict(messages[0])
            first["content"] = f"{first.get('content') or ''}\n\n{prompt}".lstrip("\n")
            out.append(first)
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": prompt, "_index": -1})
    for msg in messages:
        role = msg["role"]
        if role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(hermes_call_text(c["function"]) for c in msg["tool_calls"])
            text = msg.get("content") or ""
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls, "_index": msg["_index"]})
        elif role == "tool":
            block = f"<tool_response>\n{msg.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_merge"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_index": msg["_index"], "_tool_merge": True})
        else:
            out.append(msg)
    return out


# -- segments and tokens ------------------------------------------------------------------


@dataclass(slots=True)
class Segment:
    text: str
    special: bool  # parse special tokens in this text
    message: int = -1  # original message index of a content segment, -1 for glue


@dataclass(slots=True)
class Prompt:
    """A rendered, tokenized chat prompt."""

    text: str
    tokens: list[int]
    # per original message: (role, token offset where its glue starts, where its content starts)
    messages: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def content_starts(self) -> tuple[int, ...]:
        return tuple(start for _, _, start in self.messages)

    def message_at(self, token_index: int) -> int:
        """Index of the message that the token at `token_index` belongs to (-1: none)."""
        found = -1
        for i, (_, glue_start, _) in enumerate(self.messages):
            if glue_start <= token_index:
                found = i
        return found


def split_segments(text: str, messages: Sequence[dict]) -> list[Segment]:
    """Cut rendered text at each message's content. Contents are found in order; a content
    the template changed beyond trimming stays inside the glue around it."""
    segments: list[Segment] = []
    cursor = 0
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        start = text.find(content, cursor)
        if start < 0:
            content = content.strip()
            start = text.find(content, cursor)
        if start < 0:
            continue
        if start > cursor:
            segments.append(Segment(text[cursor:start], True))
        segments.append(Segment(content, msg["role"] == "assistant", msg.get("_index", -1)))
        cursor = start + len(content)
    if cursor < len(text):
        segments.append(Segment(text[cursor:], True))
    assert "".join(s.text for s in segments) == text
    return segments


class Tokenizer:
    """Tokenizes segments with an LRU cache, so a growing conversation only tokenizes what is new."""

    def __init__(self, model, max_entries: int = 8192) -> None:
        self.model = model
        self._cache: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def tokenize(self, text: str, special: bool) -> list[int]:
        key = (text, special)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        tokens = self.model.tokenize(text, add_special=False, parse_special=special)
        with self._lock:
            self._cache[key] = tokens
            if len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return tokens

    def prompt(self, text: str, *, add_bos: bool = True) -> list[int]:
        """A plain text prompt (completions): BOS per the vocabulary, special tokens parsed."""
        tokens = self.model.tokenize(text, add_special=add_bos, parse_special=True)
        return tokens


class PromptBuilder:
    def __init__(self, template: ChatTemplate, model) -> None:
        self.template = template
        self.model = model
        self.tokenizer = Tokenizer(model)

    def build(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool = True, extra: dict | None = None) -> Prompt:
        """Render and tokenize. Thread-safe; call it off the event loop (it runs ctypes)."""
        indexed = [dict(m, _index=i) for i, m in enumerate(messages)]
        template_tools = tools
        if not self.template.supports_tools and (tools or any(m["role"] == "tool" or m.get("tool_calls") for m in indexed)):
            indexed = inject_tools(indexed, tools)
            template_tools = None
        text = self.template.render(indexed, template_tools, add_generation_prompt, extra)
        segments = split_segments(text, indexed)
        tokens: list[int] = []
        spans: dict[int, tuple[int, int, int]] = {}  # message -> glue start, content start, end
        previous_end = 0
        for seg in segments:
            if seg.message >= 0 and seg.message not in spans:
                spans[seg.message] = (previous_end, len(tokens), -1)
            tokens.extend(self.tokenizer.tokenize(seg.text, seg.special))
            if seg.message >= 0:
                previous_end = len(tokens)
                glue, content, _ = spans[seg.message]
                spans[seg.message] = (glue, content, previous_end)
        shift = self._bos_prefix(tokens)
        if shift:
            tokens = [self.model.bos] + tokens
        return Prompt(text, tokens, _message_spans(messages, spans, shift))

    def _bos_prefix(self, tokens: list[int]) -> int:
        """1 when the vocabulary wants a BOS token and the template did not render one."""
        model = self.model
        return int(model.add_bos and model.bos >= 0 and (not tokens or tokens[0] != model.bos))


def _message_spans(messages, spans: dict[int, tuple[int, int, int]], shift: int) -> list[tuple[str, int, int]]:
    """(role, glue start, content start) per message. A message whose content was not found
    (tool calls only, or content the template changed) starts where the previous content ended."""
    out = []
    cursor = 0
    for i, m in enumerate(messages):
        if i in spans:
            glue, content, end = spans[i]
            out.append((m["role"], glue + shift, content + shift))
            cursor = end + shift
        else:
            out.append((m["role"], cursor, cursor))
    return out
