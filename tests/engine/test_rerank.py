"""Reranking (--reranking): llama.cpp's rank pooling scores each (query, document) pair, and
/rerank answers in Jina's and TEI's shapes, best first, with clear errors."""

import httpx
import numpy as np
import pytest

from warmslot.slots.engine.embedding_worker import InputTooLong, Reranker
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api.embedding import EmbeddingContext
from tests.helpers import THREADS, warmslot_server

pytestmark = pytest.mark.model

DOCS = ["a cat on a mat", "the stock market fell", "cats purr and sleep", "a recipe for bread"]


@pytest.fixture(scope="module")
def model(tiny_models):
    m = Model(str(tiny_models["attention"]), n_gpu_layers=0)
    yield m
    m.close()


def test_scores_are_the_last_hidden_state_of_each_pair(model):
    """Without a classifier head, llama.cpp's rank pooling of a causal model is the pair's last
    token's hidden state; the score is its first value, alone or with other pairs in a request."""
    reranker = Reranker(model, n_ctx=256, n_threads=THREADS)
    raw = EmbeddingContext(model, n_ctx=256, n_seq=1, pooling="none", n_threads=THREADS)
    try:
        pairs = [reranker.prompt(model, "cats", doc) for doc in DOCS]
        assert not reranker.together  # no classifier: a decode per pair
        together = reranker.score(pairs).result(60)
        alone = [reranker.score([p]).result(60)[0] for p in pairs]
        expected = [float(raw.per_token(p)[-1][0]) for p in pairs]
        with pytest.raises(InputTooLong):
            reranker.score([[1] * 300])
    finally:
        raw.close()
        reranker.close()
    assert np.allclose(alone, expected, atol=1e-4)
    assert np.allclose(together, alone, atol=1e-2)
    assert len(set(np.round(alone, 4))) == len(DOCS)  # the documents are told apart


def test_pair_prompt_puts_query_then_document_between_special_tokens(model):
    reranker = Reranker(model, n_ctx=64, n_threads=THREADS)
    try:
        q, d = model.tokenize("cats"), model.tokenize("a cat on a mat")
        tokens = reranker.prompt(model, "cats", "a cat on a mat")
    finally:
        reranker.close()
    head = [model.bos] if model.add_bos else []
    assert tokens[: len(head) + len(q)] == head + q
    assert tokens[-len(d) - (1 if model.add_eos else 0):][: len(d)] == d


@pytest.fixture(scope="module")
def server(tiny_models):
    proc = warmslot_server(tiny_models["attention"], "-c", "512", "--reranking")
    yield proc
    proc.stop()


def test_rerank_orders_by_score_and_cuts_at_top_n(server):
    r = httpx.post(f"{server.url}/v1/rerank", json={"query": "cats", "documents": DOCS}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    scores = [x["relevance_score"] for x in body["results"]]
    assert sorted(x["index"] for x in body["results"]) == [0, 1, 2, 3] and scores == sorted(scores, reverse=True)
    tokens = [httpx.post(f"{server.url}/tokenize", json={"content": t}).json()["tokens"] for t in ("cats", *DOCS)]
    specials = body["usage"]["prompt_tokens"] - len(DOCS) * len(tokens[0]) - sum(len(t) for t in tokens[1:])
    assert specials % len(DOCS) == 0 and 0 <= specials // len(DOCS) <= 4  # BOS, EOS, SEP, EOS at most

    top = httpx.post(f"{server.url}/rerank", json={"query": "cats", "documents": [{"text": d} for d in DOCS], "top_n": 2,
                                                   "return_documents": True}).json()
    assert top["results"] == [{**x, "document": {"text": DOCS[x["index"]]}} for x in body["results"][:2]]

    tei = httpx.post(f"{server.url}/reranking", json={"query": "cats", "texts": DOCS, "return_text": True}).json()
    assert [x["index"] for x in tei] == [x["index"] for x in body["results"]]
    assert all(x["text"] == DOCS[x["index"]] and x["score"] == pytest.approx(y["relevance_score"])
               for x, y in zip(tei, body["results"]))


@pytest.mark.parametrize("body,param", [
    ({"query": "cats", "documents": []}, "documents"),
    ({"query": "cats", "documents": None}, "documents"),
    ({"query": "cats", "documents": 123}, "documents"),
    ({"query": "cats", "documents": [1, 2]}, "documents[0]"),
    ({"documents": DOCS}, "query"),
    ({"query": "cats", "documents": DOCS, "top_n": -1}, "top_n"),
    ({"query": "cats", "documents": ["word " * 600]}, "documents[0]"),
])
def test_bad_rerank_requests_get_a_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/rerank", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert httpx.post(f"{server.url}/rerank", json={"query": "q", "documents": ["d"]}).status_code == 200


def test_rerank_without_the_flag_is_501(tiny_models):
    proc = warmslot_server(tiny_models["attention"], "-c", "256")
    try:
        r = httpx.post(f"{proc.url}/rerank", json={"query": "q", "documents": ["d"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"], r.text
        assert httpx.get(f"{proc.url}/health").status_code == 200
    finally:
        proc.stop()
