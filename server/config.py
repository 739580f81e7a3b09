"""Command-line flags (named like llama-server's) and their WARMSLOT_* environment variables."""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field

from warmslot.slots import SPEC_TYPES, EngineConfig, SamplingParams, SpecConfig, physical_memory, placement

from . import llama_flags
from .cors import CorsPolicy
from .routes.vertex import Vertex
from .routes.vertex import from_env as vertex_from_env
from .output.markers import FORMATS
from .version import version_text

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
SIZE_HELP = "a bare number is MiB, as in llama-server (8192: 8 GiB); or give a unit: 8GiB, 512MiB, 2G, 4096B"


class AutoSize(int):
    """A size that 'auto' chose (an int; the capacity table says it was automatic)."""


def parse_size(text: str) -> int:
    """Bytes from a size flag. A bare number is MiB, as llama-server reads --cache-ram
    ('8192': 8 GiB); a unit makes it explicit: '8GiB', '512MiB', '2G', '4096B' (K/M/G/T are
    powers of 1024, B is bytes). 'auto' (for --cache-ram): a quarter of the physical memory,
    at most 32 GiB, at least 1 GiB."""
    if str(text).strip().lower() == "auto":
        return AutoSize(max(1 << 30, min(32 << 30, physical_memory() // 4)))
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} ({SIZE_HELP})")
    value, unit, suffix = float(m.group(1)), m.group(2).lower(), m.group(3)
    if not unit and not suffix:
        unit = "m"  # NOTE: llama-server's size flags take MiB
    return int(value * (1024 ** " kmgt".index(unit or " ")))


def parse_vram(text: str) -> int | None:
    """--cache-vram: a size, or 'auto' (None: the engine decides from free device memory)."""
    return None if str(text).strip().lower() == "auto" else parse_size(text)


def _argument(parse):
    """An argparse type from a parser that raises ValueError, keeping its message."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


parse_tensor_split = _argument(placement.parse_tensor_split)
parse_device_names = _argument(placement.parse_device_names)
parse_rpc_servers = _argument(placement.parse_rpc_servers)
parse_tensor_overrides = _argument(placement.parse_tensor_overrides)

DEFAULT_CACHE_RAM = "auto"
DISK_AUTO_MAX = 64 << 30


def parse_disk_size(text: str, directory: str | None) -> int:
    """--cache-disk-size: a size in --cache-ram's units, or 'auto': half of the space free on
    the directory's file system now, at most 64 GiB."""
    if str(text).strip().lower() != "auto":
        return parse_size(text)
    probe = os.path.abspath(directory or ".")
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return max(1 << 20, min(DISK_AUTO_MAX, st.f_bavail * st.f_frsize // 2))


@dataclass
class ServerConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None
    api_keys: list[str] = field(default_factory=list)
    chat_template: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)  # --chat-template-kwargs: template variables of every request
    n_predict: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)  # a request's defaults
    slots_endpoint: bool = True
    tool_format: str = "auto"
    reasoning_format: str = "auto"  # auto, deepseek or none
    reasoning_default: str = "auto"  # --reasoning: on/off set the templates' enable_thinking (a request may override it)
    reasoning_budget: int = -1  # tokens of thinking before </think> is forced; -1: no limit
    log_level: str = "info"
    max_n: int = 8  # choices per request (n)
    responses_store: int = 256  # responses kept per tenant for previous_response_id
    responses_secret: str | None = None  # signs /v1/responses reasoning items' encrypted_content (None: random per process)
    keep_billing_header: bool = False  # /v1/messages: keep Claude Code's per-request billing header in the prompt
    aliases: list[str] = field(default_factory=list)  # every name of the model, alias first
    hf_repo: str | None = None  # USER/REPO[:QUANT] to download
    hf_file: str | None = None
    hf_token: str | None = None
    ignored_flags: list[tuple[str, str]] = field(default_factory=list)  # llama-server flags that change nothing here, and why
    admin_key: str | None = None  # sees every tenant on /slots and /engine (default: the first API key)
    metrics_open: bool = False  # /metrics without a key even when keys are set
    max_body: int = 8 << 20  # bytes of a request body; more gets 413 (0: no limit)
    request_timeout: float = 0.0  # seconds a request may take in all (0: no limit)
    shutdown_timeout: float = 30.0  # seconds running requests get to finish after SIGTERM
    sleep_idle_s: float = -1.0  # --sleep-idle-seconds: unload the model after this long idle (-1: never)
    slot_save_path: str | None = None  # POST /slots/{id}?action=save|restore reads and writes files here
    slot_save_size: int = 4 << 30  # bytes the files in slot_save_path may take in all
    max_messages: int = 10000  # messages (or input items) in one request; more get 400
    max_tools: int = 256  # tools in one request; more get 400
    vertex: Vertex | None = None  # Vertex AI's prediction protocol (AIP_MODE=PREDICTION in the environment)
    image_max_bytes: int = 20 << 20  # bytes of one image (decoded); more get 400
    image_max_pixels: int = 33_554_432  # pixels of one image; more get 400
    media_path: str | None = None  # file:// image URLs are read from this folder (--media-path)
    image_fetch: bool = False  # http(s) image URLs are fetched (--image-fetch)
    image_fetch_timeout: float = 10.0  # seconds a fetch may take in all
    no_mmproj: bool = False  # -hf does not fetch the repository's projector (--no-mmproj)
    webui: bool = True  # the chat and cache page at /
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    tags: list[str] = field(default_factory=list)  # informational, listed on /v1/models
    hosts: list[str] = field(default_factory=list)  # every address to listen on (--host a,b)


# (flags, dest, kind, default, help). kind: str, int, float, size, bool
_FLAGS = [
    (("-m", "--model"), "model", str, None, "path of the GGUF model (default: the embedded SmolLM2 135M Instruct, or Gemma 3 270M, if installed)"),
    (("--host",), "host", str, "127.0.0.1", "address to listen on; several separated by commas (e.g. 127.0.0.1,::1)"),
    (("--port",), "port", int, 8080, "port to listen on"),
    (("-np", "--parallel"), "parallel", int, 4, "number of slots (sequences decoded together)"),
    (("-c", "--ctx-size"), "ctx_size", int, 0, "KV cache size in tokens, shared by all slots (0: the model's training context if it fits the free device memory, or RAM on a CPU, else the largest that fits)"),
    (("-ngl", "--n-gpu-layers"), "n_gpu_layers", int, None, "layers to offload to the GPU (-1: all; default: all, or as many as fit with --fit on)"),
    (("-sm", "--split-mode"), "split_mode", str, "layer", "how to spread the model over several GPUs: none (one GPU, --main-gpu), layer (whole layers and their KV cache per GPU), row (weight rows across GPUs; KV cache and results on --main-gpu), tensor (experimental in llama.cpp)"),
    (("-ts", "--tensor-split"), "tensor_split", parse_tensor_split, None, "proportion of the model for each GPU, e.g. 3,1 (default: in proportion to free memory)"),
    (("-mg", "--main-gpu"), "main_gpu", int, 0, "the GPU for the whole model with --split-mode none, or for the KV cache and results with row"),
    (("-dev", "--device"), "device", parse_device_names, None, "comma-separated devices to offload to, named as --list-devices shows them (none: no offload; default: all GPUs)"),
    (("--list-devices",), "list_devices", bool, False, "print the devices the model can be offloaded to, with their memory, and exit"),
    (("--rpc",), "rpc", parse_rpc_servers, None, "comma-separated RPC servers (host:port) whose devices join the ones the model is spread over (needs llama-cpp-python built with -DGGML_RPC=on)"),
    (("-fa", "--flash-attn"), "flash_attn", str, "auto", "flash attention: on, off or auto"),
    (("-ctk", "--cache-type-k"), "cache_type_k", str, "f16", "KV cache type for K (f16, bf16, q8_0, q4_0, ...)"),
    (("-ctv", "--cache-type-v"), "cache_type_v", str, "f16", "KV cache type for V"),
    (("-b", "--batch-size"), "batch_size", int, 2048, "logical batch size: tokens per decode step"),
    (("-ub", "--ubatch-size"), "ubatch_size", int, 512, "physical batch size"),
    (("-t", "--threads"), "threads", int, 0, "CPU threads for generation (0: the number of physical cores)"),
    (("-tb", "--threads-batch"), "threads_batch", int, 0, "CPU threads for prompt processing (0: same as --threads)"),
    (("-n", "--n-predict"), "n_predict", int, -1, "default max_tokens when a request sets none (-1: until the context is full)"),
    (("--chat-template",), "chat_template", str, None, "a Jinja chat template file, or a built-in by name: warmslot's Jinja gemma, chatml, llama3, mistral, or one of llama.cpp's own formats (command-r, llama2, phi3, zephyr, ...), which llama.cpp renders"),
    (("-a", "--alias"), "alias", str, None, "model name to report in the API (default: the file name); several names separated by commas, the first is reported"),
    (("--api-key",), "api_key", str, None, "require this key (Authorization: Bearer KEY); several keys separated by commas"),
    (("--api-key-file",), "api_key_file", str, None, "a file of API keys, one per line (blank lines and lines starting with # are skipped), added to --api-key's"),
    (("--cors-origins",), "cors_origins", str, "*", "origins whose web pages may call the server from a browser: * (any: the request's Origin is echoed back while --cors-credentials is on), localhost (pages on this machine only), or a comma-separated list"),
    (("--cors-methods",), "cors_methods", str, "GET, POST, DELETE, OPTIONS", "methods a CORS preflight allows"),
    (("--cors-headers",), "cors_headers", str, "*", "headers a CORS preflight allows"),
    (("--cors-credentials",), "cors_credentials", "on", "on", "CORS preflights allow credentials (the default)"),
    (("--no-cors-credentials",), "cors_credentials", "off", "on", "CORS preflights do not allow credentials; with --cors-origins * the origin is then '*'"),
    (("--tags",), "tags", str, None, "comma-separated tags of the model, listed on /v1/models (informational)"),
    (("--max-queue",), "max_queue", int, 64, "requests that may wait for a slot; more get 503 with Retry-After"),
    (("--admin-key",), "admin_key", str, None, "the key that sees every tenant's slots and cache entries on /slots and /engine and reads /metrics (default: the first --api-key)"),
    (("--metrics-open",), "metrics_open", bool, False, "serve /metrics without a key even when --api-key is set (anyone who reaches the port reads the model path and the load)"),
    (("--max-body",), "max_body", "size", "8MiB", "largest request body; larger bodies get 413 (0: no limit); " + SIZE_HELP),
    (("--request-timeout",), "request_timeout", float, 0.0, "seconds a request may take from arrival to its last token; a request's own 'timeout' can only shorten it (0: no limit)"),
    (("--shutdown-timeout",), "shutdown_timeout", float, 30.0, "seconds running requests get to finish after SIGTERM before they end with an error"),
    (("--sleep-idle-seconds",), "sleep_idle_seconds", float, -1.0, "unload the model after this many seconds without a request, keeping the prompt cache and the disk tier; the next request that needs the model loads it again (-1: never)"),
    (("--swa-full",), "swa_full", bool, False, "keep the full KV cache on sliding-window models (more memory, no checkpoints needed)"),
    (("-ctxcp", "--ctx-checkpoints"), "ctx_checkpoints", int, 32, "checkpoints kept per slot on non-truncatable models"),
    (("--checkpoint-every",), "checkpoint_every", int, 8192, "tokens between checkpoints inside a long prefill (0: only at message starts)"),
    (("--checkpoint-ram",), "checkpoint_ram", "size", "4GiB", "memory for checkpoints per slot; " + SIZE_HELP),
    (("-cram", "--cache-ram"), "cache_ram", "size", DEFAULT_CACHE_RAM, "RAM for the prompt cache (0: off; auto: a quarter of the RAM, at most 32GiB); " + SIZE_HELP),
    (("--cache-vram",), "cache_vram", "vram", "0", "device memory for spare sequences that keep idle conversations on the GPU, a size (" + SIZE_HELP + ") or auto (0: none). With a stream per slot (attention models) each spare is a stream; auto: up to one per slot in free device memory. Recurrent and hybrid models get two spare sequences per slot in their one pool"),
    (("--cache-disk",), "cache_disk", str, None, "directory of the disk tier: prompt-cache entries evicted from RAM, and those worth keeping at shutdown, are written there and survive restarts (created owner-only; default: off)"),
    (("--cache-disk-size",), "cache_disk_size", str, "auto", "byte budget of --cache-disk (auto: half the free space, at most 64GiB); " + SIZE_HELP),
    (("--slot-save-path",), "slot_save_path", str, None, "directory for POST /slots/{id}?action=save|restore|erase and its 'filename' (as llama-server's); it must exist"),
    (("--slot-save-size",), "slot_save_size", "size", "4GiB", "most bytes the files in --slot-save-path may take; a save past it gets 507 (without --api-key, slot files are off unless --slot-save-path is given); " + SIZE_HELP),
    (("--max-messages",), "max_messages", int, 10000, "most messages in one chat request or one Responses conversation (stored history plus input items); more get 400 naming the field (0: no limit)"),
    (("--max-tools",), "max_tools", int, 256, "most tools in one request; more get 400 naming 'tools' (0: no limit)"),
    (("--prefill-chunk",), "prefill_chunk", int, 0, "prompt tokens per step while other slots generate (0: --ubatch-size)"),
    (("-kvu", "--kv-unified"), "kv_unified", "on", "auto", "one KV pool that all slots share, so one slot may use all of it (default with one slot, and on recurrent and hybrid models)"),
    (("-no-kvu", "--no-kv-unified"), "kv_unified", "off", "auto", "a KV stream of --ctx-size/--parallel cells per slot (default with several slots on attention and sliding-window models) [env value: on, off or auto]"),
    (("--no-park-idle",), "no_park_idle", bool, False, "keep idle slots' contents in the KV pool when another request starts (they slow down its decoding)"),
    (("--no-slots",), "no_slots", bool, False, "disable the /slots and /engine endpoints (they answer 501)"),
    (("--no-webui",), "no_webui", bool, False, "no web page at / (the chat and cache view)"),
    (("--tool-format",), "tool_format", str, "auto", "tool-call format: auto (from the chat template), hermes, hermes_xml, llama3, mistral, json"),
    (("-rea", "--reasoning"), "reasoning", str, "auto", "thinking in chat replies: on or off set the chat template's enable_thinking (off also closes a think block the template always opens); auto: on where the template has an enable_thinking switch (as llama-server), else the template's default. A request's chat_template_kwargs override it"),
    (("--reasoning-format",), "reasoning_format", str, "auto", "auto: thoughts go to reasoning_content when the chat template uses <think>; deepseek: always; none: leave them in content"),
    (("--log-level",), "log_level", str, "info", "debug, info, warning or error"),
    (("--max-n",), "max_n", int, 8, "most choices one request may ask for (n); the prompt is evaluated once and forked into the others"),
    (("--embeddings",), "embeddings", bool, False, "serve /v1/embeddings from a second llama context with embeddings on (generation is unaffected)"),
    (("--rerank", "--reranking"), "reranking", bool, False, "serve /rerank (and /v1/rerank) from a context with rank pooling: relevance scores of query-document pairs from a reranker model"),
    (("--pooling",), "pooling", str, "auto", "embedding pooling: auto (the model's own; mean when it declares none), mean, cls, last, or none (a vector per token: /embeddings only, /v1/embeddings refuses it)"),
    (("--responses-store",), "responses_store", int, 256, "responses kept per tenant for previous_response_id (/v1/responses); older ones are evicted"),
    (("--responses-secret",), "responses_secret", str, None, "the secret that signs the turn in a /v1/responses reasoning item's encrypted_content; the same secret on every replica, or across restarts, keeps clients' histories reusable (default: a random one per process: after a restart old blobs are ignored)"),
    (("--keep-billing-header",), "keep_billing_header", bool, False, "/v1/messages: keep Claude Code's x-anthropic-billing-header system block in the prompt (it changes on every request, so every request then recomputes the whole prompt; dropped by default)"),
]

# Flags llama-server users type: its sampling defaults, reasoning, model download, and flags
# for what warmslot always does (accepted, with a log line that they change nothing).
_FLAGS += [
    (("--chat-template-file",), "chat_template_file", str, None, "a Jinja chat template file (as --chat-template FILE)"),
    (("--chat-template-kwargs",), "chat_template_kwargs", str, None, "a JSON object of chat template variables for every request, e.g. '{\"enable_thinking\": false}'; a request's chat_template_kwargs override them"),
    (("--no-mmap",), "no_mmap", bool, False, "read the weights into memory instead of mapping the file"),
    (("--mlock",), "mlock", bool, False, "keep the weights in RAM (never swapped out)"),
    (("--repack",), "repack", bool, False, "repack weights for llama.cpp's CPU kernels (AMX, interleaved quants): their batched sums differ from one token's, so a cached conversation may answer otherwise than cold"),
    (("-nr", "--no-repack"), "no_repack", bool, False, "no weight repacking on the CPU (the default)"),
    (("-s", "--seed"), "seed", int, -1, "default sampling seed of requests that send none (-1: random)"),
    (("--temp", "--temperature"), "temp", float, 0.8, "default temperature"),
    (("--top-k",), "top_k", int, 40, "default top-k (0: off)"),
    (("--top-p",), "top_p", float, 0.95, "default top-p (1.0: off)"),
    (("--min-p",), "min_p", float, 0.05, "default min-p (0.0: off)"),
    (("--repeat-last-n",), "repeat_last_n", int, 64, "default number of recent tokens the penalties look at"),
    (("--repeat-penalty",), "repeat_penalty", float, 1.0, "default repeat penalty (1.0: off)"),
    (("--presence-penalty",), "presence_penalty", float, 0.0, "default presence penalty (0.0: off)"),
    (("--frequency-penalty",), "frequency_penalty", float, 0.0, "default frequency penalty (0.0: off)"),
    (("--reasoning-budget",), "reasoning_budget", int, -1, "tokens a reply may think before </think> is forced (-1: no limit, 0: end thinking at once)"),
    (("-hf", "-hfr", "--hf-repo"), "hf_repo", str, None, "download the model from Hugging Face: USER/REPO[:QUANT] (quant default Q4_K_M, else the first GGUF), into its cache"),
    (("-hff", "--hf-file"), "hf_file", str, None, "the GGUF file of --hf-repo to download (overrides the quant)"),
    (("-hft", "--hf-token"), "hf_token", str, None, "Hugging Face token (default: HF_TOKEN or the saved login)"),
    (("-v", "--verbose"), "verbose", bool, False, "log everything, llama.cpp included (as --log-level debug)"),
    (("--jinja",), "jinja", "noop", False, "accepted for llama-server compatibility: chat templates always run with Jinja"),
    (("--metrics",), "metrics", "noop", False, "accepted for llama-server compatibility: /metrics is always on"),
    (("--slots",), "slots", "noop", False, "accepted for llama-server compatibility: /slots is on unless --no-slots"),
    (("-cb", "--cont-batching"), "cont_batching", "noop", False, "accepted for llama-server compatibility: batching is always continuous"),
]

# Images in chat messages (a vision projector beside the model, through libmtmd).
_FLAGS += [
    (("-mm", "--mmproj"), "mmproj", str, None, "a multimodal projector GGUF for the model: chat messages may then hold images (image_url data: URLs)"),
    (("--no-mmproj-offload",), "no_mmproj_offload", bool, False, "keep the projector on the CPU"),
    (("--image-min-tokens",), "image_min_tokens", int, -1, "fewest tokens an image takes, for projectors of dynamic resolution (-1: the projector's own)"),
    (("--image-max-tokens",), "image_max_tokens", int, -1, "most tokens an image takes, for projectors of dynamic resolution (-1: the projector's own)"),
    (("--image-max-bytes",), "image_max_bytes", "size", "20m", "largest image or audio clip accepted, decoded (a bare number is MiB); more get 400"),
    (("--image-max-pixels",), "image_max_pixels", int, 33_554_432, "most pixels (width x height) of an image accepted; more get 400"),
    (("--media-path",), "media_path", str, None, "a folder that image_url file:// URLs are read from (paths inside it only); without it they get 400"),
    (("--image-fetch",), "image_fetch", bool, False, "fetch http(s) image URLs (within --image-max-bytes and --image-fetch-timeout); without it they get 400"),
    (("--image-fetch-timeout",), "image_fetch_timeout", float, 10.0, "seconds an image fetch may take in all"),
    (("--no-mmproj", "--no-mmproj-auto"), "no_mmproj", bool, False, "-hf: do not download the repository's projector (mmproj) beside the model"),
]

# Expert offload, tensor placement and --fit (llama-server's names and meanings)
_FLAGS += [
    (("-cmoe", "--cpu-moe"), "cpu_moe", bool, False, "keep the experts of every layer of a mixture-of-experts model in RAM (tensors matching \\.ffn_(up|down|gate)_exps)"),
    (("-ncmoe", "--n-cpu-moe"), "n_cpu_moe", int, 0, "keep the experts of the first N layers in RAM"),
    (("-ot", "--override-tensor"), "override_tensor", parse_tensor_overrides, None, "PATTERN=BUFFER,...: tensors whose name the regular expression finds go to that buffer type (CPU, CUDA0, ...; the first match wins); repeatable"),
    (("--fit",), "fit", str, "on", "on: what is left unset (the context, expert placement, GPU layers) is chosen to fit the free device memory with --fit-target; off: load as set"),
    (("-fitt", "--fit-target"), "fit_target", int, 1024, "MiB left free on each device by --fit (one value for every device), and the margin of the capacity answer"),
    (("-fitc", "--fit-ctx"), "fit_ctx", int, 4096, "the smallest context --fit may choose"),
    (("--fit-print",), "fit_print", bool, False, "load the model, print the capacity table and what the server can hold (largest context per slot, most slots, prompt cache RAM), and exit without serving"),
]

_REPEATABLE = {"override_tensor"}  # each use adds to the list

# Speculative decoding (llama-server's names; see slots/speculative.py).
_FLAGS += [
    (("--spec-type",), "spec_type", str, "none", "speculative decoding: none; ngram-simple (drafts from the slot's own prompt and output: the tokens that followed the last earlier occurrence of the last --spec-ngram-size-n tokens); draft or draft-simple (a draft model, -md); draft-mtp (the model's own MTP layers)"),
    (("--draft", "--draft-n", "--draft-max"), "draft_max", int, 64, "most tokens drafted per step (0: no drafting)"),
    (("--draft-min", "--draft-n-min"), "draft_min", int, 0, "a shorter draft is not used"),
    (("--draft-p-min",), "draft_p_min", float, 0.75, "a draft model stops drafting before a token it gives less probability (n-gram drafts have none)"),
    (("--spec-ngram-size-n",), "spec_ngram_size_n", int, 12, "ngram-simple: tokens of the n-gram looked up in the slot's history"),
    (("--spec-ngram-size-m",), "spec_ngram_size_m", int, 48, "ngram-simple: most tokens drafted after a match (before --draft-max)"),
    (("--spec-ngram-size-min",), "spec_ngram_size_min", int, 3, "ngram-simple: the shortest n-gram looked up where the last --spec-ngram-size-n tokens did not occur before (equal to -n: only that length)"),
    (("--spec-ngram-memory",), "spec_ngram_memory", int, 65536, "ngram-simple: tokens of earlier requests' outputs kept, drafted from where the slot's history has no match (same tenant only; 0: none)"),
    (("--spec-rs-snapshots",), "spec_rs_snapshots", int, -1, "recurrent and hybrid models: recurrent states kept per sequence after its last tokens, so a draft of up to that many tokens rolls back without a state copy; every step writes them, and each costs one more recurrent state per sequence (-1: 4 with a draft model or MTP, 0 with n-grams; 0: state copies only)"),
    (("-md", "--model-draft"), "model_draft", str, None, "a draft model for speculative decoding (same vocabulary; sets --spec-type draft): it drafts greedily while each token is at least --draft-p-min likely"),
    (("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), "gpu_layers_draft", int, -1, "layers of the draft model on the GPU (-1: all)"),
    (("-devd", "--device-draft"), "device_draft", parse_device_names, None, "comma-separated devices for the draft model, named as --list-devices shows them (none: the CPU; default: -dev's)"),
    (("-ctkd", "--cache-type-k-draft"), "cache_type_k_draft", str, "f16", "KV cache type for K of the draft model"),
    (("-ctvd", "--cache-type-v-draft"), "cache_type_v_draft", str, "f16", "KV cache type for V of the draft model"),
]

_CHOICES = {
    "fit": ("on", "off"),
    "split_mode": tuple(placement.SPLIT_MODES),
    "flash_attn": ("on", "off", "auto"),
    "cache_type_k": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    "cache_type_v": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    "tool_format": ("auto",) + tuple(f for f in FORMATS if f != "none"),
    "reasoning_format": ("auto", "deepseek", "none"),
    "reasoning": ("on", "off", "auto"),
    "log_level": ("debug", "info", "warning", "error"),
    "pooling": ("auto", "mean", "cls", "last", "none"),
    "spec_type": SPEC_TYPES,
    "cache_type_k_draft": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    "cache_type_v_draft": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
}


def env_name(dest: str) -> str:
    return "WARMSLOT_" + dest.upper()


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warmslot",
        allow_abbrev=False,  # a prefix of a llama-server flag must not be taken for another flag
        description="An OpenAI-compatible llama.cpp server for agents: it never recomputes a prefix it has seen.",
        epilog="Every flag can also be set with an environment variable WARMSLOT_<NAME>, e.g. WARMSLOT_CTX_SIZE=16384. "
        f"Sizes (--cache-ram, --checkpoint-ram, --cache-vram): {SIZE_HELP}.",
    )
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    for flags, dest, kind, default, text in _FLAGS:
        env = os.environ.get(env_name(dest))
        help_text = f"{text} [env {env_name(dest)}]"
        if kind in (bool, "noop"):
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
        if dest in _REPEATABLE:
            parser.add_argument(*flags, dest=dest, type=convert, default=[value] if value else None, action="append", help=help_text)
            continue
        parser.add_argument(*flags, dest=dest, type=convert, default=value, choices=_CHOICES.get(dest), help=help_text)
    llama_flags.add_to(parser)
    return parser


def placement_of(a: argparse.Namespace) -> placement.Placement:
    return placement.Placement(
        split_mode=a.split_mode, main_gpu=a.main_gpu, tensor_split=a.tensor_split or (), devices=a.device,
        rpc_servers=a.rpc or (), tensor_overrides=tensor_overrides_of(a),
    )


def tensor_overrides_of(a: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """-ot's overrides in the order given, then --cpu-moe's, then --n-cpu-moe's."""
    out = [pair for group in a.override_tensor or () for pair in group]
    if a.cpu_moe:
        out += placement.expert_overrides(None)
    if a.n_cpu_moe > 0:
        out += placement.expert_overrides(a.n_cpu_moe)
    return tuple(out)


def parse_config(argv: list[str] | None = None) -> tuple[ServerConfig, argparse.Namespace]:
    parser = build_parser()
    a = parser.parse_args(argv)
    ignored, refused = llama_flags.effects(a)
    if refused:
        parser.error("; ".join(f"{flag} is not supported: {reason}" for flag, reason in refused))
    if a.parallel < 1:
        parser.error("--parallel must be at least 1")
    if a.max_n < 1 or a.responses_store < 1:
        parser.error("--max-n and --responses-store must be at least 1")
    if a.max_messages < 0 or a.max_tools < 0:
        parser.error("--max-messages and --max-tools must be 0 (no limit) or more")
    if a.cache_disk and a.cache_ram <= 0:
        parser.error("--cache-disk keeps what the RAM prompt cache evicts: it needs --cache-ram above 0")
    if a.slot_save_path and not os.path.isdir(a.slot_save_path):
        parser.error(f"--slot-save-path: not a directory: {a.slot_save_path}")
    try:
        disk_size = parse_disk_size(a.cache_disk_size, a.cache_disk) if a.cache_disk else 0
    except (argparse.ArgumentTypeError, OSError) as exc:
        parser.error(f"--cache-disk-size: {exc}")
    if a.cache_disk and disk_size <= 0:
        parser.error("--cache-disk-size must be above 0")
    if a.main_gpu < 0:
        parser.error("--main-gpu must be a device index (0 or more)")
    if a.n_cpu_moe < 0 or a.fit_target < 0 or a.fit_ctx < 0:
        parser.error("--n-cpu-moe, --fit-target and --fit-ctx must be 0 or more")
    engine = EngineConfig(
        model_path=a.model or "",
        n_parallel=a.parallel,
        n_ctx=a.ctx_size,
        n_batch=a.batch_size,
        n_ubatch=a.ubatch_size,
        n_threads=a.threads,
        n_threads_batch=a.threads_batch,
        n_gpu_layers=-1 if a.n_gpu_layers is None else a.n_gpu_layers,
        n_gpu_layers_auto=a.n_gpu_layers is None,
        fit=a.fit == "on",
        fit_target=a.fit_target << 20,
        fit_ctx=a.fit_ctx,
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
        reranking=a.reranking,
        cache_ram_auto=isinstance(a.cache_ram, AutoSize),
        use_mmap=not a.no_mmap,
        use_mlock=a.mlock,
        repack=True if a.repack and not a.no_repack else None,
        cache_disk=a.cache_disk,
        cache_disk_size=disk_size,
        placement=placement_of(a),
        mmproj=a.mmproj,
        mmproj_offload=not a.no_mmproj_offload,
        image_min_tokens=a.image_min_tokens,
        image_max_tokens=a.image_max_tokens,
        spec=_spec(a, parser),
    )
    if a.reasoning_budget < -1:
        parser.error("--reasoning-budget must be -1 (no limit), 0 or more")
    if a.model and a.hf_repo:
        parser.error("give -m (a local file) or -hf (a Hugging Face repository), not both")
    keys = [k.strip() for k in (a.api_key or "").split(",") if k.strip()]
    if a.api_key_file:
        try:
            with open(a.api_key_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        except OSError as exc:
            parser.error(f"--api-key-file: cannot read {a.api_key_file}: {exc.strerror or exc}")
    aliases = [name.strip() for name in (a.alias or "").split(",") if name.strip()]
    try:
        vertex = vertex_from_env()
    except ValueError:
        parser.error("AIP_HTTP_PORT must be a port number")
    config = ServerConfig(
        engine=engine,
        host=a.host.split(",")[0].strip(),
        hosts=[h.strip() for h in a.host.split(",") if h.strip()],
        port=vertex.port if vertex is not None else a.port,
        vertex=vertex,
        alias=aliases[0] if aliases else None,
        aliases=aliases,
        api_keys=keys,
        chat_template=a.chat_template_file or a.chat_template,
        chat_template_kwargs=_template_kwargs(a.chat_template_kwargs, parser),
        n_predict=a.n_predict,
        sampling=_sampling(a),
        slots_endpoint=not a.no_slots,
        tool_format=a.tool_format,
        reasoning_format=a.reasoning_format,
        reasoning_default=a.reasoning,
        reasoning_budget=a.reasoning_budget,
        log_level="debug" if a.verbose else a.log_level,
        hf_repo=a.hf_repo,
        hf_file=a.hf_file,
        hf_token=a.hf_token,
        ignored_flags=[(flags[-1], text.split(": ", 1)[-1]) for flags, dest, kind, _, text in _FLAGS if kind == "noop" and getattr(a, dest)] + ignored,
        admin_key=a.admin_key or None,
        metrics_open=a.metrics_open,
        max_body=a.max_body,
        request_timeout=max(0.0, a.request_timeout),
        shutdown_timeout=max(0.0, a.shutdown_timeout),
        sleep_idle_s=a.sleep_idle_seconds if a.sleep_idle_seconds > 0 else -1.0,
        slot_save_path=a.slot_save_path,
        slot_save_size=a.slot_save_size,
        max_messages=a.max_messages,
        max_tools=a.max_tools,
        image_max_bytes=a.image_max_bytes,
        image_max_pixels=a.image_max_pixels,
        media_path=a.media_path,
        image_fetch=a.image_fetch,
        image_fetch_timeout=max(0.1, a.image_fetch_timeout),
        no_mmproj=a.no_mmproj,
        max_n=a.max_n,
        responses_store=a.responses_store,
        responses_secret=a.responses_secret,
        webui=not a.no_webui,
        keep_billing_header=a.keep_billing_header,
        cors=CorsPolicy(a.cors_origins, a.cors_methods, a.cors_headers, a.cors_credentials != "off"),
        tags=[t.strip() for t in (a.tags or "").split(",") if t.strip()],
    )
    if a.media_path and not os.path.isdir(a.media_path):
        parser.error(f"--media-path: no such folder: {a.media_path}")
    if a.chat_template_file and not os.path.isfile(a.chat_template_file):
        parser.error(f"--chat-template-file: no such file: {a.chat_template_file}")
    return config, a


def _template_kwargs(text: str | None, parser: argparse.ArgumentParser) -> dict:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        parser.error(f"--chat-template-kwargs: not JSON: {exc}")
    if not isinstance(value, dict):
        parser.error("--chat-template-kwargs: a JSON object is needed, e.g. '{\"enable_thinking\": false}'")
    return value


def _spec(a: argparse.Namespace, parser: argparse.ArgumentParser) -> SpecConfig:
    """Speculative decoding from its flags (refused with llama-server's names when out of range)."""
    kind = a.spec_type
    if kind == "draft-simple":
        kind = "draft"  # llama-server's name for a standalone draft model
    if a.model_draft and kind == "none":
        kind = "draft"  # -md alone turns it on, as in llama-server
    if a.model_draft and kind != "draft":
        parser.error(f"--spec-type {kind} drafts without a model: give it or -md, not both")
    if kind == "draft" and not a.model_draft:
        parser.error("--spec-type draft needs a draft model (-md)")
    if a.model_draft and not os.path.isfile(a.model_draft):
        parser.error(f"-md: no such file: {a.model_draft}")
    try:
        return SpecConfig(
            type=kind, n_max=a.draft_max, n_min=a.draft_min, p_min=a.draft_p_min,
            ngram_n=a.spec_ngram_size_n, ngram_min=a.spec_ngram_size_min, ngram_m=a.spec_ngram_size_m, ngram_memory=a.spec_ngram_memory, draft_model=a.model_draft or None,
            draft_gpu_layers=a.gpu_layers_draft, draft_type_k=a.cache_type_k_draft, draft_type_v=a.cache_type_v_draft,
            draft_devices=a.device_draft if a.device_draft is not None else a.device, rs_snapshots=a.spec_rs_snapshots,
        )
    except ValueError as exc:
        parser.error(str(exc))


def _sampling(a: argparse.Namespace) -> SamplingParams:
    """The request defaults from the sampling flags: the one place they come from."""
    return SamplingParams(
        temperature=max(0.0, a.temp),
        top_k=a.top_k,
        top_p=a.top_p,
        min_p=a.min_p,
        repeat_penalty=a.repeat_penalty,
        repeat_last_n=a.repeat_last_n,
        frequency_penalty=a.frequency_penalty,
        presence_penalty=a.presence_penalty,
        seed=None if a.seed < 0 else a.seed,
    )
