"""Claude Code's real requests, replayed against the real server on tiny models that carry
each template family's chat template and tokenizer (tests/template_families.py).

The requests are the pinned CLI's own (tests/data/claude_code, captured by
scripts/capture_claude_code.py): a session whose main agent starts two subagents in one
turn, loads and uses the web tools, is compacted and goes on, a task list, /context's token
counts, and a session title (structured output). Each is sent as captured (its headers and
betas too), its output cut to a few tokens; the two subagents' requests of one turn go
together, as the CLI sends them.

- every request is answered 200 (Qwen3.5's template alone raised on the first one);
- the title request's reply follows its schema (the grammar makes even a random model start
  `{"title": "`; tests/agents/test_messages_api.py checks a whole title on the default model);
- the main agent's first request, sent again at the end, reuses at least 95% of its prompt,
  and its first request after the subagents' reuses 95% of the main request before (where
  the template moves the tool list to the new last user message, Mistral's, the system
  prompt before it);
- several subagents started in one turn, sent together after a warm main request, each
  reuse the whole main prompt (-np 2: two run at once, the third waits).
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import re
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.helpers import warmslot_server
from tests.template_families import FAMILIES, SPECS, write_family_model

pytestmark = [pytest.mark.model, pytest.mark.server]

FIXTURES = pathlib.Path(__file__).parents[1] / "data" / "claude_code"
MAX_TOKENS = 2  # output is not what is tested: a random model's tokens
# The schema's grammar lets whitespace in before and after the colon (llama.cpp's `space`
# rule: a space, or one or two newlines and up to 20 spaces or tabs), and a random model may
# take it: 8 tokens once ended at '{"title" :' when requests in the same batch moved its
# near-tied logits. Up to the value's opening quote the grammar allows three such runs of at
# most 22 characters, plus `{"title":`: 96 tokens cover them even at one token a character.
TITLE_TOKENS = 96
TITLE_START = re.compile(r'\s*\{\s*"title"\s*:\s*"')
GENERATION_SLACK = 32  # tokens of a prompt's generation prompt, which a longer conversation renders otherwise


@dataclass(frozen=True)
class Captured:
    name: str  # NN-kind.json
    kind: str  # main, subagentN, compact, webfetch, websearch, todos, title, count_tokens
    path: str
    headers: dict
    body: dict


def captured() -> list[Captured]:
    out = []
    for file in sorted(FIXTURES.glob("*.json")):
        data = json.loads(file.read_text(encoding="utf-8"))
        kind = file.stem.split("-", 1)[1]
        out.append(Captured(file.name, kind, data["path"], data["headers"], data["body"]))
    assert out, f"no fixtures in {FIXTURES}"
    return out


def turns(requests: list[Captured]) -> list[list[Captured]]:
    """The requests in order, the subagents' requests of one turn (adjacent) grouped."""
    out: list[list[Captured]] = []
    for r in requests:
        if r.kind.startswith("subagent") and out and out[-1][0].kind.startswith("subagent"):
            out[-1].append(r)
        else:
            out.append([r])
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family_server(request, tmp_path_factory):
    model = write_family_model(request.param, tmp_path_factory.getbasetemp() / "families")
    proc = warmslot_server(model, "-np", "2", "-c", "65536")
    yield request.param, proc
    proc.stop()


def send(client: httpx.Client, r: Captured) -> httpx.Response:
    """One captured request as the CLI sent it, its output cut short (and not streamed)."""
    if r.kind == "count_tokens":
        return client.post("/v1/messages/count_tokens", json=r.body, headers=r.headers)
    body = dict(r.body, max_tokens=TITLE_TOKENS if r.kind == "title" else MAX_TOKENS, stream=False)
    return client.post("/v1/messages", json=body, headers=r.headers)


def together(client: httpx.Client, requests: list[Captured]) -> list[httpx.Response]:
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: send(client, r), requests))


def prompt_tokens(reply: dict) -> int:
    usage = reply["usage"]
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def test_a_claude_code_session_replays_with_every_request_answered(family_server):
    family, server = family_server
    requests = captured()
    client = httpx.Client(base_url=server.url, timeout=600)
    started = time.monotonic()
    replies: dict[str, dict] = {}
    failed = []
    for turn in turns(requests):
        for r, response in zip(turn, together(client, turn)):
            if response.status_code != 200:
                failed.append(f"{r.name}: {response.status_code} {response.text[:300]}")
            else:
                replies[r.name] = response.json()
    assert not failed, "\n".join(failed)

    counts = [replies[r.name]["input_tokens"] for r in requests if r.kind == "count_tokens"]
    assert counts and all(n > 0 for n in counts)
    title = next(r for r in requests if r.kind == "title")
    text = "".join(b.get("text", "") for b in replies[title.name]["content"])
    assert TITLE_START.match(text), replies[title.name]

    mains = [r for r in requests if r.kind == "main"]
    again = send(client, mains[0]).json()
    assert again["usage"]["cache_read_input_tokens"] >= 0.95 * prompt_tokens(again), again["usage"]
    # the main agent's first request after its subagents' last ones: their return
    names = [r.name for r in requests]
    last_sub = max(i for i, r in enumerate(requests) if r.kind.startswith("subagent"))
    back = next(r for r in requests[last_sub:] if r.kind == "main")
    before = next(r for r in reversed(requests[:names.index(back.name)]) if r.kind == "main")
    reused = replies[back.name]["usage"]["cache_read_input_tokens"]
    kept = 0.95 * prompt_tokens(replies[before.name])
    if SPECS[family].tools_before_last_user and back.body["messages"][-1]["role"] == "user":
        system = dict(back.body, messages=[{"role": "user", "content": "x"}])
        del system["tools"]
        kept = client.post("/v1/messages/count_tokens", json=system).json()["input_tokens"] - GENERATION_SLACK
    assert reused >= kept, (family, back.name, kept, replies[back.name]["usage"])
    print(f"{family}: {len(requests) + 1} requests replayed in {time.monotonic() - started:.1f} s")


def test_parallel_subagents_each_reuse_the_warm_main_prompt(family_server):
    """Claude Code starts subagents as parallel tool calls of one turn: concurrent requests
    that share the main agent's prompt. After a warm request of the same shape, each reuses
    all of it but its own last user message, whichever slot it gets (three on two slots)."""
    family, server = family_server
    main = next(r for r in captured() if r.kind == "main")

    def turn(text: str) -> Captured:
        messages = [*main.body["messages"], {"role": "assistant", "content": "Starting the subagents."},
                    {"role": "user", "content": text}]
        return Captured(text, "subagent", main.path, main.headers, dict(main.body, messages=messages))

    client = httpx.Client(base_url=server.url, timeout=600)
    warm = send(client, turn("Go."))
    assert warm.status_code == 200, warm.text
    shared = prompt_tokens(warm.json()) - GENERATION_SLACK  # all but "Go." and the generation prompt
    replies = together(client, [turn(f"SUBAGENT-{i}: count the lines of notes.txt.") for i in range(3)])
    assert [r.status_code for r in replies] == [200] * 3, [r.text[:300] for r in replies]
    for reply in replies:
        assert reply.json()["usage"]["cache_read_input_tokens"] >= shared, (family, shared, reply.json()["usage"])
