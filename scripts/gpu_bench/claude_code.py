"""A Claude-Code-shaped session for the `messages` workload, as Anthropic Messages requests.

A main agent (a ~20K-token system prompt and a dozen tools with `input_schema`) works through
scripted tool_use -> tool_result turns; two sub-agents, each with its own ~6K-token system
prompt and the tools less Task and TodoWrite, take turns in between (main, sub1, main, sub2,
...). Every request starts its `system` with Claude Code's billing header, which changes on
every request. At the end the main agent's history is compacted: its first tool result is
rewritten (as Claude Code clears old tool results), so the history diverges right after the
system prompt, the tools, the task and the first tool call; one more turn follows.

The assistant turns are the scripted ones, never the model's output, so every server sees
the same requests. Sizes are in tokens at --msg-scale 1 and scale with it. With the current
shapes (claude_code_shapes.py) every agent request also carries a system message after the
first user message, adaptive thinking, effort and context management, and a session-title
request follows the first main request.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from . import claude_code_shapes as shapes_now
from .agent import tool_sizes
from .text import DIRS, TextFactory, random_ident, random_path, random_sentence, random_url, random_words

MAIN_SYSTEM_TOKENS = 20000
SUB_SYSTEM_TOKENS = 6000
MAIN_TOOL_TOKENS = (300, 2000)  # a tool result of the main agent: MIN, MAX
SUB_TOOL_TOKENS = (200, 1200)
TOOL_DOC_TOKENS = 200  # the usage notes in each tool's description
CLEARED = "[Old tool result content cleared]"
MODEL = "claude-sonnet-4-5-20250929"
USER_ID = "user_3f9a0c5e7b1d2a4c6e8f0a1b3c5d7e9f_account_6a1f2b3c-4d5e-6f70-8192-a3b4c5d6e7f8_session_{session}"


def _schema(props: dict[str, tuple], required: list[str]) -> dict:
    out = {}
    for name, spec in props.items():
        out[name] = {"type": spec[0], "description": spec[1], **(spec[2] if len(spec) > 2 else {})}
    return {"type": "object", "properties": out, "required": required, "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}


# name, description head, input properties, required, kind of its result, input builder
ToolSpec = tuple[str, str, dict, list, str, Callable[[random.Random], dict]]
TOOL_SPECS: list[ToolSpec] = [
    ("Task", "Launch a new agent to handle complex, multi-step tasks autonomously.",
     {"description": ("string", "A short (3-5 word) description of the task"),
      "prompt": ("string", "The task for the agent to perform"),
      "subagent_type": ("string", "The type of specialized agent to use for this task")},
     ["description", "prompt", "subagent_type"], "prose",
     lambda r: {"description": " ".join(random_words(r, 3, 5)), "prompt": random_sentence(r, 12, 30),
                "subagent_type": "general-purpose"}),
    ("Bash", "Executes a given bash command in a persistent shell session with optional timeout.",
     {"command": ("string", "The command to execute"),
      "timeout": ("number", "Optional timeout in milliseconds (max 600000)"),
      "description": ("string", "Clear, concise description of what this command does in 5-10 words"),
      "run_in_background": ("boolean", "Set to true to run this command in the background")},
     ["command"], "log",
     lambda r: {"command": f"python -m pytest -x tests/test_{random_ident(r, 1)}.py -q", "timeout": 600000,
                "description": "Run the tests"}),
    ("Glob", "Fast file pattern matching tool that works with any codebase size.",
     {"pattern": ("string", "The glob pattern to match files against"),
      "path": ("string", "The directory to search in. Defaults to the current working directory.")},
     ["pattern"], "listing", lambda r: {"pattern": f"{r.choice(DIRS)}/**/*.py"}),
    ("Grep", "A powerful search tool built on ripgrep.",
     {"pattern": ("string", "The regular expression pattern to search for in file contents"),
      "path": ("string", "File or directory to search in (rg PATH)."),
      "glob": ("string", "Glob pattern to filter files (e.g. \"*.js\")"),
      "output_mode": ("string", "Output mode", {"enum": ["content", "files_with_matches", "count"]}),
      "-n": ("boolean", "Show line numbers in output"),
      "head_limit": ("number", "Limit output to first N lines/entries")},
     ["pattern"], "listing",
     lambda r: {"pattern": f"def {random_ident(r)}", "path": r.choice(DIRS), "output_mode": "content", "-n": True}),
    ("LS", "Lists files and directories in a given path.",
     {"path": ("string", "The absolute path to the directory to list (must be absolute, not relative)"),
      "ignore": ("array", "List of glob patterns to ignore", {"items": {"type": "string"}})},
     ["path"], "listing", lambda r: {"path": f"/home/user/project/{r.choice(DIRS)}"}),
    ("Read", "Reads a file from the local filesystem.",
     {"file_path": ("string", "The absolute path to the file to read"),
      "offset": ("number", "The line number to start reading from"),
      "limit": ("number", "The number of lines to read")},
     ["file_path"], "code", lambda r: {"file_path": f"/home/user/project/{random_path(r)}"}),
    ("Edit", "Performs exact string replacements in files.",
     {"file_path": ("string", "The absolute path to the file to modify"),
      "old_string": ("string", "The text to replace"),
      "new_string": ("string", "The text to replace it with (must be different from old_string)"),
      "replace_all": ("boolean", "Replace all occurences of old_string (default false)", {"default": False})},
     ["file_path", "old_string", "new_string"], "code",
     lambda r: {"file_path": f"/home/user/project/{random_path(r)}", "old_string": random_ident(r, 3),
                "new_string": random_ident(r, 3)}),
    ("MultiEdit", "Makes multiple edits to a single file in one operation.",
     {"file_path": ("string", "The absolute path to the file to modify"),
      "edits": ("array", "Array of edit operations to perform sequentially on the file",
                {"items": {"type": "object", "properties": {"old_string": {"type": "string"},
                                                            "new_string": {"type": "string"}}}})},
     ["file_path", "edits"], "code",
     lambda r: {"file_path": f"/home/user/project/{random_path(r)}",
                "edits": [{"old_string": random_ident(r, 2), "new_string": random_ident(r, 2)}]}),
    ("Write", "Writes a file to the local filesystem.",
     {"file_path": ("string", "The absolute path to the file to write (must be absolute, not relative)"),
      "content": ("string", "The content to write to the file")},
     ["file_path", "content"], "code",
     lambda r: {"file_path": f"/home/user/project/{random_path(r)}", "content": random_sentence(r)}),
    ("WebFetch", "Fetches content from a specified URL and processes it using an AI model.",
     {"url": ("string", "The URL to fetch content from", {"format": "uri"}),
      "prompt": ("string", "The prompt to run on the fetched content")},
     ["url", "prompt"], "prose", lambda r: {"url": random_url(r), "prompt": random_sentence(r, 6, 12)}),
    ("WebSearch", "Allows Claude to search the web and use the results to inform responses.",
     {"query": ("string", "The search query to use", {"minLength": 2}),
      "allowed_domains": ("array", "Only include search results from these domains", {"items": {"type": "string"}})},
     ["query"], "search", lambda r: {"query": " ".join(random_words(r, 3, 6))}),
    ("TodoWrite", "Use this tool to create and manage a structured task list for your current coding session.",
     {"todos": ("array", "The updated todo list", {"items": {"type": "object", "properties": {
         "content": {"type": "string", "minLength": 1},
         "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
         "activeForm": {"type": "string", "minLength": 1}}, "required": ["content", "status", "activeForm"]}})},
     ["todos"], "json",
     lambda r: {"todos": [{"content": random_sentence(r, 4, 8), "status": "in_progress", "activeForm": "Working"}]}),
]
SPECS = {s[0]: s for s in TOOL_SPECS}
SUB_AGENT_TOOLS = [s[0] for s in TOOL_SPECS if s[0] not in ("Task", "TodoWrite")]
MAIN_PLAN = ["Grep", "Read", "Bash", "Glob", "Read", "WebSearch", "WebFetch", "Bash", "Edit", "LS", "Read", "Grep"]
SUB_PLANS = (["Glob", "Read", "Grep", "Read", "Bash", "Read", "LS"],
             ["WebSearch", "WebFetch", "Read", "Grep", "Bash", "Read", "Glob"])


def tools_for(texts: TextFactory, names: list[str], doc_tokens: int) -> list[dict]:
    """Anthropic tool definitions: a description head and usage notes of `doc_tokens`."""
    out = []
    for name in names:
        _, head, props, required, _, _ = SPECS[name]
        notes = texts.text("prose", f"cc-tool-doc:{name}", doc_tokens) if doc_tokens > 0 else ""
        out.append({"name": name, "description": f"{head}\n\nUsage notes:\n{notes}",
                    "input_schema": _schema(props, required)})
    return out


def billing_header(index: int, vary: str) -> str:
    """Claude Code's first system block for request `index`: the cch always changes, and with
    vary="version" the version does too."""
    rng = random.Random(f"cc-billing:{index}")
    cch = "".join(rng.choice("0123456789abcdef") for _ in range(5))
    version = f"2.1.{index}" if vary == "version" else "2.1.101"
    return f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={cch};"


@dataclass
class CCAgent:
    """One agent of the session: its system text, tools, task, scripted calls and results."""

    texts: TextFactory
    name: str
    system_tokens: int
    tool_names: list[str]
    plan: list[str]
    result_range: tuple[int, int]
    doc_tokens: int
    size_offset: int = 0
    _tools: list[dict] | None = field(default=None, repr=False)

    def system_text(self) -> str:
        head = ("You are Claude Code, Anthropic's official CLI for Claude.\n" if self.name == "main" else
                f"You are an agent for Claude Code ({self.name}). Given the user's message, use the tools "
                f"available to complete the task.\n")
        return head + self.texts.text("prose", f"cc-system:{self.name}", max(self.system_tokens, 50))

    def tools(self) -> list[dict]:
        if self._tools is None:
            self._tools = tools_for(self.texts, self.tool_names, self.doc_tokens)
        return self._tools

    def task(self) -> str:
        rng = random.Random(f"cc-task:{self.name}")
        return ("<system-reminder>As you answer the user's questions, you can use the following context.\n"
                "</system-reminder>\n" if self.name == "main" else "") + \
            " ".join(random_sentence(rng) for _ in range(5))

    def call(self, k: int) -> dict:
        name = self.plan[k % len(self.plan)]
        rng = random.Random(f"cc-call:{self.name}:{k}")
        return {"type": "tool_use", "id": f"toolu_{self.name}_{k:02d}", "name": name, "input": SPECS[name][5](rng)}

    def result(self, k: int) -> str:
        lo, hi = self.result_range
        size = tool_sizes(k + 1, lo, hi, self.size_offset)[k]
        kind = SPECS[self.plan[k % len(self.plan)]][4]
        return self.texts.text(kind, f"cc-result:{self.name}:{k}", max(size, 10))

    def messages(self, n_results: int, compacted: bool = False) -> list[dict]:
        """The task, then `n_results` turns of assistant tool_use and user tool_result; with
        `compacted`, the first result is cleared."""
        out: list[dict] = [{"role": "user", "content": [{"type": "text", "text": self.task()}]}]
        for k in range(n_results):
            rng = random.Random(f"cc-say:{self.name}:{k}")
            out.append({"role": "assistant", "content": [{"type": "text", "text": random_sentence(rng, 6, 14)},
                                                         self.call(k)]})
            text = CLEARED if compacted and k == 0 else self.result(k)
            out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{self.name}_{k:02d}",
                                                     "content": text}]})
        return out


@dataclass(frozen=True)
class Step:
    """One request of the session: which agent, how many tool results its history holds,
    compacted or not, and the index (in the session) of the same agent's request whose prompt
    is a prefix of this one (None: its first request)."""

    agent: str
    n_results: int
    compacted: bool
    base: int | None


def schedule(main_turns: int, sub_turns: int, title: bool = False) -> list[Step]:
    """main, sub1, main, sub2, ...: main_turns + 1 main requests (0..main_turns tool results),
    sub_turns requests of each sub-agent in the gaps, then the compaction and one more turn.
    With `title`, the session-title request (agent "title") follows the first main request."""
    subs = [(name, n) for n in range(sub_turns) for name in ("sub1", "sub2")]
    steps: list[Step] = []
    last: dict[str, int] = {}

    def add(agent: str, n: int, compacted: bool = False, base: int | None = -1) -> None:
        steps.append(Step(agent, n, compacted, last.get(agent) if base == -1 else base))
        last[agent] = len(steps) - 1

    for n in range(main_turns + 1):
        add("main", n)
        if title and n == 0:
            add("title", 0)
        if subs and n < main_turns:
            add(*subs.pop(0))
    for name, n in subs:
        add(name, n)
    first_main = next(i for i, s in enumerate(steps) if s.agent == "main")
    add("main", main_turns, compacted=True, base=first_main)  # diverges after the first request's prompt
    add("main", main_turns + 1, compacted=True)
    return steps


class Session:
    """The agents of one session and the Messages body of each step."""

    def __init__(self, texts: TextFactory, *, scale: float, gen_tokens: int, billing: str, session_id: str,
                 shapes: str = "current") -> None:
        def s(n: int) -> int:
            return max(1, int(n * scale))
        self.gen_tokens, self.billing, self.session_id = gen_tokens, billing, session_id
        self.texts, self.current = texts, shapes == "current"
        self.agent_types_tokens, self.title_tokens = s(shapes_now.AGENT_TYPES_TOKENS), s(shapes_now.TITLE_PROMPT_TOKENS)
        tool_names = [t[0] for t in TOOL_SPECS]
        self.agents = {
            "main": CCAgent(texts, "main", s(MAIN_SYSTEM_TOKENS), tool_names, MAIN_PLAN,
                            (s(MAIN_TOOL_TOKENS[0]), s(MAIN_TOOL_TOKENS[1])), s(TOOL_DOC_TOKENS)),
            "sub1": CCAgent(texts, "sub1", s(SUB_SYSTEM_TOKENS), SUB_AGENT_TOOLS, SUB_PLANS[0],
                            (s(SUB_TOOL_TOKENS[0]), s(SUB_TOOL_TOKENS[1])), s(TOOL_DOC_TOKENS), 1),
            "sub2": CCAgent(texts, "sub2", s(SUB_SYSTEM_TOKENS), SUB_AGENT_TOOLS, SUB_PLANS[1],
                            (s(SUB_TOOL_TOKENS[0]), s(SUB_TOOL_TOKENS[1])), s(TOOL_DOC_TOKENS), 2),
        }

    def schedule(self, main_turns: int, sub_turns: int) -> list[Step]:
        return schedule(main_turns, sub_turns, title=self.current)

    def path(self) -> str:
        return shapes_now.PATH if self.current else "/v1/messages"

    def headers(self, step: Step) -> dict[str, str]:
        """The headers of `step`'s request beyond the API key and version (none when legacy)."""
        return shapes_now.headers(side=step.agent == "title") if self.current else {}

    def body(self, step: Step, index: int) -> dict[str, Any]:
        """The request of `step`, the `index`-th of the session (its billing header)."""
        metadata = {"user_id": USER_ID.format(session=self.session_id)}
        if step.agent == "title":
            task = self.agents["main"].task().split("</system-reminder>\n")[-1]  # the user's words alone
            return shapes_now.title_body(self.texts, model=MODEL, billing=billing_header(index, self.billing),
                                         task=task, prompt_tokens=self.title_tokens, metadata=metadata)
        agent = self.agents[step.agent]
        messages = copy.deepcopy(agent.messages(step.n_results, step.compacted))
        fields: dict[str, Any] = {"temperature": 0.0}
        if self.current:  # no temperature: the CLI sends none with thinking on
            fields = shapes_now.agent_fields(messages, shapes_now.system_message(self.texts, step.agent,
                                                                                  self.agent_types_tokens))
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # as Claude Code marks the last block
        return {
            "model": MODEL, "max_tokens": self.gen_tokens, "stream": True, **fields,
            "system": [{"type": "text", "text": billing_header(index, self.billing)},
                       {"type": "text", "text": agent.system_text(), "cache_control": {"type": "ephemeral"}}],
            "messages": messages,
            "tools": agent.tools(),
            "metadata": metadata,
        }

    def size_estimate(self, agent: str, n_results: int) -> int:
        """Tokens of an agent's prompt with `n_results` results (the context's budget), from the
        settings alone: no text is made, so the texts are still calibrated on the first server."""
        if agent == "title":
            return self.title_tokens + 300
        a = self.agents[agent]
        tools = sum(len(json.dumps(SPECS[n][2])) // 2 + 60 + a.doc_tokens for n in a.tool_names)
        results = sum(tool_sizes(n_results, *a.result_range, a.size_offset)) if n_results else 0
        system_message = self.agent_types_tokens + 100 if self.current else 0
        return a.system_tokens + tools + 200 + results + n_results * 120 + system_message
