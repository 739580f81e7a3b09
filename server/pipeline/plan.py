"""Planning: what a request needs before it is submitted.

A chat-shaped request (chat completions, Responses, and any API converted to chat messages)
becomes a `ChatPlan`: the rendered prompt, the tools offered, the grammar that constrains the
output, the reasoning budget, and the checkpoint boundaries where agent histories diverge. A
completion prompt becomes its tokens. Planning runs on the tokenize pool (`Server.offload`):
schema conversion, template rendering and grammar checks can take a while.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from warmslot.slots import GrammarSpec, MediaSpan, ReasoningBudget

from ..prompt.builder import Prompt
from ..prompt.template import prompt_opens_reasoning
from ..errors import InvalidRequest
from ..prompt.exact_turns import splice_turns
from ..gbnf.response_format import json_schema_grammar
from ..gbnf.tools import tool_call_grammar
from ..prompt.media import MEDIA_MARKER, attach_images, message_images
from ..output.parser import OutputParser
from warmslot.server.request.constraints import (
    ResponseSchema,
    ToolChoice,
    parse_response_format,
    validate_tool_choice,
    validate_tools,
)
from ..request.protocol import ChatParams
from ..request.reasoning import budget_spec
from ..state import ModelHost

log = logging.getLogger("warmslot.server")


@dataclass(slots=True)
class ChatPlan:
    """What a chat request needs before it is submitted."""

    prompt: Prompt
    tools: list[dict] | None  # the tools offered to the model (None: no tool calls)
    opens_reasoning: bool  # the prompt leaves a think block open
    grammar: GrammarSpec | None
    budget: ReasoningBudget | None = None  # --reasoning-budget
    media: tuple[MediaSpan, ...] = ()  # the prompt's images (runs of placeholder ids in its tokens)
    breakpoints: tuple[int, ...] = ()  # messages the client marked as cache breakpoints

    @property
    def boundaries(self) -> list[int]:
        return checkpoint_boundaries(self.prompt, self.breakpoints)

    def parser(self, host: ModelHost) -> OutputParser:
        """A fresh output parser for one choice of this plan's reply."""
        return OutputParser(
            format=host.tool_format,
            reasoning=host.reasoning[0],
            starts_in_reasoning=self.opens_reasoning,
            tools_enabled=self.tools is not None,
            tools=self.tools,
        )


class _Memo:
    """The latest results of a pure function of a request's tools, by key. An agent sends the
    same tools on every turn; checking them and building their grammar took 90 ms for Claude
    Code's 16 tools on two CPU cores. Results are shared: nothing downstream changes them."""

    def __init__(self, size: int = 32) -> None:
        self._items: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()  # errors are raised, not kept
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


_TOOLS = _Memo()
_TOOL_GRAMMARS = _Memo()


def _tools_key(tools: object) -> str:
    return json.dumps(tools, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def check_n(host: ModelHost, n: int) -> None:
    if n > host.config.max_n:
        raise InvalidRequest(f"'n' must be at most {host.config.max_n} (--max-n)", param="n")


def plan_chat(host: ModelHost, params: ChatParams, budget: int = -1) -> ChatPlan:
    """Validate the tools, build the prompt and the grammar (on the tokenize pool)."""
    key = _tools_key(params.tools) if params.tools else ""
    tools = _TOOLS.get((key,), lambda: validate_tools(params.tools)) if params.tools is not None else []
    choice = validate_tool_choice(params.tool_choice, tools)
    offered = tools if tools and choice.mode != "none" else None
    # NOTE: tool_choice "none" still renders the tools (only the grammar and the parsing turn
    # off), as llama-server and vLLM do: the prompt, and so the cached prefix, stays the same
    images = message_images(params.messages)
    projector = host.engine.projector if images else None
    if images and projector is None:
        what = "audio" if images[0].audio else "images"
        raise InvalidRequest(f"this model takes no {what}: the server runs without a projector (--mmproj)", param=images[0].param)
    marker = MEDIA_MARKER if images else None
    # NOTE: a hidden tool (Anthropic's `defer_loading`) is callable but left out of the
    # prompt's tool list: the tool result that loads it shows its definition, so loading one
    # never changes the prompt's start
    listed = [t for t in tools if t["function"]["name"] not in params.hidden_tools] if params.hidden_tools else tools
    prompt = host.builder.build(
        params.messages, listed or None, extra=params.template_kwargs, media_marker=marker,
        add_generation_prompt=params.add_generation_prompt, continue_final=params.continue_final,
    )
    media: tuple[MediaSpan, ...] = ()
    if images:
        config = host.config
        prompt, media = attach_images(
            prompt, images, projector, max_bytes=config.image_max_bytes, max_pixels=config.image_max_pixels, media_path=config.media_path,
            fetch_timeout=config.image_fetch_timeout if config.image_fetch else None,
        )
    if params.exact_turns:
        prompt, media = _splice(host, prompt, params.exact_turns, media)
    # a request that turns thinking off gets no think block in its grammar either
    reasoning = host.reasoning[0] and params.template_kwargs.get("enable_thinking") is not False
    opens = prompt_opens_reasoning(prompt.text)
    grammar = _grammar(host, params, offered, choice, reasoning, reasoning and opens, key)
    spec = budget_spec(budget, host.engine.vocab, opens) if host.thinks else None
    return ChatPlan(prompt, offered, reasoning and opens, grammar, spec, media, params.breakpoints)


def _splice(host: ModelHost, prompt: Prompt, turns: dict, media: tuple[MediaSpan, ...]) -> tuple[Prompt, tuple[MediaSpan, ...]]:
    """Earlier assistant turns as the model generated them (see exact_turns.py)."""
    spliced, report = splice_turns(prompt, turns, host.engine.vocab.is_eog)
    if report.skipped:  # one line per request: a long history may hold many such turns
        first, reason = next(iter(report.skipped.items()))
        log.info("%d of %d turns rendered by the template, not as generated (from message %d: %s)",
                 len(report.skipped), len(turns), first, reason)
    media = tuple(dataclasses.replace(m, start=report.moved(m.start)) for m in media)
    return spliced, media


def _grammar(
    host: ModelHost, params: ChatParams, tools: list[dict] | None, choice: ToolChoice, reasoning: bool, opens: bool,
    tools_key: str = "",
) -> GrammarSpec | None:
    """The grammar that constrains the output (tool_choice, response_format), if any."""
    spec = None
    if tools:
        parallel, fmt = params.parallel_tool_calls, host.tool_format
        spec = _TOOL_GRAMMARS.get((tools_key, repr(choice), fmt, parallel, reasoning, opens), lambda: tool_call_grammar(
            tools, choice, fmt, parallel_tool_calls=parallel, reasoning=reasoning, starts_in_reasoning=opens,
        ))
    response = parse_response_format(params.response_format)
    if params.json_schema is not None:
        response = ResponseSchema(params.json_schema, params.schema_param)
    output = None
    if response is not None:
        output = json_schema_grammar(response.schema, response.param, reasoning=reasoning, starts_in_reasoning=opens)
    elif params.grammar is not None:  # the client's own GBNF, as llama-server takes it
        output = GrammarSpec(params.grammar)
        error = host.engine.vocab.check_grammar(output)
        if error is not None:
            raise InvalidRequest(f"the grammar cannot be used: {error}", param="grammar")
    if output is not None:
        if spec is not None and not spec.lazy:
            raise InvalidRequest(f"{response.param if response else 'grammar'} cannot be combined with a required tool call",
                                 param=response.param.split(".")[0] if response else "grammar")
        spec = output if spec is None else spec
    return spec


def checkpoint_boundaries(prompt: Prompt, breakpoints: tuple[int, ...] = ()) -> list[int]:
    """Where agent histories diverge: the end of the system text itself (a turn that drops
    the tools, such as a summary turn, still reuses the system prompt), the end of the
    system+tools prefix (the content start of the first non-system message), the start of
    every user or tool message, and the start of the generation prompt (templates often
    render the previous turn's generation prompt differently once the reply is in the
    history, e.g. adding an empty think block). `breakpoints`: messages the client marked
    (Anthropic's `cache_control`), each a boundary where the next message's glue starts."""
    out = [prompt.system_end] if prompt.system_end is not None else []
    for i in breakpoints:
        if i + 1 < len(prompt.messages):
            out.append(prompt.messages[i + 1][1])
        elif prompt.generation_start is not None:
            out.append(prompt.generation_start)
    seen_non_system = False
    for role, _glue, content in prompt.messages:
        if role != "system" and not seen_non_system:
            seen_non_system = True
            out.append(content)
        elif role in ("user", "tool"):
            out.append(content)
    if prompt.generation_start is not None:
        out.append(prompt.generation_start)
    return sorted({b for b in out if 0 < b < len(prompt.tokens)})


def completion_tokens(host: ModelHost, prompt: str | list[int], param: str) -> list[int]:
    """A completion prompt's tokens (on the tokenize pool for a text)."""
    tokens = host.builder.tokenizer.prompt(prompt) if isinstance(prompt, str) else list(prompt)
    if not tokens:
        raise InvalidRequest("the prompt has no tokens", param=param)
    return tokens


def echo_text(host: ModelHost, prompt: str | list[int], tokens: list[int]) -> str:
    """What `echo` puts before a choice's text: the prompt as sent, or its tokens' text."""
    return prompt if isinstance(prompt, str) else host.engine.vocab.detokenize(tokens)
