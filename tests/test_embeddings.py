"""Embeddings on their own context: each pooling equals llama.cpp's per-token vectors pooled
by hand, and several inputs in one request give the vectors each gives alone."""

import numpy as np
import pytest

from warmslot.slots.embeddings import Embedder, InputTooLong, choose_pooling
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api.embedding import EmbeddingContext
from tests.helpers import random_tokens

pytestmark = pytest.mark.model

POOL = {"mean": lambda rows: rows.mean(axis=0), "cls": lambda rows: rows[0], "last": lambda rows: rows[-1]}


@pytest.fixture(scope="module", params=["attention", "default"])
def model(request, tiny_models, default_model):
    path = default_model if request.param == "default" else tiny_models[request.param]
    m = Model(str(path), n_gpu_layers=0)
    yield m
    m.close()


def _inputs(model) -> list[list[int]]:
    if model.info.arch.startswith("gemma"):
        texts = ["The cat sat on the mat.", "Embeddings map text to vectors", "hello"]
        return [model.tokenize(t, add_special=True) for t in texts]
    return [random_tokens(s, n) for s, n in ((1, 30), (2, 7), (3, 55))]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_vectors_equal_llama_cpp_token_vectors_pooled(model, pooling):
    inputs = _inputs(model)
    raw = EmbeddingContext(model, n_ctx=256, n_seq=1, pooling="none", n_threads=2, flash_attn="off")
    try:
        expected = []
        for tokens in inputs:
            v = POOL[pooling](raw.per_token(tokens).astype(np.float64))
            expected.append(v / np.linalg.norm(v))
    finally:
        raw.close()
    embedder = Embedder(model, pooling=pooling, n_ctx=256, n_threads=2)
    try:
        assert embedder.pooling == pooling
        got = embedder.embed(inputs).result(60)
        alone = [embedder.embed([t]).result(60)[0] for t in inputs]
    finally:
        embedder.close()
    for g, a, e in zip(got, alone, expected):
        assert g.shape == (embedder.n_embd,) and abs(np.linalg.norm(g) - 1) < 1e-5
        assert np.abs(g - e).max() < 1e-4  # llama.cpp's own pooling of the same vectors
        assert np.array_equal(g, a)  # several in one request == one by one


def test_an_input_longer_than_the_context_is_refused(model):
    embedder = Embedder(model, pooling="mean", n_ctx=64, n_threads=2)
    try:
        assert embedder.n_ctx == 64
        assert len(embedder.embed([random_tokens(9, 64)]).result(60)) == 1
        with pytest.raises(InputTooLong):
            embedder.embed([random_tokens(9, 10), random_tokens(9, 65)])
    finally:
        embedder.close()


def test_auto_pooling_is_mean_for_a_generative_model(default_model):
    m = Model(str(default_model), n_gpu_layers=0, vocab_only=True)
    try:
        assert choose_pooling(m, "auto") == "mean"
        assert choose_pooling(m, "last") == "last"
    finally:
        m.close()


def _rss_mib() -> float:
    import os

    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_2000_token_input_keeps_memory_bounded(default_model):
    """A generative model computes logits for every output token: 2,000 tokens of Gemma's
    262k vocabulary once took 4 GB of buffers, kept for the context's life."""
    m = Model(str(default_model), n_gpu_layers=0)
    embedder = Embedder(m, pooling="mean", n_ctx=2048, n_threads=2)
    try:
        before = _rss_mib()
        (vector,) = embedder.embed([random_tokens(5, 2000)]).result(300)
        grown = _rss_mib() - before
        assert grown < 600, grown  # MiB: the chunks' buffers, not 4 GB
        assert embedder.memory_bytes < 1 << 30
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
    finally:
        embedder.close()
        m.close()


def test_a_long_input_in_chunks_equals_llama_cpp_token_vectors_pooled(default_model):
    m = Model(str(default_model), n_gpu_layers=0)
    tokens = random_tokens(6, 300)  # several chunks
    raw = EmbeddingContext(m, n_ctx=512, n_seq=1, pooling="none", n_threads=2, flash_attn="off")
    try:
        expected = raw.per_token(tokens).astype(np.float64).mean(axis=0)
    finally:
        raw.close()
    embedder = Embedder(m, pooling="mean", n_ctx=512, n_threads=2)
    try:
        (got,) = embedder.embed([tokens]).result(120)
    finally:
        embedder.close()
        m.close()
    assert np.abs(got - expected / np.linalg.norm(expected)).max() < 1e-3
