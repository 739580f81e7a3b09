"""Text completion bodies and stream chunks from the pipeline's reply and events."""

from __future__ import annotations

import json
from typing import Any

from warmslot.slots import Usage, Vocab

from ...errors import ApiError
from ...output.logprob_shapes import CompletionLogprobs
from ...pipeline import ChoiceEnd, Delta, End, PromptProgress, Reply, StreamEvent
from ...request.protocol import GenerationParams
from ..bodies import Envelope, error_events, progress_fields, timings_body, usage_body, usage_chunk

OBJECT = "text_completion"


def completion_choice(text: str, finish_reason: str | None, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_body(env: Envelope, reply: Reply, echoes: list[str], vocab: Vocab, with_logprobs: bool) -> dict[str, Any]:
    choices = []
    for c in reply.choices:
        echo = echoes[c.index]
        logprobs = CompletionLogprobs(vocab, len(echo)).add(c.logprobs) if with_logprobs else None
        choices.append(completion_choice(echo + c.text, c.finish.value, c.index, logprobs))
    body = env.base(OBJECT)
    body["choices"] = choices
    body["usage"] = usage_body(reply.usage)
    body["timings"] = timings_body(reply.usage)
    return body


def completion_chunk(
    env: Envelope, text: str, finish_reason: str | None = None, usage: Usage | None = None,
    *, index: int = 0, logprobs: dict | None = None,
) -> str:
    body = env.base(OBJECT)
    body["choices"] = [completion_choice(text, finish_reason, index, logprobs)]
    if usage is not None:
        body["timings"] = timings_body(usage)
    return json.dumps(body, ensure_ascii=False)


class CompletionStream:
    """A text completion stream: each choice's echo, its text pieces and its finish chunk,
    the usage chunk when asked for, then [DONE]."""

    def __init__(self, env: Envelope, vocab: Vocab, gen: GenerationParams, echoes: list[str]) -> None:
        self.env = env
        self.gen = gen
        self.echoes = echoes
        self.logprobs = [CompletionLogprobs(vocab, len(e)) if gen.logprobs is not None else None for e in echoes]

    def start(self) -> list[str]:
        return [completion_chunk(self.env, echo, index=i) for i, echo in enumerate(self.echoes) if echo]

    def render(self, event: StreamEvent) -> list[str]:
        if isinstance(event, Delta):
            tracker = self.logprobs[event.index]
            lp = tracker.add(event.logprobs) if tracker is not None else None
            return [completion_chunk(self.env, event.out.text, usage=event.timings, index=event.index, logprobs=lp)]
        if isinstance(event, PromptProgress):
            body = {**self.env.base(OBJECT), "choices": [completion_choice("", None, event.index, None)], **progress_fields(event)}
            return [json.dumps(body, ensure_ascii=False)]
        if isinstance(event, ChoiceEnd):
            return [completion_chunk(self.env, "", event.finish.value, event.usage, index=event.index)]
        assert isinstance(event, End)
        usage = [usage_chunk(self.env, event.usage, OBJECT)] if self.gen.include_usage else []
        return usage + ["[DONE]"]

    def fail(self, error: ApiError) -> list[str]:
        return error_events(error)
