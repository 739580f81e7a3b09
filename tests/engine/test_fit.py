"""--fit as a pure function of sizes: a 30B-A3B-shaped model on 24 GB and 16 GB cards, what the
user set kept, the capacity answer, and the flags that feed it."""

import pytest

from warmslot.server.process.config import parse_config
from warmslot.slots import placement
from warmslot.slots.fitting.fit import FitRequest, ModelSizes, device_bytes, fit, headroom

GIB, MIB = 1 << 30, 1 << 20
Q4_0 = 18 / 32  # bytes per weight


def qwen3_30b_a3b_tensors() -> dict[str, int]:
    """The tensor table of Qwen3-30B-A3B at Q4_0: E 2048, 48 layers, 32 heads / 4 KV heads of
    128, 128 experts of 768, vocabulary 151,936 (about 17 GB)."""
    E, heads, kv, hd, n_exp, ff, vocab = 2048, 32, 4, 128, 128, 768, 151936
    t = {"token_embd.weight": int(E * vocab * Q4_0), "output.weight": int(E * vocab * Q4_0), "output_norm.weight": E * 4}
    for il in range(48):
        b = f"blk.{il}"
        t |= {
            f"{b}.attn_norm.weight": E * 4, f"{b}.ffn_norm.weight": E * 4,
            f"{b}.attn_q.weight": int(E * heads * hd * Q4_0), f"{b}.attn_k.weight": int(E * kv * hd * Q4_0),
            f"{b}.attn_v.weight": int(E * kv * hd * Q4_0), f"{b}.attn_output.weight": int(heads * hd * E * Q4_0),
            f"{b}.attn_q_norm.weight": hd * 4, f"{b}.attn_k_norm.weight": hd * 4,
            f"{b}.ffn_gate_inp.weight": E * n_exp * 4,
            f"{b}.ffn_gate_exps.weight": int(E * ff * n_exp * Q4_0), f"{b}.ffn_up_exps.weight": int(E * ff * n_exp * Q4_0),
            f"{b}.ffn_down_exps.weight": int(ff * E * n_exp * Q4_0),
        }
    return t


SIZES = ModelSizes.from_tensors(qwen3_30b_a3b_tensors(), 48)
KV_PER_TOKEN = 48 * 4 * 128 * 2 * 2  # f16 K and V of every layer: 96 KiB


def request(free_gib: float, **kw) -> FitRequest:
    args = dict(free_bytes=(int(free_gib * GIB),), margin_bytes=1024 * MIB, n_parallel=3, n_ctx_train=262144,
                kv_bytes_per_token=KV_PER_TOKEN, fixed_bytes=512 * MIB)
    return FitRequest(**(args | kw))


def test_tensor_table_is_split_into_layers_experts_output_and_input():
    assert SIZES.n_layer == 48 and SIZES.is_moe
    assert SIZES.expert_bytes[0] == 3 * int(2048 * 768 * 128 * Q4_0)
    assert SIZES.input_bytes == int(2048 * 151936 * Q4_0)
    assert 16 * GIB < SIZES.total_bytes < 18 * GIB
    assert sum(SIZES.expert_bytes) > 0.9 * SIZES.total_bytes


def test_24gb_card_gets_all_layers_and_the_largest_context_that_fits():
    plan = fit(SIZES, request(23.5))
    assert plan.fits and plan.n_cpu_moe == 0 and plan.n_gpu_layers == 49
    assert 4096 < plan.n_ctx < 262144 and plan.n_ctx % (3 * 256) == 0
    assert plan.device_bytes <= plan.budget_bytes == int(23.5 * GIB) - 1024 * MIB
    # one granule more per slot would not fit
    assert device_bytes(SIZES, request(23.5), plan.n_ctx + 3 * 256, 0, 49) > plan.budget_bytes
    assert plan.changed == (f"context {plan.n_ctx} (the model was trained on 262144)",)


def test_16gb_card_keeps_the_fewest_layers_experts_in_ram_at_the_smallest_context():
    plan = fit(SIZES, request(15.5))
    assert plan.fits and plan.n_ctx == 4096 and plan.n_gpu_layers == 49
    assert 0 < plan.n_cpu_moe < 48
    # one layer fewer in RAM would not fit: the fewest
    assert device_bytes(SIZES, request(15.5), 4096, plan.n_cpu_moe - 1, 49) > plan.budget_bytes
    assert len(plan.changed) == 2 and "experts" in plan.changed[1]


def test_experts_the_user_placed_are_kept_and_the_context_grows_into_the_room():
    plan = fit(SIZES, request(15.5, n_cpu_moe=48))
    assert plan.fits and plan.n_cpu_moe == 48 and plan.n_ctx > 65536
    assert not any("experts" in c for c in plan.changed)


def test_dense_layers_leave_the_device_when_experts_are_not_enough():
    plan = fit(SIZES, request(2.5))
    assert plan.fits and plan.n_cpu_moe == 48 and plan.n_gpu_layers < 49
    assert "layers on the devices" in plan.changed[-1]


def test_what_the_user_set_is_never_shrunk_and_a_misfit_is_reported():
    plan = fit(SIZES, request(23.5, n_ctx=262144, n_gpu_layers=-1, n_cpu_moe=0))
    assert not plan.fits and plan.n_ctx == 262144 and plan.n_gpu_layers == 49 and plan.n_cpu_moe == 0
    assert plan.changed == ()
    assert "context of 262144" in plan.explain()
    # the user's context is kept; only the unset experts move
    plan = fit(SIZES, request(23.5, n_ctx=131072))
    assert plan.fits and plan.n_ctx == 131072 and plan.n_cpu_moe > 0


def test_margin_is_per_device():
    one = fit(SIZES, request(23.5))
    two = fit(SIZES, request(0, free_bytes=(int(11.75 * GIB), int(11.75 * GIB))))
    assert two.budget_bytes == one.budget_bytes - 1024 * MIB
    assert two.n_ctx < one.n_ctx


def test_capacity_answer_with_the_margin():
    # a 24 GB card after loading: 2 GiB free, 6 GiB of KV held for 3 slots of 21,845 tokens
    answer = headroom(where="device memory", free_bytes=2 * GIB, state_bytes=6 * GIB, margin_bytes=1536 * MIB,
                      kv_bytes_per_token=KV_PER_TOKEN, state_bytes_per_slot=0, n_slots=3, n_ctx_slot=16384,
                      n_ctx_train=262144, cache_ram_bytes=32 * GIB)
    budget = 8 * GIB - 1536 * MIB
    assert answer.budget_bytes == budget
    assert answer.max_ctx_slot == budget // 3 // KV_PER_TOKEN // 256 * 256
    assert answer.max_slots == budget // (16384 * KV_PER_TOKEN) == 4
    assert "1.50 GiB" in answer.describe() and answer.to_json()["cache_ram_bytes"] == 32 * GIB
    # recurrent state is a fixed cost per slot
    hybrid = headroom(where="RAM", free_bytes=4 * GIB, state_bytes=0, margin_bytes=GIB, kv_bytes_per_token=None,
                      state_bytes_per_slot=GIB, n_slots=2, n_ctx_slot=4096, n_ctx_train=8192, cache_ram_bytes=0)
    assert hybrid.max_slots == 3 and hybrid.max_ctx_slot == 8192


def test_expert_patterns_are_llama_servers():
    assert placement.expert_overrides(None) == ((r"\.ffn_(up|down|gate)_exps", "CPU"),)
    assert placement.expert_overrides(2) == ((r"blk\.0\.ffn_(up|down|gate)_exps", "CPU"),
                                             (r"blk\.1\.ffn_(up|down|gate)_exps", "CPU"))
    assert placement.parse_tensor_overrides(r"exps=CPU, blk\.1\.=CUDA0") == (("exps", "CPU"), (r"blk\.1\.", "CUDA0"))
    for bad in ("exps", "=CPU", "exps=", "ex(ps=CPU"):
        with pytest.raises(ValueError):
            placement.parse_tensor_overrides(bad)


def test_flags_build_the_overrides_in_order_and_the_fit_settings():
    config, _ = parse_config(["-ot", "attn_q=CPU", "--n-cpu-moe", "1", "-ot", "a=CPU,b=CPU", "--cpu-moe"])
    e = config.engine
    assert e.placement.tensor_overrides == (
        ("attn_q", "CPU"), ("a", "CPU"), ("b", "CPU"), (r"\.ffn_(up|down|gate)_exps", "CPU"),
        (r"blk\.0\.ffn_(up|down|gate)_exps", "CPU"),
    )
    assert e.fit and e.fit_target == 1024 * MIB and e.fit_ctx == 4096 and e.n_gpu_layers_auto and e.n_gpu_layers == -1
    config, _ = parse_config(["--fit", "off", "--fit-target", "1536", "--fit-ctx", "8192", "-ngl", "20"])
    e = config.engine
    assert not e.fit and e.fit_target == 1536 * MIB and e.fit_ctx == 8192
    assert e.n_gpu_layers == 20 and not e.n_gpu_layers_auto
    for bad in (["--fit", "maybe"], ["-ot", "exps"], ["--n-cpu-moe", "-1"]):
        with pytest.raises(SystemExit):
            parse_config(bad)
