"""/v1/completions: OpenAI's text completions (one prompt or a batch) over the pipeline."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ... import pipeline
from ...request.protocol import parse_completion
from ...state import open_request
from ..bodies import Envelope
from .render import CompletionStream, completion_body


async def completions(request: Request) -> Response:
    host, key, body = await open_request(request)
    params = parse_completion(body, host.engine.info.n_vocab, host.config.sampling)
    generation = await pipeline.start_text(request, host, key, params)
    env = Envelope.of(generation, "cmpl")
    vocab = host.engine.vocab
    if params.gen.stream:
        return pipeline.sse_response(generation, CompletionStream(env, vocab, params.gen, generation.echoes))
    reply = await generation.collect(request)
    out = completion_body(env, reply, generation.echoes, vocab, params.gen.logprobs is not None)
    if params.gen.explain_cache:
        out["warmslot"] = {"cache": generation.explanation()}
    return JSONResponse(out, headers=generation.headers)
