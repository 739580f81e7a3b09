"""The Messages fields that shape a reply beyond its prompt: structured output, thinking and
effort, and the fields that are accepted and ignored.

- `output_config.format` (and the older top-level `output_format`), `{"type":
  "json_schema", "schema"}`: the reply is one JSON value of the schema, constrained by a
  grammar as chat's `response_format` is;
- `thinking` and `output_config.effort` become the template's reasoning switch
  (`enable_thinking`) and the reasoning budget:

  ======================================  ===================  ==========================
  request                                 enable_thinking      reasoning budget (tokens)
  ======================================  ===================  ==========================
  no `thinking` (as Anthropic's API:      false                0
  no extended thinking)
  `disabled`                              false                0
  `enabled`, `budget_tokens: N`           true                 N
  `adaptive`, effort `low`                the server's         1024
  `adaptive`, effort `medium`             the server's         8192
  `adaptive`, effort `high`               the server's         32768
  `adaptive`, `xhigh`, `max` or none      the server's         the server's
  ======================================  ===================  ==========================

  (an effort's budget never exceeds the server's --reasoning-budget when that is set);
- what warmslot has no use for (`context_management`, `thinking.display`, `service_tier`,
  `anthropic-beta` values, a server tool's definition) is accepted and named in a debug
  log line, never refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidRequest
from ...request.protocol import INT32_MAX

EFFORT_BUDGETS = {"low": 1024, "medium": 8192, "high": 32768}  # other efforts: the server's budget
USED_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "metadata", "tools", "tool_choice", "thinking", "output_config", "output_format", "cache_salt", "timeout",
})


@dataclass(slots=True)
class Reasoning:
    """What `thinking` and `effort` ask of the template and the sampler."""

    budget: int  # the reasoning budget (-1: none)
    enable_thinking: bool | None = None  # None: the server's --reasoning
    ignored: list[str] = field(default_factory=list)


def reasoning(body: dict, default_budget: int) -> Reasoning:
    """`thinking` and `output_config.effort` (see the table above)."""
    value = body.get("thinking")
    effort, ignored = _effort(body.get("output_config"))
    kind = value.get("type") if isinstance(value, dict) else None
    ignored += [f"thinking.{k}" for k in (value if isinstance(value, dict) else {}) if k not in ("type", "budget_tokens")]
    if value is None or kind == "disabled":
        # NOTE: Claude Code sends no `thinking` in its helper requests (titles, web fetch and
        # search summaries): they are meant to be quick, and a thinking model would think first
        return Reasoning(0, False, ignored + (["output_config.effort"] if effort else []))
    if kind == "adaptive":
        budget = EFFORT_BUDGETS.get(effort or "", -1)
        if budget < 0 or 0 <= default_budget < budget:
            budget = default_budget
        return Reasoning(budget, None, ignored)
    if kind != "enabled":
        raise InvalidRequest("'thinking' must be an object of type enabled, disabled or adaptive", param="thinking")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= INT32_MAX:
        raise InvalidRequest("'thinking.budget_tokens' must be a non-negative integer", param="thinking.budget_tokens")
    return Reasoning(budget, True, ignored)


def _effort(config: Any) -> tuple[str | None, list[str]]:
    if config is None:
        return None, []
    if not isinstance(config, dict):
        raise InvalidRequest("'output_config' must be an object", param="output_config")
    effort = config.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise InvalidRequest("'output_config.effort' must be a string", param="output_config.effort")
    unknown = [] if effort is None or effort in EFFORT_BUDGETS or effort in ("xhigh", "max") else ["output_config.effort"]
    return effort, unknown + [f"output_config.{k}" for k in config if k not in ("effort", "format")]


@dataclass(slots=True)
class OutputSchema:
    schema: dict
    param: str  # the field that holds it, for errors


def output_schema(body: dict) -> OutputSchema | None:
    """The schema of `output_config.format`, or of the older `output_format`, if any."""
    config = body.get("output_config")
    fmt, param = (config.get("format"), "output_config.format") if isinstance(config, dict) else (None, "")
    if fmt is None and body.get("output_format") is not None:
        fmt, param = body["output_format"], "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InvalidRequest("the output format must be an object of type json_schema", param=f"{param}.type")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest("a json_schema output format needs 'schema' (a JSON schema object)", param=f"{param}.schema")
    return OutputSchema(schema, f"{param}.schema")


def ignored_fields(body: dict) -> list[str]:
    """The top-level fields of a body that change nothing here."""
    return sorted(k for k in body if k not in USED_FIELDS)
