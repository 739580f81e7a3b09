"""Experts in RAM (--cpu-moe, --n-cpu-moe, -ot) on the tiny MoE model: llama.cpp places the
tensors the overrides name (its log says so, and the capacity table counts them), answers
equal the unsplit run, and reuse works across the split as everywhere (RAM prompt cache, slot
files). --fit changes nothing on a CPU, and --fit-print answers without serving."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import httpx
import pytest

from tests.helpers import assert_same_answer, cold_run, generate, random_tokens, REUSE_ENGINE, THREADS, tiny_engine, warmslot_server
from warmslot.slots import Placement, placement

P = random_tokens(11, 200)
Q = random_tokens(12, 30)
R = random_tokens(13, 150)
SPLIT = Placement(tensor_overrides=((r"blk\.3\.ffn_down_exps", "CPU"), *placement.expert_overrides(2)))


def test_experts_in_ram_answer_as_the_unsplit_model_and_the_table_counts_them(tiny_moe):
    ref = cold_run(tiny_moe, P)
    engine = tiny_engine(tiny_moe, placement=SPLIT, **REUSE_ENGINE)
    try:
        warm = generate(engine, P, return_prompt_logits=True)
        capacity = engine.info.capacity
    finally:
        engine.stop()
    assert_same_answer(warm, ref)
    # layers 0 and 1: gate, up and down experts; layer 3: its down experts
    assert capacity.overridden == {"CPU": 7}
    assert "7 tensors on CPU" in capacity.table()
    # --fit is on by default and changes nothing on a CPU; the capacity answer is about RAM
    assert engine.config.fit and capacity.fit is None
    assert capacity.headroom.where == "RAM" and capacity.headroom.max_slots >= 1
    assert capacity.headroom.margin_bytes == 1 << 30


def test_a_conversation_comes_back_from_the_ram_cache_across_the_split(tiny_moe):
    ref = cold_run(tiny_moe, P + Q, boundaries=(len(P),))
    engine = tiny_engine(tiny_moe, placement=Placement(tensor_overrides=placement.expert_overrides(None)), **REUSE_ENGINE)
    try:
        generate(engine, P)
        generate(engine, R)  # another conversation takes the one slot: P moves to the prompt cache
        warm = generate(engine, P + Q, return_prompt_logits=True)
        assert engine.info.capacity.overridden == {"CPU": 12}
    finally:
        engine.stop()
    assert (warm.usage.source, warm.usage.cached_tokens, warm.usage.computed_tokens) == ("ram", len(P), len(Q))
    assert_same_answer(warm, ref)


@pytest.fixture(scope="module")
def moe_server(tiny_moe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("moe-slots")
    # no prompt cache: a hit after a restore can only come from the restored slot
    proc = warmslot_server(tiny_moe, "-np", "1", "-c", "1024", "--cache-ram", "0", "--slot-save-path", str(directory),
                           "-ot", r"blk\.0\.attn_q\.weight=CPU", "--cpu-moe")
    yield proc
    proc.stop()


def complete(url: str, prompt: str) -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_props_and_slots_show_the_overrides_and_what_the_server_can_hold(moe_server):
    props = httpx.get(moe_server.url + "/props", timeout=30).json()["capacity"]
    assert props["overridden_tensors"] == {"CPU": 13}
    assert props["fit"] is None
    room = props["headroom"]
    assert room["where"] == "RAM" and room["margin_bytes"] == 1 << 30 and room["cache_ram_bytes"] == 0
    assert room["max_ctx_slot"] == 4096 and room["max_slots"] >= 1
    slots = httpx.get(moe_server.url + "/engine", timeout=30).json()
    assert slots["capacity"]["headroom"] == room


def test_a_saved_slot_restores_across_the_split(moe_server):
    url = moe_server.url
    prompt = "The experts live in RAM while the rest of the model " * 4
    cold = complete(url, prompt)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert httpx.post(url + "/slots/0?action=save", json={"filename": "moe.bin"}, timeout=60).status_code == 200
    complete(url, "Something else entirely, so that the slot holds another conversation.")
    r = httpx.post(url + "/slots/0?action=restore", json={"filename": "moe.bin"}, timeout=60)
    assert r.status_code == 200 and r.json()["n_restored"] > 0
    warm = complete(url, prompt)
    # the whole prompt, with the logits the file saved at its end
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == warm["usage"]["prompt_tokens"]
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]


def warmslot_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "warmslot.server", "-t", str(THREADS), "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_fit_print_answers_without_serving(tiny_moe):
    done = warmslot_cli("-m", str(tiny_moe), "--fit-print", "-np", "3", "-c", "1536", "--n-cpu-moe", "1", "--fit-target", "1536")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "capacity with 3 slots" in out and "512 per slot, 3 slots" in out
    assert "3 tensors on CPU" in out
    assert "can hold" in out and "after a margin of 1.50 GiB" in out and "tokens per slot at this --parallel" in out
    assert "listening on" not in done.stderr


@pytest.mark.parametrize("args, message", [
    (["-ot", "exps=NoSuchDevice"], "-ot/--override-tensor exps=NoSuchDevice: unknown buffer type 'NoSuchDevice' (available: CPU"),
    (["-ot", "ex(ps=CPU"], "-ot/--override-tensor: not a regular expression"),
])
def test_a_bad_override_stops_the_start_up_naming_the_flag(tiny_moe, args, message):
    done = warmslot_cli("-m", str(tiny_moe), *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_fit_plans_from_the_gguf_layers_and_a_stated_card(tiny_moe):
    """The plan on a card of a stated size: the tensor table and the layer count come from the
    file (a vocab-only load leaves llama.cpp's layer count at 0), so the context drops to
    --fit-ctx and the experts of the fewest layers go to RAM."""
    from warmslot.slots import EngineConfig
    from warmslot.slots.fitting.fit import ModelSizes
    from warmslot.slots.fitting.fit_settings import COMPUTE_RESERVE, plan_for
    from warmslot.slots.fitting.gguf_tensors import tensor_sizes

    tensors = tensor_sizes(tiny_moe)
    sizes = ModelSizes.from_tensors(tensors, 4)
    assert sum(tensors.values()) == 1125120  # llama_model_size of the file
    assert sizes.expert_bytes == (3 * 64 * 64 * 4 * 4,) * 4
    cfg = EngineConfig(model_path=str(tiny_moe), n_parallel=1, type_k="f32", type_v="f32", fit_target=0, fit_ctx=1024,
                       n_gpu_layers_auto=True)
    expert = sizes.expert_bytes[0]
    card = COMPUTE_RESERVE + sum(sizes.layer_bytes) + sizes.output_bytes + 1024 * 1024 + 2 * expert + expert // 2
    plan = plan_for(cfg, (card,))
    assert (plan.n_ctx, plan.n_cpu_moe, plan.n_gpu_layers, plan.fits) == (1024, 2, 5, True)
    # with room for everything the training context and every layer stay
    plan = plan_for(cfg, (COMPUTE_RESERVE + sizes.total_bytes + 4096 * 1024,))
    assert (plan.n_ctx, plan.n_cpu_moe, plan.n_gpu_layers, plan.changed) == (4096, 0, 5, ())


def test_fit_settings_apply_the_plan_and_refuse_what_the_user_set_too_big(tiny_moe, monkeypatch):
    """On a (stated) GPU: the fitted settings carry the experts' overrides and the layers, and
    a context the user set that cannot fit stops the load with the numbers."""
    from warmslot.slots import EngineConfig
    from warmslot.slots.fitting import fit_settings as fitting
    from warmslot.slots.fitting.fit import ModelSizes
    from warmslot.slots.fitting.gguf_tensors import tensor_sizes
    from warmslot.slots.llama_api import Device

    sizes = ModelSizes.from_tensors(tensor_sizes(tiny_moe), 4)
    expert = sizes.expert_bytes[0]
    # the dense layers, the output, 1024 tokens of f32 KV and the experts of one layer and a half
    card = fitting.COMPUTE_RESERVE + sum(sizes.layer_bytes) + sizes.output_bytes + 1024 * 1024 + expert + expert // 2
    monkeypatch.setattr(fitting, "gpu_memory", lambda: [Device("CUDA0", "gpu", card, 2 * card)])
    cfg = EngineConfig(model_path=str(tiny_moe), n_parallel=1, type_k="f32", type_v="f32", fit_target=0, fit_ctx=1024,
                       n_gpu_layers_auto=True)
    fitted, plan = fitting.fit_settings(cfg, on_gpu=True)
    assert plan.fits and plan.n_cpu_moe == 3 and fitted.n_gpu_layers == 5 and fitted.n_ctx == 0
    assert fitted.placement.tensor_overrides == placement.expert_overrides(3)
    assert cfg.placement.tensor_overrides == ()  # the caller's settings are not changed
    too_big = EngineConfig(model_path=str(tiny_moe), n_parallel=1, type_k="f32", type_v="f32", fit_target=0,
                           n_ctx=4096, n_gpu_layers=-1, placement=Placement(tensor_overrides=placement.expert_overrides(None)))
    with pytest.raises(fitting.CannotFit, match=r"does not fit CUDA0 with a margin of 0 MiB.*context of 4096"):
        fitting.fit_settings(too_big, on_gpu=True)
    off = dataclasses.replace(too_big, fit=False)
    assert fitting.fit_settings(off, on_gpu=True) == (off, None)  # --fit off: loaded as set


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    from warmslot.slots.fitting.gguf_tensors import NotGGUF, tensor_sizes

    path = tmp_path / "x.gguf"
    path.write_bytes(b"not a model at all, just some bytes")
    with pytest.raises(NotGGUF):
        tensor_sizes(path)
