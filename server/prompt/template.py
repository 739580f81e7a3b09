"""Chat templates: which one a server uses, rendering it, and what its source tells about
the output (tool-call format, think blocks).

A template is the GGUF's own, a file, one of warmslot's Jinja built-ins by name, or one of
llama.cpp's own formats by name (rendered by llama.cpp, as llama-server does). Jinja runs
sandboxed (`jinja_env`).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2

from warmslot.slots import apply_builtin_chat_template, builtin_chat_templates

from ..errors import InvalidRequest
from .jinja_env import compiled as _compiled
from ..output.markers import HERMES_OPEN, MISTRAL_CALLS, PYTHON_TAG, THINK_CLOSE, THINK_OPEN

log = logging.getLogger("warmslot.chat")

BUILTIN_TEMPLATES = ("gemma", "chatml", "llama3", "mistral")


def builtin_source(name: str) -> str:
    return resources.files(__package__).joinpath("templates", f"{name}.jinja").read_text("utf-8")


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    source: str
    bos_token: str = ""
    eos_token: str = ""
    defaults: tuple[tuple[str, Any], ...] = ()  # template variables a request may override (--reasoning)
    native: bool = False  # `name` is one of llama.cpp's built-in formats, rendered by llama.cpp (no Jinja)

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.source

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, extra: dict | None = None) -> str:
        if self.native:
            return self._render_native(messages, add_generation_prompt)
        template = _compiled(self.source)
        variables = dict(self.defaults)
        today = datetime.date.today()  # as llama.cpp's templates get it
        variables.update(date_string=today.strftime("%d %b %Y"), datetime=today.strftime("%b %d %Y"))
        variables.update(extra or {})
        variables.update(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            try:
                text = template.render(**variables)
            except (TypeError, jinja2.exceptions.UndefinedError):
                # templates written for string contents fail on an assistant message that holds
                # only tool calls (content null): they get "" instead, as they would elsewhere
                if not any(m.get("content") is None for m in messages):
                    raise
                variables["messages"] = [dict(m, content="") if m.get("content") is None else m for m in messages]
                text = template.render(**variables)
        except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {type(exc).__name__}: {exc}", param="messages") from exc
        if add_generation_prompt and variables.get("enable_thinking") is False and prompt_opens_reasoning(text):
            text += THINK_CLOSE  # a template that always opens a think block: thinking off closes it at once
        return text

    def _render_native(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """llama.cpp's built-in format: roles and text only (tools were injected as text)."""
        try:
            return apply_builtin_chat_template(self.name, [(m["role"], m.get("content") or "") for m in messages], add_generation_prompt)
        except ValueError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}", param="messages") from exc


def choose_template(spec: str | None, gguf_template: str | None, arch: str, vocab_has: "callable") -> tuple[str, str, bool]:
    """(name, source, native) of the template to use. `spec` is --chat-template: a file, the
    name of one of warmslot's Jinja built-ins, or the name of one of llama.cpp's own formats
    (native: llama.cpp renders it, as llama-server does for such a name). Without it: the
    GGUF's template, else a built-in chosen by architecture."""
    if spec:
        if os.path.isfile(spec):
            with open(spec, encoding="utf-8") as f:
                return spec, f.read(), False
        if spec in BUILTIN_TEMPLATES:
            return spec, builtin_source(spec), False
        if spec in builtin_chat_templates():
            return spec, "", True
        raise ValueError(
            f"--chat-template {spec!r} is neither a file nor a built-in: {', '.join(BUILTIN_TEMPLATES)} (Jinja), "
            f"or one of llama.cpp's: {', '.join(builtin_chat_templates())}"
        )
    if gguf_template:
        return "gguf", gguf_template, False
    name = _template_for_arch(arch, vocab_has)
    log.warning("the model has no chat template; using the built-in %r template for arch %s", name, arch)
    return name, builtin_source(name), False


def _template_for_arch(arch: str, vocab_has) -> str:
    if arch.startswith("gemma"):
        return "gemma"
    if vocab_has("<|start_header_id|>"):
        return "llama3"
    if vocab_has("[INST]"):
        return "mistral"
    return "chatml"


# -- what a template tells about the output ------------------------------------------------

_GENERATION_PROMPT_RE = re.compile(r"add_generation_prompt")
_STRING_LITERAL_RE = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", re.S)


def detect_format(chat_template: str | None) -> str:
    """Pick the tool-call format a model most likely produces.

    Decided from the chat template source when it shows a tool syntax:
      ``<tool_call>`` with ``<function=``/``<parameter=`` -> "hermes_xml" (Qwen3-Coder, Qwen3.5);
      ``<tool_call>`` -> "hermes"; ``[TOOL_CALLS]`` -> "mistral";
      ``<|python_tag|>``, or an ``ipython`` role with ``"parameters"`` -> "llama3".
    Otherwise "hermes": the Qwen families use Hermes markers natively, and templates that know
    no tools get a Hermes-style tool prompt injected (`inject_tools`), so Hermes is what such
    models are asked to write.
    """
    template = chat_template or ""
    if HERMES_OPEN in template:
        if "<function=" in template and "<parameter=" in template:
            return "hermes_xml"
        return "hermes"
    if MISTRAL_CALLS in template:
        return "mistral"
    if PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        return "llama3"
    return "hermes"


def detect_reasoning(chat_template: str | None) -> tuple[bool, bool]:
    """(uses ``<think>`` reasoning, generation prompt leaves a think block open).

    Heuristics: the template mentions ``<think>`` -> reasoning. The generation prompt is taken
    to be the template text after its last mention of ``add_generation_prompt``; if one of the
    string literals there contains ``<think>`` not followed by ``</think>`` in the same literal
    (``'<|im_start|>assistant\\n<think>\\n'``), the output starts inside reasoning. A literal
    such as ``'<think>\\n\\n</think>\\n\\n'`` (thinking switched off) does not count. Which
    branch a template takes depends on its variables (``enable_thinking`` and the like), so
    this is a default; `prompt_opens_reasoning` on the rendered prompt gives the answer for
    one request.
    """
    template = chat_template or ""
    if THINK_OPEN not in template:
        return False, False
    positions = [m.end() for m in _GENERATION_PROMPT_RE.finditer(template)]
    tail = template[positions[-1] :] if positions else ""
    opens = False
    for match in _STRING_LITERAL_RE.finditer(tail):
        literal = match.group(1) if match.group(1) is not None else match.group(2)
        pos = literal.find(THINK_OPEN)
        if pos >= 0 and THINK_CLOSE not in literal[pos:]:
            opens = True
            break
    return True, opens


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its last ``<think>`` is unclosed)."""
    start = prompt.rfind(THINK_OPEN)
    return start >= 0 and THINK_CLOSE not in prompt[start:]
