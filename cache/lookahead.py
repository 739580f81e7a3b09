"""What the waiting queue says about the future, for choosing what a tier gives up.

When more conversations come and go than the device and RAM hold, least-recently-used
eviction fails the common case: sessions taking turns in a queue come back in the order they
left, so the conversation used least recently is the one needed next, and LRU throws out
every conversation just before it returns. The queue of requests waiting for a slot knows
better: it lists the prompts that will start next, in order. A tier that must give something
up gives up what no waiting prompt continues (least recently used first among those), and
else what the latest waiting prompt continues: Belady's rule with the queue as its horizon.

A holder (a slot's contents or a cache entry) is *continued* by a prompt when the prompt
starts with all of the holder's previous prompt, but for a few tokens (a re-rendered end of
turn): the prompt is that conversation's next turn. Sharing a system prompt is not enough.

The queue does not show an agent's other conversations: while a sub-agent works, its main
agent has no request waiting. Where the client names its session (Claude Code does), a
holder of a session at work is needed after the queue (`session_uses`).
"""

from __future__ import annotations

import itertools
from typing import Hashable, Iterable, Sequence, TypeVar

K = TypeVar("K", bound=Hashable)

# waiting prompts looked at: the next ones to start (matching is O(holders) per prompt)
HORIZON = 32
# tokens at the end of a holder's prompt that its next turn may render differently (the
# end-of-turn markup of the reply it generated)
SLACK = 64
_TAIL = 256  # compared first: two conversations that share a system prompt differ here


def continues(held: Sequence[int], prompt_end: int | None, tokens: Sequence[int]) -> bool:
    """Whether `tokens` starts with the first `prompt_end` tokens of `held` (all of them if
    None), less SLACK: the next turn of the conversation `held` is."""
    n = min(len(held) if prompt_end is None else prompt_end, len(held)) - SLACK
    if n <= 0 or len(tokens) < n:
        return False
    start = max(0, n - _TAIL)
    if list(held[start:n]) != list(tokens[start:n]):
        return False
    return list(held[:start]) == list(tokens[:start])


def next_uses(
    holders: Iterable[tuple[K, str, Sequence[int], int | None]],
    upcoming: Iterable[tuple[str, Sequence[int]]],
) -> dict[K, int]:
    """For each holder (key, tenant, tokens, prompt_end), the queue position of the first of
    the `upcoming` prompts (tenant, tokens; next first) that continues it. Holders no prompt
    within HORIZON continues are absent: as far as the queue knows, never needed."""
    holders = list(holders)
    out: dict[K, int] = {}
    for i, (tenant, tokens) in enumerate(itertools.islice(upcoming, HORIZON)):
        for key, h_tenant, held, prompt_end in holders:
            if key not in out and h_tenant == tenant and continues(held, prompt_end, tokens):
                out[key] = i
    return out


def session_uses(
    holders: Iterable[tuple[K, str, str]],
    running: Iterable[tuple[str, str]],
    waiting: Iterable[tuple[str, str]],
    uses: dict[K, int],
) -> dict[K, int]:
    """`uses` (from next_uses), with the holders (key, tenant, session) that no waiting prompt
    continues but whose client session (tenant, session: an agent's whole run, which Claude
    Code names in every request) has a request running or waiting: the session's other
    conversation (a main agent while its sub-agent works) comes back once that request is
    done, so after the prompts waiting now. A running session's holders are needed at
    HORIZON, the i-th waiting request's at HORIZON + 1 + i; a holder with no session is not."""
    when: dict[tuple[str, str], int] = {}
    for tenant, session in running:
        if session:
            when.setdefault((tenant, session), HORIZON)
    for i, (tenant, session) in enumerate(itertools.islice(waiting, HORIZON)):
        if session:
            when.setdefault((tenant, session), HORIZON + 1 + i)
    out = dict(uses)
    if when:
        for key, tenant, session in holders:
            if key not in out and session and (tenant, session) in when:
                out[key] = when[(tenant, session)]
    return out


def give_up_first(uses: dict[K, int], key: K) -> tuple[bool, int]:
    """A sort key: what no waiting prompt needs first, then the latest needed."""
    return key in uses, -uses.get(key, 0)


def victim_order(keys: Sequence[K], uses: dict[K, int]) -> list[K]:
    """`keys` (least recently used first) in the order to give them up: first those no
    waiting prompt needs, in LRU order; then those needed, the latest needed first."""
    return sorted(keys, key=lambda k: give_up_first(uses, k))  # stable: LRU order among equals
