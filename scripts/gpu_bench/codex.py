"""A Codex-shaped session for the `codex` workload, as `POST /v1/responses` requests.

The shapes are those of the OpenAI Codex CLI 0.171 (recorded requests: `store: false`,
`include: ["reasoning.encrypted_content"]`, `reasoning: {"summary": "auto"}`, a
`prompt_cache_key` that is the session id, `client_metadata`, `tool_choice: "auto"`,
`parallel_tool_calls: true`). The input starts with two `developer` messages (the CLI's
instructions, then its skills and permissions: ~10K tokens at --codex-scale 1) and two `user`
messages (the environment context, then the task). The tools: the functions exec_command,
write_stdin, apply_patch, request_user_input, view_image, get_goal, create_goal, update_goal, the
namespace `multi_agent_v1` (close_agent, resume_agent, send_input, spawn_agent, wait_agent) and
the hosted `{"type": "web_search"}`; `--codex-tools functions` offers the namespace's functions
as plain ones and leaves the hosted tool out, for servers that refuse the others.

Codex keeps no state on the server: every request resends the whole history, the output items
it got back included. After each reply the session appends the reply's output items as
returned (reasoning items with their `encrypted_content`, messages, function calls), then a
`function_call_output` of 1K-4K tokens for each call. A reply without a call (a random-weight
model never makes one) gets the turn's scripted call appended after its items, so the tool
loop goes on and every server sees requests of the same sizes. Codex sends no
`max_output_tokens`; the session does (--codex-gen-tokens), or a model that never stops would
run to the end of its context.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from .agent import tool_sizes
from .text import DIRS, TextFactory, random_ident, random_path, random_sentence

INSTRUCTIONS_TOKENS = 8000  # the first developer message, at --codex-scale 1
SKILLS_TOKENS = 2000  # the second
TOOL_DOC_TOKENS = 150  # notes added to each function's description
SPAWN_DOC_TOKENS = 1500  # spawn_agent's long description
RESULT_TOKENS = (1000, 4000)  # a function_call_output: MIN, MAX
TOOL_MODES = ("codex", "functions")
NAMESPACE = "multi_agent_v1"
MODEL = "gpt-5.5-codex"


def _params(props: dict[str, tuple[str, str]], required: list[str]) -> dict:
    return {"type": "object", "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
            "required": required, "additionalProperties": False}


# name, description head, parameters, required
FUNCTIONS = [
    ("exec_command", "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
     {"cmd": ("string", "Shell command to execute."), "workdir": ("string", "Working directory."),
      "yield_time_ms": ("number", "How long to wait for output before yielding."),
      "max_output_tokens": ("number", "Output token budget.")}, ["cmd"]),
    ("write_stdin", "Writes characters to an existing unified exec session and returns recent output.",
     {"session_id": ("number", "Identifier of the running unified exec session."),
      "chars": ("string", "Bytes to write to stdin."), "yield_time_ms": ("number", "How long to wait.")},
     ["session_id"]),
    ("apply_patch", "Use the `apply_patch` tool to edit files.",
     {"input": ("string", "The entire contents of the apply_patch command")}, ["input"]),
    ("request_user_input", "Request user input for one to three short questions and wait for the response.",
     {"questions": ("array", "Questions to show the user.")}, ["questions"]),
    ("view_image", "View a local image file from the filesystem when visual inspection is needed.",
     {"path": ("string", "Local filesystem path to an image file.")}, ["path"]),
    ("get_goal", "Get the current goal for this thread, including status, budgets and usage.", {}, []),
    ("create_goal", "Create a goal only when explicitly requested by the user or system/developer instructions.",
     {"objective": ("string", "The concrete objective to start pursuing."),
      "token_budget": ("integer", "Positive token budget for the new goal.")}, ["objective"]),
    ("update_goal", "Update the existing goal.", {"status": ("string", "complete, blocked or paused.")}, ["status"]),
]
AGENT_FUNCTIONS = [
    ("close_agent", "Close an agent and any open descendants when they are no longer needed.",
     {"target": ("string", "Agent id to close.")}, ["target"]),
    ("resume_agent", "Resume a previously closed agent by id.", {"id": ("string", "Agent id to resume.")}, ["id"]),
    ("send_input", "Send a message to an existing agent.",
     {"target": ("string", "Agent id to message."), "message": ("string", "Plain-text message."),
      "interrupt": ("boolean", "True interrupts the current task.")}, ["target"]),
    ("spawn_agent", "Spawn a sub-agent for a well-scoped task.",
     {"message": ("string", "Initial plain-text task for the new agent."),
      "fork_context": ("boolean", "True forks the current thread history into the new agent.")}, []),
    ("wait_agent", "Wait for agents to reach a final status.",
     {"targets": ("array", "Agent ids to wait on."), "timeout_ms": ("number", "Timeout in milliseconds.")},
     ["targets"]),
]
# the scripted call of each turn (cycled): name, namespaced, kind of its output's text
PLAN = [("exec_command", False, "listing"), ("exec_command", False, "code"), ("spawn_agent", True, "json"),
        ("exec_command", False, "log"), ("apply_patch", False, "code"), ("wait_agent", True, "prose"),
        ("exec_command", False, "code"), ("exec_command", False, "log")]


def _function(texts: TextFactory, spec: tuple, doc_tokens: int) -> dict[str, Any]:
    name, head, props, required = spec
    doc = texts.text("prose", f"codex-tool-doc:{name}", doc_tokens) if doc_tokens > 0 else ""
    return {"type": "function", "name": name, "description": f"{head}\n{doc}".rstrip(), "strict": False,
            "parameters": _params(props, required)}


@dataclass
class CodexSession:
    """The fixed head of every request (instructions, context, tools) and the scripted turns."""

    texts: TextFactory
    scale: float = 1.0
    gen_tokens: int = 32
    tools_mode: str = "codex"
    session_id: str = field(default_factory=lambda: str(uuid.UUID(int=random.Random("codex-session").getrandbits(128))))

    def s(self, n: int) -> int:
        return max(1, int(n * self.scale))

    def head(self) -> list[dict[str, Any]]:
        """The two developer messages and the two user messages that open every request."""
        rng = random.Random("codex-ids")

        def message(role: str, text: str) -> dict[str, Any]:
            return {"type": "message", "id": f"msg_{uuid.UUID(int=rng.getrandbits(128))}", "role": role,
                    "content": [{"type": "input_text", "text": text}]}

        instructions = ("You are a coding agent running in the Codex CLI, a terminal-based coding assistant.\n\n"
                        + self.texts.text("prose", "codex-instructions", self.s(INSTRUCTIONS_TOKENS)))
        skills = ("<permissions instructions>\nFilesystem sandboxing: workspace-write.\n</permissions instructions>\n"
                  "<skills_instructions>\n" + self.texts.text("prose", "codex-skills", self.s(SKILLS_TOKENS))
                  + "</skills_instructions>")
        env = ("<environment_context>\n  <cwd>/home/user/project</cwd>\n  <shell>bash</shell>\n"
               "  <current_date>2026-04-07</current_date>\n  <timezone>Etc/UTC</timezone>\n</environment_context>")
        trng = random.Random("codex-task")
        task = " ".join(random_sentence(trng) for _ in range(4))
        return [message("developer", instructions), message("developer", skills), message("user", env),
                message("user", task)]

    def tools(self) -> list[dict[str, Any]]:
        doc = self.s(TOOL_DOC_TOKENS)
        functions = [_function(self.texts, f, doc) for f in FUNCTIONS]
        agents = [_function(self.texts, f, self.s(SPAWN_DOC_TOKENS) if f[0] == "spawn_agent" else doc)
                  for f in AGENT_FUNCTIONS]
        if self.tools_mode == "functions":
            return functions + agents
        namespace = {"type": "namespace", "name": NAMESPACE,
                     "description": "Tools for spawning and managing sub-agents.", "tools": agents}
        return functions[:5] + [namespace] + functions[5:] + [{"type": "web_search", "external_web_access": True}]

    def body(self, input_items: list[dict], turn: int) -> dict[str, Any]:
        """A request of the session: `input_items` is the whole history (head included)."""
        turn_id = str(uuid.UUID(int=random.Random(f"codex-turn:{turn}").getrandbits(128)))
        return {
            "model": MODEL, "stream": True, "input": input_items, "tools": self.tools(), "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": self.session_id,
            "max_output_tokens": self.gen_tokens,
            "client_metadata": {"session_id": self.session_id, "thread_id": self.session_id, "turn_id": turn_id,
                                "x-codex-turn-metadata": json.dumps({"session_id": self.session_id, "turn_id": turn_id,
                                                                     "request_kind": "turn", "sandbox": "none"})},
        }

    def scripted_call(self, turn: int) -> dict[str, Any]:
        """The turn's function_call item, as Codex echoes one (namespaced calls name theirs)."""
        name, namespaced, _ = PLAN[turn % len(PLAN)]
        rng = random.Random(f"codex-call:{turn}")
        args: dict[str, Any]
        if name == "exec_command":
            cmds = (f"rg -n {random_ident(rng)} {rng.choice(DIRS)}", f"sed -n 1,200p {random_path(rng)}",
                    "python -m pytest -x -q", f"ls -la {rng.choice(DIRS)}")
            args = {"cmd": rng.choice(cmds), "yield_time_ms": 10000}
        elif name == "apply_patch":
            path = random_path(rng)
            args = {"input": f"*** Begin Patch\n*** Update File: {path}\n@@\n-{random_ident(rng, 3)}\n+"
                             f"{random_ident(rng, 3)}\n*** End Patch"}
        elif name == "spawn_agent":
            args = {"message": random_sentence(rng, 10, 20)}
        else:
            args = {"targets": [str(uuid.UUID(int=rng.getrandbits(128)))], "timeout_ms": 30000}
        item = {"type": "function_call", "status": "completed", "id": f"fc_bench{turn}", "name": name,
                "arguments": json.dumps(args), "call_id": f"call{turn:05d}"}
        if namespaced and self.tools_mode == "codex":
            item["namespace"] = NAMESPACE
        return item

    def call_output(self, turn: int, call_id: str, k: int = 0) -> dict[str, Any]:
        """The output of the turn's k-th call: a shell-style head and 1K-4K tokens of text."""
        lo, hi = self.s(RESULT_TOKENS[0]), self.s(RESULT_TOKENS[1])
        size = tool_sizes(turn + 1, lo, hi)[turn]
        kind = PLAN[turn % len(PLAN)][2]
        text = self.texts.text(kind, f"codex-output:{turn}:{k}", max(size, 10))
        head = f"Chunk ID: {turn:06x}\nWall time: 0.{turn:04d} seconds\nProcess exited with code 0\nOutput:\n"
        return {"type": "function_call_output", "id": f"fco_bench{turn}_{k}", "call_id": call_id, "output": head + text}

    def turn_items(self, output: list[dict] | None, turn: int) -> list[dict[str, Any]]:
        """What the client appends after turn `turn`'s reply: its output items as returned
        (`output`; None or [] when the request failed), the scripted call when it made none,
        and an output for every call."""
        items = [echo_item(it) for it in output or [] if it.get("type") in ("reasoning", "message", "function_call")]
        calls = [it for it in items if it["type"] == "function_call"]
        if not calls:
            calls = [self.scripted_call(turn)]
            items.append(calls[0])
        return items + [self.call_output(turn, c.get("call_id") or f"call{turn:05d}", k) for k, c in enumerate(calls)]

    def size_estimate(self, turns: int) -> int:
        """Tokens of the last request's prompt, from the settings (no text is made)."""
        # a template writes each tool as JSON: about 2.5 characters a token
        tools = sum(int(len(json.dumps([name, head, _params(props, req)])) / 2.5) + 20
                    for name, head, props, req in FUNCTIONS + AGENT_FUNCTIONS)
        tools += self.s(TOOL_DOC_TOKENS) * (len(FUNCTIONS) + len(AGENT_FUNCTIONS)) + self.s(SPAWN_DOC_TOKENS)
        results = sum(tool_sizes(turns, self.s(RESULT_TOKENS[0]), self.s(RESULT_TOKENS[1]))) if turns else 0
        return (self.s(INSTRUCTIONS_TOKENS) + self.s(SKILLS_TOKENS) + 300 + tools + results
                + turns * (self.gen_tokens + 150))


def echo_item(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as Codex keeps it for its next request: the fields of its own item types
    (what a server adds beyond them is not sent back)."""
    keep = {"reasoning": ("type", "id", "summary", "content", "encrypted_content"),
            "message": ("type", "status", "id", "role", "content"),
            "function_call": ("type", "status", "id", "name", "namespace", "arguments", "call_id")}[item["type"]]
    out = {k: copy.deepcopy(item[k]) for k in keep if k in item and item[k] is not None}
    if item["type"] == "message":
        out["content"] = [{"type": "output_text", "text": p.get("text") or "", "annotations": []}
                          for p in item.get("content") or [] if p.get("type") == "output_text"]
    return out
