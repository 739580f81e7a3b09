"""The model's vocabulary, for any thread.

The HTTP side tokenizes prompts, renders templates and detokenizes on its own threads while
the engine thread decodes. `Vocab` offers only what reads the vocabulary, which llama.cpp
allows from several threads at once (as its own server does), and never the model or the
context behind it.
"""

from __future__ import annotations

from typing import Sequence

from .grammar import GrammarSpec
from .llama_api import Model, check_grammar


class Vocab:
    def __init__(self, model: Model) -> None:
        self._model = model
        self.n_vocab = model.n_vocab
        self.bos = model.bos
        self.eos = model.eos
        self.add_bos = model.add_bos

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        return self._model.detokenize(tokens, special=special)

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        return self._model.token_piece(token, special=special)

    def token_text(self, token: int) -> str:
        return self._model.token_text(token)

    def is_special(self, token: int) -> bool:
        return self._model.is_special(token)

    def is_eog(self, token: int) -> bool:
        return self._model.is_eog(token)

    def special_text(self, token: int) -> str:
        """The text of a special token such as BOS ('' when the model has none)."""
        return self._model.token_text(token) if token >= 0 else ""

    def is_one_token(self, text: str) -> bool:
        """Whether `text` is exactly one vocabulary token (a template's special marker)."""
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return len(tokens) == 1 and self.token_text(tokens[0]) == text

    def check_grammar(self, spec: GrammarSpec) -> str | None:
        """Why llama.cpp would refuse the grammar with this vocabulary, or None (see
        llama_api.check_grammar; compiling can take tenths of a second)."""
        return check_grammar(self._model, spec)
