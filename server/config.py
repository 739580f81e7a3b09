"""Command-line flags (named like llama-server's) and their WARMSLOT_* environment variables."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field

from warmslot.slots import SamplingParams
from warmslot.slots.engine import EngineConfig
from warmslot.slots.loader import physical_memory

from .output.markers import FORMATS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from '8GiB', '512MiB', '2G', '1048576'. K/M/G/T are powers of 1024. 'auto' (for
    --cache-ram): a quarter of the physical memory, at most 32 GiB, at least 1 GiB."""
    if str(text).strip().lower() == "auto":
        return max(1 << 30, min(32 << 30, physical_memory() // 4))
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8GiB, 512MiB, 0)")
    value, unit = float(m.group(1)), m.group(2).lower()
    return int(value * (1024 ** " kmgt".index(unit or " ")))


def parse_vram(text: str) -> int | None:
    """--cache-vram: a size, or 'auto' (None: the engine decides from free device memory)."""
    return None if str(text).strip().lower() == "auto" else parse_size(text)


DEFAULT_CACHE_RAM = "auto"


@dataclass
class ServerConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None
    api_keys: list[str] = field(default_factory=list)
    chat_template: str | None = None
    n_predict: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)  # a request's defaults
    slots_endpoint: bool = True
    tool_format: str = "auto"
    reasoning_format: str = "auto"
    log_level: str = "info"
    max_n: int = 8  # choices per request (n)
    responses_store: int = 256  # responses kept per tenant for previous_response_id


# (flags, dest, kind, default, help). kind: str, int, float, size, bool
_FLAGS = [
    (("-m", "--model"), "model", str, None, "path of the GGUF model (default: the embedded Gemma 3 270M, if installed)"),
    (("--host",), "host", str, "127.0.0.1", "address to listen on"),
    (("--port",), "port", int, 8080, "port to listen on"),
    (("-np", "--parallel"), "parallel", int, 4, "number of slots (sequences decoded together)"),
    (("-c", "--ctx-size"), "ctx_size", int, 0, "KV cache size in tokens, shared by all slots (0: the model's training context, at most 32768)"),
    (("-ngl", "--n-gpu-layers"), "n_gpu_layers", int, -1, "layers to offload to the GPU (-1: all)"),
    (("-fa", "--flash-attn"), "flash_attn", str, "auto", "flash attention: on, off or auto"),
    (("-ctk", "--cache-type-k"), "cache_type_k", str, "f16", "KV cache type for K (f16, bf16, q8_0, q4_0, ...)"),
    (("-ctv", "--cache-type-v"), "cache_type_v", str, "f16", "KV cache type for V"),
    (("-b", "--batch-size"), "batch_size", int, 2048, "logical batch size: tokens per decode step"),
    (("-ub", "--ubatch-size"), "ubatch_size", int, 512, "physical batch size"),
    (("-t", "--threads"), "threads", int, 0, "CPU threads for generation (0: the number of physical cores)"),
    (("-tb", "--threads-batch"), "threads_batch", int, 0, "CPU threads for prompt processing (0: same as --threads)"),
    (("-n", "--n-predict"), "n_predict", int, -1, "default max_tokens when a request sets none (-1: until the context is full)"),
    (("--chat-template",), "chat_template", str, None, "a Jinja chat template file, or a built-in: gemma, chatml, llama3, mistral"),
    (("--alias",), "alias", str, None, "model name to report in the API (default: the file name)"),
    (("--api-key",), "api_key", str, None, "require this key (Authorization: Bearer KEY); several keys separated by commas"),
    (("--max-queue",), "max_queue", int, 64, "requests that may wait for a slot; more get 503 with Retry-After"),
    (("--swa-full",), "swa_full", bool, False, "keep the full KV cache on sliding-window models (more memory, no checkpoints needed)"),
    (("-ctxcp", "--ctx-checkpoints"), "ctx_checkpoints", int, 32, "checkpoints kept per slot on non-truncatable models"),
    (("--checkpoint-every",), "checkpoint_every", int, 8192, "tokens between checkpoints inside a long prefill (0: only at message starts)"),
    (("--checkpoint-ram",), "checkpoint_ram", "size", "4GiB", "bytes of checkpoints kept per slot"),
    (("-cram", "--cache-ram"), "cache_ram", "size", DEFAULT_CACHE_RAM, "RAM for the prompt cache, e.g. 8GiB (0: off; auto: a quarter of the RAM, at most 32GiB)"),
    (("--cache-vram",), "cache_vram", "vram", "0", "device memory for spare sequences that keep idle conversations on the GPU, e.g. 8GiB or auto (0: none). With a stream per slot (attention models) each spare is a stream; auto: up to one per slot in free device memory. Recurrent and hybrid models get two spare sequences per slot in their one pool"),
    (("--prefill-chunk",), "prefill_chunk", int, 0, "prompt tokens per step while other slots generate (0: --ubatch-size)"),
    (("-kvu", "--kv-unified"), "kv_unified", "on", "auto", "one KV pool that all slots share, so one slot may use all of it (default with one slot, and on recurrent and hybrid models)"),
    (("-no-kvu", "--no-kv-unified"), "kv_unified", "off", "auto", "a KV stream of --ctx-size/--parallel cells per slot (default with several slots on attention and sliding-window models) [env value: on, off or auto]"),
    (("--no-park-idle",), "no_park_idle", bool, False, "keep idle slots' contents in the KV pool when another request starts (they slow down its decoding)"),
    (("--no-slots",), "no_slots", bool, False, "disable the /slots endpoint"),
    (("--tool-format",), "tool_format", str, "auto", "tool-call format: auto (from the chat template), hermes, hermes_xml, llama3, mistral, json"),
    (("--reasoning-format",), "reasoning_format", str, "auto", "auto: split <think> into reasoning_content; none: leave it in content"),
    (("--log-level",), "log_level", str, "info", "debug, info, warning or error"),
    (("--max-n",), "max_n", int, 8, "most choices one request may ask for (n); the prompt is evaluated once and forked into the others"),
    (("--embeddings",), "embeddings", bool, False, "serve /v1/embeddings from a second llama context with embeddings on (generation is unaffected)"),
    (("--pooling",), "pooling", str, "auto", "embedding pooling: auto (the model's own; mean when it declares none), mean, cls or last"),
    (("--responses-store",), "responses_store", int, 256, "responses kept per tenant for previous_response_id (/v1/responses); older ones are evicted"),
]

_CHOICES = {
    "flash_attn": ("on", "off", "auto"),
    "cache_type_k": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    "cache_type_v": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    "tool_format": ("auto",) + tuple(f for f in FORMATS if f != "none"),
    "reasoning_format": ("auto", "none"),
    "log_level": ("debug", "info", "warning", "error"),
    "pooling": ("auto", "mean", "cls", "last"),
}


def env_name(dest: str) -> str:
    return "WARMSLOT_" + dest.upper()


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warmslot",
        description="An OpenAI-compatible llama.cpp server for agents: it never recomputes a prefix it has seen.",
        epilog="Every flag can also be set with an environment variable WARMSLOT_<NAME>, e.g. WARMSLOT_CTX_SIZE=16384.",
    )
    for flags, dest, kind, default, text in _FLAGS:
        env = os.environ.get(env_name(dest))
        help_text = f"{text} [env {env_name(dest)}]"
        if kind is bool:
            value = _env_bool(env) if env is not None else default
            parser.add_argument(*flags, dest=dest, action="store_true", default=value, help=help_text)
            continue
        if kind in ("on", "off"):  # one of two flags that set a three-way setting
            if env is not None and env.strip().lower() not in ("on", "off", "auto"):
                parser.error(f"{env_name(dest)} must be on, off or auto")
            value = env.strip().lower() if env is not None else default
            parser.add_argument(*flags, dest=dest, action="store_const", const=kind, default=value, help=help_text)
            continue
        convert = {"size": parse_size, "vram": parse_vram}.get(kind, kind)
        value = env if env is not None else default
        if value is not None and kind in ("size", "vram"):
            value = convert(value)
        elif value is not None and env is not None:
            value = convert(value)
        parser.add_argument(*flags, dest=dest, type=convert, default=value, choices=_CHOICES.get(dest), help=help_text)
    return parser


def parse_config(argv: list[str] | None = None) -> tuple[ServerConfig, argparse.Namespace]:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.parallel < 1:
        parser.error("--parallel must be at least 1")
    if a.max_n < 1 or a.responses_store < 1:
        parser.error("--max-n and --responses-store must be at least 1")
    engine = EngineConfig(
        model_path=a.model or "",
        n_parallel=a.parallel,
        n_ctx=a.ctx_size,
        n_batch=a.batch_size,
        n_ubatch=a.ubatch_size,
        n_threads=a.threads,
        n_threads_batch=a.threads_batch,
        n_gpu_layers=a.n_gpu_layers,
        flash_attn=a.flash_attn,
        type_k=a.cache_type_k,
        type_v=a.cache_type_v,
        swa_full=a.swa_full,
        max_queue=a.max_queue,
        prefill_chunk=a.prefill_chunk,
        ctx_checkpoints=max(1, a.ctx_checkpoints),
        checkpoint_bytes=a.checkpoint_ram,
        checkpoint_every=a.checkpoint_every,
        cache_ram=a.cache_ram,
        park_idle=not a.no_park_idle,
        kv_unified=a.kv_unified,
        cache_vram=a.cache_vram,
        embeddings=a.embeddings,
        pooling=a.pooling,
    )
    keys = [k.strip() for k in (a.api_key or "").split(",") if k.strip()]
    config = ServerConfig(
        engine=engine,
        host=a.host,
        port=a.port,
        alias=a.alias,
        api_keys=keys,
        chat_template=a.chat_template,
        n_predict=a.n_predict,
        slots_endpoint=not a.no_slots,
        tool_format=a.tool_format,
        reasoning_format=a.reasoning_format,
        log_level=a.log_level,
        max_n=a.max_n,
        responses_store=a.responses_store,
    )
    return config, a
