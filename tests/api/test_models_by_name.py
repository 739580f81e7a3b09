"""Several models in one server, by name (--models-file, --models-dir): the catalog and the name
lookup without a model, and the line saying whether models fit together; then two tiny models
of different memory kinds (attention and hybrid) served by name through a real server:
wildcard aliases, loading on demand while the other model serves, --models-max unloading the
least recently used model and its conversation coming back warm, 404 in each API's shape, the
admin routes and a request's keep_alive, and GET /models/capacity estimating each model before
its load and measuring it after."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import sys
import time

import anthropic
import httpx
import openai
import pytest

from scripts.server_process import ServerProcess
from tests.helpers import abort_while_streaming, metric, THREADS
from warmslot.server.models.capacity import Together, estimate, most_at_once
from warmslot.server.models.catalog import CatalogError, NameMatcher, parse_duration, read_models_dir, read_models_file
from warmslot.server.models.configs import model_configs
from warmslot.server.process.cli import several_models
from warmslot.server.process.config import parse_config

TURN = [{"role": "user", "content": "Name three colors."}]


# -- the catalog, without a model ----------------------------------------------------------------


def test_the_first_matching_name_wins_exact_names_before_wildcards():
    matcher = NameMatcher([("small", ["claude-*haiku*", "gpt-mini"]), ("big", ["claude-*", "big-exact"])])
    assert matcher.match("claude-3-5-haiku-latest") == "small"
    assert matcher.match("claude-opus-4") == "big"
    assert matcher.match("gpt-mini") == "small" and matcher.match("big") == "big"
    assert matcher.match("claude") is None and matcher.match("gpt-4o") is None
    # an exact name wins over a wildcard listed before it
    assert NameMatcher([("a", ["x-*"]), ("b", ["x-1"])]).match("x-1") == "b"


def test_keep_alive_durations_read_as_ollama_writes_them():
    assert parse_duration("5m", "k") == 300 and parse_duration("1h30m", "k") == 5400 and parse_duration("90s", "k") == 90
    assert parse_duration(0, "k") == 0 and parse_duration("2.5", "k") == 2.5
    assert parse_duration(-1, "k") == float("inf") and parse_duration("-1m", "k") == float("inf")
    for bad in ("soon", "", "5x", True):
        with pytest.raises(CatalogError):
            parse_duration(bad, "k")


def test_a_models_folder_is_read_as_llama_server_lays_it_out(tmp_path):
    (tmp_path / "alpha.gguf").write_bytes(b"")
    (tmp_path / "mmproj-stray.gguf").write_bytes(b"")  # a projector at the top is no model
    vision = tmp_path / "vision"
    vision.mkdir()
    for name in ("mmproj-vision-f16.gguf", "vision-Q4-00002-of-00002.gguf", "vision-Q4-00001-of-00002.gguf"):
        (vision / name).write_bytes(b"")
    (tmp_path / "empty").mkdir()
    specs = read_models_dir(str(tmp_path))
    assert [s.name for s in specs] == ["alpha", "vision"]
    assert specs[1].path.endswith("vision-Q4-00001-of-00002.gguf")
    assert specs[1].args == ["--mmproj", str(vision / "mmproj-vision-f16.gguf")]


def test_a_models_file_gives_each_model_its_flags(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    ini = tmp_path / "models.ini"
    ini.write_text(
        f"[*]\nctx-size = 2048\n\n[a]\nmodel = {tmp_path / 'a.gguf'}\nalias = claude-*haiku*\nparallel = 2\n"
        f"cache-type-k = q8_0\nswa-full = true\nkeep-alive = 5m\n\n[b]\nmodel = {tmp_path / 'b.gguf'}\nc = 512\n"
    )
    config, _ = parse_config(["--models-file", str(ini), "--cache-disk", str(tmp_path / "disk")])
    (a, a_config), (b, b_config) = model_configs(config, ["--models-file", str(ini), "--cache-disk", str(tmp_path / "disk")])
    assert (a.name, a.patterns, a.keep_alive, b.keep_alive) == ("a", ["claude-*haiku*"], 300, float("inf"))
    assert (a_config.engine.n_ctx, a_config.engine.n_parallel, a_config.engine.type_k, a_config.engine.swa_full) == (2048, 2, "q8_0", True)
    assert (b_config.engine.n_ctx, b_config.engine.n_parallel) == (512, config.engine.n_parallel)
    assert a_config.alias == "a" and a_config.aliases == ["a", "claude-*haiku*"]
    assert a_config.engine.cache_disk == str(tmp_path / "disk" / "a")  # each model's disk tier in its own folder
    # the server's RAM budget is one for both models (each model's cache stays while it is unloaded)
    pool = a_config.engine.shared_ram
    assert pool is not None and b_config.engine.shared_ram is pool and pool.total == config.engine.cache_ram
    assert a_config.engine.cache_ram == b_config.engine.cache_ram == config.engine.cache_ram
    # and so is its disk budget
    assert a_config.engine.shared_disk is b_config.engine.shared_disk is not None
    assert a_config.engine.shared_disk.total == a_config.engine.cache_disk_size == config.engine.cache_disk_size
    assert a_config.engine.spare_share == b_config.engine.spare_share == 2  # so are the auto spares' device memory
    assert a_config.sleep_idle_s < 0  # unloaded by the registry, never by a sleep of its own
    assert a_config.engine.pinned_at_load == 0 < config.engine.pinned_at_load  # pinning would stall the other model


@pytest.mark.parametrize("section, error", [
    ("[a]\nport = 9000\n", "whole server, not per model"),
    ("[a]\nhf-repo = a/b\n", "not per model"),
    ("[a]\nno-such-flag = 1\n", "not a flag"),
    ("[a]\nswa-full = maybe\n", "switch"),
    ("[c]\nctx-size = 1\n", "names no model file"),
    ("[a]\nctx-size = lots\n", "model a"),
])
def test_a_models_file_that_cannot_be_served_is_refused(tmp_path, section, error):
    (tmp_path / "a.gguf").write_bytes(b"")
    ini = tmp_path / "models.ini"
    ini.write_text(f"[a]\nmodel = {tmp_path / 'a.gguf'}\n" + section.replace("[a]\n", ""))
    config, _ = parse_config(["--models-file", str(ini)])
    with pytest.raises(CatalogError, match=error):
        model_configs(config, ["--models-file", str(ini)])


def test_a_models_file_adds_to_the_folders_models(tmp_path):
    for name in ("a.gguf", "b.gguf", "c.gguf"):
        (tmp_path / name).write_bytes(b"")
    ini = tmp_path / "models.ini"
    ini.write_text(f"[c]\nalias = first-*\nparallel = 3\n\n[d]\nmodel = {tmp_path / 'a.gguf'}\n\n[a]\nc = 64\n")
    specs = read_models_file(str(ini), read_models_dir(str(tmp_path)))
    # the file's models in its order (its wildcards are matched in that order), then the folder's others
    assert [(s.name, s.args) for s in specs] == [
        ("c", ["--alias", "first-*", "--parallel", "3"]), ("d", []), ("a", ["-c", "64"]), ("b", []),
    ]


def test_one_model_or_several_not_both(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    for argv, error in (
        (["-m", str(tmp_path / "a.gguf"), "--models-dir", str(tmp_path)], "not both"),
        (["--models-default", "a"], "names a model of"),
        (["--models-dir", str(tmp_path), "--models-default", "b"], "no model named 'b'"),
        (["--models-dir", str(tmp_path / "nowhere")], "not a folder"),
    ):
        with pytest.raises(CatalogError, match=error):
            several_models(parse_config(argv)[0], argv)
    assert several_models(parse_config([])[0], []) is None  # -m alone: one model, as always


def test_the_fit_line_says_whether_the_models_fit_together_or_take_turns():
    gib = 1 << 30
    assert most_at_once([5 * gib, 3 * gib, 3 * gib], 7 * gib) == 1  # 3 + 3 fit, but not any two
    assert most_at_once([5 * gib, 3 * gib, 3 * gib], 8 * gib) == 2 and most_at_once([9 * gib], 8 * gib) == 0
    fits = Together("device memory", free_bytes=10 * gib, held_bytes=4 * gib, margin_bytes=gib, need_bytes=9 * gib,
                    at_once=3, models_max=2, estimated=(), not_counted=())
    assert fits.fits and fits.room_bytes == 13 * gib
    assert fits.summary(3) == ("all 3 models fit in device memory together: they take 9.00 GiB, 13.00 GiB of device memory "
                               "is there after the margin, 4.00 GiB to spare; --models-max 2 has them take turns all the same")
    tight = Together("RAM", 6 * gib, 0, 2 * gib, 9 * gib, at_once=1, models_max=2, estimated=("big",), not_counted=("compute buffers",))
    assert not tight.fits
    assert tight.summary(3) == ("the 3 models do not fit in RAM together: they take 9.00 GiB and 4.00 GiB of RAM is there after "
                                "the margin and the prompt caches' budgets; one fits at a time, but --models-max 2 lets more load: "
                                "--models-max 1 has them take turns (estimated for big, not counting compute buffers)")
    turns = Together("RAM", 6 * gib, 0, 2 * gib, 9 * gib, at_once=2, models_max=1, estimated=(), not_counted=())
    assert turns.summary(3).endswith("any 2 of them fit at once, and --models-max 1 has them take turns")


def test_a_server_of_one_model_has_no_capacity_view_of_models(tmp_path):
    from starlette.testclient import TestClient

    from warmslot.server.app import create_app

    config, _ = parse_config(["-m", str(tmp_path / "never-loaded.gguf")])
    r = TestClient(create_app(config)).get("/models/capacity")  # no lifespan: nothing is loaded
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text


# -- served by name ------------------------------------------------------------------------------


def serve(tmp_path, tiny_models, *args: str) -> ServerProcess:
    """A server of two tiny models on 2 threads, in a models folder laid out as llama-server's
    (`small`: attention, a file at the top; `big`: hybrid, in a folder of its own), the models
    file giving their names and flags."""
    folder = tmp_path / "models"
    (folder / "big").mkdir(parents=True)
    (folder / "small.gguf").symlink_to(tiny_models["attention"])
    (folder / "big" / "tiny-hybrid.gguf").symlink_to(tiny_models["hybrid"])
    ini = tmp_path / "models.ini"
    ini.write_text(
        "[*]\nctx-size = 1024\nparallel = 1\ncache-ram = 64\ncache-type-k = f32\ncache-type-v = f32\n\n"
        "[small]\nalias = claude-*haiku*, gpt-mini\n\n[big]\nalias = claude-*\n"
    )
    cmd = [sys.executable, "-m", "warmslot.server", "-t", str(THREADS), "--models-dir", str(folder), "--models-file", str(ini),
           "--admin-key", "admin", "--metrics-open", *args]
    return ServerProcess("warmslot", cmd, ready_timeout=120, env={"GGML_NO_BACKTRACE": "1"})


def chat(url: str, model: str, messages=TURN, **extra) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(url + "/v1/models").json()["data"]}


def wait_state(url: str, model: str, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while states(url)[model] != state:
        assert time.monotonic() < deadline, f"{model} never became {state}: {states(url)}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_loaded(tmp_path_factory, tiny_models):
    with serve(tmp_path_factory.mktemp("two"), tiny_models, "--models-max", "2") as proc:
        yield proc


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    return tmp_path_factory.mktemp("disk")


@pytest.fixture(scope="module")
def one_loaded(tmp_path_factory, tiny_models, disk):
    with serve(tmp_path_factory.mktemp("one"), tiny_models, "--models-max", "1", "--cache-disk", str(disk)) as proc:
        yield proc


def test_the_capacity_view_estimates_the_models_not_loaded_yet(two_loaded, tiny_models):
    url = two_loaded.url
    view = httpx.get(url + "/models/capacity").json()
    assert [(m["model"], m["state"], m["source"]) for m in view["data"]] == [("small", "unloaded", "estimated"), ("big", "unloaded", "estimated")]
    small, big = view["data"]
    # small (attention): its weights from the tensor table, its KV cache of 1024 f32 cells from the metadata
    assert 0 < small["weights_bytes"] <= os.path.getsize(tiny_models["attention"])
    assert small["state_bytes"] > 0 and small["held_bytes"] == {"CPU": small["weights_bytes"] + small["state_bytes"]}
    assert small["compute_bytes"] is None and small["not_counted"] == ["compute buffers"]
    assert (small["n_ctx"], small["cache_ram_bytes"]) == (1024, 64 << 20)
    # big (hybrid): its recurrent state is known once it is loaded
    assert big["state_bytes"] is None and any("recurrent" in part for part in big["not_counted"])
    together = view["together"]
    assert (together["where"], together["held_bytes"], together["estimated"]) == ("RAM", 0, ["small", "big"])
    assert together["need_bytes"] == small["total_bytes"] + big["total_bytes"]
    assert together["margin_bytes"] == (1 << 30) + 2 * (64 << 20)  # --fit-target and both prompt caches' budgets
    assert together["fits"] and together["summary"].startswith("all 2 models fit in RAM together"), together
    assert "not counting compute buffers" in together["summary"]
    assert "/models/capacity" in httpx.get(url + "/openapi.json").json()["paths"]
    assert states(url) == {"small": "unloaded", "big": "unloaded"}  # the view loads nothing
    # the engine families have a series per model, unloaded ones too
    assert metric(two_loaded, 'warmslot_generated_tokens_total{model="big"}') == 0
    assert metric(two_loaded, 'warmslot_queue_depth{model="small"}') == 0


def test_names_and_wildcards_pick_the_model(two_loaded):
    url = two_loaded.url
    assert states(url) == {"small": "unloaded", "big": "unloaded"}  # nothing loads before a request names it
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    reply = client.chat.completions.create(model="claude-3-5-haiku-latest", messages=TURN, max_tokens=8, temperature=0)
    assert reply.model == "small"
    assert chat(url, "claude-opus-4")["model"] == "big"
    assert chat(url, "gpt-mini")["model"] == "small" and chat(url, "big")["model"] == "big"
    assert states(url) == {"small": "loaded", "big": "loaded"}
    assert httpx.get(url + "/v1/models/claude-3-haiku").json()["id"] == "small"
    # the service routes speak of the model they name
    assert httpx.get(url + "/props", params={"model": "claude-opus"}).json()["model_alias"] == "big"
    assert httpx.get(url + "/props").json()["model_alias"] == "small"  # no name: the first model
    assert httpx.get(url + "/engine", params={"model": "big"}).json()["slots"][0]["state"] == "idle"
    vocab = [httpx.post(url + "/tokenize", json={"content": "hi", "model": m}).json()["tokens"] for m in ("small", "big")]
    assert vocab[0] and vocab[1]
    assert metric(two_loaded, 'warmslot_model_requests_total{model="small"}') >= 2
    for name in ("small", "big"):  # the engine families, labelled by model
        assert metric(two_loaded, f'warmslot_generated_tokens_total{{model="{name}"}}') > 0
        assert metric(two_loaded, f'warmslot_prompt_tokens_total{{model="{name}",source="computed"}}') > 0
        assert re.search(r'^warmslot_model_info\{[^}]*model="%s"' % name, httpx.get(url + "/metrics").text, re.M)
    assert metric(two_loaded, 'warmslot_model_loaded{model="big"}') == 1


def test_an_unknown_name_is_a_404_in_each_apis_shape(two_loaded):
    url = two_loaded.url
    with pytest.raises(openai.NotFoundError) as caught:
        openai.OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(model="gpt-4o", messages=TURN, max_tokens=4)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["type"] == "invalid_request_error"
    r = httpx.post(url + "/v1/completions", json={"model": "gpt-4o", "prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic.Anthropic(base_url=url, api_key="x").messages.create(model="gemini-pro", max_tokens=4, messages=TURN)
    assert caught.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "model: The model 'gemini-pro' does not exist"}}


def test_a_model_loads_while_the_other_serves_and_both_serve_together(two_loaded):
    url = two_loaded.url
    r = httpx.post(url + "/models/unload", json={"model": "big"}, headers={"Authorization": "Bearer admin"})
    assert r.status_code == 200 and r.json()["state"] == "sleeping"
    # a long stream on `small` goes on while `big` loads and answers
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
        "model": "small", "messages": TURN, "max_tokens": 120, "temperature": 0, "stream": True, "ignore_eos": True,
    }) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert states(url)["big"] == "sleeping"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            bigs = [pool.submit(chat, url, "claude-opus", [{"role": "user", "content": f"Count to {i}."}]) for i in range(3)]
            assert all(f.result()["model"] == "big" for f in bigs)
        rest = [line for line in lines if line.startswith("data: ")]
    assert first and rest[-1] == "data: [DONE]" and len(rest) > 100
    assert states(url) == {"small": "loaded", "big": "loaded"}
    # and both at once, through the Messages API too
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        client = anthropic.Anthropic(base_url=url, api_key="x")
        msgs = [pool.submit(client.messages.create, model=m, max_tokens=6, messages=TURN) for m in ("claude-haiku-4-5", "claude-sonnet-4")]
        chats = [pool.submit(chat, url, m) for m in ("small", "big")]
        assert [f.result().model for f in msgs] == ["claude-haiku-4-5", "claude-sonnet-4"]  # named as the client sent
        assert [f.result()["model"] for f in chats] == ["small", "big"]


def test_admin_routes_need_the_admin_key_and_keep_alive_zero_unloads(two_loaded):
    url = two_loaded.url
    r = httpx.post(url + "/models/load", json={"model": "small"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403
    r = httpx.post(url + "/models/load", json={"model": "nope"}, headers={"Authorization": "Bearer admin"})
    assert r.status_code == 404
    chat(url, "small", keep_alive=0)  # Ollama's: unloaded once the request ends
    wait_state(url, "small", "sleeping")
    r = httpx.post(url + "/models/load", json={"model": "gpt-mini"}, headers={"Authorization": "Bearer admin"})
    assert r.status_code == 200 and r.json() == {"success": True, "model": "small", "state": "loaded"}
    assert metric(two_loaded, 'warmslot_model_unloads_total{model="small"}') >= 1


def test_the_least_recently_used_model_makes_room_and_comes_back_warm(one_loaded, disk):
    url = one_loaded.url
    first = chat(one_loaded.url, "big")
    assert states(url) == {"small": "unloaded", "big": "loaded"}
    chat(url, "small")  # --models-max 1: big is unloaded, its slot kept in its prompt cache
    assert states(url) == {"small": "loaded", "big": "sleeping"}
    turn2 = TURN + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]}, {"role": "user", "content": "More?"}]
    warm = chat(url, "big", turn2)
    assert states(url) == {"small": "sleeping", "big": "loaded"}
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    cold = chat(url, "big", turn2, cache_prompt=False)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert metric(one_loaded, 'warmslot_model_prompt_tokens_total{model="big",source="ram"}') > 0
    assert metric(one_loaded, 'warmslot_model_loads_total{model="big"}') == 2
    assert sorted(p.name for p in disk.iterdir()) == ["big", "small"]  # each model's disk tier in its own folder


def test_requests_for_both_models_wait_their_turn_under_models_max_1(one_loaded):
    url = one_loaded.url
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = [pool.submit(chat, url, m, [{"role": "user", "content": f"Say {i}."}]) for i, m in enumerate(["small", "big"] * 2)]
        assert [f.result()["model"] for f in replies] == ["small", "big"] * 2
    assert sorted(states(url).values()) == ["loaded", "sleeping"]


def test_the_capacity_view_measures_what_each_model_took(one_loaded, tiny_models):
    url = one_loaded.url
    loaded = next(name for name, state in states(url).items() if state == "loaded")
    view = httpx.get(url + "/models/capacity").json()
    by_name = {m["model"]: m for m in view["data"]}
    assert {m["model"]: m["source"] for m in view["data"]} == {
        name: "measured" if name == loaded else "measured at its last load" for name in ("small", "big")}
    # the loaded model's memory is its capacity table's: weights, KV cache and recurrent state, compute buffers
    table = httpx.get(url + "/engine", params={"model": loaded}).json()["capacity"]
    held = by_name[loaded]
    assert held["weights_bytes"] == sum(table["weights_bytes"].values())
    assert held["state_bytes"] == sum(d["state_bytes"] for d in table["device_memory"])
    assert held["compute_bytes"] == sum(table["compute_bytes"].values())
    assert held["total_bytes"] == held["held_bytes"]["CPU"] == held["weights_bytes"] + held["state_bytes"] + held["compute_bytes"]
    assert (held["n_ctx"], held["n_spare"], held["not_counted"]) == (1024, 0, [])  # no spare sequences on the CPU
    # what was estimated before small's first load is what llama.cpp allocated
    weights, kv, _ = estimate(str(tiny_models["attention"]), "", 1024, "f32", "f32")
    small = by_name["small"]
    assert kv == small["state_bytes"]
    assert abs(weights - small["weights_bytes"]) <= 0.05 * small["weights_bytes"], (weights, small["weights_bytes"])
    together = view["together"]
    assert together["held_bytes"] == held["total_bytes"] and together["estimated"] == []
    assert together["need_bytes"] == by_name["small"]["total_bytes"] + by_name["big"]["total_bytes"]
    assert together["fits"] and together["summary"].endswith("--models-max 1 has them take turns all the same"), together


def test_a_request_that_waits_past_the_load_timeout_gets_503_and_the_load_goes_on(tmp_path, tiny_models):
    with serve(tmp_path, tiny_models, "--models-load-timeout", "0.001", "--models-default", "small") as proc:
        # --models-default: a name nothing matches is the default model's
        r = httpx.post(proc.url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": TURN, "max_tokens": 4})
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and r.json()["error"]["code"] == "loading"
        wait_state(proc.url, "small", "loaded")
        assert chat(proc.url, "gpt-4o")["model"] == "small"


def test_an_abort_names_the_running_requests_of_every_model(tmp_path, tiny_models):
    with serve(tmp_path, tiny_models) as proc:
        chat(proc.url, "small")
        body = {"model": "big", "messages": TURN, "max_tokens": 100000, "ignore_eos": True, "stream": True}
        request_id = abort_while_streaming(proc, body)
        assert proc.proc.returncode == -signal.SIGABRT
        crash = [line for line in proc.output().splitlines() if line.startswith("warmslot crash:")]
        models = [line.split(":", 1)[1].strip() for line in crash if line.rstrip().endswith(".gguf:")]
        assert models == ["small.gguf:", "tiny-hybrid.gguf:"], proc.output()[-3000:]
        assert any(request_id in line and "via /v1/chat/completions" in line for line in crash), crash


def test_sigterm_lets_every_models_streams_finish(tmp_path, tiny_models):
    with serve(tmp_path, tiny_models) as proc:
        chat(proc.url, "small")
        body = {"model": "big", "messages": TURN, "max_tokens": 60, "ignore_eos": True, "stream": True, "temperature": 0}
        with httpx.stream("POST", proc.url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            os.kill(proc.pid, signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) > 50
        assert proc.proc.wait(30) == 0


def test_a_model_that_fails_to_load_answers_500_and_is_tried_again(tmp_path, tiny_models):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    ini = tmp_path / "models.ini"
    ini.write_text(f"[*]\nctx-size = 512\nparallel = 1\n\n[small]\nmodel = {tiny_models['attention']}\n\n[broken]\nmodel = {broken}\n")
    cmd = [sys.executable, "-m", "warmslot.server", "-t", str(THREADS), "--models-file", str(ini)]
    with ServerProcess("warmslot", cmd, ready_timeout=120) as proc:
        for attempt in (1, 2):
            r = httpx.post(proc.url + "/v1/chat/completions", json={"model": "broken", "messages": TURN, "max_tokens": 4}, timeout=60)
            assert r.status_code == 500 and "failed to load" in r.json()["error"]["message"]
            assert states(proc.url)["broken"] == "unloaded"
            assert metric(proc, 'warmslot_model_load_failures_total{model="broken"}') == attempt
        assert chat(proc.url, "small")["model"] == "small"
