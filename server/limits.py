"""What one request may ask of the server, checked before any work starts.

Each check is cheap (lengths of lists the body already holds) and answers a 400 that names
the field, so a client learns what to change. A request that retrying can never fix (more
choices than the queue holds) is a 400, never a 503.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InvalidRequest

if TYPE_CHECKING:
    from .state import Warmslot


def check_body_limits(server: "Warmslot", body: dict) -> None:
    """`messages` and `tools` of a request body within --max-messages and --max-tools."""
    config = server.config
    _check_count(body, "messages", config.max_messages, "--max-messages")
    _check_count(body, "tools", config.max_tools, "--max-tools")


def _check_count(body: dict, name: str, limit: int, flag: str) -> None:
    value = body.get(name)
    if isinstance(value, list) and limit > 0 and len(value) > limit:
        raise InvalidRequest(f"'{name}' has {len(value)} entries; this server takes at most {limit} ({flag})", param=name)


def check_fanout(server: "Warmslot", n_choices: int, *, n_prompts: int = 1) -> None:
    """A request of `n_choices` choices for each of `n_prompts` prompts becomes that many
    engine requests, which all wait in one queue: more than --max-queue can never be taken,
    so it is a 400 (a 503 would tell the client to retry in vain)."""
    limit = server.config.engine.max_queue
    total = n_choices * n_prompts
    if total > limit:
        raise InvalidRequest(
            f"'n' ({n_choices}) times the number of prompts ({n_prompts}) is {total} requests; "
            f"the queue of this server holds at most {limit} (--max-queue)",
            param="n" if n_prompts == 1 else "n, prompt",
        )
