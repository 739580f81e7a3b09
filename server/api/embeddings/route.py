"""/v1/embeddings: vectors from the embedding context (`--embeddings`).

`input` is a string, an array of strings, an array of token ids, or an array of those
arrays; an input may also be llama-server's `{"content": [text parts]}` (the parts joined).
`encoding_format` is "float" (lists of numbers) or "base64" (little-endian float32
bytes, as OpenAI's clients decode them). Texts are tokenized as /v1/completions tokenizes a
prompt. `usage.prompt_tokens` counts every input's tokens. With `--pooling none`, /embeddings
answers llama-server's array of each input's per-token vectors, and /v1/embeddings refuses.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import InputTooLong

from ...errors import InvalidRequest, NotSupported
from ...state import ModelHost, open_request

MAX_INPUTS = 2048  # as OpenAI limits one request


def _inputs(value: Any, n_vocab: int) -> list[str | list[int]]:
    """The request's inputs, each a text or a list of token ids."""
    def tokens_ok(item: Any) -> bool:
        return isinstance(item, list) and bool(item) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in item
        )

    if isinstance(value, (str, dict)):
        items: list = [value]
    elif tokens_ok(value):
        items = [value]
    elif isinstance(value, list) and value and all(isinstance(v, (str, list, dict)) for v in value):
        items = value
    else:
        raise InvalidRequest(
            "'input' must be a string, an array of strings, an array of token ids or an array of those", param="input"
        )
    items = [_parts_text(item, f"input[{i}]") if isinstance(item, dict) else item for i, item in enumerate(items)]
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'input' takes at most {MAX_INPUTS} inputs", param="input")
    for i, item in enumerate(items):
        if isinstance(item, str) and not item:
            raise InvalidRequest("an input must not be empty", param=f"input[{i}]")
        if isinstance(item, list) and not tokens_ok(item):
            raise InvalidRequest(f"input {i} must be token ids of the vocabulary (0..{n_vocab - 1})", param=f"input[{i}]")
    return items


def _parts_text(item: dict, param: str) -> str:
    """llama-server's multimodal input form, `{"content": [parts]}`: its text parts, joined."""
    parts = item.get("content")
    if not isinstance(parts, list) or not parts:
        raise InvalidRequest("an input object needs 'content', an array of text parts", param=f"{param}.content")
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(f"content part of type {kind!r} is not supported here: send text parts", param=f"{param}.content[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def embeddings(request: Request) -> Response:
    host, _key, body = await open_request(request)
    embedder = host.engine.embedder
    if embedder is None:
        raise NotSupported("this server does not compute embeddings; start it with --embeddings", code="embeddings_disabled")
    per_token = embedder.pooling == "none"
    if per_token and request.url.path.startswith("/v1/"):
        raise InvalidRequest(
            "--pooling none gives a vector per token, which /v1/embeddings cannot return: use /embeddings, "
            "or start the server with another --pooling", param="input", code="pooling_not_supported",
        )
    items = _inputs(body.get("input"), host.engine.info.n_vocab)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be float or base64", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != embedder.n_embd:
        raise InvalidRequest(f"this model's embeddings have {embedder.n_embd} dimensions", param="dimensions")
    deadline = host.server.deadline(None)
    tokens = await host.server.offload(_tokenize, host, items, request=request, deadline=deadline)
    try:
        embedder.check(tokens)
        vectors = await host.server.embed_queue.run(lambda job: embedder.embed(tokens, job=job), request=request, deadline=deadline)
    except InputTooLong as exc:
        raise InvalidRequest(f"{exc}; split it, or start the server with a larger --batch-size", param=f"input[{exc.index}]") from None
    n_tokens = sum(len(t) for t in tokens)
    if per_token:  # llama-server's shape for it: an array, each input's rows
        return JSONResponse([{"index": i, "embedding": m.tolist()} for i, m in enumerate(vectors)])
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(vectors)]
    return JSONResponse({
        "object": "list",
        "data": data,
        "model": host.model_name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    })


def _tokenize(host: ModelHost, items: list[str | list[int]]) -> list[list[int]]:
    out = []
    for i, item in enumerate(items):
        tokens = host.builder.tokenizer.prompt(item) if isinstance(item, str) else list(item)
        if not tokens:
            raise InvalidRequest("the input has no tokens", param=f"input[{i}]")
        out.append(tokens)
    return out
