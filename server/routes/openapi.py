"""The service routes in /openapi.json: health, models and props, tokenize, the slots and
their files, what a load balancer asks a replica, and the web page."""

from __future__ import annotations

from typing import Any

from ..models.registry import ModelState
from ..openapi_schemas import JSON, MESSAGE, TOOL, errors, get, json_body, nullable, post, required_object

MODEL_STATES = tuple(state.value for state in ModelState)  # with several models (server/models/)

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
    "state": {"type": "string", "enum": list(MODEL_STATES)}, "status": {"type": "object"},
}}


def _model_action(summary: str) -> dict[str, Any]:
    """POST /models/load or /models/unload (routes/model_admin.py)."""
    body = required_object("model")
    body["properties"] = {"model": {"type": "string"}}
    answer = {"type": "object", "required": ["success", "model", "state"], "properties": {
        "success": {"type": "boolean"}, "model": {"type": "string"}, "state": {"type": "string", "enum": list(MODEL_STATES)}}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
        "responses": {"200": json_body(answer, summary), **errors(400, 401, 403, 404, 413, 500, 503)},
    }}

_BYTES_BY_DEVICE = {"type": "object", "additionalProperties": {"type": "integer"}}
_MODEL_MEMORY = {"type": "object", "required": ["model", "state", "source", "held_bytes", "total_bytes"], "properties": {
    "model": {"type": "string"}, "state": {"type": "string", "enum": list(MODEL_STATES)},
    "source": {"type": "string", "enum": ["measured", "measured at its last load", "estimated"]},
    "held_bytes": {**_BYTES_BY_DEVICE, "description": "by device: CPU is host memory, device a GPU not yet chosen (an estimate)"},
    **{k: {"type": "integer"} for k in ("total_bytes", "weights_bytes", "n_slots", "cache_ram_bytes")},
    **{k: {"type": "integer", "nullable": True} for k in ("state_bytes", "compute_bytes", "n_ctx", "n_spare")},
    "not_counted": {"type": "array", "items": {"type": "string"}},
}}
_MODELS_CAPACITY = {"type": "object", "required": ["object", "data", "together"], "properties": {
    "object": {"type": "string", "enum": ["list"]},
    "data": {"type": "array", "items": _MODEL_MEMORY},
    "together": {"type": "object", "required": ["where", "fits", "summary"], "properties": {
        "where": {"type": "string", "enum": ["device memory", "RAM"]},
        **{k: {"type": "integer"} for k in ("free_bytes", "held_bytes", "margin_bytes", "room_bytes", "need_bytes", "at_once", "models_max")},
        "fits": {"type": "boolean"}, "summary": {"type": "string"},
        "estimated": {"type": "array", "items": {"type": "string"}}, "not_counted": {"type": "array", "items": {"type": "string"}},
    }},
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
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "tools": nullable({"type": "array", "items": TOOL}),
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
            "request": nullable({"type": "object"}),
            "redacted": {"type": "boolean", "description": "another tenant's slot: only id and state"},
        }}},
        "cache": nullable({"type": "object", "properties": {
            "budget_bytes": {"type": "integer"}, "bytes": {"type": "integer"}, "n_entries": {"type": "integer"},
            "entries": {"type": "array", "items": {"type": "object"}},
        }}),
        "capacity": nullable({"type": "object", "description": "what is held where (as in /props)"}),
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


_RECENT = {
    "type": "object", "required": ["object", "data"], "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "description": "newest first", "items": {"type": "object", "required": ["id", "ended", "route", "tenant"], "properties": {
            "id": {"type": "string"}, "ended": {"type": "number", "description": "Unix seconds"},
            "route": {"type": "string"}, "tenant": {"type": "string", "description": "a short hash, as /slots shows it"},
            **{k: {"type": "integer"} for k in ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms")},
            "images": {"type": "array", "items": {"type": "object", "properties": {
                "hash": {"type": "string"}, "kind": {"type": "string", "enum": ["image", "audio"]},
                "start": {"type": "integer"}, "n_tokens": {"type": "integer"},
            }}},
            "explanation": {"type": "object", "description": "the cache explanation (warmslot_explain) without text: positions, counts and the reason"},
        }}},
    },
}


def _slot_action() -> dict[str, Any]:
    return {"post": {
        "summary": "llama-server's slot persistence with --slot-save-path: save, restore or erase a slot (admin key)",
        "parameters": [
            {"name": "id_slot", "in": "path", "required": True, "schema": {"type": "string"}},
            {"name": "action", "in": "query", "required": True, "schema": {"type": "string", "enum": ["save", "restore", "erase"]}},
        ],
        "requestBody": {"required": False, "content": {JSON: {"schema": {"type": "object", "properties": {"filename": {"type": "string"}}}}}},
        "responses": {
            "200": json_body({"type": "object", "required": ["id_slot"], "properties": {
                "id_slot": {"type": "integer"}, "filename": {"type": "string"}, "n_saved": {"type": "integer"},
                "n_written": {"type": "integer"}, "n_restored": {"type": "integer"}, "n_read": {"type": "integer"},
                "n_erased": {"type": "integer"}, "timings": {"type": "object"},
            }}, "what the action did"),
            **errors(400, 401, 403, 413, 500, 501, 503),
        },
    }}


def _lora_adapters() -> dict[str, Any]:
    adapter = {"type": "object", "required": ["id", "path", "scale"], "properties": {
        "id": {"type": "integer"}, "path": {"type": "string"}, "scale": {"type": "number"},
        "task_name": {"type": "string"}, "prompt_prefix": {"type": "string"},
    }}
    scales = {"type": "array", "items": {"type": "object", "required": ["id", "scale"], "properties": {
        "id": {"type": "integer", "minimum": 0}, "scale": {"type": "number"},
    }}}
    listed = get({"type": "array", "items": adapter}, "llama-server's: the LoRA adapters (--lora) and their default scales", 401, 500, 503)
    return {**listed, "post": {
        "summary": "llama-server's: set the LoRA adapters' default scales (adapters left out: 0; admin key)",
        "requestBody": {"required": True, "content": {JSON: {"schema": scales}}},
        "responses": {"200": json_body(required_object("success"), "set"), **errors(400, 401, 403, 413, 500, 503)},
    }}


def _webui_file() -> dict[str, Any]:
    return {"get": {
        "summary": "the web page's files: the page, its script and its style sheet (not with --no-webui)",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": ["index.html", "app.js", "style.css"]}}],
        "responses": {"200": {"description": "the file", "content": {kind: {"schema": {"type": "string"}} for kind in ("text/html", "text/javascript", "text/css")}}, **errors(404)},
    }}


def paths() -> dict[str, Any]:
    health = {"get": {"summary": "readiness: 200 when the model is loaded and the server takes requests", "responses": {
        "200": json_body(_HEALTH, "ready"), "500": json_body(_HEALTH, "the model failed to load"),
        "503": json_body(_HEALTH, "loading, or shutting down"),
    }}}
    models = get(_MODELS, "the served model", 500)
    model = {"get": {
        "summary": "the model under its name or an alias",
        "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": json_body(_MODEL, "the model"), **errors(404, 500)},
    }}
    props = get(_PROPS, "llama-server's /props: the slots' context, the request defaults, the chat template, the capacity table", 401, 500, 503)
    return {
        "/health": health, "/v1/health": health,
        "/v1/models": models, "/models": models, "/v1/models/{model_id}": model,
        "/props": props, "/v1/props": props,
        "/version": get(_VERSION, "warmslot, llama-cpp-python and llama.cpp versions"),
        "/tokenize": post(_TOKENIZE_REQUEST, _TOKENIZE, "token ids of a text or of rendered messages"),
        "/apply-template": post(_TOKENIZE_REQUEST, required_object("prompt"), "the prompt text the chat template renders for messages and tools"),
        "/detokenize": post(_DETOKENIZE_REQUEST, {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}, "the text of token ids"),
        "/slots": get(_SLOT_ARRAY, "--parallel entries, as llama-server lists slots: the sequences running requests, then idle ones (GET /engine lists the spare sequences too) (own tenants only, unless the admin key); ?fail_on_no_slot=1: 503 when --parallel requests run", 401, 500, 501, 503),
        "/engine": get(_SLOTS, "the slots, the queue, the prompt cache and the capacity (own tenants only, unless the admin key)", 401, 500, 501, 503),
        "/engine/requests": {"get": {
            "summary": "the last requests that ended, every tenant's, redacted as /slots is (admin key); ?limit=N: the newest N",
            "parameters": [{"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}],
            "responses": {"200": json_body(_RECENT, "newest first"), **errors(400, 401, 403, 501)},
        }},
        "/slots/{id_slot}": _slot_action(),
        "/lora-adapters": _lora_adapters(),
        "/models/load": _model_action("load a model now (the admin key; with --models-dir or --models-file, else 404)"),
        "/models/unload": _model_action("unload a model now, its conversations kept in its prompt cache (the admin key; with --models-dir or --models-file, else 404)"),
        "/models/capacity": get(_MODELS_CAPACITY, "what each model takes (measured once loaded, else estimated) and whether they fit together (with --models-dir or --models-file, else 404)", 401, 404),
        # what a load balancer asks a replica (routes/worker.py)
        "/get_load": get(required_object("load", "running", "waiting", "slots"), "load for a router: running and waiting requests, KV cells", 500, 503),
        "/get_model_info": get(required_object("model_id", "n_ctx"), "the model, as a router asks a worker", 500, 503),
        "/get_server_info": get(required_object("version", "model_id", "placement", "device_memory"), "the server's configuration, placement and memory by device", 401, 500, 503),
        "/health_generate": get(required_object("status"), "200 once the engine answers a call", 500, 503),
        # the web page (routes/webui.py)
        "/": get({"type": "string"}, "the web page: a chat with the model and a live view of the slots and the cache (not with --no-webui)", 404, media="text/html"),
        "/webui/{name}": _webui_file(),
    }
