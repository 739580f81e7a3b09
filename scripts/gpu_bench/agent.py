"""The replayed agent: its tool schemas, recorded tool calls and tool results."""

from __future__ import annotations

import json
import random
from typing import Any

from .text import DIRS, TextFactory, random_ident, random_path, random_sentence, random_url, random_words


def _tool(name: str, description: str, params: dict[str, tuple], required: list[str]) -> dict:
    props = {}
    for pname, spec in params.items():
        ptype, pdesc = spec[0], spec[1]
        prop: dict[str, Any] = {"type": ptype, "description": pdesc}
        if len(spec) > 2:
            prop.update(spec[2])
        props[pname] = prop
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required},
    }}


TOOLS = [
    _tool("read_file", "Read a text file from the workspace and return its lines with line numbers. Use offset and "
          "limit to page through large files instead of reading them whole.",
          {"path": ("string", "Path of the file, relative to the workspace root."),
           "offset": ("integer", "First line to return (1-based).", {"minimum": 1}),
           "limit": ("integer", "Most lines to return.", {"minimum": 1, "maximum": 2000})}, ["path"]),
    _tool("write_file", "Create or overwrite a file with the given content. Parent directories are created.",
          {"path": ("string", "Path of the file to write."), "content": ("string", "The complete new content.")},
          ["path", "content"]),
    _tool("patch_file", "Replace one exact occurrence of old_string with new_string in a file. Fails when old_string "
          "is missing or occurs more than once, unless replace_all is true.",
          {"path": ("string", "File to edit."), "old_string": ("string", "Exact text to replace."),
           "new_string": ("string", "Replacement text."),
           "replace_all": ("boolean", "Replace every occurrence.", {"default": False})},
          ["path", "old_string", "new_string"]),
    _tool("list_directory", "List the entries of a directory with their sizes and modification times.",
          {"path": ("string", "Directory to list."), "recursive": ("boolean", "Descend into subdirectories."),
           "max_entries": ("integer", "Most entries to return.", {"default": 500})}, ["path"]),
    _tool("search_files", "Search file contents with a regular expression, like ripgrep. Returns matching lines "
          "as path:line:text.",
          {"pattern": ("string", "Regular expression to search for."),
           "path": ("string", "Directory or file to search in."),
           "glob": ("string", "Only search files whose name matches this glob, e.g. *.py."),
           "case_sensitive": ("boolean", "Match case exactly.", {"default": True})}, ["pattern"]),
    _tool("run_terminal", "Run a shell command in the workspace and return its combined output and exit code. "
          "Long-running commands should use background=true and process_status.",
          {"command": ("string", "The command line to run with bash."),
           "timeout": ("integer", "Seconds before the command is killed.", {"default": 120}),
           "background": ("boolean", "Start the command and return at once with a process id."),
           "workdir": ("string", "Directory to run in.")}, ["command"]),
    _tool("process_status", "Report the status and new output of a background process started by run_terminal.",
          {"process_id": ("string", "The id run_terminal returned."),
           "kill": ("boolean", "Stop the process.")}, ["process_id"]),
    _tool("web_search", "Search the web and return titles, URLs and snippets of the best results.",
          {"query": ("string", "The search query."),
           "max_results": ("integer", "Most results to return.", {"minimum": 1, "maximum": 20}),
           "recency_days": ("integer", "Only results newer than this many days.")}, ["query"]),
    _tool("web_extract", "Fetch web pages and return their main text as markdown, without navigation and ads.",
          {"urls": ("array", "Pages to fetch.", {"items": {"type": "string"}, "maxItems": 5}),
           "max_chars": ("integer", "Truncate each page to this many characters.")}, ["urls"]),
    _tool("browser_navigate", "Open a URL in the headless browser and return an accessibility snapshot of the page.",
          {"url": ("string", "The address to open."),
           "wait_for": ("string", "CSS selector to wait for before the snapshot.")}, ["url"]),
    _tool("browser_click", "Click an element of the current page, identified by its snapshot reference.",
          {"ref": ("string", "Element reference from the last snapshot, e.g. e42."),
           "double": ("boolean", "Double click.")}, ["ref"]),
    _tool("browser_type", "Type text into an input element of the current page.",
          {"ref": ("string", "Element reference from the last snapshot."), "text": ("string", "Text to type."),
           "submit": ("boolean", "Press Enter afterwards.")}, ["ref", "text"]),
    _tool("http_request", "Send an HTTP request and return the status, headers and body of the response.",
          {"method": ("string", "HTTP method.", {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]}),
           "url": ("string", "The URL."), "headers": ("object", "Request headers."),
           "body": ("string", "Request body.")}, ["method", "url"]),
    _tool("python_exec", "Run Python code in a persistent sandboxed interpreter and return stdout, stderr and the "
          "value of the last expression.",
          {"code": ("string", "The code to run."), "timeout": ("integer", "Seconds before it is interrupted.")},
          ["code"]),
    _tool("memory_save", "Save a fact to long-term memory so that later sessions can recall it.",
          {"key": ("string", "Short name of the fact."), "content": ("string", "The fact."),
           "tags": ("array", "Labels for later search.", {"items": {"type": "string"}})}, ["key", "content"]),
    _tool("memory_search", "Search long-term memory for facts saved in earlier sessions.",
          {"query": ("string", "What to look for."), "limit": ("integer", "Most facts to return.")}, ["query"]),
    _tool("todo_write", "Replace the task list that tracks progress on the current request.",
          {"todos": ("array", "The tasks.", {"items": {"type": "object", "properties": {
              "content": {"type": "string"}, "status": {"type": "string",
                                                         "enum": ["pending", "in_progress", "completed"]}}}})},
          ["todos"]),
    _tool("send_message", "Send a message to the user on their messaging platform while the task continues.",
          {"text": ("string", "The message."), "channel": ("string", "Channel or chat id.")}, ["text"]),
    _tool("git", "Run a git subcommand in the workspace repository (status, diff, log, show, add, commit, checkout).",
          {"args": ("array", "Arguments after `git`.", {"items": {"type": "string"}})}, ["args"]),
    _tool("delegate_task", "Start a sub-agent with its own context for a self-contained subtask and return its "
          "final report.",
          {"goal": ("string", "What the sub-agent must achieve."),
           "context": ("string", "Everything it needs to know."),
           "toolsets": ("array", "Tool groups it may use.", {"items": {"type": "string"}})}, ["goal"]),
]

# (tool, kind of its result, arguments builder)
CALL_PLAN = [
    ("search_files", "listing", lambda r: {"pattern": f"def {random_ident(r)}", "path": r.choice(DIRS), "glob": "*.py"}),
    ("read_file", "code", lambda r: {"path": random_path(r), "offset": 1, "limit": 400}),
    ("run_terminal", "log", lambda r: {"command": f"python -m pytest -x tests/test_{random_ident(r, 1)}.py -q",
                                       "timeout": 600}),
    ("web_search", "search", lambda r: {"query": " ".join(random_words(r, 3, 6)), "max_results": 8}),
    ("web_extract", "prose", lambda r: {"urls": [random_url(r)], "max_chars": 20000}),
    ("list_directory", "listing", lambda r: {"path": r.choice(DIRS), "recursive": True}),
    ("http_request", "json", lambda r: {"method": "GET", "url": random_url(r) + "?page=1&per_page=100"}),
    ("read_file", "code", lambda r: {"path": random_path(r), "offset": r.randint(100, 900), "limit": 300}),
    ("python_exec", "log", lambda r: {"code": f"import {random_ident(r, 1)}\nprint({random_ident(r, 1)}.{random_ident(r)}())"}),
    ("memory_search", "json", lambda r: {"query": " ".join(random_words(r, 2, 4)), "limit": 20}),
]


def tool_sizes(n: int, lo: int, hi: int, offset: int = 0) -> list[int]:
    """Deterministic tool-result sizes spread over [lo, hi] (mean about (lo+hi)/2)."""
    steps = 7
    out = []
    for i in range(n):
        k = ((i + offset) * 5 + 3) % (steps + 1)  # 3,0,5,2,7,4,1,6,...: every step once per 8 turns
        out.append(round(lo + (hi - lo) * k / steps))
    return out


class Agent:
    """One replayed agent session: its system prompt, recorded calls and tool results."""

    def __init__(self, texts: TextFactory, *, session: str, system_tokens: int, n_tools: int, tools_in: str,
                 tool_lo: int, tool_hi: int, turns: int, size_offset: int = 0, task_seed: str | None = None,
                 system_seed: str = "system") -> None:
        self.texts = texts
        self.session = session
        self.tools = TOOLS[:n_tools]
        self.tools_in = tools_in
        self.turns = turns
        self.sizes = tool_sizes(turns, tool_lo, tool_hi, size_offset)
        self.system_tokens = system_tokens
        self.system_seed = system_seed
        self.task_seed = task_seed or session
        self._tools_tokens: int | None = None

    def tools_token_estimate(self) -> int:
        text = "\n".join(json.dumps(t) for t in self.tools)
        return int(len(text) / self.texts.chars_per_token["json"])

    def system_message(self) -> str:
        head = (f"Session {self.session}. You are Hermes, an autonomous agent that works in the user's "
                f"workspace with tools.\n\n")
        tools_text = ""
        if self.tools_in == "text":
            tools_text = ("\n\n# Tools\n\nCall a tool by replying with a <tool_call> block holding a JSON object "
                          "with `name` and `arguments`. Available tools:\n\n"
                          + "\n".join(json.dumps(t["function"], indent=1) for t in self.tools) + "\n")
        budget = self.system_tokens - self.tools_token_estimate() - 40
        body = self.texts.text("prose", self.system_seed, max(budget, 100))
        return head + body + tools_text

    def request_tools(self) -> list[dict] | None:
        """The `tools` of every request; the first description names the session, so that a
        template that renders the tools before the system text (Qwen3.5) still starts each
        session's prompt differently within a few tokens."""
        if self.tools_in != "api" or not self.tools:
            return None
        tools = json.loads(json.dumps(self.tools))
        fn = tools[0]["function"]
        fn["description"] = f"(Session {self.session}.) " + fn["description"]
        return tools

    def user_task(self) -> str:
        rng = random.Random(f"task:{self.task_seed}")
        return ("Please look into the following problem in the repository and fix it, running the tests "
                "before you finish. " + " ".join(random_sentence(rng) for _ in range(6)))

    def call(self, turn: int) -> tuple[dict, str]:
        """The recorded assistant tool call of `turn` (0-based) and the kind of its result."""
        names = {t["function"]["name"] for t in self.tools}
        plan = [p for p in CALL_PLAN if p[0] in names] or CALL_PLAN
        name, kind, args = plan[turn % len(plan)]
        rng = random.Random(f"call:{self.session}:{turn}")
        call = {"id": f"call_{self.session}_{turn}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args(rng))}}
        return call, kind

    def recorded_reply(self, turn: int) -> tuple[dict, str]:
        """The assistant message of `turn` (1-based) as agents that rebuild their history send it:
        the recorded tool call, no text; and the id its tool result answers."""
        call, _ = self.call(turn - 1)
        return {"role": "assistant", "content": "", "tool_calls": [call]}, call["id"]

    def echoed_reply(self, turn: int, reply: dict[str, Any]) -> tuple[dict, str]:
        """The assistant message of `turn` (1-based) as the server generated it (text, reasoning,
        the tool calls it parsed), and the id its tool result answers: the first call the model
        made, else the recorded call's."""
        msg: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
        if reply.get("reasoning"):
            msg["reasoning_content"] = reply["reasoning"]
        got_calls = [c for c in reply.get("tool_calls") or [] if c.get("name")]
        if not got_calls:
            return msg, self.call(turn - 1)[0]["id"]
        msg["tool_calls"] = [{"id": c.get("id") or f"call_echo_{turn}_{i}", "type": "function",
                              "function": {"name": c["name"], "arguments": c.get("arguments") or "{}"}}
                             for i, c in enumerate(got_calls)]
        return msg, msg["tool_calls"][0]["id"]

    def tool_result(self, turn: int) -> tuple[str, int]:
        _, kind = self.call(turn)
        size = self.sizes[turn]
        return self.texts.text(kind, f"result:{self.task_seed}:{turn}", size), size

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system_message()}, {"role": "user", "content": self.user_task()}]
