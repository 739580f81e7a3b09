"""LoRA adapters through the HTTP server, as llama-server serves them: --lora and
--lora-init-without-apply, GET and POST /lora-adapters, a request's own `lora`, and the
isolation of cached state by adapter set (a prefix computed under one set never serves
another, on any tier), with requests under different sets running side by side."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.helpers import REUSE_ENGINE, generate, random_tokens, tiny_engine, warmslot_server
from tests.tiny_lora import write_tiny_lora
from warmslot.slots import AdapterSet, NotReady, SpecConfig
from warmslot.slots.step.adapter_turns import next_turn

TASK = "tiny-task"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return write_tiny_lora(tmp_path_factory.mktemp("lora") / "adapter.gguf", task_name=TASK)


@pytest.fixture(scope="module")
def server(tiny_models, adapter):
    # no spare sequences: a conversation that leaves its slot goes to the prompt cache
    proc = warmslot_server(tiny_models["attention"], "-np", "2", "-c", "2048", "--temp", "0", "--cache-vram", "0",
                           "--lora", str(adapter), "--lora-init-without-apply")
    yield proc
    proc.stop()


def complete(server, prompt: str, lora=None, *, cache_prompt: bool = True, n: int = 12, salt: str = "") -> dict:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "cache_prompt": cache_prompt, "warmslot_explain": True,
            "cache_salt": salt}
    if lora is not None:
        body["lora"] = lora
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def text(reply: dict) -> str:
    return reply["choices"][0]["text"]


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


ON = [{"id": 0, "scale": 1.0}]
OFF = [{"id": 0, "scale": 0.0}]


def test_the_adapters_are_listed_at_scale_0_with_init_without_apply(server, adapter):
    listed = httpx.get(server.url + "/lora-adapters").json()
    assert listed == [{"id": 0, "path": str(adapter), "scale": 0.0, "task_name": TASK, "prompt_prefix": ""}]
    props = httpx.get(server.url + "/props").json()
    assert props["lora_adapters"] == listed
    assert props["default_generation_settings"]["params"]["lora"] == [{"id": 0, "scale": 0.0}]


def test_scale_0_is_the_base_model_and_scale_1_changes_the_tokens(server):
    prompt = "Scale test: the quick brown fox jumps over"
    base = text(complete(server, prompt, cache_prompt=False))
    assert text(complete(server, prompt, OFF, cache_prompt=False)) == base
    assert text(complete(server, prompt, ON, cache_prompt=False)) != base


def test_a_prefix_cached_without_the_adapter_serves_only_requests_without_it(server):
    prompt, salt = "Isolation test: a long enough prompt that the cache would hold it whole " * 2, "isolation"
    complete(server, prompt, salt=salt)  # the base model's state of the prompt, now in a slot
    under_adapter = complete(server, prompt, ON, salt=salt)
    assert cached(under_adapter) == 0
    assert "other LoRA adapters" in under_adapter["warmslot"]["cache"]["reason"]
    again = complete(server, prompt, ON, salt=salt)  # the same set comes back: its own prefix serves it
    assert cached(again) > 0 and text(again) == text(under_adapter)
    assert text(complete(server, prompt, ON, cache_prompt=False, salt=salt)) == text(under_adapter)  # a cold run's answer
    assert cached(complete(server, prompt, salt=salt)) > 0  # and the base model's is still there
    for i in range(2):  # two other tenants take both slots: what they held goes to RAM
        complete(server, "An unrelated conversation. " * 8, n=1, salt=f"other {i}")
    from_ram = {name: complete(server, prompt, lora, salt=salt) for name, lora in (("on", ON), ("off", None))}
    assert from_ram["on"]["warmslot"]["cache"]["source"] == "ram" and text(from_ram["on"]) == text(under_adapter)
    assert from_ram["off"]["warmslot"]["cache"]["source"] == "ram" and cached(from_ram["off"]) > 0


def test_requests_under_different_adapters_run_together_with_their_own_answers(server):
    prompt = "Concurrency test: two sets of adapters decode in turns"
    cold = {name: text(complete(server, prompt, lora, cache_prompt=False, n=24)) for name, lora in (("on", ON), ("off", OFF))}
    assert cold["on"] != cold["off"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [(name, pool.submit(complete, server, prompt, lora, cache_prompt=False, n=24))
                for name, lora in (("on", ON), ("off", OFF), ("on", ON), ("off", OFF))]
        for name, job in jobs:
            assert text(job.result()) == cold[name], name


def test_post_lora_adapters_sets_the_default_and_a_request_overrides_it(server):
    prompt = "Default test: the server's scales apply to requests that name none"
    base = text(complete(server, prompt, cache_prompt=False))
    on = text(complete(server, prompt, ON, cache_prompt=False))
    try:
        assert httpx.post(server.url + "/lora-adapters", json=ON).json() == {"success": True}
        assert httpx.get(server.url + "/lora-adapters").json()[0]["scale"] == 1.0
        assert text(complete(server, prompt, cache_prompt=False)) == on
        assert text(complete(server, prompt, [], cache_prompt=False)) == on  # [] is the default, as in llama-server
        assert text(complete(server, prompt, OFF, cache_prompt=False)) == base
        native = httpx.post(server.url + "/completion", json={"prompt": prompt, "n_predict": 1}, timeout=120).json()
        assert native["generation_settings"]["lora"] == [{"id": 0, "scale": 1.0}]  # what it ran under
        chat = httpx.post(server.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "lora": OFF}, timeout=120)
        assert chat.status_code == 200, chat.text
    finally:
        assert httpx.post(server.url + "/lora-adapters", json=[]).status_code == 200  # left out: scale 0
    assert httpx.get(server.url + "/lora-adapters").json()[0]["scale"] == 0.0
    assert text(complete(server, prompt, cache_prompt=False)) == base


@pytest.mark.parametrize("lora", ["x", {"id": 0, "scale": 1}, [{"id": 1, "scale": 1}], [{"id": -1, "scale": 1}],
                                  [{"id": 0}], [{"id": "0", "scale": 1}], [{"id": 0, "scale": "1"}], [0]])
def test_a_bad_lora_field_is_a_400_and_the_server_keeps_serving(server, lora):
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
                       ("/completion", {"prompt": "x", "n_predict": 1}),
                       ("/v1/responses", {"input": "x", "max_output_tokens": 1})):
        reply = httpx.post(server.url + path, json={**body, "lora": lora}, timeout=60)
        assert reply.status_code == 400, (path, reply.text)
        assert reply.json()["error"]["param"] == "lora"
    assert httpx.post(server.url + "/lora-adapters", json=lora).status_code == 400
    complete(server, "still serving", n=1)


def test_a_bad_post_body_is_a_400(server):
    for raw in (b"{}", b"not json", b'{"id": 0, "scale": 1}'):
        assert httpx.post(server.url + "/lora-adapters", content=raw).status_code == 400
    assert httpx.get(server.url + "/lora-adapters").json()[0]["scale"] == 0.0


def test_the_disk_tier_keeps_states_apart_by_adapter_set(tiny_models, adapter, tmp_path):
    """A conversation written to disk without adapters serves the base model after a restart,
    never a request under an adapter, and the adapter's own state comes back from disk too."""
    args = dict(REUSE_ENGINE, cache_disk=str(tmp_path / "disk"), cache_disk_size=64 << 20, lora=((str(adapter), 1.0),))
    prompt = random_tokens(50, 120)
    engine = tiny_engine(tiny_models["attention"], **args)
    try:
        generate(engine, prompt)
    finally:
        engine.stop()  # the slot's contents are written on the way out, under the base model's scope
    engine = tiny_engine(tiny_models["attention"], **args)
    try:
        on = AdapterSet.of({0: 1.0}, engine.info.adapters)
        under_adapter = generate(engine, prompt, adapters=on)
        assert under_adapter.usage.cached_tokens == 0
        base = generate(engine, prompt)
        assert base.reuse.source == "disk" and base.usage.cached_tokens > 0
    finally:
        engine.stop()
    engine = tiny_engine(tiny_models["attention"], **args)
    try:
        again = generate(engine, prompt, adapters=AdapterSet.of({0: 1.0}, engine.info.adapters))
        assert again.reuse.source == "disk" and again.tokens == under_adapter.tokens
    finally:
        engine.stop()


def test_what_decodes_apart_from_the_step_is_refused_with_adapters(tiny_models, adapter, tmp_path):
    """A draft model, n-gram drafts, MTP and images decode outside the step's one adapter set:
    refused at start-up, naming both; and a file that is not an adapter names itself."""
    lora = ((str(adapter), 1.0),)
    with pytest.raises(NotReady, match=r"--lora\) do not go with speculative decoding"):
        tiny_engine(tiny_models["attention"], lora=lora, spec=SpecConfig(type="ngram-simple"))
    with pytest.raises(NotReady, match="not a LoRA adapter GGUF"):
        tiny_engine(tiny_models["attention"], lora=((str(tiny_models["attention"]), 1.0),))


# -- the step's adapter set: a pure choice ----------------------------------------------------


def test_steps_take_turns_over_the_sets_with_work():
    a, b, c = (AdapterSet(((0, s),), ("d",)) for s in (1.0, 0.5, 0.25))
    assert next_turn([], None) is None
    assert next_turn([a], None) == a and next_turn([a], a) == a
    order = [a, b, c]
    seen, last = [], None
    for _ in range(6):
        last = next_turn(order, last)
        seen.append(last)
    assert seen == [a, b, c, a, b, c]  # no set waits more than one step per other set
    assert next_turn([b, c], a) == b  # a set with no work left: the oldest's next


def test_lora_flags_are_read_as_llama_server_writes_them(tmp_path):
    from warmslot.server.process.config import parse_config

    one, two = (tmp_path / "a.gguf", tmp_path / "b.gguf")
    one.write_bytes(b""), two.write_bytes(b"")
    config, _ = parse_config(["--lora", f"{one},{two}", "--lora-scaled", f"{two}:0.5"])
    assert config.engine.lora == ((str(one), 1.0), (str(two), 1.0), (str(two), 0.5))
    config, _ = parse_config(["--lora", str(one), "--lora-init-without-apply"])
    assert config.engine.lora == ((str(one), 0.0),)
    for bad in (["--lora", str(tmp_path / "missing.gguf")], ["--lora-scaled", str(one)], ["--lora-scaled", f"{one}:x"]):
        with pytest.raises(SystemExit):
            parse_config(bad)
