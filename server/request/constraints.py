"""What constrains a reply: `tools`, `tool_choice` and `response_format`, validated.

Each check raises `InvalidRequest` naming the field; the schemas are converted once here
(`convert_schema`) so that a schema the grammar cannot hold is refused before any work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from ..gbnf.schema import convert_schema

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_CHOICE_MODES = ("none", "auto", "required")
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """A validated `tool_choice`: mode "none", "auto", "required" or "function" (with `name`).
    `allowed` (from `{"type": "allowed_tools"}`): the only tools the grammar lets the model
    call; every tool is still rendered into the prompt, so narrowing them keeps the prefix."""

    mode: str
    name: str | None = None
    allowed: tuple[str, ...] | None = None


def validate_tools(tools: object) -> list[dict[str, Any]]:
    """Check an OpenAI `tools` list; answers it normalised (parameters always present)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    seen: set[str] = set()
    return [_validate_tool(tool, f"tools[{i}]", seen) for i, tool in enumerate(tools)]


def _validate_tool(tool: object, at: str, seen: set[str]) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise InvalidRequest("a tool must be an object", param=at)
    if tool.get("type", "function") != "function":
        raise InvalidRequest("only tools of type 'function' are supported", param=f"{at}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest("'function' must be an object", param=f"{at}.function")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        raise InvalidRequest(
            "a function name must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'", param=f"{at}.function.name"
        )
    if name in seen:
        raise InvalidRequest(f"the function name '{name}' is used twice", param=f"{at}.function.name")
    seen.add(name)
    clean: dict[str, Any] = {"name": name}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidRequest("'description' must be a string", param=f"{at}.function.description")
        clean["description"] = description
    clean["parameters"] = _validate_parameters(function.get("parameters"), f"{at}.function.parameters")
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidRequest("'strict' must be a boolean", param=f"{at}.function.strict")
        clean["strict"] = strict
    return {"type": "function", "function": clean}


def _validate_parameters(parameters: object, param: str) -> dict[str, Any]:
    if parameters is None:
        return {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be a JSON schema object", param=param)
    if parameters.get("type", "object") != "object":
        raise InvalidRequest("'parameters' must describe an object (type 'object')", param=param)
    convert_schema(parameters, param)
    return parameters


def validate_tool_choice(tool_choice: object, tools: list[dict[str, Any]]) -> ToolChoice:
    """Check `tool_choice` against validated `tools`; absent means "auto" with tools, else "none"."""
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICE_MODES:
            raise InvalidRequest(
                f"'tool_choice' must be one of {', '.join(TOOL_CHOICE_MODES)} or a function", param="tool_choice"
            )
        if tool_choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' is 'required' but no tools are given", param="tool_choice")
        return ToolChoice(tool_choice)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "allowed_tools":
        return _allowed_tools(tool_choice, tools)
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
        raise InvalidRequest(
            "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            param="tool_choice",
        )
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
    if not isinstance(name, str):
        raise InvalidRequest("'tool_choice' names no function", param="tool_choice")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise InvalidRequest(f"'tool_choice' names the unknown function '{name}'", param="tool_choice")
    return ToolChoice("function", name)


def _allowed_tools(tool_choice: dict, tools: list[dict[str, Any]]) -> ToolChoice:
    """`{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}` (chat), or the same
    fields at the top level (Responses); each tool `{"type": "function", "function":
    {"name"}}` or `{"type": "function", "name"}`."""
    spec = tool_choice.get("allowed_tools", tool_choice)
    at = "tool_choice.allowed_tools" if "allowed_tools" in tool_choice else "tool_choice"
    if not isinstance(spec, dict):
        raise InvalidRequest("'allowed_tools' must be an object", param=at)
    mode = spec.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise InvalidRequest("'mode' must be auto or required", param=f"{at}.mode")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise InvalidRequest("'tools' must be a non-empty array of functions", param=f"{at}.tools")
    known = {tool["function"]["name"] for tool in tools}
    names = []
    for i, item in enumerate(listed):
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or name not in known:
            raise InvalidRequest(f"allowed tool {name!r} is not one of 'tools'", param=f"{at}.tools[{i}]")
        names.append(name)
    return ToolChoice(mode, allowed=tuple(names))


@dataclass(slots=True)
class ResponseSchema:
    """A validated `response_format` that constrains the output: the schema and its field."""

    schema: dict[str, Any]
    param: str


def parse_response_format(response_format: object) -> ResponseSchema | None:
    """Check an OpenAI `response_format`; None for plain text.

    ``{"type": "text"}`` -> None; ``{"type": "json_object"}`` -> any JSON object (a ``schema``
    next to it is honoured); ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}`` -> values of the schema.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise InvalidRequest("'schema' must be a JSON schema object", param="response_format.schema")
        return ResponseSchema(schema or ANY_OBJECT_SCHEMA, "response_format.schema")
    if kind == "json_schema":
        schema = _json_schema_field(response_format.get("json_schema"))
        return ResponseSchema(schema, "response_format.json_schema.schema")
    raise InvalidRequest(
        "'response_format.type' must be one of text, json_object, json_schema", param="response_format.type"
    )


def _json_schema_field(spec: object) -> dict[str, Any]:
    at = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise InvalidRequest("'json_schema' must be an object", param=at)
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name)):
        raise InvalidRequest("'name' must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'", param=f"{at}.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'strict' must be a boolean", param=f"{at}.strict")
    schema = spec.get("schema")
    if schema is None:
        return ANY_OBJECT_SCHEMA
    if not isinstance(schema, dict):
        raise InvalidRequest("'schema' must be a JSON schema object", param=f"{at}.schema")
    return schema
