"""What OpenAI's chat and text completion bodies share: the envelope, usage and timings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from warmslot.slots import Usage

from ..pipeline import Generation, PromptProgress


@dataclass(slots=True)
class Envelope:
    """What every body of one response repeats."""

    id: str
    created: int
    model: str
    fingerprint: str
    _heads: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, generation: Generation, prefix: str) -> "Envelope":
        host = generation.host
        return cls(f"{prefix}-{generation.id}", generation.created, host.model_name, f"ws-{host.engine.info.fingerprint[:10]}")

    def base(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def head(self, obj: str) -> str:
        """The JSON text of `base(obj)` without its closing brace (for fast chunks)."""
        text = self._heads.get(obj)
        if text is None:
            text = self._heads[obj] = json.dumps(self.base(obj), ensure_ascii=False)[:-1]
        return text


def usage_body(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, **shifted_field(usage, "shifted_tokens")},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def shifted_field(usage: Usage, name: str) -> dict[str, int]:
    """With --cache-reuse, `{name: n}`: n of the cached tokens came from shifted chunks (their
    KV is approximate); without it, nothing."""
    return {name: usage.shifted_tokens} if usage.shifted_tokens is not None else {}


def timings_body(usage: Usage) -> dict[str, Any]:
    """llama-server's `timings` object, so tools written for it read warmslot's numbers too."""
    computed = usage.prompt_tokens - usage.cached_tokens
    # the first token comes from the prompt's last logits: decode_s spans the steps after it
    steps = usage.completion_tokens - 1
    predicted_ms = round(usage.decode_s * 1000, 3)
    body = {
        "cache_n": usage.cached_tokens,
        **shifted_field(usage, "cache_shifted_n"),
        "prompt_n": computed,
        "prompt_ms": round(usage.prefill_s * 1000, 3),
        "prompt_per_token_ms": usage.prefill_s * 1000 / computed if computed else 0.0,
        "prompt_per_second": computed / usage.prefill_s if usage.prefill_s > 0 else 0.0,
        "predicted_n": usage.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps > 0 else 0.0,
        "predicted_per_second": steps * 1000 / predicted_ms if predicted_ms > 0 and steps > 0 else 0.0,
    }
    if usage.draft_tokens:  # as llama-server: only when the request drafted
        body["draft_n"] = usage.draft_tokens
        body["draft_n_accepted"] = usage.draft_accepted
    return body


def progress_fields(event: PromptProgress) -> dict[str, Any]:
    """llama-server's fields on a stream chunk that reports the prompt's evaluation."""
    fields: dict[str, Any] = {"prompt_progress": event.body()}
    if event.timings is not None:
        fields["timings"] = timings_body(event.timings)
    return fields


def usage_chunk(env: Envelope, usage: Usage, obj: str, reasoning_tokens: int = 0) -> str:
    """The last chunk of a stream with `stream_options.include_usage` (with llama-server's
    `timings`, as its last chunk has them)."""
    body = env.base(obj)
    body["choices"] = []
    body["usage"] = usage_body(usage, reasoning_tokens)
    body["timings"] = timings_body(usage)
    return json.dumps(body, ensure_ascii=False)


def error_events(error) -> list[str]:
    """How a chat or completion stream ends on an error: an OpenAI error body, then [DONE]."""
    return [json.dumps(error.body()), "[DONE]"]
