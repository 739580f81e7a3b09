"""Log-probabilities in OpenAI's shapes: chat's `logprobs.content` list, and the legacy
completions object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

from __future__ import annotations

import functools
from typing import Any, Sequence

from warmslot.slots import TokenLogprob, Vocab

# JSON has no -inf: a token the logit bias banned reports this, as OpenAI does
FLOOR = -9999.0


def _value(logprob: float) -> float:
    return logprob if logprob > FLOOR else FLOOR


@functools.lru_cache(maxsize=65536)
def _piece(vocab: Vocab, token: int) -> bytes:
    return vocab.token_piece(token, special=True)


def token_text(vocab: Vocab, token: int) -> str:
    return _piece(vocab, token).decode("utf-8", errors="replace")


def _chat_entry(vocab: Vocab, token: int, logprob: float) -> dict[str, Any]:
    return {"id": token, "token": token_text(vocab, token), "logprob": _value(logprob), "bytes": list(_piece(vocab, token))}


def chat_content(vocab: Vocab, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` items for these tokens."""
    out = []
    for e in entries:
        item = _chat_entry(vocab, e.token, e.logprob)
        item["top_logprobs"] = [_chat_entry(vocab, t, lp) for t, lp in e.top]
        out.append(item)
    return out


def chat_logprobs(vocab: Vocab, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """A chat choice's `logprobs` (None when the request did not ask)."""
    if entries is None:
        return None
    return {"content": chat_content(vocab, entries), "refusal": None}


class CompletionLogprobs:
    """The legacy completions object, built piece by piece for a stream: `text_offset` counts
    characters of the choice's text, from `start` (the echoed prompt's length, if any)."""

    def __init__(self, vocab: Vocab, start: int = 0) -> None:
        self.vocab = vocab
        self.offset = start
        self._partial = b""  # bytes of a character split across tokens

    def add(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            body["tokens"].append(token_text(self.vocab, e.token))
            body["token_logprobs"].append(_value(e.logprob))
            body["top_logprobs"].append({token_text(self.vocab, t): _value(lp) for t, lp in e.top})
            body["text_offset"].append(self.offset)
            self._advance(self.vocab.token_piece(e.token, special=False))
        return body

    def _advance(self, piece: bytes) -> None:
        data = self._partial + piece
        text = data.decode("utf-8", errors="ignore")
        # keep an incomplete character's bytes for the next token
        complete = len(text.encode("utf-8"))
        self._partial = data[complete:] if len(data) - complete < 4 else b""
        self.offset += len(text)
