"""The OpenAI Codex CLI on /v1/responses: its recorded requests replayed on every template
family, the parts of the API it relies on, and `codex exec` itself against the real server.

- The requests `codex exec` sent (tests/data/codex, recorded by scripts/codex_capture.py) are
  replayed on tiny models carrying each template family (tests/template_families.py), the way
  Codex sends them: streamed, `store: false`, each stub reasoning item replaced by the server's
  own answer to that request. Every request gets a 200, and each request of the main
  conversation reuses the whole previous prompt and reply (less at most its last token).
- On the tiny attention model: a namespace tool's function is offered and its call comes back
  named by namespace; hosted tools are left out and named; a reasoning item's signed turn
  brings back the exact tokens; a tampered one is ignored and named; `prompt_cache_key`
  brings a request to the slot that served the key.
- `codex exec` (the pinned CLI) runs one turn against the server on the chat model.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import time
import zlib

import httpx
import pytest

from tests.helpers import warmslot_server
from tests.template_families import FAMILIES, SPECS, write_family_model

pytestmark = [pytest.mark.model, pytest.mark.server]

FIXTURES = pathlib.Path(__file__).parents[1] / "data" / "codex"
MAIN = ("01", "02", "03", "05")  # the main agent's conversation: each request resends the one before
MAX_OUTPUT = 8  # tokens a replayed reply may take (Codex sends no limit)
GENERATION_SLACK = 32  # tokens that end a one-message prompt and not the longer one
NOT_INSTALLED = "the Codex CLI is not installed: tests/install_deps.sh installs it (npm install -g @openai/codex@0.171.0)"

SHELL = {"type": "function", "name": "exec_command", "description": "Run a shell command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a subagent.",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for subagents.", "tools": [SPAWN]}
HOSTED = [
    {"type": "web_search", "external_web_access": True}, {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"}, {"type": "computer_use_preview", "display_width": 800, "display_height": 600, "environment": "linux"},
]
STATELESS = {"store": False, "include": ["reasoning.encrypted_content"]}


# -- helpers ------------------------------------------------------------------------------------


def events_of(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def create(url: str, body: dict) -> tuple[int, dict, list[dict]]:
    """(status, the final response or the error body, the events of a stream)."""
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=900) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json(), []
        if not body.get("stream"):
            r.read()
            return 200, r.json(), []
        events = events_of(r)
    done = [e for e in events if e["type"] in ("response.completed", "response.failed")]
    return 200, done[-1]["response"] if done else {}, events


def resent(item: dict) -> dict:
    """An output item as the Codex CLI sends it back (it keeps these fields)."""
    keep = ("type", "id", "role", "status", "content", "summary", "encrypted_content", "name", "namespace", "arguments", "call_id")
    return {k: item[k] for k in keep if k in item}


def unpack_turn(blob: str) -> tuple[int, list[int]]:
    """(prompt length, reply tokens) of a signed turn, read as the format is documented (the
    tag is not checked here: the server checks it)."""
    raw = base64.urlsafe_b64decode(blob[4:] + "=" * (-len(blob[4:]) % 4))
    payload = zlib.decompress(raw[16:])
    _version, prompt_len, _digest, h, n = struct.unpack_from("<BI16sII", payload)
    return prompt_len, list(struct.unpack_from(f"<{n}i", payload, struct.calcsize("<BI16sII") + 4 * h))


def cached(usage: dict) -> int:
    return usage["input_tokens_details"]["cached_tokens"]


def whole(usage: dict) -> int:
    """The previous prompt and its reply: what the slot holds after it (its last token aside)."""
    return usage["input_tokens"] + usage["output_tokens"]


# -- the recorded requests on every template family ------------------------------------------------


def body_of(number: str) -> dict:
    """The recorded request `number` (its file's name starts with it)."""
    (path,) = FIXTURES.glob(f"{number}-*.json")
    return json.loads(path.read_text())


def replay(url: str) -> dict[str, tuple[int, dict]]:
    """Each recorded request in order, as Codex sends it, with every stub reasoning item
    (`rs_stub<N>`) replaced by the server's own reasoning item answering request N.
    Returns name -> (status, the final response or the error body)."""
    answers: dict[str, dict] = {}
    out = {}
    for path in sorted(FIXTURES.glob("[0-9][0-9]-*.json")):
        number = path.name[:2]
        body = json.loads(path.read_text())
        body["input"] = [answers.get(i.get("id"), i) if i.get("type") == "reasoning" else i for i in body["input"]]
        body["max_output_tokens"] = MAX_OUTPUT
        status, response, events = create(url, body)
        out[number] = (status, response)
        if status == 200:  # the items as Codex keeps them: from the done events
            done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
            answers[f"rs_stub{int(number)}"] = resent(next(i for i in done if i["type"] == "reasoning"))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_codex_requests_replay_on_every_template_family(family, tmp_path_factory):
    """Every recorded request gets a 200; each request of the main conversation starts with
    the whole previous prompt and reply, reused (cached == previous prompt + reply, less at
    most the reply's last token, which was sampled but never evaluated). Where the template
    writes the tool list before the last user message, a new user turn reuses the system
    prompt (the tool list and all after it moved)."""
    started = time.monotonic()
    path = write_family_model(family, tmp_path_factory.mktemp("family"))
    server = warmslot_server(path, "-np", "1", "-c", "16384", "--temp", "0", "-fa", "on")
    try:
        check_replay(family, server.url)
    finally:
        server.stop()
    print(f"{family}: replayed in {time.monotonic() - started:.1f} s")


def check_replay(family: str, url: str) -> None:
    results = replay(url)
    failed = {n: r for n, (status, r) in results.items() if status != 200 or r.get("status") not in ("completed", "incomplete")}
    assert not failed, failed
    for before, after in zip(MAIN, MAIN[1:]):
        previous, usage = results[before][1]["usage"], results[after][1]["usage"]
        if SPECS[family].tools_before_last_user and body_of(after)["input"][-1].get("role") == "user":
            # a new user turn moves the tool list (the template writes it before the last
            # user message): what stays in place is the system prompt, reused
            system = [i for i in body_of(after)["input"] if i.get("role") in ("system", "developer")]
            kept = input_tokens(url, {"input": [*system, {"type": "message", "role": "user", "content": "x"}]}) - GENERATION_SLACK
            assert kept <= cached(usage) < whole(previous) - 1, (before, after, kept, usage)
            continue
        assert whole(previous) - 1 <= cached(usage) <= whole(previous), (before, after, previous, usage)
        assert cached(usage) >= 0.95 * usage["input_tokens"], (after, usage)


# -- the API parts Codex relies on, on the tiny attention model -----------------------------------


@pytest.fixture(scope="module")
def server(tiny_models):
    proc = warmslot_server(tiny_models["attention"], "-np", "2", "-c", "4096", "--temp", "0", "--responses-secret", "test-secret")
    yield proc
    proc.stop()


def input_tokens(url: str, body: dict, path: str = "/v1/responses/input_tokens") -> int:
    r = httpx.post(url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def test_a_namespace_function_is_offered_and_its_call_comes_back_named_by_namespace(server):
    body = {"input": "Start a subagent.", "tools": [SHELL, NAMESPACE], "tool_choice": {"type": "function", "name": "spawn_agent"},
            "max_output_tokens": 96}
    status, plain, _ = create(server.url, body)
    assert status == 200, plain
    (call,) = [o for o in plain["output"] if o["type"] == "function_call"]
    assert (call["namespace"], call["name"], json.loads(call["arguments"])) == ("multi_agent_v1", "spawn_agent", {})
    status, streamed, events = create(server.url, {**body, "stream": True})
    added = [e["item"] for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    (arguments_done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert added[0]["namespace"] == arguments_done["namespace"] == "multi_agent_v1" and arguments_done["name"] == "spawn_agent"
    # sent back, the call renders as the model was offered it: the function under its own
    # name, the namespace's description leading its own (the same prompt as chat's)
    history = [{"type": "message", "role": "user", "content": "Start a subagent."}, resent(call),
               {"type": "function_call_output", "call_id": call["call_id"], "output": "started"}]
    flat = {"type": "function", "function": {"name": "spawn_agent", "description": "Tools for subagents.\n\nStart a subagent.",
                                             "parameters": SPAWN["parameters"]}}
    chat = [{"role": "user", "content": "Start a subagent."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call["call_id"], "type": "function",
                                                                  "function": {"name": "spawn_agent", "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["call_id"], "content": "started"}]
    responses_count = input_tokens(server.url, {"input": history, "tools": [SHELL, NAMESPACE]})
    chat_count = input_tokens(server.url, {"messages": chat, "tools": [{"type": "function", "function": {
        k: SHELL[k] for k in ("name", "description", "parameters")}}, flat]}, "/v1/chat/completions/input_tokens")
    assert responses_count == chat_count
    assert input_tokens(server.url, {"input": "Hi", "tools": [SHELL, NAMESPACE]}) > input_tokens(server.url, {"input": "Hi", "tools": [SHELL]})


def test_hosted_tools_are_left_out_and_named_never_a_400(server):
    body = {"input": "Hi", "tools": [SHELL, *HOSTED], "max_output_tokens": 2}
    left_out = [{"index": i + 1, "type": t["type"]} for i, t in enumerate(HOSTED)]
    status, plain, _ = create(server.url, body)
    assert status == 200 and plain["warmslot"]["tools_left_out"] == left_out
    status, streamed, events = create(server.url, {**body, "stream": True})
    assert status == 200 and streamed["warmslot"]["tools_left_out"] == left_out
    assert events[0]["response"]["warmslot"]["tools_left_out"] == left_out  # response.created says it too
    # the model never sees them: the prompt is the function's alone
    assert input_tokens(server.url, body) == input_tokens(server.url, {"input": "Hi", "tools": [SHELL]})
    status, only_hosted, _ = create(server.url, {"input": "Hi", "tools": HOSTED, "max_output_tokens": 2})
    assert status == 200 and only_hosted["tool_choice"] == "none"
    r = httpx.post(server.url + "/v1/responses", json={"input": "Hi", "tools": ["web_search"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"  # not a tool at all: still a 400


def first_turn(server, stream: bool, task: str) -> tuple[list[dict], dict, list[dict]]:
    """A forced namespaced call, stateless: (the input, the response, its events). Each test
    asks its own `task`, so that no test reuses another's turns."""
    items = [{"type": "message", "role": "developer", "content": "Use the tools."},
             {"type": "message", "role": "user", "content": task}]
    body = {"input": items, "tools": [SHELL, NAMESPACE], "tool_choice": {"type": "function", "name": "spawn_agent"},
            "max_output_tokens": 96, "stream": stream, "prompt_cache_key": "session-1", "client_metadata": {"x": "y"}, **STATELESS}
    status, response, events = create(server.url, body)
    assert status == 200, response
    return items, response, events


def next_turn(server, items: list[dict], output: list[dict]) -> dict:
    call = next(o for o in output if o["type"] == "function_call")
    follow = items + [resent(o) for o in output] + [{"type": "function_call_output", "call_id": call["call_id"], "output": "started"}]
    status, response, _ = create(server.url, {"input": follow, "tools": [SHELL, NAMESPACE], "max_output_tokens": 4,
                                              "prompt_cache_key": "session-1", **STATELESS})
    assert status == 200, response
    return response


@pytest.mark.parametrize("stream", [False, True])
def test_a_resent_reasoning_item_brings_back_the_exact_tokens(server, stream):
    """The first output item is a reasoning item (empty: the model does not think) whose
    encrypted_content holds every token of the reply; sent back with the history, the turn is
    those tokens, and the next request reuses the whole previous prompt and reply, less at
    most its last token. Streamed, every output_item.done waits for the end, in order."""
    items, first, events = first_turn(server, stream, f"Start a subagent (streamed: {stream}).")
    reasoning = first["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [] and reasoning["encrypted_content"].startswith("ws1.")
    prompt_len, tokens = unpack_turn(reasoning["encrypted_content"])
    usage = first["usage"]
    assert prompt_len == usage["input_tokens"] and len(tokens) in (usage["output_tokens"], usage["output_tokens"] - 1)
    if stream:
        done = [e for e in events if e["type"] == "response.output_item.done"]
        assert [e["item"]["id"] for e in done] == [o["id"] for o in first["output"]]
        assert done[0]["item"]["encrypted_content"] == reasoning["encrypted_content"]
        last_delta = max(i for i, e in enumerate(events) if e["type"].endswith(".delta"))
        assert min(events.index(e) for e in done) > last_delta
    text = httpx.post(server.url + "/detokenize", json={"tokens": tokens}, timeout=60).json()["content"]
    call = next(o for o in first["output"] if o["type"] == "function_call")
    assert "spawn_agent" in text and json.loads(call["arguments"]) == {}
    second = next_turn(server, items, first["output"])
    assert whole(usage) - 1 <= cached(second["usage"]) <= whole(usage), (usage, second["usage"])


def test_a_tampered_or_foreign_blob_is_ignored_and_named(server):
    """A blob that does not verify (changed, or signed with another secret: another server,
    or this one before a restart without --responses-secret) is ignored: the turn renders from
    its items (the previous prompt is still reused, the turn as generated is not), and the
    response names the item."""
    from warmslot.server.api.responses.signed_turns import TurnSigner
    from warmslot.server.prompt.exact_turns import ExactTurn

    items, first, _ = first_turn(server, False, "Start a subagent, then check its blob.")
    blob = first["output"][0]["encrypted_content"]
    tampered = blob[:40] + ("A" if blob[40] != "A" else "B") + blob[41:]
    foreign = TurnSigner(b"another-secret", "llama:264:0").sign(ExactTurn(first["usage"]["input_tokens"], bytes(16), (1, 2, 3)))
    seconds = []
    for bad in (tampered, foreign):
        output = [dict(first["output"][0], encrypted_content=bad), *first["output"][1:]]
        seconds.append(next_turn(server, items, output))
        assert seconds[-1]["warmslot"]["encrypted_content_ignored"] == ["input[2]"]
    reused = cached(seconds[0]["usage"])
    assert first["usage"]["input_tokens"] <= reused < whole(first["usage"]) - 1, (first["usage"], seconds[0]["usage"])
    assert seconds[1]["usage"]["input_tokens"] == seconds[0]["usage"]["input_tokens"]  # rendered alike, from the items


def test_prompt_cache_key_brings_a_request_to_the_slot_that_served_the_key(server):
    """Codex sends its session id as `prompt_cache_key`: a request of the session goes to the
    slot that served it, where prefixes are otherwise equal (every prompt of a template shares
    its first tokens)."""
    def slot_of(response) -> int:
        return int(re.search(r"slot=(\d+)", response.headers["x-warmslot-cache"]).group(1))

    def slot(key: str, text: str) -> int:
        body = {"input": text, "prompt_cache_key": key, "max_output_tokens": 2}
        r = httpx.post(server.url + "/v1/responses", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return slot_of(r)

    # session-b's first request comes while session-a's first one runs: one on each slot
    body = {"input": "Alpha.", "prompt_cache_key": "session-a", "max_output_tokens": 1500, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=300) as running:
        assert running.status_code == 200
        a = slot_of(running)  # admitted: it runs (1,500 tokens take the tiny model a while)
        b = slot("session-b", "Bravo.")
        generated = sum(1 for line in running.iter_lines() if line.startswith("event: response.output_text.delta"))
    assert generated > 100 and a != b
    assert slot("session-b", "Charlie.") == b
    assert slot("session-a", "Delta.") == a
    assert slot("session-b", "Echo.") == b


# -- codex exec itself ------------------------------------------------------------------------


def codex_binary() -> str:
    path = shutil.which("codex")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(NOT_INSTALLED)
        pytest.skip(NOT_INSTALLED)
    return path


def test_codex_exec_runs_a_turn_against_the_server(chat_model, tmp_path):
    """`codex exec` with the server as a custom provider (wire_api "responses"), every tool
    it ships with (its subagent namespace and hosted web search included), one turn. Its base
    instructions are replaced by one line (`model_instructions_file`), which keeps the first
    prompt to about 5K tokens on the 135M chat model; `-n 16` keeps the reply short, and a
    slow prefill on a busy machine must not make Codex give up and send it again."""
    codex = codex_binary()
    server = warmslot_server(chat_model, "-np", "1", "-c", "16384", "-n", "16", "--temp", "0")
    try:
        home, work = tmp_path / "codex-home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        instructions = tmp_path / "instructions.md"
        instructions.write_text("You are Codex, a coding agent. Answer briefly.\n")
        (home / "config.toml").write_text(
            'model = "local"\nmodel_provider = "warmslot"\nsandbox_mode = "read-only"\napproval_policy = "never"\n'
            f'model_instructions_file = "{instructions}"\n\n[model_providers.warmslot]\nname = "warmslot"\n'
            f'base_url = "{server.url}/v1"\nwire_api = "responses"\nenv_key = "WARMSLOT_KEY"\n'
            "stream_idle_timeout_ms = 1800000\nstream_max_retries = 0\nrequest_max_retries = 0\n"
        )
        env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(tmp_path), "WARMSLOT_KEY": "unused"}
        run = subprocess.run([codex, "exec", "--skip-git-repo-check", "Reply with the word hello."], cwd=work, env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
        log = server.output()
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip(), run.stderr
    served = re.findall(r"responses: prompt (\d+)", log)
    assert served and int(served[0]) > 1000, log[-3000:]
    assert "tools left out (this server cannot run them): web_search" in log
