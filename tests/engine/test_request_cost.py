"""What one request may cost: prompt building linear in the number of messages, an
over-long prompt stopped before it is built whole, limits on messages and tools, and a pool
that hostile requests cannot monopolize. Built on the default model's real vocabulary."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests.helpers import warmslot_server
from warmslot.server.prompt.builder import PromptBuilder, PromptTooLong
from warmslot.server.prompt.template import ChatTemplate, builtin_source


@pytest.fixture(scope="module")
def vocab(default_vocab):
    return default_vocab


def gemma_builder(vocab, **kw) -> PromptBuilder:
    template = ChatTemplate("gemma", builtin_source("gemma"), vocab.special_text(vocab.bos), vocab.special_text(vocab.eos))
    return PromptBuilder(template, vocab, **kw)


def letters(n: int, text: str = "a") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(n)]


def test_a_chat_of_100000_one_letter_messages_builds_in_seconds(vocab):
    builder = gemma_builder(vocab)
    builder.build(letters(4), None)  # the template compiled, the glue found

    def cpu_seconds(n: int):
        started = time.process_time()
        built = builder.build(letters(n), None)
        return time.process_time() - started, built

    tenth = sorted(cpu_seconds(10_000)[0] for _ in range(3))[1]
    elapsed, prompt = cpu_seconds(100_000)
    # NOTE: 1.3 s alone on a 2-core machine, 2.8-3.2 s on a slow day, 5.6 s on a slower CPU.
    # Under a profiler: rendering the template 26%, cutting the text at each message's
    # content 23%, splitting the glue at its special tokens 26%, the message spans 8%.
    # Quadratic, 10,000 messages took 98 s. The process's CPU time, not the wall clock: tests
    # run two at a time, and the other one's share of the cores says nothing of this build's
    # cost. Linear: ten times the messages take about ten times the time (quadratic: a
    # hundred), whatever the CPU; the absolute bound keeps it within seconds. A build of
    # 10,000 took 0.09 to 0.21 s in one process here, and 100,000 8 to 27 times one of them
    # (the CPU time moves with what the other test does to the caches): the median of three
    # small builds, and half the quadratic ratio as the bound.
    assert elapsed < 50 * tenth, (elapsed, tenth)
    assert elapsed < 30, elapsed
    assert len(prompt.messages) == 100_000
    contents = [content for _, _, content in prompt.messages]
    assert contents == sorted(contents) and len(set(contents)) == 100_000


@pytest.mark.parametrize("content", ["a", "t", "rt", "of", "_", "turn"])
def test_a_message_that_is_a_piece_of_a_special_token_leaves_the_token_whole(vocab, content):
    """"a" is also inside "<start_of_turn>": found there, it cut the token into text."""
    builder = gemma_builder(vocab)
    prompt = builder.build(letters(6, content), None)
    whole = vocab.tokenize(prompt.text, add_special=False, parse_special=True)
    if vocab.add_bos and whole[:1] != [vocab.bos]:
        whole = [vocab.bos] + whole
    assert prompt.tokens == whole
    start_of_turn = vocab.tokenize("<start_of_turn>", parse_special=True)
    assert prompt.tokens.count(start_of_turn[0]) == 7  # six messages and the generation prompt


def test_message_positions_from_known_token_lengths_equal_those_from_llama_cpp(vocab):
    """Token lengths are asked of llama.cpp once each: a prompt built again from the lengths
    already known gets the same positions as a fresh builder's, with no call per token."""
    messages = [{"role": "system", "content": "Réponds en français. 日本語も少し。"},
                {"role": "user", "content": "Quelle est la météo à Zürich? 🌦️ " * 40},
                {"role": "assistant", "content": "Il fait beau — 晴れ。"},
                {"role": "user", "content": "Merci ✓ " * 30}]
    plain = gemma_builder(vocab).build(messages, None)
    scanned = gemma_builder(vocab)
    first = scanned.build(messages, None)  # each token's length is asked once
    assert first.messages == plain.messages
    calls = []
    original = vocab.token_piece
    vocab.token_piece = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        built = scanned.build(messages, None)
    finally:
        del vocab.token_piece
    assert (built.tokens, built.messages, built.generation_start, built.system_end) == (
        plain.tokens, plain.messages, plain.generation_start, plain.system_end)
    assert calls == []


def test_an_over_long_prompt_stops_before_it_is_built_whole(vocab):
    builder = gemma_builder(vocab, max_tokens=1000)
    with pytest.raises(PromptTooLong) as err:
        builder.build(letters(20_000), None)
    assert 1000 < err.value.at_least < 1100  # counted no further than needed
    assert err.value.status == 400 and "exceeds the available context size (1000 tokens)" in err.value.message


def test_the_longest_piece_is_the_longest_token_as_llama_cpp_renders_it(vocab):
    # the bound above rests on it: no token's bytes are longer (one pass, no piece kept)
    pieces = [vocab.token_piece(t) for t in range(vocab.n_vocab)]
    assert vocab.longest_piece() == max(map(len, pieces)) > 1
    assert gemma_builder(vocab).longest_piece() == vocab.longest_piece()


def test_a_text_that_cannot_fit_is_refused_before_it_is_rendered(vocab):
    builder = gemma_builder(vocab, max_tokens=1000)
    builder.longest_piece()
    rendered = []
    original = builder.template.render
    object.__setattr__(builder, "template", type("Spy", (), {
        "render": lambda self, *a, **k: rendered.append(1) or original(*a, **k),
        "supports_tools": builder.template.supports_tools,
        "source": builder.template.source, "bos_token": builder.template.bos_token, "eos_token": builder.template.eos_token,
    })())
    with pytest.raises(PromptTooLong):
        builder.build([{"role": "user", "content": "x" * 200_000}], None)
    assert rendered == []


# -- limits and a pool no one can monopolize, on a real server -----------------------------


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "2", "-c", "4096", "--max-messages", "20000", "--max-tools", "4")
    yield proc
    proc.stop()


def post_chat(url, messages, timeout=120, **extra):
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def test_more_messages_or_tools_than_the_limits_get_400_naming_the_field(server):
    r = post_chat(server.url, letters(20_001))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "--max-messages" in r.json()["error"]["message"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tools = [{**tool, "function": {**tool["function"], "name": f"f{i}"}} for i in range(5)]
    r = post_chat(server.url, letters(1), tools=tools)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_more_responses_input_items_than_the_limit_get_400_naming_input(server):
    items = [{"role": "user", "content": "a"}] * 20_001
    r = httpx.post(server.url + "/v1/responses", json={"input": items, "max_output_tokens": 4}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert "--max-messages" in r.json()["error"]["message"]
    # the stored history counts too: 2 stored + 19,999 new items are over the limit
    first = httpx.post(server.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 1}, timeout=120)
    assert first.status_code == 200, first.text
    body = {"input": items[:19_999], "previous_response_id": first.json()["id"], "max_output_tokens": 4}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert "20001 messages" in r.json()["error"]["message"], r.text  # not the context error


def test_an_over_long_chat_gets_the_context_error(server):
    r = post_chat(server.url, letters(20_000))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "exceed_context_size_error"


def test_a_chat_is_answered_while_four_hostile_requests_run(server):
    """Four clients send chats of the most messages allowed, again and again: a normal chat
    still gets its answer (they once filled the tokenize pool for hours)."""
    stop = time.monotonic() + 150
    done = []

    def hostile():
        statuses = []
        while not done and time.monotonic() < stop:
            try:
                statuses.append(post_chat(server.url, letters(20_000), timeout=60).status_code)
            except httpx.TimeoutException:
                statuses.append("timeout")
        return statuses

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        attackers = [pool.submit(hostile) for _ in range(4)]
        time.sleep(2)
        started = time.monotonic()
        try:
            r = post_chat(server.url, [{"role": "user", "content": "Say hi."}], timeout=90)
        finally:
            done.append(True)
        elapsed = time.monotonic() - started
        outcomes = [f.result() for f in attackers]
    assert r.status_code == 200, r.text
    assert elapsed < 45, elapsed  # seconds on a loaded 2-core machine; an idle one answers in well under one
    assert all(s in (400, 503) for statuses in outcomes for s in statuses), outcomes
