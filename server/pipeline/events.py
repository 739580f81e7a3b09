"""What the pipeline hands an API adapter: typed events while a reply streams, or the whole
reply, and the rules every API shares (finish reasons, usage over several choices).

A streamed reply is, per choice, any number of `Delta`s (and `PromptProgress` reports, when
asked for) and one `ChoiceEnd`, then one `End` for the whole request. An adapter renders
these; it never sees engine events, parsers or logprob bookkeeping.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from warmslot.slots import FinishReason, TokenLogprob, Usage

from ..output.parsed import ContentDelta, ParsedMessage, ReasoningDelta, ToolCallDelta

Output = ContentDelta | ReasoningDelta | ToolCallDelta


class Finish(str, enum.Enum):
    """Why a choice ended, in API terms (each adapter words it its own way)."""

    STOP = "stop"  # end of turn or a stop string
    LENGTH = "length"  # max_tokens or the context; also a tool call that never closed
    TOOL_CALLS = "tool_calls"  # the reply ended with whole tool calls


def finish_of(reason: FinishReason | None, has_tool_calls: bool, cut: bool = False) -> Finish:
    """LENGTH when max_tokens cut the reply, and whenever the output ended inside a tool call
    (`cut`: by max_tokens, a stop string or end of generation): that call never closed, is
    not among the calls, and a client must not take the reply as whole. Calls that all
    closed before the token limit are TOOL_CALLS."""
    if cut or (reason is FinishReason.LENGTH and not has_tool_calls):
        return Finish.LENGTH
    return Finish.TOOL_CALLS if has_tool_calls else Finish.STOP


@dataclass(slots=True)
class Delta:
    """New output of one choice: parsed content, reasoning or a tool-call fragment (a text
    completion's raw text is a ContentDelta), with the logprobs of the tokens behind it."""

    index: int
    out: Output
    logprobs: list[TokenLogprob] = field(default_factory=list)
    timings: Usage | None = None  # with timings_per_token: the choice's usage so far


@dataclass(slots=True)
class PromptProgress:
    """With return_progress: how far one choice's prompt evaluation got. `processed` prompt
    tokens of `total` are in memory, `cache` of them reused; `timings` (with
    timings_per_token) counts the evaluated ones."""

    index: int
    total: int
    cache: int
    processed: int
    time_ms: int
    timings: Usage | None = None

    def body(self) -> dict:
        """llama-server's `prompt_progress` object."""
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass(slots=True)
class ChoiceEnd:
    """A choice finished; `logprobs` of tokens whose text never became output (held back)."""

    index: int
    finish: Finish
    usage: Usage
    logprobs: list[TokenLogprob] = field(default_factory=list)
    truncated: bool = False  # the token limit ended it (also after whole tool calls)
    cut_call: int | None = None  # the index of a tool call max_tokens cut (never sent whole)
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    tokens: list[int] = field(default_factory=list)  # every token it generated (not the end-of-generation token)


@dataclass(slots=True)
class End:
    """Every choice finished: the request's usage and its reasoning tokens."""

    usage: Usage
    reasoning_tokens: int = 0


StreamEvent = Delta | PromptProgress | ChoiceEnd | End


@dataclass(slots=True)
class ChoiceReply:
    """One choice of a whole (not streamed) reply."""

    index: int
    text: str  # the raw text (a text completion's answer)
    parsed: ParsedMessage | None  # chat: content, reasoning and the tool calls that closed
    logprobs: list[TokenLogprob]
    finish: Finish
    usage: Usage
    truncated: bool = False  # the token limit ended it (also after whole tool calls)
    cut_call: int | None = None
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    tokens: list[int] = field(default_factory=list)  # every token it generated (not the end-of-generation token)


@dataclass(slots=True)
class Reply:
    choices: list[ChoiceReply]
    usage: Usage  # each prompt once, the completions summed
    reasoning_tokens: int = 0


def total_usage(usages: list[Usage], n: int) -> Usage:
    """A request's usage from its choices' (prompt i's j-th choice at i*n + j): each prompt
    once (its first choice's), the completions summed."""
    firsts = usages[::n]
    cached = sum(u.cached_tokens for u in firsts)
    source = next((u.source for u in firsts if u.cached_tokens), firsts[0].source)
    return dataclasses.replace(
        firsts[0], prompt_tokens=sum(u.prompt_tokens for u in firsts), cached_tokens=cached, source=source,
        completion_tokens=sum(u.completion_tokens for u in usages),
        draft_tokens=sum(u.draft_tokens for u in usages), draft_accepted=sum(u.draft_accepted for u in usages),
        shifted_tokens=None if firsts[0].shifted_tokens is None else sum(u.shifted_tokens or 0 for u in firsts),
    )
