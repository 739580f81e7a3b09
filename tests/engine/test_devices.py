"""Placement on devices: llama-server's -sm, -ts, -mg, -dev, --list-devices and --rpc, the
model parameters they set, and the bytes each device holds.

A CPU machine has no GPU to split over: these tests check the listing against ggml's device
registry, the parsing, what lands in `llama_model_params`, that a model loads with a
placement, and the per-device bytes. RPC: the llama-cpp-python that `pip install` builds has
no RPC backend, so `--rpc` must refuse clearly; a build with it (scripts/build_rpc.sh) runs
a real round trip through an RPC server on loopback instead.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import time

import llama_cpp
import pytest

from scripts.server_process import REPO_ROOT, free_port
from tests.helpers import generate, random_tokens, tiny_engine
from warmslot.slots.fitting.capacity import DeviceMemory, device_memory
from warmslot.slots.llama_api.native_log import NativeLog, record_buffers
from warmslot.server.process.config import parse_config
from warmslot.slots.llama_api import LlamaError, Model, Placement, devices, placement

SERVER = [sys.executable, "-m", "warmslot.server"]


def test_list_devices_prints_every_offload_device_and_exits():
    """llama-server's format: one line per device but the CPU (on a CPU-only build: none)."""
    out = subprocess.run([*SERVER, "--list-devices"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "Available devices:"
    expected = [d.name for d in devices() if d.kind != "cpu"]  # the registry, read on its own
    if expected:
        assert [line.split(":")[0].strip() for line in lines[1:]] == expected
        assert all(line.endswith(" MiB free)") for line in lines[1:])
    else:
        assert lines[1:] == ["  (none)"]
    # from the environment too, and it listens on nothing: its port may be taken by another server
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        by_env = subprocess.run(SERVER, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                                env={**os.environ, "WARMSLOT_LIST_DEVICES": "1", "WARMSLOT_PORT": port})
    assert by_env.returncode == 0 and by_env.stdout == out.stdout, by_env.stderr


@pytest.mark.parametrize("text, expected", [
    ("3,1", (3.0, 1.0)), ("3/1", (3.0, 1.0)), ("1, 0, 2.5", (1.0, 0.0, 2.5)), ("1", (1.0,)),
])
def test_tensor_split_parses_like_llama_server(text, expected):
    config, _ = parse_config(["-ts", text])
    assert config.engine.placement.tensor_split == expected


@pytest.mark.parametrize("args", [
    ["-ts", "a,b"], ["-ts", "0,0"], ["-ts", "1,nan"], ["-ts", ",".join(["1"] * (placement.MAX_DEVICES + 1))],
    ["-ts=-1,2"], ["-sm", "rows"], ["-mg", "-1"], ["-dev", "none,CUDA0"], ["--rpc", "host-without-port"],
    ["--rpc", "h:0"],
])
def test_bad_placement_flags_are_refused(args, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(args)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_placement_flags_and_environment(monkeypatch):
    config, _ = parse_config(["-sm", "row", "-mg", "1", "-dev", "CUDA0, CUDA1", "--rpc", "10.0.0.2:50052,[::1]:50052"])
    assert config.engine.placement == Placement("row", 1, (), ("CUDA0", "CUDA1"), ("10.0.0.2:50052", "[::1]:50052"))
    assert parse_config(["-dev", "none"])[0].engine.placement.devices == ()
    assert parse_config([])[0].engine.placement == Placement()  # llama.cpp's defaults: layer, GPU 0, all devices
    monkeypatch.setenv("WARMSLOT_TENSOR_SPLIT", "2,1")
    monkeypatch.setenv("WARMSLOT_SPLIT_MODE", "none")
    spread = parse_config([])[0].engine.placement
    assert (spread.split_mode, spread.tensor_split) == ("none", (2.0, 1.0))


def test_placement_lands_in_the_model_params():
    params = llama_cpp.llama_model_default_params()
    keep = placement.PlacementParams(Placement(split_mode="row", main_gpu=1, tensor_split=(3.0, 1.0), devices=()))
    keep.apply(params)
    assert (params.split_mode, params.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_ROW, 1)
    assert [params.tensor_split[i] for i in range(placement.MAX_DEVICES)] == [3.0, 1.0] + [0.0] * (placement.MAX_DEVICES - 2)
    assert ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p))[0] is None  # -dev none: an empty list
    default = llama_cpp.llama_model_default_params()
    placement.PlacementParams(Placement()).apply(default)
    assert not default.tensor_split and not default.devices  # NULL: llama.cpp's own choice
    assert default.split_mode == llama_cpp.LLAMA_SPLIT_MODE_LAYER


def test_unknown_device_names_the_ones_there_are(tiny_models):
    with pytest.raises(LlamaError, match=r"no device 'CUDA7' to offload to \(--list-devices shows: "):
        Model(str(tiny_models["attention"]), placement=Placement(devices=("CUDA7",)))


def test_a_placement_loads_and_state_bytes_by_device(tiny_models):
    """On the CPU a split changes nothing but must load and generate as without one; the
    state bytes by device are what the KV cache takes."""
    prompt = random_tokens(3, 40)
    plain = tiny_engine(tiny_models["attention"])
    try:
        expected = generate(plain, prompt).tokens
    finally:
        plain.stop()
    engine = tiny_engine(tiny_models["attention"], placement=Placement(split_mode="none", tensor_split=(3.0, 1.0), devices=()))
    try:
        assert generate(engine, prompt).tokens == expected
        info = engine.info
        state = sum(d.state_bytes for d in info.device_memory)
        assert abs(state - info.n_ctx * info.kv_bytes_per_token) <= 0.01 * (1 << 20)  # logged to 0.01 MiB
        assert sum(d.model_bytes for d in info.device_memory) > 0
    finally:
        engine.stop()


def test_device_memory_sums_llama_cpp_buffer_lines_by_device():
    lines = [
        "load_tensors:        CUDA0 model buffer size =  6000.50 MiB",
        "load_tensors:   CPU_Mapped model buffer size =   300.00 MiB",
        "llama_kv_cache:        CUDA0 KV buffer size =   512.00 MiB",
        "llama_kv_cache:        CUDA1 KV buffer size =   256.00 MiB",
        "llama_memory_recurrent:        CUDA1 RS buffer size =    12.25 MiB",
        "llama_kv_cache:        CUDA0 KV buffer size =    64.00 MiB",  # a sliding-window model's second cache
        "sched_reserve:        CUDA0 compute buffer size =   100.00 MiB",
    ]
    mib = 1 << 20
    native = NativeLog()
    with record_buffers() as found:  # what the loader records while the model and context are made
        for line in lines:
            native.write(2, line + "\n")
    assert device_memory(found) == (
        DeviceMemory("CUDA0", int(6000.5 * mib), 576 * mib),
        DeviceMemory("CPU_Mapped", 300 * mib, 0),
        DeviceMemory("CUDA1", 0, int(268.25 * mib)),
    )


def test_rpc_round_trip_or_a_clear_refusal(tiny_models, tmp_path):
    if not placement.supports_rpc():
        out = subprocess.run([*SERVER, "--rpc", "127.0.0.1:50052"], capture_output=True, text=True, timeout=120,
                             cwd=REPO_ROOT)
        assert out.returncode == 2 and "-DGGML_RPC=on" in out.stderr
        with pytest.raises(LlamaError, match="GGML_RPC=on"):
            placement.add_rpc_servers(["127.0.0.1:50052"])
        return
    rpc_round_trip(tiny_models["attention"], tmp_path)


def rpc_round_trip(model, tmp_path) -> None:
    """The model on an RPC server's device: same tokens as on the local CPU, and states saved
    to the prompt cache and restored through RPC give the same answer."""
    endpoint = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "rpc.log", "w")
    server = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "rpc_server.py"), endpoint],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_listening(endpoint)
        a, b = random_tokens(5, 60), random_tokens(6, 60)
        local = tiny_engine(model)
        try:
            expected = [generate(local, p).tokens for p in (a, b, a + [10, 11, 12])]
        finally:
            local.stop()
        engine = tiny_engine(model, placement=Placement(rpc_servers=(endpoint,)))
        try:
            got = [generate(engine, p) for p in (a, b, a + [10, 11, 12])]  # -np 1: a goes to RAM, comes back
            assert [r.tokens for r in got] == expected
            assert got[2].reuse.source.value == "ram"
            assert any(d.device.startswith("RPC") and d.state_bytes > 0 for d in engine.info.device_memory)
        finally:
            engine.stop()
    finally:
        server.kill()
        server.wait(10)
        log.close()


def _wait_listening(endpoint: str, timeout: float = 30.0) -> None:
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"no RPC server on {endpoint}")


def test_auto_flash_attention_is_off_on_the_cpu(tiny_models, monkeypatch):
    """On the CPU, "auto" turns flash attention off (it decodes slower there at depth, and its
    sums move a cache hit further from a cold run), sliding-window models included, unless
    the V cache is quantized (which needs it) or the attention scores would take too much RAM;
    a setting given is kept, and a GPU leaves "auto" to llama.cpp. The state fingerprint names
    the choice: without it llama.cpp stores V transposed, so saved states differ."""
    from warmslot.slots import EngineConfig
    from warmslot.slots.engine import loader

    monkeypatch.setattr(loader, "physical_memory", lambda: 16 << 30)
    cfg = EngineConfig(model_path="m.gguf")
    assert loader.flash_attn_setting(cfg, 32, False, 32768) == "off"  # 512 x 32768 x 32 floats: 2 GiB of 16
    assert loader.flash_attn_setting(cfg, 32, False, 131072) == "auto"  # 8 GiB: too much
    assert loader.flash_attn_setting(cfg, 32, True, 32768) == "auto"
    assert loader.flash_attn_setting(EngineConfig(model_path="m.gguf", type_v="q8_0"), 32, False, 4096) == "auto"
    assert loader.flash_attn_setting(EngineConfig(model_path="m.gguf", flash_attn="on"), 32, False, 4096) == "on"
    monkeypatch.undo()
    for name in ("attention", "swa"):
        engine = tiny_engine(tiny_models[name], flash_attn="auto")
        try:
            assert ":fa-off:" in engine.info.state_fingerprint
            prompt = random_tokens(3, 20)
            assert len(generate(engine, prompt, max_tokens=4).tokens) == 4
        finally:
            engine.stop()


def test_one_pool_that_keeps_idle_conversations_warns_on_the_cpu_without_flash_attention(tiny_models, caplog):
    """One pool with --cache-vram keeps idle conversations' cells where every step's attention
    spans them; without flash attention the CPU multiplies each of those cells, and the server
    says so at load. With flash attention, or with a stream per slot, it does not."""
    import logging

    warning = "one KV pool that keeps idle conversations"
    cases = (
        (dict(kv_unified="on", cache_vram=1 << 20, flash_attn="off"), True),
        (dict(kv_unified="on", cache_vram=1 << 20, flash_attn="on"), False),
        (dict(kv_unified="off", flash_attn="off"), False),
    )
    for overrides, warns in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            engine = tiny_engine(tiny_models["attention"], n_parallel=2, **overrides)
            try:
                n_spare = engine.call(lambda e: e.loaded.layout.n_spare).result()
                assert len(generate(engine, random_tokens(4, 20), max_tokens=2).tokens) == 2
            finally:
                engine.stop()
        assert (n_spare > 0) is (overrides["kv_unified"] == "on")
        assert (warning in caplog.text) is warns, overrides
