"""The Responses API's streamed events, from the output parser's deltas.

`response.created` and `response.in_progress` open the stream. Each output item is
announced (`response.output_item.added`), filled (`response.output_text.delta`,
`response.reasoning_text.delta`, `response.function_call_arguments.delta`, with
`response.content_part.added`/`.done` around a message's or reasoning's text) and closed
(`..._text.done`, `response.function_call_arguments.done`, `response.output_item.done`)
before the next one starts. `response.completed` carries the whole response (its status
"incomplete" when the token limit cut it), with llama-server's `timings`. With
`return_progress`, `response.in_progress` events report the prompt's evaluation
(`prompt_progress`); with `timings_per_token` each delta carries the timings so far. A failure is an `error` event then `response.failed`.
Every event has a `sequence_number`, counting from 0.

With `include: ["reasoning.encrypted_content"]` the first item is always a reasoning item
(without content when the model does not think), and every `response.output_item.done` waits
for the end of the reply: the reasoning item's `encrypted_content` signs every token of the
reply (signed_turns.py), and a client that builds its history from the done events (as the
Codex CLI does) then has the items in their output order.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from warmslot.slots import Vocab

from ...errors import ApiError
from ...output.logprob_shapes import chat_content
from ...output.parsed import ReasoningDelta, ToolCallDelta
from ...pipeline import ChoiceEnd, Delta, End, PromptProgress, StreamEvent
from ..bodies import progress_fields, timings_body
from .items import call_item, message_item, new_id, reasoning_item, text_part, usage_body
from .tools import ResponsesTools


class _Item:
    """An output item being streamed."""

    def __init__(self, kind: str, index: int, call_id: str = "", name: dict[str, str] | None = None) -> None:
        self.kind = kind  # reasoning, message or function_call
        self.id = new_id({"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind])
        self.index = index
        self.call_id = call_id
        self.name = name or {"name": ""}  # a call's name (and namespace)
        self.text: list[str] = []
        self.logprobs: list = []
        self.cut = False  # a function call the token limit cut: never passed off as whole
        self.encrypted: str | None = None  # a reasoning item's signed turn
        self.empty = False  # a reasoning item opened only to carry the signed turn

    def body(self, status: str, with_logprobs: bool) -> dict[str, Any]:
        text = "".join(self.text)
        if self.kind == "reasoning":
            return reasoning_item(self.id, text, status, self.encrypted)
        if self.kind == "message":
            return message_item(self.id, text, self.logprobs if with_logprobs else None, status)
        return call_item(self.id, self.call_id, self.name, text, status)


class ResponseEvents:
    """Turns one response's pipeline events into SSE events (dicts for EventSourceResponse);
    `keep(body, items, tokens)` is called with the finished response and its tokens.
    `sign(tokens)`: the signed turn for a reasoning item's encrypted_content (None: not asked)."""

    def __init__(
        self, skeleton: Callable[..., dict], vocab: Vocab, with_logprobs: bool, keep: Callable[[dict, list, list], None],
        tools: ResponsesTools, sign: Callable[[list[int]], str] | None = None,
    ) -> None:
        self._skeleton = skeleton  # (status, output, usage=None, error=None, incomplete=None) -> response body
        self._vocab = vocab
        self._with_logprobs = with_logprobs
        self._keep = keep
        self._tools = tools
        self._sign = sign
        self._truncated = False
        self._seq = 0
        self.items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}  # tool call index -> its item
        self._held: list[_Item] = []  # items whose output_item.done waits for the signed turn
        self.tokens: list[int] = []  # the reply's tokens (from its ChoiceEnd)
        self.response: dict | None = None  # the finished response (after `finish`)

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        body = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return {"event": kind, "data": json.dumps(body, ensure_ascii=False)}

    def start(self) -> list[dict]:
        response = self._skeleton(status="in_progress", output=[])
        return [self.event("response.created", response=response), self.event("response.in_progress", response=response)]

    def render(self, event: StreamEvent) -> list[dict]:
        if isinstance(event, Delta):
            lp = chat_content(self._vocab, event.logprobs) if self._with_logprobs else []
            out = self.feed(event.out, lp)
            if event.timings is not None and out:  # timings_per_token: on the delta's event
                data = json.loads(out[-1]["data"])
                data["timings"] = timings_body(event.timings)
                out[-1]["data"] = json.dumps(data, ensure_ascii=False)
            return out
        if isinstance(event, PromptProgress):
            response = self._skeleton(status="in_progress", output=[])
            return [self.event("response.in_progress", response=response, **progress_fields(event))]
        if isinstance(event, ChoiceEnd):
            self._truncated = event.truncated
            self.tokens = event.tokens
            if event.cut_call is not None and event.cut_call in self._calls:
                self._calls[event.cut_call].cut = True
            return []
        assert isinstance(event, End)
        finished = self.finish(
            usage_body(event.usage, event.reasoning_tokens), "max_output_tokens" if self._truncated else None, timings_body(event.usage),
        )
        self._keep(self.response, self.output(), self.tokens)
        return finished

    def feed(self, delta, logprobs: list) -> list[dict]:
        """Events for one parser delta; `logprobs`: the chat-form logprobs of its tokens."""
        out = self._open_turn(isinstance(delta, ReasoningDelta))
        if isinstance(delta, ToolCallDelta):
            item = self._calls.get(delta.index)
            out += [] if item is not None else self._begin("function_call", delta)
            item = self._calls[delta.index]
            item.text.append(delta.arguments)
            if delta.arguments:
                out.append(self.event("response.function_call_arguments.delta", item_id=item.id, output_index=item.index, delta=delta.arguments))
            return out
        kind = "reasoning" if isinstance(delta, ReasoningDelta) else "message"
        out += [] if self._open is not None and self._open.kind == kind else self._begin(kind, delta)
        item = self._open
        item.text.append(delta.text)
        where = dict(item_id=item.id, output_index=item.index, content_index=0)
        if kind == "reasoning":
            return out + [self.event("response.reasoning_text.delta", **where, delta=delta.text)]
        item.logprobs += logprobs
        return out + [self.event("response.output_text.delta", **where, delta=delta.text, logprobs=logprobs)]

    def _open_turn(self, thinks: bool) -> list[dict]:
        """With a signed turn asked for, the reasoning item that carries it comes first: when
        the reply does not start by thinking, an empty one."""
        if self._sign is None or self.items or thinks:
            return []
        out = self._begin("reasoning", None, empty=True)
        return out + self._close()

    def _begin(self, kind: str, delta, empty: bool = False) -> list[dict]:
        out = self._close()
        if kind == "function_call":
            item = _Item(kind, len(self.items), delta.id or new_id("call"), self._tools.call_fields(delta.name or ""))
            self._calls[delta.index] = item
        else:
            item = _Item(kind, len(self.items))
        item.empty = empty
        self.items.append(item)
        self._open = item
        out.append(self.event("response.output_item.added", output_index=item.index, item=item.body("in_progress", False)))
        if kind != "function_call" and not empty:
            part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else text_part("", None)
            out.append(self.event("response.content_part.added", item_id=item.id, output_index=item.index, content_index=0, part=part))
        return out

    def _close(self) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.text)
        where = dict(item_id=item.id, output_index=item.index)
        out = []
        if item.cut:  # its arguments never closed: announced as incomplete, and left out of the output
            return self._done(item)
        if item.kind == "function_call":
            out.append(self.event("response.function_call_arguments.done", **where, **item.name, arguments=text))
        elif item.empty:
            pass
        elif item.kind == "reasoning":
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=text))
            out.append(self.event("response.content_part.done", **where, content_index=0, part={"type": "reasoning_text", "text": text}))
        else:
            lp = item.logprobs if self._with_logprobs else None
            out.append(self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=lp or []))
            out.append(self.event("response.content_part.done", **where, content_index=0, part=text_part(text, lp)))
        return out + self._done(item)

    def _done(self, item: _Item) -> list[dict]:
        """The item's output_item.done, or nothing yet while the signed turn is awaited."""
        if self._sign is not None:
            self._held.append(item)
            return []
        return [self.event("response.output_item.done", output_index=item.index, item=self._final(item))]

    def _final(self, item: _Item) -> dict[str, Any]:
        return item.body("incomplete", False) if item.cut else item.body("completed", self._with_logprobs)

    def output(self) -> list[dict]:
        """The finished items (a message item when nothing else was produced); a cut call is
        not one of them."""
        if not self.items:
            self.items.append(_Item("message", 0))
        return [item.body("completed", self._with_logprobs) for item in self.items if not item.cut]

    def finish(self, usage: dict, incomplete: str | None, timings: dict) -> list[dict]:
        """The stream's end: `response.completed` in every case, as llama-server ends it and as
        the OpenAI SDK's stream helper waits for; a reply the token limit cut says so in its
        body (status "incomplete", incomplete_details)."""
        out = self._close()
        if not self.items:  # an empty answer is still one (empty) message
            out += self._open_turn(False) + self._begin("message", None) + self._close()
        if self._sign is not None:  # the reply is whole: its turn signed, the held items done in order
            self.items[0].encrypted = self._sign(self.tokens)
            out += [self.event("response.output_item.done", output_index=item.index, item=self._final(item)) for item in self._held]
            self._held.clear()
        status = "incomplete" if incomplete else "completed"
        response = self.response = self._skeleton(status=status, output=self.output(), usage=usage, incomplete=incomplete)
        return out + [self.event("response.completed", response=response, timings=timings)]

    def fail(self, exc: ApiError) -> list[dict]:
        """An `error` event with the error's code, message and param, then `response.failed`."""
        error = exc.body()["error"]
        out = [self.event("error", code=error.get("code") or error.get("type"), message=error["message"], param=error.get("param"))]
        response = self._skeleton(status="failed", output=[item.body("incomplete", False) for item in self.items], error={
            "code": error.get("code") or error.get("type") or "server_error", "message": error["message"],
        })
        return out + [self.event("response.failed", response=response)]
