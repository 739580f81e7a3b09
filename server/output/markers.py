"""The markers that delimit reasoning and tool calls, and the tool-call format names.

Kept apart from the parsers so that modules that only need the names (flag choices, template
detection, grammar building) import nothing else.
"""

from __future__ import annotations

from typing import Iterable

FORMATS = ("hermes", "hermes_xml", "llama3", "mistral", "json", "none")
HERMES_FORMATS = ("hermes", "hermes_xml")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"

WHITESPACE = " \t\r\n"


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `markers`."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def find_first_marker(text: str, markers: Iterable[str]) -> tuple[int, str]:
    """Position and marker of the earliest occurrence of any marker, or (-1, "")."""
    found, which = -1, ""
    for marker in markers:
        pos = text.find(marker)
        if pos >= 0 and (found < 0 or pos < found):
            found, which = pos, marker
    return found, which
