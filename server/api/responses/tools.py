"""Responses tools in chat's terms: function tools, namespace tools, and hosted tools left out.

- A `function` tool is a chat function tool.
- A `namespace` tool (`{"type": "namespace", "name", "description", "tools": [functions]}`,
  how the Codex CLI groups its subagent tools) offers each of its functions to the model under
  the function's own name (or `<namespace>__<name>` where two would share a name), its
  description led by the namespace's. A call of one comes back as the Responses API names it:
  `{"type": "function_call", "namespace": "<namespace>", "name": "<name>", ...}`, and such an
  item sent back in `input` renders as the call the model made.
- Every other tool type (`web_search`, `file_search`, `code_interpreter`, `image_generation`,
  `computer_use_preview`, `mcp`, `local_shell`, `custom`, ...) is a tool that the server
  cannot run or the model cannot call here: it is left out (the model never sees it), logged,
  and named in the response's `warmslot.tools_left_out`, never a 400.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidRequest

log = logging.getLogger("warmslot.server")

_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
_warned: set[str] = set()  # tool types already logged at warning level (then at debug)


@dataclass(slots=True)
class ResponsesTools:
    """A request's tools as chat sees them."""

    chat: list[dict] | None  # chat-form function tools (None: the request sent no `tools`)
    qualified: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered name -> (namespace, name)
    left_out: list[dict] = field(default_factory=list)  # {"index", "type"} of each tool left out

    def offered_name(self, name: str, namespace: str | None) -> str:
        """The name the model knows a function by (`namespace` as a call item names it)."""
        if namespace:
            for offered, (space, inner) in self.qualified.items():
                if space == namespace and inner == name:
                    return offered
        return name

    def call_fields(self, offered: str) -> dict[str, str]:
        """A call item's `name` (and `namespace`) for the function the model called."""
        found = self.qualified.get(offered)
        return {"name": offered} if found is None else {"namespace": found[0], "name": found[1]}


def _function(tool: dict, description_head: str = "") -> dict:
    if isinstance(tool.get("function"), dict):  # already in chat's form
        function = dict(tool["function"])
    else:
        function = {k: tool[k] for k in _FUNCTION_FIELDS if tool.get(k) is not None}
    if description_head:
        own = function.get("description")
        function["description"] = f"{description_head}\n\n{own}" if isinstance(own, str) and own else description_head
    return {"type": "function", "function": function}


def parse_tools(value: Any) -> ResponsesTools:
    """The request's `tools`: function and namespace tools offered, the others left out."""
    if value is None:
        return ResponsesTools(None)
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    out = ResponsesTools([])
    spaced: list[tuple[str, str, dict]] = []  # (namespace, its description, function tool)
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise InvalidRequest("each tool must be an object with a 'type'", param=f"tools[{i}]")
        if kind == "function":
            out.chat.append(_function(tool))
        elif kind == "namespace":
            spaced += _namespace_functions(tool, f"tools[{i}]")
        else:
            out.left_out.append({"index": i, "type": kind})
    taken = {t["function"].get("name") for t in out.chat}
    inner_names = [f.get("name") for _, _, f in spaced]
    for space, head, function in spaced:
        name = function.get("name")
        unique = name not in taken and inner_names.count(name) == 1
        offered = name if unique else f"{space}__{name}"
        out.qualified[offered] = (space, name)
        out.chat.append(_function({**function, "name": offered}, head))
    if out.left_out:
        _log_left_out(out.left_out)
    return out


def _namespace_functions(tool: dict, where: str) -> list[tuple[str, str, dict]]:
    space, inner = tool.get("name"), tool.get("tools")
    if not isinstance(space, str) or not space:
        raise InvalidRequest("a namespace tool needs a 'name'", param=f"{where}.name")
    if not isinstance(inner, list):
        raise InvalidRequest("a namespace tool needs 'tools', an array of function tools", param=f"{where}.tools")
    head = tool.get("description") if isinstance(tool.get("description"), str) else ""
    out = []
    for j, function in enumerate(inner):
        at = f"{where}.tools[{j}]"
        if not isinstance(function, dict) or function.get("type", "function") != "function":
            kind = function.get("type") if isinstance(function, dict) else None
            raise InvalidRequest(f"a namespace holds function tools here, not {kind!r}", param=f"{at}.type")
        if not isinstance(function.get("name"), str):
            raise InvalidRequest("a function needs a 'name'", param=f"{at}.name")
        out.append((space, head, function))
    return out


def _log_left_out(left_out: list[dict]) -> None:
    kinds = sorted({t["type"] for t in left_out})
    new = [k for k in kinds if k not in _warned]
    _warned.update(new)
    level = logging.WARNING if new else logging.DEBUG
    log.log(level, "responses: tools left out (this server cannot run them): %s", ", ".join(kinds))


def tool_choice(value: Any, tools: ResponsesTools) -> Any:
    """Responses' `tool_choice` in chat's form, a namespaced function by its offered name."""
    if isinstance(value, dict) and value.get("type") == "function" and "function" not in value:
        name = value.get("name")
        if isinstance(name, str):
            name = tools.offered_name(name, value.get("namespace"))
        return {"type": "function", "function": {"name": name}}
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        listed = value.get("tools")
        if isinstance(listed, list):
            renamed = [
                {**t, "name": tools.offered_name(t["name"], t.get("namespace"))}
                if isinstance(t, dict) and isinstance(t.get("name"), str) and "function" not in t else t
                for t in listed
            ]
            return {**value, "tools": renamed}
    return value
