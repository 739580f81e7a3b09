"""What one request may ask of the server, checked before any work starts.

Each check is cheap (lengths of lists the body already holds) and answers a 400 that names
the field, so a client learns what to change. A request that retrying can never fix (more
choices than the queue holds) is a 400, never a 503.
"""

from __future__ import annotations

from ..process.config import ServerConfig
from ..errors import InvalidRequest


def check_body_limits(config: ServerConfig, body: dict) -> None:
    """`messages` and `tools` of a request body within --max-messages and --max-tools."""
    _check_count(body, "messages", config.max_messages, "--max-messages")
    _check_count(body, "tools", config.max_tools, "--max-tools")
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        check_fanout(config, n, n_prompts=_n_prompts(body.get("prompt")))


def check_conversation(config: ServerConfig, n_messages: int, param: str) -> None:
    """A conversation that reaches the prompt as `n_messages` messages (a Responses request's
    stored history plus its `input` items) within --max-messages."""
    if config.max_messages > 0 and n_messages > config.max_messages:
        raise InvalidRequest(
            f"'{param}' makes a conversation of {n_messages} messages; this server takes at most "
            f"{config.max_messages} (--max-messages)",
            param=param,
        )


def _n_prompts(prompt) -> int:
    """Prompts in a /v1/completions body: a list of texts or of token lists is a batch."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    return 1


def _check_count(body: dict, name: str, limit: int, flag: str) -> None:
    value = body.get(name)
    if isinstance(value, list) and limit > 0 and len(value) > limit:
        raise InvalidRequest(f"'{name}' has {len(value)} entries; this server takes at most {limit} ({flag})", param=name)


def check_fanout(config: ServerConfig, n_choices: int, *, n_prompts: int = 1) -> None:
    """A request of `n_choices` choices for each of `n_prompts` prompts becomes that many
    engine requests: more than the slots and the queue together hold (--parallel plus
    --max-queue) can never be taken, so it is a 400 (a 503 would tell the client to retry
    in vain)."""
    engine = config.engine
    limit = engine.max_queue + engine.n_parallel
    total = n_choices * n_prompts
    if total > limit:
        raise InvalidRequest(
            f"'n' ({n_choices}) times the number of prompts ({n_prompts}) is {total} requests; "
            f"this server holds at most {limit} at once (--parallel plus --max-queue)",
            param="n" if n_prompts == 1 else "n, prompt",
        )
