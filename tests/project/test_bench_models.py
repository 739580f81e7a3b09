"""scripts/bench_models.py writes models that llama.cpp loads and runs as the real shapes.

Every model is written at ``--scale tiny`` with few layers (real tokenizer, template, layer
pattern and head dimensions; small widths), loaded with llama.cpp and decoded for a few
tokens. The real sizes are only planned (no file is written). The tokenizer is llama.cpp's
``ggml-vocab-qwen35.gguf``, from the pinned llama-cpp-python sdist (the `qwen35_vocab` fixture).
"""

import ctypes
import pathlib
import struct

import llama_cpp
import numpy as np
import pytest

from scripts import bench_models
from warmslot.slots import model_params

pytestmark = pytest.mark.model

# few layers, but each pattern present: qwen35 3 DeltaNet + 1 attention, gemma3 5 SWA + 1 global
LAYERS = {"qwen3-8b": 2, "qwen3-0.6b": 2, "qwen35-27b": 4, "qwen35-9b": 4, "gemma3-4b": 6, "gemma3-270m": 6, "qwen3-30b-a3b": 2}
ARCH = {"qwen3-8b": "qwen3", "qwen3-0.6b": "qwen3", "qwen35-27b": "qwen35", "qwen35-9b": "qwen35", "gemma3-4b": "gemma3", "gemma3-270m": "gemma3", "qwen3-30b-a3b": "qwen3moe"}
N_GEN = 32
PROMPT = "<|im_start|>user\nTell me about lighthouses.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def vocab_path(qwen35_vocab) -> pathlib.Path:
    return qwen35_vocab


@pytest.fixture(scope="module")
def models(vocab_path, tmp_path_factory) -> dict[str, pathlib.Path]:
    out = tmp_path_factory.mktemp("bench-models")
    return {
        name: bench_models.write_bench_model(name, out / f"{name}.gguf", vocab_path, scale="tiny",
                                             layers=LAYERS[name], quiet=True)
        for name in bench_models.MODELS
    }


def _load(path: pathlib.Path, *, vocab_only: bool = False):
    mparams = model_params()
    mparams.vocab_only = vocab_only
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    assert model, f"failed to load {path}"
    return model


def _meta(model, key: str) -> str:
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    assert n >= 0, f"no {key}"
    return buf.value.decode()


def _tokenize(model, text: str, add_special: bool) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), add_special, True)
    assert n >= 0
    return list(buf[:n])


@pytest.fixture(scope="module")
def vocab_model(vocab_path):
    model = _load(vocab_path, vocab_only=True)
    yield model
    llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("name", list(LAYERS))
def test_loads_and_decodes(name, models, vocab_model):
    model = _load(models[name])
    try:
        assert _meta(model, "general.architecture") == ARCH[name]
        assert llama_cpp.llama_model_n_layer(model) == LAYERS[name]
        assert bool(llama_cpp.llama_model_is_hybrid(model)) == (ARCH[name] == "qwen35")
        assert not llama_cpp.llama_model_is_recurrent(model)
        n_swa = llama_cpp.llama_model_n_swa(model)
        if ARCH[name] == "gemma3":
            assert n_swa == bench_models.TINY[name]["sliding_window"]
        else:
            assert n_swa == 0

        # the tokenizer and chat template of the vocab file
        template = llama_cpp.llama_model_chat_template(model, None)
        assert template and template == llama_cpp.llama_model_chat_template(vocab_model, None)
        assert b"<|im_start|>" in template
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_n_tokens(vocab) == llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(vocab_model))
        for add_special in (False, True):
            tokens = _tokenize(model, "Hello world", add_special)
            assert tokens == _tokenize(vocab_model, "Hello world", add_special)
            assert len(tokens) >= 2
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 256
        cparams.n_batch = 64
        cparams.n_ubatch = 64
        cparams.n_threads = 1
        cparams.n_threads_batch = 1
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        assert ctx
        batch = llama_cpp.llama_batch_init(64, 0, 1)
        try:
            def decode(tokens: list[int], pos0: int) -> np.ndarray:
                for i, tok in enumerate(tokens):
                    batch.token[i] = tok
                    batch.pos[i] = pos0 + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = i == len(tokens) - 1
                batch.n_tokens = len(tokens)
                assert llama_cpp.llama_decode(ctx, batch) == 0
                ptr = llama_cpp.llama_get_logits_ith(ctx, len(tokens) - 1)
                return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

            prompt = _tokenize(model, PROMPT, False)
            logits = decode(prompt, 0)
            out = []
            for i in range(N_GEN):
                assert np.isfinite(logits).all(), f"non-finite logits at step {i}"
                tok = int(np.argmax(logits))
                assert not llama_cpp.llama_vocab_is_control(vocab, tok)
                out.append(tok)
                logits = decode([tok], len(prompt) + i)
            assert len(set(out)) > N_GEN // 2, out
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)


def test_planned_size_matches_file(models, vocab_path):
    """The dry run's size is the written file's size, to the byte."""
    for name, path in models.items():
        s = bench_models.resolve_shape(name, "tiny", LAYERS[name])
        v = bench_models.read_vocab(vocab_path)
        meta, data = bench_models.plan_size(s, v, "tiny", bench_models.tensor_plan(s, v.n_vocab))
        assert meta + data == path.stat().st_size, name


def test_kept_when_up_to_date_else_rewritten(models, vocab_path, tmp_path, capsys):
    path = tmp_path / "m.gguf"
    bench_models.write_bench_model("qwen3-8b", path, vocab_path, scale="tiny", layers=1)
    first = path.read_bytes()
    capsys.readouterr()
    bench_models.write_bench_model("qwen3-8b", path, vocab_path, scale="tiny", layers=1)
    assert "kept" in capsys.readouterr().out
    assert path.read_bytes() == first
    bench_models.write_bench_model("qwen3-8b", path, vocab_path, scale="tiny", layers=2)
    assert "layers\": 2" in bench_models.read_spec(path)
    assert not path.with_name(path.name + ".partial").exists()


def test_fallback_template(vocab_path, tmp_path):
    """A vocab file without a chat template gets FALLBACK_CHAT_TEMPLATE (ChatML with tools)."""
    entries = [kv.raw for key, kv in bench_models.read_kv(vocab_path).items() if key != "tokenizer.chat_template"]
    bare = tmp_path / "vocab-no-template.gguf"
    bare.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + b"".join(entries))
    out = bench_models.write_bench_model("qwen3-8b", tmp_path / "m.gguf", bare, scale="tiny", layers=1, quiet=True)
    kv = bench_models.read_kv(out)
    assert kv["tokenizer.chat_template"].value.decode() == bench_models.FALLBACK_CHAT_TEMPLATE
    assert kv["tokenizer.ggml.tokens"].raw == bench_models.read_kv(vocab_path)["tokenizer.ggml.tokens"].raw


def test_real_shapes(vocab_path):
    """The real plans: layer patterns, key tensor shapes and the Q4_0 size of Qwen3.5-27B."""
    v = bench_models.read_vocab(vocab_path)
    n_vocab = v.n_vocab

    s = bench_models.resolve_shape("qwen35-27b")
    plan = {t.name: t for t in bench_models.tensor_plan(s, n_vocab)}
    attn = [il for il in range(s.n_layer) if f"blk.{il}.attn_q.weight" in plan]
    assert attn == list(range(3, 64, 4))
    assert plan["blk.3.attn_q.weight"].ne == (5120, 2 * 24 * 256)
    assert plan["blk.3.attn_k.weight"].ne == (5120, 4 * 256)
    assert plan["blk.3.attn_output.weight"].ne == (24 * 256, 5120)
    assert plan["blk.0.attn_qkv.weight"].ne == (5120, 2 * 16 * 128 + 48 * 128)
    assert plan["blk.0.ssm_out.weight"].ne == (6144, 5120)
    assert plan["blk.0.ssm_norm.weight"].ne == (128,)
    assert plan["blk.0.ffn_down.weight"].ne == (17408, 5120)
    assert plan["output.weight"].ne == (5120, n_vocab)
    data = sum(t.nbytes for t in plan.values())
    assert abs(data / 2**30 - 13.66) < 0.005

    s = bench_models.resolve_shape("qwen3-30b-a3b")
    plan = {t.name: t for t in bench_models.tensor_plan(s, n_vocab)}
    assert plan["blk.0.ffn_gate_exps.weight"].ne == (2048, 768, 128)
    assert plan["blk.0.ffn_down_exps.weight"].ne == (768, 2048, 128)
    assert plan["blk.47.ffn_gate_inp.weight"].ne == (2048, 128)
    assert "blk.0.ffn_gate.weight" not in plan
    data = sum(t.nbytes for t in plan.values())
    assert abs(data / 2**30 - 16.04) < 0.005, data / 2**30

    s = bench_models.resolve_shape("gemma3-4b")
    assert [il for il in range(s.n_layer) if not s.is_swa(il)] == [5, 11, 17, 23, 29]
    s = bench_models.resolve_shape("qwen35-9b", layers=10)
    assert [il for il in range(s.n_layer) if not s.is_recurrent(il)] == [3, 7]


def test_a_qwen35_shape_with_its_mtp_block_drafts(vocab_path, tmp_path):
    """--mtp adds Qwen3.5's MTP block after the last layer: llama.cpp loads it as one MTP
    layer, and an engine with --spec-type draft-mtp drafts from it (random weights: the
    drafts are rejected, the output is the output without them)."""
    from tests.helpers import generate, tiny_engine
    from warmslot.slots import SpecConfig

    path = bench_models.write_bench_model("qwen35-9b", tmp_path / "mtp.gguf", vocab_path, scale="tiny", layers=4,
                                          quiet=True, mtp=True)
    prompt = list(range(1000, 1040))
    outputs = []
    for spec in (SpecConfig(), SpecConfig(type="draft-mtp", n_max=4, p_min=0.0)):
        engine = tiny_engine(path, spec=spec)
        try:
            r = generate(engine, prompt, max_tokens=12)
            if spec.on:
                assert engine.spec.draft_model.mtp.ctx.model.info.arch == "qwen35"
                assert r.usage.draft_tokens > 0
            outputs.append(r.tokens)
        finally:
            engine.stop()
    assert outputs[0] == outputs[1]
    with pytest.raises(ValueError, match="Qwen3.5"):
        bench_models.resolve_shape("qwen3-8b", "tiny", 2, mtp=True)
