"""The OpenAPI 3.0 document served at /openapi.json: every route, with the request bodies the
parser accepts (`protocol.py`) and the bodies the handlers answer (`responses.py`, errors).

The schemas say what a valid request looks like; the parser checks more than a schema can
(token ids within the vocabulary, a prompt that fits a slot, grammars llama.cpp can compile)
and answers those with a 400. The fuzzing suite (tests/test_fuzz.py) generates requests from
this document and checks every response against it.
"""

from __future__ import annotations

from typing import Any

from .api.messages.openapi import messages_paths
from .api.rerank import route as rerank_route
from .request.protocol import INT32_MAX, MAX_STOP, MAX_TIMEOUT, ROLES

JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def _number(lo: float, hi: float) -> dict[str, Any]:
    return _nullable({"type": "number", "minimum": lo, "maximum": hi})


_CONTENT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}

_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": list(ROLES)},
        "content": _nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": _CONTENT_PART}]}),
        "name": {"type": "string"},
        "tool_call_id": {"type": "string"},
        "reasoning_content": {"type": "string"},
        "tool_calls": {"type": "array", "items": _ref("ToolCall")},
    },
}

_TOOL = {
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
_GENERATION = {
    "max_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "max_completion_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "temperature": _number(0, 100),
    "top_p": _number(0, 1),
    "min_p": _number(0, 1),
    "top_k": _nullable({"type": "integer", "minimum": 0, "maximum": INT32_MAX}),
    "repeat_penalty": _number(0, 10),
    "repeat_last_n": _nullable({"type": "integer", "minimum": 0, "maximum": INT32_MAX}),
    "frequency_penalty": _number(-2, 2),
    "presence_penalty": _number(-2, 2),
    "seed": _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
    "logit_bias": _nullable({
        "type": "object",
        "description": "token id (decimal digits) to a bias between -100 and 100",
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    }),
    "stop": _nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP}]}),
    "stream": _nullable({"type": "boolean"}),
    "stream_options": _nullable({"type": "object", "properties": {"include_usage": {"type": "boolean"}}}),
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": 128, "description": "choices; at most --max-n (default 8)"}),
    "user": _nullable({"type": "string", "description": "with cache_salt: the tenant within the API key"}),
    "cache_salt": _nullable({"type": "string"}),
    "cache_prompt": _nullable({"type": "boolean", "description": "false: reuse nothing (a cold baseline)"}),
    "ignore_eos": _nullable({"type": "boolean"}),
    "warmslot_explain": _nullable({"type": "boolean", "description": "add the cache explanation as a `warmslot` field"}),
    "timeout": _nullable({"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_TIMEOUT,
                          "description": "seconds the request may take, waiting and running (at most --request-timeout)"}),
    "speculative.n_max": _nullable({"type": "integer", "minimum": 0, "maximum": 1024,
                                    "description": "most tokens drafted per step, at most --draft-max (0: no speculative decoding for this request)"}),
    "speculative.n_min": _nullable({"type": "integer", "minimum": 0, "maximum": 1024, "description": "a shorter draft is not used"}),
    "speculative.p_min": _number(0, 1),
}

_CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
        "tools": _nullable({"type": "array", "items": _TOOL}),
        "tool_choice": _nullable({"oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            }},
        ]}),
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "response_format": _nullable({
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                "schema": {"type": "object"},
                "json_schema": {"type": "object", "properties": {
                    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                    "schema": {"type": "object"},
                    "strict": {"type": "boolean"},
                }},
            },
        }),
        "chat_template_kwargs": _nullable({"type": "object"}),
        "add_generation_prompt": _nullable({"type": "boolean"}),
        "continue_final_message": _nullable({"type": "boolean", "description": "the reply continues the final assistant message (a final assistant message is continued anyway unless add_generation_prompt is false)"}),
        "grammar": _nullable({"type": "string", "description": "GBNF text the reply follows"}),
        "json_schema": _nullable({"type": "object", "description": "a JSON schema the reply is one value of"}),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),
        **_GENERATION,
    },
}

_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            {"type": "array", "minItems": 1, "maxItems": 16, "description": "a batch of prompts", "items": {"oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]}},
        ]},
        "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 5}),
        "echo": _nullable({"type": "boolean"}),
        **_GENERATION,
    },
}

_USAGE = {
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

_TOOL_CALL = {
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

_ENVELOPE = {
    "id": {"type": "string"},
    "object": {"type": "string"},
    "created": {"type": "integer"},
    "model": {"type": "string"},
    "system_fingerprint": {"type": "string"},
    "usage": _ref("Usage"),
    "timings": {"type": "object"},
    "warmslot": {"type": "object", "description": "the cache explanation (warmslot_explain)"},
}

_CHAT_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        **_ENVELOPE,
        "object": {"type": "string", "enum": ["chat.completion"]},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"type": "integer"},
                "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"]},
                "logprobs": {"type": "object", "nullable": True},
                "message": {"type": "object", "required": ["role", "content"], "properties": {
                    "role": {"type": "string", "enum": ["assistant"]},
                    "content": _nullable({"type": "string"}),
                    "reasoning_content": {"type": "string"},
                    "tool_calls": {"type": "array", "items": {**_TOOL_CALL, "required": ["id", "type", "function"]}},
                }},
            },
        }},
    },
}

_TEXT_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        **_ENVELOPE,
        "object": {"type": "string", "enum": ["text_completion"]},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["index", "text", "finish_reason"],
            "properties": {
                "index": {"type": "integer"},
                "text": {"type": "string"},
                "finish_reason": {"type": "string", "enum": ["stop", "length"]},
                "logprobs": {"type": "object", "nullable": True},
            },
        }},
    },
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": _nullable({"type": "string"}),
            "code": _nullable({"type": "string"}),
        },
    }},
}

_HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"type": "string", "enum": ["ok", "loading", "shutting_down", "error"]},
        "progress": {"type": "number"},
        "error": {"type": "object"},
    },
}

_MODEL = {"type": "object", "required": ["id", "object"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
    "owned_by": {"type": "string"}, "aliases": {"type": "array", "items": {"type": "string"}},
    "context_length": {"type": "integer"}, "max_model_len": {"type": "integer"}, "meta": {"type": "object"},
}}

_MODELS = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _MODEL}},
}

_PROPS = {"type": "object", "required": ["default_generation_settings", "total_slots", "model_path", "build_info"], "properties": {
    "default_generation_settings": {"type": "object", "required": ["params", "n_ctx"], "properties": {
        "params": {"type": "object"}, "n_ctx": {"type": "integer"}}},
    "total_slots": {"type": "integer"}, "model_alias": {"type": "string"}, "model_path": {"type": "string"},
    "chat_template": {"type": "string"}, "build_info": {"type": "string"}, "n_ctx_train": {"type": "integer"},
    "capacity": {"type": "object", "nullable": True},
}}

_VERSION = {"type": "object", "required": ["version", "llama_cpp_python", "build_info"], "properties": {
    "version": {"type": "string"}, "llama_cpp_python": {"type": "string"}, "ggml": {"type": "string"},
    "llama_cpp_commit": {"type": "string"}, "build_info": {"type": "string"},
}}

_TOKENIZE_REQUEST = {
    "type": "object",
    "description": "`content` (tokenized as /v1/completions does) or `messages` (and `tools`, rendered as /v1/chat/completions does)",
    "properties": {
        "content": {"type": "string"},
        "add_special": {"type": "boolean"},
        "with_pieces": {"type": "boolean"},
        "add_generation_prompt": {"type": "boolean"},
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
        "tools": _nullable({"type": "array", "items": _TOOL}),
    },
}

_TOKENIZE = {
    "type": "object",
    "required": ["tokens"],
    "properties": {
        "tokens": {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "object", "required": ["id", "piece"]}]}},
        "messages": {"type": "array", "items": {"type": "object", "properties": {
            "role": {"type": "string"}, "start": {"type": "integer"}, "content_start": {"type": "integer"},
        }}},
    },
}

_DETOKENIZE_REQUEST = {
    "type": "object",
    "required": ["tokens"],
    "properties": {"tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
}

_SLOTS = {
    "type": "object",
    "required": ["memory", "n_ctx", "slots", "queue_depth"],
    "properties": {
        "memory": {"type": "string"},
        "n_ctx": {"type": "integer"},
        "queue_depth": {"type": "integer"},
        "pinned_bytes": {"type": "integer"},
        "pinned_free_bytes": {"type": "integer"},
        "slots": {"type": "array", "items": {"type": "object", "required": ["id", "state", "redacted"], "properties": {
            "id": {"type": "integer"},
            "state": {"type": "string", "enum": ["idle", "prefill", "decode"]},
            "n_tokens": {"type": "integer"},
            "tenant": {"type": "string"},
            "content_hash": {"type": "string"},
            "checkpoint_bytes": {"type": "integer"},
            "idle_s": {"type": "number"},
            **{k: {"type": "array", "items": {"type": "object"}} for k in ("checkpoints", "images")},
            "request": _nullable({"type": "object"}),
            "redacted": {"type": "boolean", "description": "another tenant's slot: only id and state"},
        }}},
        "cache": _nullable({"type": "object", "properties": {
            "budget_bytes": {"type": "integer"}, "bytes": {"type": "integer"}, "n_entries": {"type": "integer"},
            "entries": {"type": "array", "items": {"type": "object"}},
        }}),
        "capacity": _nullable({"type": "object", "description": "what is held where (as in /props)"}),
    },
}


_SLOT_ARRAY = {
    "type": "array", "description": "llama-server's shape: one object per slot, warmslot's slot fields beside its own",
    "items": {"type": "object", "required": ["id", "n_ctx", "speculative", "is_processing", "state"], "properties": {
        **{k: {"type": "integer"} for k in ("id", "n_ctx", "n_prompt_tokens", "n_prompt_tokens_processed", "n_prompt_tokens_cache")},
        "speculative": {"type": "boolean"}, "is_processing": {"type": "boolean"}, "id_task": {"type": "string"},
        **_SLOTS["properties"]["slots"]["items"]["properties"],
    }},
}


_SSE_EVENT = {
    "type": "object",
    "description": "one server-sent event",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a chunk (JSON), an error body ({\"error\": ...}), or [DONE]"},
        "event": {"type": "string"},
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {
        400: "invalid request (param names the field)", 401: "missing or wrong API key", 404: "unknown route",
        403: "the route needs the admin key", 405: "method not allowed", 408: "the request passed its timeout", 413: "the body is larger than --max-body",
        500: "the model failed to load, or an internal error", 501: "not enabled on this server (a flag turns it on)",
        503: "loading, queue full, KV cache full or shutting down",
    }
    return {str(s): _json(_ref("Error"), words[s]) for s in statuses}


def _generation(request: str, response: str, summary: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref(request)}}},
        "responses": {
            "200": {
                "description": "the completion; with stream: server-sent events of chunks, an error event if one happens after the start, then [DONE]",
                "content": {JSON: {"schema": _ref(response)}, "text/event-stream": {"schema": _SSE_EVENT}},
            },
            **_errors(400, 401, 408, 413, 500, 503),
        },
    }}


def _get(schema: dict[str, Any], summary: str, *errors: int, media: str = JSON) -> dict[str, Any]:
    ok = {"description": summary, "content": {media: {"schema": schema}}}
    return {"get": {"summary": summary, "responses": {"200": ok, **_errors(*errors)}}}


_NATIVE_REQUEST = {"type": "object", "required": ["prompt"], "properties": {
    "prompt": {"oneOf": [{"type": "string"}, {"type": "array"}, {"type": "object"}]},
    "n_predict": {"type": "integer"},
    "n_probs": {"type": "integer"},
    "post_sampling_probs": {"type": "boolean"},
    "return_tokens": {"type": "boolean"},
    "stream": {"type": "boolean"},
}}
_NATIVE_REPLY = {"type": "object", "required": ["content", "stop"], "properties": {
    "content": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer"}}, "stop": {"type": "boolean"},
    "stop_type": {"type": "string"}, "tokens_predicted": {"type": "integer"}, "tokens_evaluated": {"type": "integer"},
    "timings": {"type": "object"}, "generation_settings": {"type": "object"},
}}
_NATIVE_COMPLETION = {"post": {
    "summary": "llama-server's native completion: one reply object, a list for several prompts; with stream: data lines",
    "requestBody": {"required": True, "content": {"application/json": {"schema": _NATIVE_REQUEST}}},
    "responses": {
        "200": {"description": "the reply (a list for several prompts)",
                "content": {"application/json": {"schema": {"oneOf": [_NATIVE_REPLY, {"type": "array", "items": _NATIVE_REPLY}]}},
                            "text/event-stream": {"schema": _SSE_EVENT}}},
        **_errors(400, 401, 408, 413, 500, 503),
    },
}}


def _post(request: dict[str, Any], response: dict[str, Any], summary: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
        "responses": {"200": _json(response, summary), **_errors(400, 401, 413, 500, 503)},
    }}


_RESPONSE_REQUEST = {"type": "object", "required": ["input"], "properties": {
    "model": {"type": "string"},
    "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "instructions": _nullable({"type": "string"}),
    "tools": _nullable({"type": "array", "items": {"type": "object"}}),
    "tool_choice": _nullable({"oneOf": [{"type": "string"}, {"type": "object"}]}),
    "text": _nullable({"type": "object"}),
    "max_output_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "stream": _nullable({"type": "boolean"}),
    "store": _nullable({"type": "boolean"}),
    "previous_response_id": _nullable({"type": "string"}),
}}

_RESPONSE = {"type": "object", "required": ["id", "object", "status", "output"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]}, "status": {"type": "string"},
    "output": {"type": "array", "items": {"type": "object"}}, "usage": {"type": "object", "nullable": True},
}}

_EMBEDDINGS_REQUEST = {"type": "object", "required": ["input"], "properties": {
    "model": {"type": "string"},
    "input": {"oneOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
        {"type": "array", "items": {"type": "object", "required": ["content"], "description": "llama-server's form: text parts, joined",
                                    "properties": {"content": {"type": "array", "items": {"type": "object"}}}}},
    ]},
    "encoding_format": _nullable({"type": "string", "enum": ["float", "base64"]}),
    "dimensions": _nullable({"type": "integer", "minimum": 1}),
}}

_EMBEDDINGS = {"type": "object", "required": ["object", "data", "usage"], "properties": {
    "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"},
    "data": {"type": "array", "items": {"type": "object", "required": ["embedding", "index"]}},
    "usage": {"type": "object"},
}}

_RESPONSE_BY_ID = {
    method: {
        "summary": summary,
        "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": _json({"type": "object"}, summary), **_errors(401, 404, 500)},
    }
    for method, summary in (("get", "a stored response"), ("delete", "delete a stored response"))
}


def _object(*required: str) -> dict[str, Any]:
    return {"type": "object", "required": list(required)}


_SLOT_ACTION = {"post": {
    "summary": "llama-server's slot persistence with --slot-save-path: save, restore or erase a slot (admin key)",
    "parameters": [
        {"name": "id_slot", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "action", "in": "query", "required": True, "schema": {"type": "string", "enum": ["save", "restore", "erase"]}},
    ],
    "requestBody": {"required": False, "content": {JSON: {"schema": {"type": "object", "properties": {"filename": {"type": "string"}}}}}},
    "responses": {
        "200": _json({"type": "object", "required": ["id_slot"], "properties": {
            "id_slot": {"type": "integer"}, "filename": {"type": "string"}, "n_saved": {"type": "integer"},
            "n_written": {"type": "integer"}, "n_restored": {"type": "integer"}, "n_read": {"type": "integer"},
            "n_erased": {"type": "integer"}, "timings": {"type": "object"},
        }}, "what the action did"),
        **_errors(400, 401, 403, 413, 500, 501, 503),
    },
}}


_WEBUI_FILE = {"get": {
    "summary": "the web page's files: the page, its script and its style sheet (not with --no-webui)",
    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": ["index.html", "app.js", "style.css"]}}],
    "responses": {"200": {"description": "the file", "content": {kind: {"schema": {"type": "string"}} for kind in ("text/html", "text/javascript", "text/css")}}, **_errors(404)},
}}


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    health = {"get": {"summary": "readiness: 200 when the model is loaded and the server takes requests", "responses": {
        "200": _json(_HEALTH, "ready"), "500": _json(_HEALTH, "the model failed to load"),
        "503": _json(_HEALTH, "loading, or shutting down"),
    }}}
    models = _get(_MODELS, "the served model", 500)
    chat = _generation("ChatCompletionRequest", "ChatCompletion", "a chat completion (OpenAI API)")
    completion = _generation("CompletionRequest", "TextCompletion", "a text completion (OpenAI API)")
    props = _get(_PROPS, "llama-server's /props: the slots' context, the request defaults, the chat template, the capacity table", 401, 500, 503)
    model = {"get": {
        "summary": "the model under its name or an alias",
        "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": _json(_MODEL, "the model"), **_errors(404, 500)},
    }}
    responses = {"post": {
        "summary": "a response (OpenAI's Responses API), plain or streamed as Responses events",
        "requestBody": {"required": True, "content": {JSON: {"schema": _RESPONSE_REQUEST}}},
        "responses": {
            "200": {"description": "the response; with stream: server-sent Responses events",
                    "content": {JSON: {"schema": _RESPONSE}, "text/event-stream": {"schema": _SSE_EVENT}}},
            **_errors(400, 401, 408, 413, 500, 503),
        },
    }}
    embeddings = _post(_EMBEDDINGS_REQUEST, _EMBEDDINGS, "embeddings of texts or token ids (with --embeddings)")
    embeddings["post"]["responses"].update(_errors(501))
    rerank = _post(rerank_route.REQUEST_SCHEMA, rerank_route.RESPONSE_SCHEMA, "relevance scores of documents for a query, best first (with --reranking); with texts, TEI's list")
    rerank["post"]["responses"].update(_errors(501))
    paths = {
        "/health": health, "/v1/health": health,
        "/v1/models": models, "/models": models, "/v1/models/{model_id}": model,
        "/props": props, "/v1/props": props,
        "/version": _get(_VERSION, "warmslot, llama-cpp-python and llama.cpp versions"),
        "/v1/chat/completions": chat, "/chat/completions": chat,
        **{path: _post(_ref("ChatCompletionRequest") if "chat" in path else _RESPONSE_REQUEST, _object("input_tokens"),
                       "the prompt tokens a chat (llama-server's) or Responses (OpenAI's) request would take")
           for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens", "/v1/responses/input_tokens", "/responses/input_tokens")},
        "/v1/completions": completion, "/completions": _NATIVE_COMPLETION, "/completion": _NATIVE_COMPLETION,
        "/tokenize": _post(_TOKENIZE_REQUEST, _TOKENIZE, "token ids of a text or of rendered messages"),
        "/apply-template": _post(_TOKENIZE_REQUEST, _object("prompt"), "the prompt text the chat template renders for messages and tools"),
        "/detokenize": _post(_DETOKENIZE_REQUEST, {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}, "the text of token ids"),
        "/slots": _get(_SLOT_ARRAY, "the slots, as llama-server lists them (own tenants only, unless the admin key); ?fail_on_no_slot=1: 503 when none is idle", 401, 500, 501, 503),
        "/engine": _get(_SLOTS, "the slots, the queue, the prompt cache and the capacity (own tenants only, unless the admin key)", 401, 500, 501, 503),
        "/metrics": _get({"type": "string"}, "Prometheus metrics", 401, media="text/plain"),
        "/openapi.json": _get({"type": "object"}, "this document"),
        "/slots/{id_slot}": _SLOT_ACTION,
        "/v1/responses": responses, "/responses": responses,
        "/v1/responses/{response_id}": _RESPONSE_BY_ID,
        "/v1/embeddings": embeddings, "/embeddings": embeddings,
        **{path: rerank for path in rerank_route.PATHS},
        "/get_load": _get(_object("load", "running", "waiting", "slots"), "load for a router: running and waiting requests, KV cells", 500, 503),
        "/get_model_info": _get(_object("model_id", "n_ctx"), "the model, as a router asks a worker", 500, 503),
        "/get_server_info": _get(_object("version", "model_id", "placement", "device_memory"), "the server's configuration, placement and memory by device", 401, 500, 503),
        "/health_generate": _get(_object("status"), "200 once the engine answers a call", 500, 503),
        "/": _get({"type": "string"}, "the web page: a chat with the model and a live view of the slots and the cache (not with --no-webui)", 404, media="text/html"),
        "/webui/{name}": _WEBUI_FILE,
        **messages_paths(),
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "warmslot", "version": version, "description": "An OpenAI-compatible llama.cpp server that never recomputes a prefix it has seen."},
        "paths": paths,
        "components": {
            "schemas": {
                "ChatCompletionRequest": _CHAT_REQUEST, "CompletionRequest": _COMPLETION_REQUEST,
                "ChatCompletion": _CHAT_COMPLETION, "TextCompletion": _TEXT_COMPLETION,
                "ToolCall": _TOOL_CALL, "Usage": _USAGE, "Error": _ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "--api-key; health, models and this document need none"}},
        },
    }


_DOCUMENT: dict[str, Any] | None = None


async def openapi_endpoint(request) -> Any:
    from starlette.responses import JSONResponse

    from .version import version_info

    global _DOCUMENT
    if _DOCUMENT is None:
        _DOCUMENT = openapi_document(version_info()["version"])
    return JSONResponse(_DOCUMENT)
