"""What clients probe before they talk: /props (llama-server's shape), /version, and the models.

Agent frameworks size their history from these: hermes-agent reads /v1/props then /props
(`default_generation_settings.n_ctx`), `context_length` or `max_model_len` of a /v1/models
entry, or GET /v1/models/{id}. They all report the effective context of one slot, the most
tokens a request's prompt and reply may take together, never the training context.

NOTE: /api/v1/models is LM Studio's, which llama-server does not answer either: a 200 there
would make hermes-agent take the server for LM Studio.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ModelNotFound
from ..state import ModelHost, named_model, server_of
from ..version import build_info, version_info
from .lora_adapters import adapters_view

# With one model every POST takes any `model` for it; the README's examples use this name.
DEFAULT_MODEL_NAME = "default"

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # what llama-server reports for "a random seed"


async def props(request: Request) -> Response:
    """llama-server's /props: the slots' context, the defaults and the chat template, plus
    warmslot's capacity table."""
    host = named_model(request, request.query_params.get("model"))
    host.server.authorize(request)
    host.require_ready()
    info = host.engine.info
    template = host.builder.template
    modalities = _modalities(host)
    body = {
        "default_generation_settings": {"params": default_params(host), "n_ctx": info.n_ctx_slot},
        "total_slots": info.n_slots,
        "model_alias": host.model_name,
        "model_path": host.config.engine.model_path or info.model_path,  # as given, not the resolved blob
        "modalities": {"vision": "vision" in modalities, "video": False, "audio": "audio" in modalities},
        "endpoint_slots": host.config.slots_endpoint,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": template.source,
        "chat_template_caps": {"supports_tools": template.supports_tools, "supports_tool_calls": True,
                               "supports_system_role": True, "supports_parallel_tool_calls": True},
        "bos_token": template.bos_token,
        "eos_token": template.eos_token,
        "build_info": build_info(),
        "is_sleeping": host.sleeper is not None and host.sleeper.asleep,
        "n_ctx_train": info.n_ctx_train,
        "capacity": info.capacity.to_json() if info.capacity is not None else None,
        "lora_adapters": adapters_view(host),  # as GET /lora-adapters lists them
    }
    return JSONResponse(body)


def _modalities(host: ModelHost) -> tuple[str, ...]:
    """What the projector's encoders take ("vision", "audio"), as loaded (the engine frees the
    projector while the model sleeps; its info stays)."""
    capacity = host.engine.info.capacity if host.ready else None
    return capacity.modalities if capacity is not None else ()


def default_params(host: ModelHost) -> dict:
    """A request's defaults, named as llama-server names them."""
    s = host.config.sampling
    n_predict = host.config.n_predict
    return {
        "seed": LLAMA_DEFAULT_SEED if s.seed is None else s.seed,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "stream": False,
        "reasoning_format": host.config.reasoning_format,
        "reasoning_budget": host.config.reasoning_budget,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
        "lora": [{"id": i, "scale": scale} for i, scale in enumerate(host.lora_scales)],
    }


async def version(request: Request) -> Response:
    return JSONResponse({**version_info(), "build_info": build_info()})


def model_entry(host: ModelHost) -> dict:
    """One /v1/models entry. `context_length` and `max_model_len` (vLLM's name) are a slot's
    context, which is what a request can use."""
    entry = {"id": host.model_name, "object": "model", "created": host.created, "owned_by": "warmslot",
             "aliases": host.config.aliases or [host.model_name], "tags": host.config.tags}
    if host.ready:
        info = host.engine.info
        entry["context_length"] = info.n_ctx_slot
        entry["max_model_len"] = info.n_ctx_slot
        entry["meta"] = {
            "n_ctx": info.n_ctx_slot,
            "n_ctx_total": info.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "arch": info.arch,
            "n_params": info.n_params,
            "size": info.size_bytes,
            "n_vocab": info.n_vocab,
            "memory": info.memory.value,
        }
    return entry


async def models(request: Request) -> Response:
    """OpenAI's list in `data`; `models` is the same models in Ollama's shape, as llama-server
    adds it (clients read its `capabilities`). With several models, each entry says where it
    stands: `state` (and llama-server's `status.value`) is loaded, loading, unloading,
    sleeping (unloaded, its prompt cache kept) or unloaded."""
    server = server_of(request)
    served = [(entry.host, entry.state.value) for entry in server.models.entries.values()] if server.models else [(server.default, None)]
    data, ollama = [], []
    for host, state in served:
        entry = model_entry(host)
        media = bool(_modalities(host))
        if state is not None:
            entry.update(state=state, status={"value": state})
        data.append(entry)
        ollama.append({"name": host.model_name, "model": host.model_name, "type": "model", "format": "gguf",
                       "tags": host.config.tags, "capabilities": ["completion", "multimodal"] if media else ["completion"]})
    return JSONResponse({"object": "list", "data": data, "models": ollama})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the model under its name, any alias, or "default" (the name every
    POST accepts for the loaded model); 404 otherwise. With several models, the one the name
    picks (as a request's `model` would)."""
    server = server_of(request)
    wanted = request.path_params["model_id"]
    if server.models is not None:
        entry = server.models.resolve(wanted)
        return JSONResponse({**model_entry(entry.host), "state": entry.state.value, "status": {"value": entry.state.value}})
    entry = model_entry(server.default)
    if wanted not in (entry["id"], DEFAULT_MODEL_NAME) and wanted not in entry["aliases"]:
        raise ModelNotFound(wanted)
    return JSONResponse(entry)
