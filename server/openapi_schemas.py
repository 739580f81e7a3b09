"""The schema pieces that the APIs' parts of /openapi.json share: the OpenAI error body and
the statuses it answers, the chat message and tool shapes (chat completions and /tokenize),
the generation fields and reply envelope of chat and text completions, and the server-sent
event. Each API's own request and reply schemas live with the API (its `openapi.py`).
"""

from __future__ import annotations

from typing import Any

from .request.protocol import INT32_MAX, MAX_STOP, MAX_TIMEOUT, ROLES

JSON = "application/json"


def ref(name: str) -> dict[str, str]:
    """A reference to a component schema of the document."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def number(lo: float, hi: float) -> dict[str, Any]:
    return nullable({"type": "number", "minimum": lo, "maximum": hi})


def required_object(*required: str) -> dict[str, Any]:
    """An object reply described only by the fields it always has."""
    return {"type": "object", "required": list(required)}


CONTENT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}

# a chat message, as /v1/chat/completions and /tokenize take it
MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": list(ROLES)},
        "content": nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": CONTENT_PART}]}),
        "name": {"type": "string"},
        "tool_call_id": {"type": "string"},
        "reasoning_content": {"type": "string"},
        "tool_calls": {"type": "array", "items": ref("ToolCall")},
    },
}

TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object", "description": "a JSON schema of type object"},
                "strict": {"type": "boolean"},
            },
        },
    },
}

# fields that chat and text completions share (protocol.parse_generation)
GENERATION = {
    "max_tokens": nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "max_completion_tokens": nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "temperature": number(0, 100),
    "top_p": number(0, 1),
    "min_p": number(0, 1),
    "top_k": nullable({"type": "integer", "minimum": 0, "maximum": INT32_MAX}),
    "repeat_penalty": number(0, 10),
    "repeat_last_n": nullable({"type": "integer", "minimum": 0, "maximum": INT32_MAX}),
    "frequency_penalty": number(-2, 2),
    "presence_penalty": number(-2, 2),
    "seed": nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
    "logit_bias": nullable({
        "type": "object",
        "description": "token id (decimal digits) to a bias between -100 and 100",
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    }),
    "stop": nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP}]}),
    "stream": nullable({"type": "boolean"}),
    "stream_options": nullable({"type": "object", "properties": {"include_usage": {"type": "boolean"}}}),
    "n": nullable({"type": "integer", "minimum": 1, "maximum": 128, "description": "choices; at most --max-n (default 8)"}),
    "user": nullable({"type": "string", "description": "with cache_salt: the tenant within the API key"}),
    "cache_salt": nullable({"type": "string"}),
    "cache_prompt": nullable({"type": "boolean", "description": "false: reuse nothing (a cold baseline)"}),
    "ignore_eos": nullable({"type": "boolean"}),
    "warmslot_explain": nullable({"type": "boolean", "description": "add the cache explanation as a `warmslot` field"}),
    "timeout": nullable({"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_TIMEOUT,
                         "description": "seconds the request may take, waiting and running (at most --request-timeout)"}),
    "speculative.n_max": nullable({"type": "integer", "minimum": 0, "maximum": 1024,
                                   "description": "most tokens drafted per step, at most --draft-max (0: no speculative decoding for this request)"}),
    "speculative.n_min": nullable({"type": "integer", "minimum": 0, "maximum": 1024, "description": "a shorter draft is not used"}),
    "speculative.p_min": number(0, 1),
}

USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
        "completion_tokens_details": {"type": "object", "properties": {"reasoning_tokens": {"type": "integer"}}},
    },
}

TOOL_CALL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "arguments": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        }},
    },
}

# the fields around the choices of a chat or text completion
ENVELOPE = {
    "id": {"type": "string"},
    "object": {"type": "string"},
    "created": {"type": "integer"},
    "model": {"type": "string"},
    "system_fingerprint": {"type": "string"},
    "usage": ref("Usage"),
    "timings": {"type": "object"},
    "warmslot": {"type": "object", "description": "the cache explanation (warmslot_explain)"},
}

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": nullable({"type": "string"}),
            "code": nullable({"type": "string"}),
        },
    }},
}

# the components every part may refer to
SCHEMAS = {"ToolCall": TOOL_CALL, "Usage": USAGE, "Error": ERROR}

SSE_EVENT = {
    "type": "object",
    "description": "one server-sent event",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a chunk (JSON), an error body ({\"error\": ...}), or [DONE]"},
        "event": {"type": "string"},
    },
}

_ERROR_WORDS = {
    400: "invalid request (param names the field)", 401: "missing or wrong API key", 404: "unknown route",
    403: "the route needs the admin key", 405: "method not allowed", 408: "the request passed its timeout", 413: "the body is larger than --max-body",
    500: "the model failed to load, or an internal error", 501: "not enabled on this server (a flag turns it on)",
    503: "loading, queue full, KV cache full or shutting down",
}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A response with a JSON body."""
    return {"description": description, "content": {JSON: {"schema": schema}}}


def errors(*statuses: int) -> dict[str, Any]:
    """The OpenAI error responses of `statuses`."""
    return {str(s): json_body(ref("Error"), _ERROR_WORDS[s]) for s in statuses}


def generation(request: str, response: str, summary: str) -> dict[str, Any]:
    """A POST of a generation: the request and reply components named, plain or streamed."""
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": ref(request)}}},
        "responses": {
            "200": {
                "description": "the completion; with stream: server-sent events of chunks, an error event if one happens after the start, then [DONE]",
                "content": {JSON: {"schema": ref(response)}, "text/event-stream": {"schema": SSE_EVENT}},
            },
            **errors(400, 401, 408, 413, 500, 503),
        },
    }}


def get(schema: dict[str, Any], summary: str, *statuses: int, media: str = JSON) -> dict[str, Any]:
    """A GET answering `schema`, or the errors of `statuses`."""
    ok = {"description": summary, "content": {media: {"schema": schema}}}
    return {"get": {"summary": summary, "responses": {"200": ok, **errors(*statuses)}}}


def post(request: dict[str, Any], response: dict[str, Any], summary: str) -> dict[str, Any]:
    """A POST of a JSON body answering `response` (not streamed). Its work waits in a queue
    (the tokenize pool, the embeddings worker), so it may pass its deadline: a 408."""
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
        "responses": {"200": json_body(response, summary), **errors(400, 401, 408, 413, 500, 503)},
    }}


def input_tokens(request: dict[str, Any]) -> dict[str, Any]:
    """The input_tokens route of a generation API (chat, Responses): how many prompt tokens
    `request` would take."""
    return post(request, required_object("input_tokens"),
                "the prompt tokens a chat (llama-server's) or Responses (OpenAI's) request would take")
