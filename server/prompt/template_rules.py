"""What a chat template accepts, found once by rendering tiny conversations, and the rewrite
that fits any conversation to it.

Coding agents send conversations that many templates written for plain chat reject:

- `system` messages after the first message (Claude Code sends the list of agent types as
  `messages[1]`, role `system`) and several leading ones (Codex sends two `developer`
  messages): Qwen3.5's template raises "System message must be at the beginning", Gemma's
  and Mistral's raise on roles that do not alternate;
- a user message right after another, or right after tool results (Claude Code's "Tool
  loaded." after a ToolSearch result): strictly alternating templates raise;
- several tool calls in one assistant message (Claude Code's parallel subagents): Llama 3.x's
  templates raise "This model only supports single tool-calls at once!";
- tool call ids of any form: Mistral's templates ask for 9 letters and digits.

`rules_for(template)` renders one tiny conversation per shape (cached per template, logged
once) and `fit(messages, rules)` rewrites only what the template rejects:

- several leading system messages become one (joined by a blank line);
- a later system message becomes `<system-reminder>` text, as Claude Code itself injects
  context, appended to the user or tool message right before it, else put before the user or
  tool message right after it, else a user message of its own;
- a user message is appended to the user or tool message right before it;
- an assistant message's tool calls become one assistant message per call, each followed by
  its result;
- tool call ids become 9 letters and digits (a hash of the id: the same id, the same text).

Each rewrite only moves a message into the one before it, or into the next one when nothing
comes before it: the tokens before a message never depend on what comes after it, so a
conversation's prefix stays the same as it grows. A merged message keeps `_parts`, the texts
of the original messages it holds with their indices, so each original message is still
placed in the rendered prompt (checkpoints, miss diagnosis).
"""

from __future__ import annotations

import hashlib
import logging
import string
import threading
from dataclasses import dataclass, fields
from typing import Any

from .template import ChatTemplate
from ..errors import InvalidRequest

log = logging.getLogger("warmslot.chat")

REMINDER_OPEN = "<system-reminder>\n"
REMINDER_CLOSE = "\n</system-reminder>"
JOINER = "\n\n"
CALL_ID_CHARS = string.ascii_letters + string.digits
CALL_ID_LENGTH = 9


@dataclass(frozen=True, slots=True)
class TemplateRules:
    """Which shapes a template renders (True: passed through as they are)."""

    leading_systems: bool = True  # several system messages before the first other one
    later_systems: bool = True  # a system message after a non-system one
    user_after_user: bool = True  # two user messages in a row
    user_after_tool: bool = True  # a user message right after tool results
    parallel_calls: bool = True  # an assistant message with several tool calls
    any_call_ids: bool = True  # tool call ids of any form

    def describe(self) -> str:
        folded = [f.name for f in fields(self) if not getattr(self, f.name)]
        return "renders every shape as sent" if not folded else "rewrites " + ", ".join(folded)


# -- probing ----------------------------------------------------------------------------------

_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "a probe",
                                          "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}


def _m(role: str, content: str | None, **extra: Any) -> dict:
    return {"role": role, "content": content, **extra}


def _call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "probe_tool", "arguments": {"x": "y"}, "raw_arguments": None}}


def _renders(template: ChatTemplate, messages: list[dict], tools: list[dict] | None, *marks: str) -> bool:
    """Whether the template renders the conversation, with every mark in its text (a
    template may also drop what it does not take)."""
    try:
        text = template.render(messages, tools, True)
    except InvalidRequest:
        return False
    return all(mark in text for mark in marks)


_probed: dict[tuple, TemplateRules] = {}
_probe_lock = threading.Lock()


def rules_for(template: ChatTemplate) -> TemplateRules:
    """What `template` renders: probed once per template (a few renders of tiny
    conversations), the result logged once. Thread-safe."""
    key = (template.name, template.source, template.native, template.bos_token, template.eos_token, repr(template.defaults))
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe(template)
        return _probed[key]


def _probe(template: ChatTemplate) -> TemplateRules:
    start = [_m("system", "probe-s0"), _m("user", "probe-u1")]
    if not _renders(template, [*start, _m("assistant", "probe-a1"), _m("user", "probe-u2")], None, "probe-u2"):
        log.warning("chat template %s: a plain conversation does not render; agents' conversations are sent as they are", template.name)
        return TemplateRules()
    tail = [_m("assistant", "probe-a2"), _m("user", "probe-u3")]
    found: dict[str, bool] = {
        "leading_systems": _renders(template, [start[0], _m("system", "probe-s1"), *start[1:], *tail], None, "probe-s1"),
        "later_systems": _renders(template, [*start, _m("system", "probe-s2"), *tail], None, "probe-s2")
        and _renders(template, [*start, _m("system", "probe-s2")], None, "probe-s2"),
        "user_after_user": _renders(template, [*start, _m("user", "probe-u9"), *tail], None, "probe-u9"),
    }
    if template.supports_tools:  # else tool calls and results are injected as text (chat.inject_tools)
        one = "a1b2c3d4e"  # an id every probed template takes

        def calls(*ids: str) -> list[dict]:
            return [_m("assistant", None, tool_calls=[_call(i) for i in ids]), *(_m("tool", f"probe-r-{i}", tool_call_id=i) for i in ids)]

        found["any_call_ids"] = _renders(template, [*start, *calls("toolu_probe_01"), *tail], [_TOOL], "probe-r-toolu_probe_01")
        found["parallel_calls"] = _renders(template, [*start, *calls(one, "f5g6h7i8j"), *tail], [_TOOL], "probe-r-f5g6h7i8j")
        found["user_after_tool"] = _renders(template, [*start, *calls(one), _m("user", "probe-u9"), *tail], [_TOOL], "probe-u9")
    else:
        found["user_after_tool"] = found["user_after_user"]
    rules = TemplateRules(**found)
    log.info("chat template %s: %s", template.name, rules.describe())
    return rules


# -- fitting ----------------------------------------------------------------------------------


def fit(messages: list[dict], rules: TemplateRules) -> list[dict]:
    """`messages` (each with its "_index") rewritten into shapes the template renders; the
    input is not changed. Identity when the template takes every shape."""
    if rules == TemplateRules():
        return messages
    out: list[dict] = []
    pending: list[tuple[str, int]] = []  # reminders waiting for the next user or tool message
    i = 0
    while i < len(messages) and messages[i]["role"] == "system":
        i += 1
    lead = messages[:i]
    if len(lead) > 1 and not rules.leading_systems:
        lead = [_merged(dict(lead[0]), lead[1:])]
    out += lead
    while i < len(messages):
        msg = messages[i]
        role = msg["role"]
        if not rules.any_call_ids:
            msg = _short_ids(msg)
        if role == "system" and not rules.later_systems:
            reminder = (REMINDER_OPEN + (msg.get("content") or "") + REMINDER_CLOSE, msg["_index"])
            if out and out[-1]["role"] in ("user", "tool") and not pending:
                out[-1] = _appended(out[-1], [reminder])
            else:
                pending.append(reminder)
            i += 1
            continue
        if role in ("user", "tool") and pending:
            msg = _prepended(msg, pending)
            pending = []
        elif role == "assistant" and pending:
            out.append(_reminder_message(pending))
            pending = []
        previous = out[-1]["role"] if out else None
        if role == "user" and (previous == "user" and not rules.user_after_user or previous == "tool" and not rules.user_after_tool):
            out[-1] = _appended(out[-1], [(msg.get("content") or "", msg["_index"])])
            i += 1
            continue
        if role == "assistant" and len(msg.get("tool_calls") or ()) > 1 and not rules.parallel_calls:
            i = _split_calls(messages, i, msg, out, rules)
            continue
        out.append(msg)
        i += 1
    if pending:
        out.append(_reminder_message(pending))
    return out


def _parts(msg: dict) -> list[tuple[str, int]]:
    return msg.get("_parts") or [(msg.get("content") or "", msg["_index"])]


def _merged(host: dict, others: list[dict]) -> dict:
    parts = _parts(host) + [part for other in others for part in _parts(other)]
    return dict(host, content=JOINER.join(text for text, _ in parts), _parts=parts)


def _appended(host: dict, parts: list[tuple[str, int]]) -> dict:
    joined = _parts(host) + parts
    return dict(host, content=JOINER.join(text for text, _ in joined), _parts=joined)


def _prepended(host: dict, parts: list[tuple[str, int]]) -> dict:
    joined = parts + _parts(host)
    return dict(host, content=JOINER.join(text for text, _ in joined), _parts=joined)


def _reminder_message(parts: list[tuple[str, int]]) -> dict:
    return {"role": "user", "content": JOINER.join(text for text, _ in parts), "_index": parts[0][1], "_parts": list(parts)}


def _split_calls(messages: list[dict], i: int, msg: dict, out: list[dict], rules: TemplateRules) -> int:
    """One assistant message per tool call, each followed by its result (matched by id among
    the tool messages right after it); the text and reasoning stay with the first call.
    Returns the index of the first message not consumed."""
    j = i + 1
    results: list[dict] = []
    while j < len(messages) and messages[j]["role"] == "tool":
        results.append(messages[j] if rules.any_call_ids else _short_ids(messages[j]))
        j += 1
    by_id = {r.get("tool_call_id"): r for r in results}
    for n, call in enumerate(msg["tool_calls"]):
        part = dict(msg, tool_calls=[call]) if n == 0 else {"role": "assistant", "content": None, "tool_calls": [call], "_index": msg["_index"]}
        out.append(part)
        result = by_id.pop(call.get("id"), None)
        if result is not None:
            out.append(result)
    out += [r for r in results if r.get("tool_call_id") in by_id]  # results no call named
    return j


def short_call_id(call_id: str) -> str:
    """A tool call id as 9 letters and digits: the same id always gives the same text."""
    digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(CALL_ID_LENGTH):
        digest, k = divmod(digest, len(CALL_ID_CHARS))
        out.append(CALL_ID_CHARS[k])
    return "".join(out)


def _short_ids(msg: dict) -> dict:
    if msg.get("tool_calls"):
        return dict(msg, tool_calls=[dict(c, id=short_call_id(c.get("id") or "")) for c in msg["tool_calls"]])
    if msg["role"] == "tool":
        return dict(msg, tool_call_id=short_call_id(msg.get("tool_call_id") or ""))
    return msg
