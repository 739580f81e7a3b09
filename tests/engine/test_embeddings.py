"""Embeddings on their own context: each pooling equals llama.cpp's per-token vectors pooled
by hand, and several inputs share a decode yet give about the vectors each gives alone."""

import numpy as np
import pytest

from warmslot.slots.engine.embedding_worker import Embedder, InputTooLong, choose_pooling
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api.embedding import EmbeddingContext
from tests.helpers import random_tokens, THREADS

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
    raw = EmbeddingContext(model, n_ctx=256, n_seq=1, pooling="none", n_threads=THREADS, flash_attn="off")
    try:
        expected = []
        for tokens in inputs:
            v = POOL[pooling](raw.per_token(tokens).astype(np.float64))
            expected.append(v / np.linalg.norm(v))
    finally:
        raw.close()
    embedder = Embedder(model, pooling=pooling, n_ctx=256, n_threads=THREADS)
    try:
        assert embedder.pooling == pooling
        got = embedder.embed(inputs).result(60)
        alone = [embedder.embed([t]).result(60)[0] for t in inputs]
    finally:
        embedder.close()
    for g, a, e in zip(got, alone, expected):
        assert g.shape == (embedder.n_embd,) and abs(np.linalg.norm(g) - 1) < 1e-5
        assert np.abs(a - e).max() < 1e-4  # llama.cpp's own pooling of the same vectors
        # several in one decode: other kernel paths move a vector by at most a few 1e-3
        assert np.abs(g - a).max() < 1e-2 and float(g @ a) > 0.999


def test_an_input_longer_than_the_context_is_refused(model):
    embedder = Embedder(model, pooling="mean", n_ctx=64, n_threads=THREADS)
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
    embedder = Embedder(m, pooling="mean", n_ctx=2048, n_threads=THREADS)
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
    raw = EmbeddingContext(m, n_ctx=512, n_seq=1, pooling="none", n_threads=THREADS, flash_attn="off")
    try:
        expected = raw.per_token(tokens).astype(np.float64).mean(axis=0)
    finally:
        raw.close()
    embedder = Embedder(m, pooling="mean", n_ctx=512, n_threads=THREADS)
    try:
        (got,) = embedder.embed([tokens]).result(120)
    finally:
        embedder.close()
        m.close()
    assert np.abs(got - expected / np.linalg.norm(expected)).max() < 1e-3


def test_pooling_none_gives_each_tokens_vector_decoded_in_chunks(default_model):
    m = Model(str(default_model), n_gpu_layers=0)
    tokens = random_tokens(7, 150)  # past one chunk
    whole = EmbeddingContext(m, n_ctx=512, n_seq=1, pooling="none", n_threads=THREADS, flash_attn="off")  # one decode
    try:
        expected = whole.per_token(tokens).astype(np.float64)
    finally:
        whole.close()
    embedder = Embedder(m, pooling="none", n_ctx=512, n_threads=THREADS)
    try:
        (got,) = embedder.embed([tokens]).result(120)
        assert embedder._ctx.decodes == 3  # 64-token chunks
    finally:
        embedder.close()
        m.close()
    assert got.shape == (150, embedder.n_embd)
    assert np.abs(got - expected).max() < 1e-3 * np.abs(expected).max()  # not normalized: llama.cpp's rows


def test_many_short_inputs_share_decodes_and_match_one_by_one(model):
    """2,048 one-word inputs once took 2,048 decodes (past ten minutes); now as many share a
    decode as one batch holds."""
    if model.info.arch.startswith("gemma"):  # words: a random token id can be a rarely trained one
        words = "river stone quiet lantern harbor maple signal copper orbit meadow".split()
        inputs = [model.tokenize(" ".join(words[i % 10 : i % 10 + 1 + i % 3]), add_special=True) for i in range(40)]
    else:
        inputs = [random_tokens(100 + i, 1 + i % 3) for i in range(40)]
    embedder = Embedder(model, pooling="mean", n_ctx=256, n_threads=THREADS)
    try:
        ctx = embedder._ctx
        before = ctx.decodes
        got = embedder.embed(inputs).result(120)
        together = ctx.decodes - before
        alone = [embedder.embed([t]).result(60)[0] for t in inputs[:5]]
    finally:
        embedder.close()
    assert len(got) == len(inputs)
    assert together <= 4, together  # about 120 tokens: two 64-token batches on a causal model, one otherwise
    for g, a in zip(got, alone):
        assert float(g @ a) > 0.999


def test_a_cancelled_request_stops_between_decodes(default_model):
    m = Model(str(default_model), n_gpu_layers=0)
    embedder = Embedder(m, pooling="mean", n_ctx=256, n_threads=THREADS)

    class CancelAfterFirst:
        def __init__(self) -> None:
            self.checks = 0

        def start(self) -> bool:
            return True

        def cancelled(self) -> bool:
            self.checks += 1
            return self.checks > 1

    try:
        before = embedder._ctx.decodes
        out = embedder.embed([random_tokens(7 + i, 60) for i in range(10)], job=CancelAfterFirst()).result(120)
        assert len(out) == 1 and embedder._ctx.decodes - before == 1
    finally:
        embedder.close()
        m.close()
