"""Prompt tokenization piece by piece, with the tokens llama.cpp gives the whole text."""

from __future__ import annotations

import threading
from collections import OrderedDict

from warmslot.slots import Vocab


class Tokenizer:
    """Tokenizes prompt pieces the way llama.cpp tokenizes a whole text, with LRU caches.

    llama.cpp, when parsing special tokens, cuts a text around them and tokenizes the raw
    fragments between them one by one. Doing the same piece by piece gives the tokens a
    whole-text tokenization gives, while each piece's tokens can be cached: a growing
    conversation only tokenizes what is new.
    """

    def __init__(self, vocab: Vocab, max_entries: int = 8192) -> None:
        self.vocab = vocab
        self._raw: OrderedDict[str, list[int]] = OrderedDict()
        self._split: OrderedDict[str, list[tuple[int, str, int | None]]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def raw(self, text: str) -> list[int]:
        """Tokens of text without special tokens (text such as "<|im_start|>" stays text)."""
        return self._cached(self._raw, text, lambda: self.vocab.tokenize(text, add_special=False, parse_special=False))

    def split_specials(self, text: str) -> list[tuple[int, str, int | None]]:
        """`text` cut around the special tokens in it: (offset, text, token id or None for raw)."""
        return self._cached(self._split, text, lambda: self._find_specials(text))

    def _find_specials(self, text: str) -> list[tuple[int, str, int | None]]:
        parts: list[tuple[int, str, int | None]] = []
        cursor = 0
        for token in self.vocab.tokenize(text, add_special=False, parse_special=True):
            if not self.vocab.is_special(token):
                continue
            piece = self.vocab.token_text(token)
            at = text.find(piece, cursor) if piece else -1
            if at < 0:
                continue
            if at > cursor:
                parts.append((cursor, text[cursor:at], None))
            parts.append((at, piece, token))
            cursor = at + len(piece)
        if cursor < len(text):
            parts.append((cursor, text[cursor:], None))
        return parts

    def _cached(self, cache: OrderedDict, key: str, compute):
        with self._lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit
        value = compute()
        with self._lock:
            cache[key] = value
            if len(cache) > self._max:
                cache.popitem(last=False)
        return value

    def prompt(self, text: str, *, add_bos: bool = True) -> list[int]:
        """A plain text prompt (completions): BOS per the vocabulary, special tokens parsed."""
        return self.vocab.tokenize(text, add_special=add_bos, parse_special=True)


MEDIA_TOKEN = -1  # where a media marker was (server/prompt/media.py replaces it by its image's parts)


def split_marker(parts: list, marker: str) -> list:
    """Raw text parts cut around each media marker, which becomes a MEDIA_TOKEN part."""
    out = []
    for rel, text, token in parts:
        if token is not None or marker not in text:
            out.append((rel, text, token))
            continue
        at = 0
        for i, piece in enumerate(text.split(marker)):
            if i:
                out.append((rel + at, marker, MEDIA_TOKEN))
                at += len(marker)
            if piece:
                out.append((rel + at, piece, None))
            at += len(piece)
    return out
