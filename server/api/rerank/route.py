"""/rerank (also /v1/rerank, /reranking, /v1/reranking): relevance scores (`--reranking`).

Two request shapes, as llama-server takes them:

- Jina's and Cohere's: `query` and `documents` (strings, or objects with a `text`), an
  optional `top_n` and `return_documents`. The reply is an object: `results` of `index` and
  `relevance_score`, best first, with `usage`.
- Text Embeddings Inference's: `query` and `texts`, an optional `top_n` and `return_text`.
  The reply is a list of `index` and `score`, best first.

Each pair is the model's rerank template when its metadata has one, else query and document
between its special tokens (`slots.Reranker.prompt`); `usage.prompt_tokens` counts every pair.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import InputTooLong

from ...errors import InvalidRequest, NotSupported
from ...state import ModelHost, open_request
from ..embeddings.route import MAX_INPUTS

PATHS = ("/rerank", "/v1/rerank", "/reranking", "/v1/reranking")
ENDPOINTS = {path: "rerank" for path in PATHS}  # endpoint labels of warmslot_requests_total


def _documents(body: dict[str, Any]) -> tuple[str, list[str]]:
    """Which field holds the documents, and their texts."""
    field = "texts" if "texts" in body else "documents"
    value = body.get(field)
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'{field}' must be a non-empty array of strings", param=field)
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'{field}' takes at most {MAX_INPUTS} documents", param=field)
    texts = []
    for i, item in enumerate(value):
        if isinstance(item, dict) and field == "documents":
            item = item.get("text")
        if not isinstance(item, str):
            raise InvalidRequest(f"{field}[{i}] must be a string" + (" or an object with a text" if field == "documents" else ""),
                                 param=f"{field}[{i}]")
        texts.append(item)
    return field, texts


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=name)
    return value


async def rerank(request: Request) -> Response:
    host, _key, body = await open_request(request)
    reranker = host.engine.reranker
    if reranker is None:
        raise NotSupported("this server does not rerank; start it with --reranking", code="reranking_disabled")
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidRequest("'query' must be a string", param="query")
    field, texts = _documents(body)
    tei = field == "texts"
    top_n = body.get("top_n")
    if top_n is None:
        top_n = len(texts)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise InvalidRequest("'top_n' must be a non-negative integer", param="top_n")
    with_text = _flag(body, "return_text" if tei else "return_documents")
    deadline = host.server.deadline(None)
    pairs = await host.server.offload(_pairs, host, query, texts, request=request, deadline=deadline)
    try:
        reranker.check(pairs)
        scores = await host.server.embed_queue.run(lambda job: reranker.score(pairs, job=job), request=request, deadline=deadline)
    except InputTooLong as exc:
        raise InvalidRequest(f"{exc}; shorten it, or start the server with a larger --batch-size", param=f"{field}[{exc.index}]") from None
    order = sorted(range(len(texts)), key=lambda i: scores[i], reverse=True)[:top_n]
    if tei:
        return JSONResponse([
            {"index": i, "score": scores[i], **({"text": texts[i]} if with_text else {})} for i in order
        ])
    n_tokens = sum(len(p) for p in pairs)
    return JSONResponse({
        "model": host.model_name,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": [
            {"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}} if with_text else {})}
            for i in order
        ],
    })


def _pairs(host: ModelHost, query: str, texts: list[str]) -> list[list[int]]:
    vocab = host.builder.tokenizer.vocab
    return [host.engine.reranker.prompt(vocab, query, text) for text in texts]
