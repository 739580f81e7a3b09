"""The argparse parser, made from the flag table (flags.py): each row's names, the conversion
of its kind, its default or the value of its WARMSLOT_* environment variable, its choices and
its help; then the llama-server flags that warmslot does not implement (llama_flags.py)."""

from __future__ import annotations

import argparse
import os

from . import llama_flags
from .flag_values import SIZE_HELP, parse_size, parse_vram
from .flags import FLAGS, NOOP, OFF, ON, SIZE, VRAM
from ..version import version_text


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warmslot",
        allow_abbrev=False,  # a prefix of a llama-server flag must not be taken for another flag
        description="An OpenAI-compatible llama.cpp server for agents: it never recomputes a prefix it has seen.",
        epilog="Every flag can also be set with an environment variable WARMSLOT_<NAME>, e.g. WARMSLOT_CTX_SIZE=16384. "
        f"Sizes (--cache-ram, --checkpoint-ram, --cache-vram): {SIZE_HELP}.",
    )
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    for flag in FLAGS:
        env = os.environ.get(flag.env)
        help_text = f"{flag.help} [env {flag.env}]"
        if flag.kind in (bool, NOOP):
            value = _env_bool(env) if env is not None else flag.default
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true", default=value, help=help_text)
            continue
        if flag.kind in (ON, OFF):  # one of two flags that set a three-way setting
            if env is not None and env.strip().lower() not in ("on", "off", "auto"):
                parser.error(f"{flag.env} must be on, off or auto")
            value = env.strip().lower() if env is not None else flag.default
            parser.add_argument(*flag.names, dest=flag.dest, action="store_const", const=flag.kind, default=value,
                                help=help_text)
            continue
        convert = {SIZE: parse_size, VRAM: parse_vram}.get(flag.kind, flag.kind)
        value = env if env is not None else flag.default
        if value is not None and flag.kind in (SIZE, VRAM):
            value = convert(value)
        elif value is not None and env is not None:
            value = convert(value)
        if flag.repeatable:
            parser.add_argument(*flag.names, dest=flag.dest, type=convert, default=[value] if value else None,
                                action="append", help=help_text)
            continue
        parser.add_argument(*flag.names, dest=flag.dest, type=convert, default=value, choices=flag.choices,
                            help=help_text)
    llama_flags.add_to(parser)
    return parser


def copied(a: argparse.Namespace, owner: str) -> dict:
    """The fields of `owner` (a dotted path from ServerConfig: "" for its own fields, "engine",
    "sampling", "engine.spec") that flags set as they are (their rows' `sets`), with the values
    parsed."""
    out = {}
    for flag in FLAGS:
        if flag.sets is not None:
            where, _, name = flag.sets.rpartition(".")
            if where == owner:
                out[name] = getattr(a, flag.dest)
    return out
