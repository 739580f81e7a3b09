"""GBNF text: literals, character classes, and the rules of a grammar text as a dict."""

from __future__ import annotations

import re


def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _class_char(ch: str) -> str:
    if ch.isascii() and ch.isalnum():
        return ch
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02X}"
    if code < 0x10000:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def char_class(chars: list[str], negated: bool = False) -> str:
    return "[" + ("^" if negated else "") + "".join(_class_char(c) for c in chars) + "]"


_RULE_START_RE = re.compile(r"^([A-Za-z0-9-]+) ::= ", re.M)
_GBNF_TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[^}]*\}|[A-Za-z0-9-]+|.', re.S)
_RULE_NAME_RE = re.compile(r"[A-Za-z0-9-]+")


def split_rules(text: str) -> dict[str, str]:
    """``name ::= body`` lines of a grammar as a dict."""
    starts = list(_RULE_START_RE.finditer(text))
    rules = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        rules[match.group(1)] = text[match.end() : end].strip("\n")
    return rules


def rename(body: str, mapping: dict[str, str]) -> str:
    """`body` with rule references renamed; literals, classes and counts are left alone."""
    parts = []
    for token in _GBNF_TOKEN_RE.findall(body):
        if _RULE_NAME_RE.fullmatch(token) and token in mapping:
            parts.append(mapping[token])
        else:
            parts.append(token)
    return "".join(parts)
