"""POST /completion (and /completions with a llama-server body): llama-server's native text
completion, over the same pipeline as /v1/completions.

The body is llama-server's: `prompt` (text, token ids, or a list of them: one reply each),
`n_predict`, `n_probs`, `post_sampling_probs`, `return_tokens`, `stream`, and the sampling
fields. The reply is llama-server's shape: `content`, `tokens`, `stop`, `stop_type`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `timings`, `generation_settings`,
`completion_probabilities`; several prompts give a list. `n_indent` and `t_max_predict_ms`
are llama-server's limits for code completion (/infill, server/api/native/infill.py, uses them most).

`post_sampling_probs` gives each token's probability under the model (the exponent of its
logprob) rather than after the samplers' truncation: warmslot samples on the CPU from the
full distribution and keeps no truncated one.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from warmslot.slots import TokenLogprob, Usage, Vocab

from ... import pipeline
from ...errors import ApiError, InvalidRequest
from ...pipeline import ChoiceEnd, Delta, End, Finish, PromptProgress, StreamEvent
from ...request.protocol import MAX_TOP_LOGPROBS, CompletionParams, parse_completion
from ...state import open_request
from ..bodies import error_events, progress_fields, shifted_field, timings_body


def _prompt(prompt: Any) -> Any:
    """llama-server's JSON prompts ({"prompt_string": ...}) as text; media is refused (it
    goes through chat messages here)."""
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise InvalidRequest("/completion takes no media here: send images in /v1/chat/completions messages", param="prompt")
        return prompt.get("prompt_string")
    if isinstance(prompt, list) and any(isinstance(p, (dict, list)) for p in prompt):
        return [_prompt(p) for p in prompt]
    return prompt


def _mixed(prompt: Any, vocab: Vocab) -> Any:
    """One prompt of token ids and texts mixed ([1, 2, "text", 3]) as token ids: each text
    tokenized in place, with BOS before a text that comes first, as llama-server joins them."""
    if not (isinstance(prompt, list) and any(isinstance(p, str) for p in prompt) and any(isinstance(p, int) for p in prompt)):
        return prompt
    if not all(isinstance(p, (int, str)) and not isinstance(p, bool) for p in prompt):
        return prompt  # a batch, or something parse_completion refuses by name
    tokens: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=i == 0, parse_special=True)
        else:
            tokens.append(part)
    return tokens


def _logit_bias(bias: Any, vocab: Vocab) -> Any:
    """llama-server's logit_bias forms ([[token or text, bias], ...], text keys, `false`
    for a ban) as OpenAI's {token id: bias}."""
    pairs = bias.items() if isinstance(bias, dict) else bias if isinstance(bias, list) else None
    if pairs is None:
        return bias
    out: dict[str, float] = {}
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise InvalidRequest("'logit_bias' must map tokens (ids or text) to biases", param="logit_bias")
        key, value = pair
        value = -100.0 if value is False else value
        if isinstance(key, str) and not key.strip().lstrip("-").isdigit():
            ids = vocab.tokenize(key, add_special=False, parse_special=False)
        else:
            ids = [key]
        for token in ids:
            out[str(token)] = value
    return out


def openai_body(body: dict, vocab: Vocab) -> dict:
    """The same request in /v1/completions' words."""
    out = dict(body)
    if "prompt" in body:
        out["prompt"] = _mixed(_prompt(body["prompt"]), vocab)
    if body.get("logit_bias") is not None:
        out["logit_bias"] = _logit_bias(body["logit_bias"], vocab)
    n_predict = body.get("n_predict")
    if n_predict is not None and "max_tokens" not in body:
        if not isinstance(n_predict, int) or isinstance(n_predict, bool):
            raise InvalidRequest("'n_predict' must be an integer (-1: no limit)", param="n_predict")
        if n_predict >= 0:
            out["max_tokens"] = n_predict
    out.pop("n_predict", None)
    n_probs = body.get("n_probs", 0)
    if not isinstance(n_probs, int) or isinstance(n_probs, bool) or not 0 <= n_probs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"'n_probs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", param="n_probs")
    native_only = ("n_probs", "post_sampling_probs", "return_tokens", "id_slot", "n_indent", "t_max_predict_ms")
    for name in (*native_only, "logprobs", "echo", "stream_options"):
        out.pop(name, None)
    if n_probs or body.get("return_tokens"):
        out["logprobs"] = 0  # the generated tokens' ids travel with their logprobs (n_probs: see `completion`)
    return out


class Shape:
    """Renders one request's replies in llama-server's shape."""

    def __init__(self, body: dict, params: CompletionParams, host, prompts: list[list[int]]) -> None:
        self.vocab: Vocab = host.engine.vocab
        self.model = host.model_name
        self.n_probs = body.get("n_probs", 0)
        self.post_sampling = bool(body.get("post_sampling_probs"))
        self.return_tokens = bool(body.get("return_tokens"))
        self.fields = _response_fields(body)
        self.prompts = prompts
        self.n = params.gen.n
        self.settings = {
            "n_predict": params.gen.max_tokens if params.gen.max_tokens is not None else -1,
            "seed": params.gen.sampling.seed,
            "temperature": params.gen.sampling.temperature,
            "top_k": params.gen.sampling.top_k,
            "top_p": params.gen.sampling.top_p,
            "min_p": params.gen.sampling.min_p,
            "stream": params.gen.stream,
            "n_probs": self.n_probs,
            "adaptive_target": -1.0,
            "adaptive_decay": 0.9,
            # llama-server's list; ignore_eos bans every end-of-generation token (null: -inf)
            "logit_bias": [{"token": t, "bias": b if math.isfinite(b) else None} for t, b in sorted(params.gen.sampling.logit_bias.items())]
            + ([{"token": t, "bias": None} for t in self.vocab.eog_tokens()] if params.gen.ignore_eos else []),
            # the LoRA adapters it ran under (its own `lora`, else the server's default), scale 0 left out
            "lora": [{"id": i, "scale": scale} for i, scale in host.adapters_of(params.gen.lora).scales],
        }

    def _piece(self, token: int) -> dict[str, Any]:
        raw = self.vocab.token_piece(token)
        return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}

    def probabilities(self, logprobs: list[TokenLogprob]) -> list[dict]:
        out = []
        for lp in logprobs:
            entry = self._piece(lp.token)
            if self.post_sampling:
                entry["prob"] = math.exp(lp.logprob) if lp.logprob > -math.inf else 0.0
                entry["top_probs"] = [dict(self._piece(t), prob=math.exp(v)) for t, v in lp.top[: self.n_probs] if v > -math.inf]
            else:
                entry["logprob"] = lp.logprob
                entry["top_logprobs"] = [dict(self._piece(t), logprob=v) for t, v in lp.top[: self.n_probs]]
            out.append(entry)
        return out

    def partial(self, index: int, text: str, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index, "content": text, "tokens": [lp.token for lp in logprobs] if self.return_tokens else [],
                               "stop": False, "id_slot": -1, "tokens_predicted": len(logprobs), "tokens_evaluated": len(self.prompts[index // self.n])}
        if self.n_probs:
            out["completion_probabilities"] = self.probabilities(logprobs)
        return out

    def final(self, index: int, text: str, logprobs: list[TokenLogprob], finish: Finish, usage: Usage, stop_sequence: str | None) -> dict[str, Any]:
        prompt = self.prompts[index // self.n]
        if finish is Finish.LENGTH:
            stop_type = "limit"
        elif stop_sequence:
            stop_type = "word"
        else:
            stop_type = "eos"
        out = self.partial(index, text, logprobs)
        out.update(
            stop=True, model=self.model, tokens_predicted=usage.completion_tokens, tokens_evaluated=len(prompt),
            generation_settings=self.settings, prompt=self.vocab.detokenize(prompt), has_new_line="\n" in text,
            truncated=False, stop_type=stop_type, stopping_word=stop_sequence or "", tokens_cached=usage.cached_tokens,
            **shifted_field(usage, "tokens_shifted"), timings=timings_body(usage),
        )
        return picked(out, self.fields) if self.fields else out


def _response_fields(body: dict) -> list[str]:
    """`response_fields`: the paths ("content", "timings/prompt_n") a final reply is cut
    down to, as llama-server does for editors that read a few fields per keystroke."""
    fields = body.get("response_fields")
    if fields is None:
        return []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise InvalidRequest("'response_fields' must be a list of strings (paths such as \"timings/prompt_n\")",
                             param="response_fields")
    return fields


def picked(reply: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """The values at `paths` ("/" between keys), each under its path; a path that leads
    nowhere is left out."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = reply
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class NativeStream:
    """One `data:` line per piece of text ({"content", "stop": false}), then a final one per
    choice with `stop: true` and the whole reply's fields; no [DONE], as llama-server."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def start(self) -> list[str]:
        return []

    def render(self, event: StreamEvent) -> list[str]:
        if isinstance(event, Delta):
            partial = self.shape.partial(event.index, event.out.text, event.logprobs)
            if event.timings is not None:
                partial["timings"] = timings_body(event.timings)
            return [json.dumps(partial, ensure_ascii=False)]
        if isinstance(event, PromptProgress):
            return [json.dumps({**self.shape.partial(event.index, "", []), **progress_fields(event)}, ensure_ascii=False)]
        if isinstance(event, ChoiceEnd):
            final = self.shape.final(event.index, "", event.logprobs, event.finish, event.usage, event.stop_sequence)
            return [json.dumps(final, ensure_ascii=False)]
        assert isinstance(event, End)
        return []

    def fail(self, error: ApiError) -> list[str]:
        return error_events(error)


def _limit(body: dict, name: str) -> int:
    value = body.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer", param=name)
    return max(0, value)  # llama-server's -1 (and any negative): no limit


async def completion(request: Request) -> Response:
    host, key, body = await open_request(request)
    return await complete(request, host, key, body)


async def complete(request: Request, host, key: str, body: dict, endpoint: str = "completion") -> Response:
    """Generate for a native body (/completion's, or the one /infill builds) and reply in
    llama-server's shape. `endpoint` names the request in the log."""
    # n_predict 0: evaluate the prompt only, as llama-server does (editors warm a slot with
    # the context they will send next); /v1/completions' max_tokens has no such value
    prompt_only = type(body.get("n_predict")) is int and body["n_predict"] == 0 and "max_tokens" not in body
    native = {**body, "n_predict": -1} if prompt_only else body
    params = parse_completion(openai_body(native, host.engine.vocab), host.engine.info.n_vocab, host.config.sampling)
    if prompt_only:
        params.gen.max_tokens = 0
    # llama-server's limits for code completion (see slots.step.text.IndentLimit)
    params.gen.n_indent, params.gen.t_max_predict_ms = _limit(body, "n_indent"), _limit(body, "t_max_predict_ms")
    if params.gen.logprobs is not None:
        params.gen.logprobs = body.get("n_probs", 0)
    generation = await pipeline.start_text(request, host, key, params, endpoint)
    shape = Shape(body, params, host, generation.prompts)
    if params.gen.stream:
        return pipeline.sse_response(generation, NativeStream(shape))
    reply = await generation.collect(request)
    outs = [shape.final(c.index, c.text, c.logprobs, c.finish, c.usage, c.stop_sequence) for c in reply.choices]
    return JSONResponse(outs[0] if len(outs) == 1 else outs, headers=generation.headers)
