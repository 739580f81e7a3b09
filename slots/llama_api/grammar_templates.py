"""Compiled grammars kept per model, handed out as copies.

An agent sends the same tools with every request, so every request carries the same
tool-call grammar. llama.cpp compiles GBNF each time a grammar sampler is made: about 15 ms
for a dozen tools, on the engine thread, before the request's first step. A copy of a
compiled sampler (`llama_sampler_clone`: the rules, the parse stacks at the start, the
triggers) took 6.5 ms for a lazy tool-call grammar, and is the same sampler: the grammar's
state is where it starts, and a clone of a fresh sampler is fresh.
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import threading
from collections import OrderedDict
from typing import Callable

from .grammar import GrammarSpec

# distinct grammars kept: an agent's tool-call grammar (auto and required), a few schemas
KEPT = 8


class GrammarTemplates:
    """Fresh grammar samplers by spec, compiled once (`make`) and cloned after. Thread-safe;
    `clear` frees them (before the model's vocabulary goes)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, object] = OrderedDict()
        self.compiled = 0
        self.cloned = 0

    @staticmethod
    def key(spec: GrammarSpec) -> tuple:
        return spec.grammar, spec.root, spec.lazy, tuple(spec.trigger_patterns), tuple(spec.trigger_texts)

    def sampler(self, spec: GrammarSpec, make: Callable[[GrammarSpec], object]):
        """A new grammar sampler for `spec` that the caller owns, or NULL where `make` (the
        compiler) gives NULL. NULL results are not kept."""
        key = self.key(spec)
        with self._lock:
            template = self._items.get(key)
            if template is not None:
                self._items.move_to_end(key)
                self.cloned += 1
                return llama_cpp.llama_sampler_clone(template)
        template = make(spec)  # outside the lock: compiling takes long
        if not template:
            return template
        with self._lock:
            self.compiled += 1
            kept = self._items.setdefault(key, template)
            if kept is not template:  # another thread compiled it meanwhile
                llama_cpp.llama_sampler_free(template)
            self._items.move_to_end(key)
            while len(self._items) > self.kept:
                llama_cpp.llama_sampler_free(self._items.popitem(last=False)[1])
            return llama_cpp.llama_sampler_clone(kept)

    def clear(self) -> None:
        with self._lock:
            for template in self._items.values():
                llama_cpp.llama_sampler_free(template)
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
