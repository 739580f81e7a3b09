"""The server's config: what the command-line flags (named like llama-server's, see flags.py)
and their WARMSLOT_* environment variables say, checked and combined."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

from warmslot.slots import EngineConfig, SamplingParams

from . import llama_flags
from .engine_settings import engine_config
from .flag_parser import build_parser, copied
from .flag_values import AutoSize, parse_disk_size, parse_size  # noqa: F401  (AutoSize, parse_size: sizes, named here too)
from .flags import FLAGS, NOOP
from .vertex_settings import Vertex
from .vertex_settings import from_env as vertex_from_env
from ..middleware.cors import CorsPolicy


@dataclass
class ServerConfig:
    """What the server runs with. Written out for type checkers and readers; its defaults are
    what the flags give when none is set, and each field is reached from a row of the flag table
    (tests/suite/test_dropin_flags.py holds it to flags.py)."""

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
    spm_infill: bool = False  # /infill: suffix, then prefix (--spm-infill)
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
    models_dir: str | None = None  # several models by name: a folder laid out as llama-server's
    models_file: str | None = None  # several models by name: an INI file (server/models/catalog.py)
    models_max: int = 4  # models loaded at once
    models_default: str | None = None  # the model a name no model matches gets (None: 404)
    models_load_timeout: float = 300.0  # seconds a request waits for its model to load
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


def parse_config(argv: list[str] | None = None) -> tuple[ServerConfig, argparse.Namespace]:
    """The config from the command line and the environment; a flag out of range or a
    combination that does not go together ends the process with a message naming the flag."""
    parser = build_parser()
    a = parser.parse_args(argv)
    ignored, refused = llama_flags.effects(a)
    if refused:
        parser.error("; ".join(f"{flag} is not supported: {reason}" for flag, reason in refused))
    if a.parallel < 1:
        parser.error("--parallel must be at least 1")
    if a.max_n < 1 or a.responses_store < 1:
        parser.error("--max-n and --responses-store must be at least 1")
    if a.cache_reuse < 0:
        parser.error(f"--cache-reuse must be 0 (off) or a chunk size in tokens, 1 or more (got {a.cache_reuse})")
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
    if a.models_max < 1 or a.models_load_timeout <= 0:
        parser.error("--models-max must be at least 1 and --models-load-timeout above 0")
    if a.main_gpu < 0:
        parser.error("--main-gpu must be a device index (0 or more)")
    if a.n_cpu_moe < 0 or a.fit_target < 0 or a.fit_ctx < 0:
        parser.error("--n-cpu-moe, --fit-target and --fit-ctx must be 0 or more")
    engine = engine_config(a, disk_size, parser)
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
        sampling=_sampling(a),
        slots_endpoint=not a.no_slots,
        log_level="debug" if a.verbose else a.log_level,
        ignored_flags=_accepted_for_compatibility(a) + ignored,
        admin_key=a.admin_key or None,
        request_timeout=max(0.0, a.request_timeout),
        shutdown_timeout=max(0.0, a.shutdown_timeout),
        sleep_idle_s=a.sleep_idle_seconds if a.sleep_idle_seconds > 0 else -1.0,
        image_fetch_timeout=max(0.1, a.image_fetch_timeout),
        webui=not a.no_webui,
        cors=CorsPolicy(a.cors_origins, a.cors_methods, a.cors_headers, a.cors_credentials != "off"),
        tags=[t.strip() for t in (a.tags or "").split(",") if t.strip()],
        **copied(a, ""),  # the flags that set a field as they are (flags.py, `sets`)
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


def _accepted_for_compatibility(a: argparse.Namespace) -> list[tuple[str, str]]:
    """The NOOP flags given, each with why it changes nothing (its help after the first ': ')."""
    return [(f.names[-1], f.help.split(": ", 1)[-1]) for f in FLAGS if f.kind == NOOP and getattr(a, f.dest)]


def _sampling(a: argparse.Namespace) -> SamplingParams:
    """The request defaults from the sampling flags: the one place they come from (those that
    set a field as they are through flags.py's `sets`)."""
    return SamplingParams(
        temperature=max(0.0, a.temp),
        seed=None if a.seed < 0 else a.seed,
        **copied(a, "sampling"),
    )
