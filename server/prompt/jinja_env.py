"""The sandboxed Jinja environment chat templates render in, with the globals and filters
that Hugging Face's and llama.cpp's template runners give them, and a cache of compiled
templates."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import jinja2
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Undefined(jinja2.Undefined):
    """An undefined variable joined to a string is the empty string, as in llama.cpp's
    template engine (a template may add a variable that only some runners define)."""

    __slots__ = ()

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()


# what a template reads of its loop (`loop.first`, `loop.index0`, ...): plain values
_LOOP_FIELDS = frozenset({"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem",
                          "nextitem", "depth", "depth0"})


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with its checks skipped for a loop's own counters.

    NOTE: templates read `loop.first` or `loop.last` once per message; the sandbox's checks
    of each read (private name, internal attribute, known mutable) were a sixth of
    building a 100,000-message prompt. A loop's counters are plain values, safe to read."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if type(obj) is LoopContext and attr in _LOOP_FIELDS:
            return True
        return super().is_safe_attribute(obj, attr, value)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"], undefined=_Undefined,
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


_compile_lock = threading.Lock()
_compile_cache: dict[str, jinja2.Template] = {}


def compiled(source: str) -> jinja2.Template:
    with _compile_lock:
        template = _compile_cache.get(source)
        if template is None:
            template = _environment().from_string(source)
            _compile_cache[source] = template
        return template
