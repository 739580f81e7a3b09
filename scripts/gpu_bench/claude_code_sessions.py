"""Many Claude Code sessions for the `sessions` workload: claude_code.py's session, one per user.

Every session has a main agent (claude_code.py's ~20K-token system prompt and tools at
--sess-scale 1) and one sub-agent (its own ~6K-token system prompt and the tools less Task and
TodoWrite). What a session is made of is seeded by what it is, so that:

- the system prompts and tools are the same bytes in every session (a prefix shared by all
  the main agents, another by all the sub-agents), as one CLI version sends them; only the
  billing header at the head of `system` differs per request, and the server drops it
  (warmslot) or normalizes its `cch` (llama-server);
- the task (the first user message) and the tool results are the session's own.

The main agent's tools return large results (a file, a search, a log: 2K-9K tokens at scale 1)
and small ones (an edit's confirmation, the todo list, the sub-agent's summary: 60-400), so some
of its requests add only a few hundred tokens: how long those wait for their first token says
whether the server kept the session's state or computes it again. The sub-agent runs in the
background: its requests come between the main agent's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .agent import tool_sizes
from .claude_code import (MAIN_SYSTEM_TOKENS, SPECS, SUB_AGENT_TOOLS, SUB_SYSTEM_TOKENS, TOOL_DOC_TOKENS, TOOL_SPECS,
                          CCAgent, Session, Step)
from .text import TextFactory, random_sentence

RESULT_TOKENS = (2000, 9000)  # a large tool result at scale 1: MIN, MAX
SMALL_RESULT_TOKENS = (60, 400)  # a small one
SMALL_RESULT_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "TodoWrite", "Task"})
MAIN_PLAN = ["TodoWrite", "Grep", "Read", "Task", "Edit", "Bash", "Read", "Edit", "Bash", "Grep", "Read", "TodoWrite"]
SUB_PLAN = ["Glob", "Read", "Grep", "Read", "Bash", "Read", "LS"]
BILLING_HEADER = "x-anthropic-billing-header:"
REMINDER = ("<system-reminder>As you answer the user's questions, you can use the following context.\n"
            "</system-reminder>\n")


@dataclass
class SessionAgent(CCAgent):
    """A CCAgent whose task and tool results are its session's own, and whose small tools
    return small results."""

    session: int = 0
    small_range: tuple[int, int] = SMALL_RESULT_TOKENS

    def task(self) -> str:
        rng = random.Random(f"sessions-task:{self.name}:{self.session}")
        return (REMINDER if self.name == "main" else "") + " ".join(random_sentence(rng) for _ in range(5))

    def result_tokens(self, k: int) -> int:
        """The size of the k-th tool result (from the settings alone: no text is made)."""
        small = self.plan[k % len(self.plan)] in SMALL_RESULT_TOOLS
        lo, hi = self.small_range if small else self.result_range
        return max(tool_sizes(k + 1, lo, hi, self.size_offset)[k], 10)

    def result(self, k: int) -> str:
        kind = SPECS[self.plan[k % len(self.plan)]][4]
        return self.texts.text(kind, f"sessions-result:{self.name}:{self.session}:{k}", self.result_tokens(k))


class UserSession(Session):
    """One user's session: claude_code.Session's requests, with the agents above."""

    def __init__(self, texts: TextFactory, index: int, *, scale: float, gen_tokens: int, billing: str,
                 shapes: str) -> None:
        super().__init__(texts, scale=scale, gen_tokens=gen_tokens, billing=billing, shapes=shapes,
                         session_id=f"5e551011-{index:04x}-4a1b-8c9d-0e1f2a3b4c5d")
        self.index = index

        def s(n: int) -> int:
            return max(1, int(n * scale))
        large = (s(RESULT_TOKENS[0]), s(RESULT_TOKENS[1]))
        small = (s(SMALL_RESULT_TOKENS[0]), s(SMALL_RESULT_TOKENS[1]))
        self.agents = {
            "main": SessionAgent(texts, "main", s(MAIN_SYSTEM_TOKENS), [t[0] for t in TOOL_SPECS], MAIN_PLAN, large,
                                 s(TOOL_DOC_TOKENS), index, session=index, small_range=small),
            "sub": SessionAgent(texts, "sub", s(SUB_SYSTEM_TOKENS), SUB_AGENT_TOOLS, SUB_PLAN, large,
                                s(TOOL_DOC_TOKENS), index + 3, session=index, small_range=small),
        }

    def billing_index(self, i: int) -> int:
        """The billing header's index of the session's i-th request: its own in the whole run."""
        return self.index * 1000 + i

    def size_estimate(self, agent: str, n_results: int) -> int:
        if agent == "title":
            return super().size_estimate(agent, n_results)
        a = self.agents[agent]
        return super().size_estimate(agent, 0) + sum(a.result_tokens(k) + 120 for k in range(n_results))


def session_schedule(requests: int, title: bool) -> list[Step]:
    """One session's requests: main (0 results), the session title (current shapes), then main
    and sub in turn while the sub-agent has requests left (a third of the rest), then main."""
    n_title = 1 if title and requests > 1 else 0
    rest = max(1, requests - n_title)
    n_sub = rest // 3
    subs = list(range(n_sub))
    steps: list[Step] = []
    last: dict[str, int] = {}

    def add(agent: str, n: int) -> None:
        steps.append(Step(agent, n, False, last.get(agent)))
        last[agent] = len(steps) - 1

    for n in range(rest - n_sub):
        add("main", n)
        if n == 0 and n_title:
            add("title", 0)
        elif subs:
            add("sub", subs.pop(0))
    return steps


def longest_prompt(session: UserSession, steps: list[Step]) -> int:
    """The estimated tokens of the longest prompt of the schedule."""
    return max(session.size_estimate(s.agent, s.n_results) for s in steps)


def chat_form(body: dict) -> tuple[list[dict], list[dict] | None]:
    """The system text, the tools and the first user message of a Messages body as a chat
    request, converted as warmslot converts them (billing header dropped, system blocks joined
    by a newline, tools as functions): enough to render the prompts' shared head."""
    system = "\n".join(b["text"] for b in body.get("system") or [] if not b["text"].startswith(BILLING_HEADER))
    first = body["messages"][0]["content"]
    user = "".join(b.get("text", "") for b in first if b.get("type") == "text") if isinstance(first, list) else first
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                               "description": t["description"]}} for t in body.get("tools") or []]
    return messages, tools or None
