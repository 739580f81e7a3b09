"""The model's vocabulary, for any thread.

The HTTP side tokenizes prompts, renders templates and detokenizes on its own threads while
the engine thread decodes. `Vocab` offers only what reads the vocabulary, which llama.cpp
allows from several threads at once (as its own server does), and never the model or the
context behind it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Sequence

from .llama_api.grammar import GrammarSpec
from .llama_api import Model, check_grammar


class VocabClosed(RuntimeError):
    """The model is being freed (the engine is shutting down)."""


class Vocab:
    def __init__(self, model: Model) -> None:
        self._model = model
        self.n_vocab = model.n_vocab
        self.bos = model.bos
        self.eos = model.eos
        self.add_bos = model.add_bos
        self.fim = model.fim  # its fill-in-the-middle tokens (/infill)
        self._users = 0  # calls inside llama.cpp right now (tokenizations can take seconds)
        self._closed = False
        self._cv = threading.Condition()

    @contextlib.contextmanager
    def _use(self):
        with self._cv:
            if self._closed:
                raise VocabClosed("the model is shutting down")
            self._users += 1
        try:
            yield
        finally:
            with self._cv:
                self._users -= 1
                self._cv.notify_all()

    def retire(self, timeout: float) -> bool:
        """Refuse every later call and wait up to `timeout` s for the running ones (long
        tokenizations on the HTTP side's threads). True: nothing uses the model any more, so
        it may be freed; False: a call is still inside llama.cpp and the model must stay."""
        with self._cv:
            self._closed = True
            return self._cv.wait_for(lambda: self._users == 0, timeout)

    def reopen(self) -> None:
        """Take calls again after a `retire` that found the model still in use."""
        with self._cv:
            self._closed = False

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        with self._use():
            return self._model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        with self._use():
            return self._model.detokenize(tokens, special=special)

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        with self._use():
            return self._model.token_piece(token, special=special)

    def longest_piece(self) -> int:
        with self._use():
            return self._model.longest_piece()

    def token_text(self, token: int) -> str:
        with self._use():
            return self._model.token_text(token)

    def is_special(self, token: int) -> bool:
        with self._use():
            return self._model.is_special(token)

    def is_eog(self, token: int) -> bool:
        with self._use():
            return self._model.is_eog(token)

    def eog_tokens(self) -> list[int]:
        return self._model.eog_tokens()

    def special_text(self, token: int) -> str:
        """The text of a special token such as BOS ('' when the model has none)."""
        with self._use():
            return self._model.token_text(token) if token >= 0 else ""

    def is_one_token(self, text: str) -> bool:
        """Whether `text` is exactly one vocabulary token (a template's special marker)."""
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return len(tokens) == 1 and self.token_text(tokens[0]) == text

    def check_grammar(self, spec: GrammarSpec) -> str | None:
        """Why llama.cpp would refuse the grammar with this vocabulary, or None (see
        llama_api.check_grammar; compiling can take tenths of a second)."""
        with self._use():
            return check_grammar(self._model, spec)
