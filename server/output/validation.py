"""Whether a call's arguments are what its tool accepts: a JSON object valid against the
tool's parameter schema.

A call the model wrote stands only if this holds; the grammars enforce the schemas when they
apply, and this check is what decides where they do not (an ``auto`` reply before its trigger,
a model without grammar, keywords no grammar writes). Validation uses ``jsonschema`` (a
runtime dependency); a schema it cannot read is not held against the call.
"""

from __future__ import annotations

import json
import re
from typing import Any


def tool_parameters(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Tool name -> parameter schema, from chat-shaped (``{"function": {...}}``) or flat tools."""
    result: dict[str, Any] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = function.get("name")
        if isinstance(name, str):
            parameters = function.get("parameters")
            result[name] = parameters if isinstance(parameters, dict) else {}
    return result


class ArgumentsCheck:
    """Callable ``(name, arguments_text) -> bool``; one compiled validator per tool, made on
    first use. A name no tool has is judged only on being a JSON object."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._schemas = tool_parameters(tools)
        self._validators: dict[str, Any] = {}

    def __call__(self, name: str, arguments: str) -> bool:
        try:
            value = json.loads(arguments, strict=False)
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        schema = self._schemas.get(name)
        if not schema:
            return True
        validator = self._validator(name, schema)
        if validator is None:
            return True
        try:
            return bool(validator.is_valid(value))
        except Exception:  # a schema jsonschema cannot apply (bad regex, unknown draft quirk)
            return True

    def _validator(self, name: str, schema: dict[str, Any]) -> Any:
        if name not in self._validators:
            import jsonschema  # imported on first use: ~0.1 s, paid only by requests with calls

            try:
                default = jsonschema.Draft202012Validator
                if re.search(r'"exclusive(?:Min|Max)imum": (?:true|false)', json.dumps(schema)):
                    default = jsonschema.Draft4Validator  # draft 4's boolean form
                cls = jsonschema.validators.validator_for(schema, default=default)
                self._validators[name] = cls(schema)
            except Exception:
                self._validators[name] = None
        return self._validators[name]
