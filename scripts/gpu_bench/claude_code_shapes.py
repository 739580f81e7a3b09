"""What today's Claude Code CLI (2.1.197 and later) adds to its Messages requests, for the
`messages` workload's `--msg-shapes current` (the default; `legacy` sends none of it).

- A `system` message inside `messages`, right after the first user message: the environment
  and the list of agent types the Agent tool can start, in the main agent's and every
  sub-agent's requests (beta `mid-conversation-system-2026-04-07`).
- `thinking: {"type": "adaptive"}` on the agents' requests and `{"type": "disabled"}` on side
  requests, `output_config: {"effort": "medium"}`, `context_management` (clear old thinking),
  and the `anthropic-beta` values the CLI sends, on `POST /v1/messages?beta=true`.
- One session-title request: no tools, thinking disabled, a small max_tokens and
  `output_config.format` a JSON schema of `{"title": string}`; whether the reply parses as
  JSON that matches the schema is recorded (`title_matches_schema`).
"""

from __future__ import annotations

import json
import random
from typing import Any

from .text import TextFactory, random_sentence

SHAPES = ("current", "legacy")
CLI_VERSION = "2.1.197"
BETAS = ("claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
         "mid-conversation-system-2026-04-07", "effort-2025-11-24", "advanced-tool-use-2025-11-20")
TITLE_BETAS = ("claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
               "effort-2025-11-24", "structured-outputs-2025-12-15")
PATH = "/v1/messages?beta=true"  # as the CLI posts it
THINKING_AGENT = {"type": "adaptive"}
THINKING_SIDE = {"type": "disabled"}
OUTPUT_CONFIG = {"effort": "medium"}
CONTEXT_MANAGEMENT = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
TITLE_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
                "additionalProperties": False}
TITLE_MAX_TOKENS = 64
AGENT_TYPES_TOKENS = 500  # the system message's list of agent types, at --msg-scale 1
TITLE_PROMPT_TOKENS = 400  # the title request's instructions
AGENT_TYPES = ("general-purpose", "Explore", "Plan", "statusline-setup", "output-style-setup", "claude-code-guide")


def headers(side: bool = False) -> dict[str, str]:
    """The CLI's request headers beyond the API key and version."""
    return {"anthropic-beta": ",".join(TITLE_BETAS if side else BETAS), "x-app": "cli",
            "user-agent": f"claude-cli/{CLI_VERSION} (external, cli)"}


def system_message(texts: TextFactory, agent: str, tokens: int) -> dict[str, Any]:
    """The mid-conversation system message: the environment, then the agent types (each with a
    description from `texts`, `tokens` in all). The same for every agent but its first line."""
    per = max(5, tokens // len(AGENT_TYPES))
    kinds = "\n".join(f"- {name}: {texts.text('prose', f'cc-agent-type:{name}', per).strip()} (Tools: *)"
                      for name in AGENT_TYPES)
    text = ("# Environment\nYou have been invoked in the following environment: \n"
            " - Primary working directory: /home/user/project\n - Is a git repository: true\n"
            " - Platform: linux\n - Shell: bash\n\n"
            f"{'Available agent types for the Agent tool' if agent == 'main' else 'Agent types of this session'}:\n"
            f"{kinds}\n\nToday's date is 2026-04-07.")
    return {"role": "system", "content": [{"type": "text", "text": text}]}


def agent_fields(messages: list[dict], system: dict[str, Any]) -> dict[str, Any]:
    """The current shapes of an agent's request: the system message inserted after the first
    user message (in place, `messages` is the request's own copy), and the fields."""
    messages.insert(1, system)
    return {"thinking": dict(THINKING_AGENT), "output_config": dict(OUTPUT_CONFIG),
            "context_management": json.loads(json.dumps(CONTEXT_MANAGEMENT))}


def title_body(texts: TextFactory, *, model: str, billing: str, task: str, prompt_tokens: int,
               metadata: dict) -> dict[str, Any]:
    """The session-title request: its own system prompt, the task inside <session>, no tools."""
    instructions = ("You are naming a coding session so the user can pick it out of a long list of sessions. "
                    "The title is a short noun phrase of two to five words, in sentence case.\n\n"
                    + texts.text("prose", "cc-title-instructions", max(prompt_tokens, 20)))
    rng = random.Random("cc-title")
    return {
        "model": model, "max_tokens": TITLE_MAX_TOKENS, "stream": True,
        "system": [{"type": "text", "text": billing},
                   {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."},
                   {"type": "text", "text": instructions}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": (
            f"<session>\n{task.strip()}\n</session>\n\nWrite the title in the predominant language of the "
            f"session. {random_sentence(rng, 6, 12)}")}]}],
        "tools": [],
        "thinking": dict(THINKING_SIDE),
        "output_config": {**OUTPUT_CONFIG,
                          "format": {"type": "json_schema", "schema": json.loads(json.dumps(TITLE_SCHEMA))}},
        "metadata": metadata,
    }


def title_matches_schema(text: str | None) -> bool:
    """Whether a reply is JSON that TITLE_SCHEMA accepts: an object whose only key is a string
    `title` (checked by hand: the benchmark machine need not have jsonschema)."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"title"} and isinstance(value["title"], str)
