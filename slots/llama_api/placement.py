"""Where the model goes: llama.cpp's devices, split modes, tensor split and RPC servers.

llama-server's `-sm`, `-ts`, `-mg`, `-dev`, `--list-devices`, `--rpc`, `-ot`, `--cpu-moe` and
`--n-cpu-moe` with the same meanings, set through `llama_model_params` (split_mode, main_gpu,
tensor_split, devices, tensor_buft_overrides). RPC servers
join ggml's device registry before the model loads, as llama.cpp's own `--rpc` does: through
the RPC backend's `ggml_backend_rpc_add_server`, which exists only in builds with
`-DGGML_RPC=on`.

The bytes each device holds are read from llama.cpp's log ("CUDA0 KV buffer size = ..."),
the only place its C API reports them.
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
import logging
import math
import re
import socket
import threading
from dataclasses import dataclass
from typing import Iterable

from .backend import LlamaError, ggml_library, init_backend

log = logging.getLogger("warmslot.llama")

SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,  # one GPU: --main-gpu
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,  # whole layers (and their KV cache) per GPU, pipelined
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,  # weight rows across GPUs; KV and results on --main-gpu
    "tensor": llama_cpp.LLAMA_SPLIT_MODE_TENSOR,  # weights and KV across GPUs (experimental in llama.cpp)
}

MAX_DEVICES = int(llama_cpp.llama_max_devices())

RPC_BUILD_HINT = (
    'this llama-cpp-python has no RPC backend; reinstall it with CMAKE_ARGS="-DGGML_RPC=on" '
    "(see the README's Scaling out section)"
)

_CPU, _ACCEL = 0, 3  # enum ggml_backend_dev_type


@dataclass(frozen=True, slots=True)
class Placement:
    """How the model is spread over devices (llama-server's -sm, -ts, -mg, -dev, --rpc)."""

    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()  # a proportion per device; (): by free memory
    devices: tuple[str, ...] | None = None  # names from --list-devices; None: all; (): none
    rpc_servers: tuple[str, ...] = ()  # host:port
    # (regex, buffer type name): a tensor whose name the regex finds goes to that buffer type
    # (the first match wins), as llama-server's -ot; --cpu-moe and --n-cpu-moe add theirs last
    tensor_overrides: tuple[tuple[str, str], ...] = ()

    @property
    def offloads(self) -> bool:
        """False when `-dev none` keeps everything on the CPU."""
        return self.devices != ()


# -- parsing (no llama.cpp calls) ---------------------------------------------------------


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """'3,1' or '3/1' -> (3.0, 1.0): a non-negative proportion per device, as llama-server
    reads -ts (split on ',' and '/'). Raises ValueError."""
    parts = [p.strip() for p in re.split(r"[,/]+", str(text).strip()) if p.strip()]
    if not parts:
        raise ValueError("a tensor split needs at least one proportion, e.g. 3,1")
    if len(parts) > MAX_DEVICES:
        raise ValueError(f"{len(parts)} proportions, but llama.cpp handles at most {MAX_DEVICES} devices")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"not a list of numbers: {text!r} (example: 3,1)") from None
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"proportions must be finite and not negative: {text!r}")
    if not any(values):
        raise ValueError(f"at least one proportion must be above 0: {text!r}")
    return values


def parse_device_names(text: str) -> tuple[str, ...]:
    """'CUDA0,CUDA1' -> ('CUDA0', 'CUDA1'); 'none' -> () (no offload). Raises ValueError."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names:
        raise ValueError("no device named (see --list-devices)")
    if names == ("none",):
        return ()
    if "none" in names:
        raise ValueError("'none' cannot be combined with device names")
    return names


# llama-server's --cpu-moe pattern: the experts' projections of every layer
EXPERTS_PATTERN = r"\.ffn_(up|down|gate)_exps"
CPU_BUFFER = "CPU"


def expert_overrides(n_layers: int | None) -> tuple[tuple[str, str], ...]:
    """The overrides of --cpu-moe (None: the experts of every layer stay in RAM) and of
    --n-cpu-moe N (those of the first N layers), as llama-server writes them."""
    if n_layers is None:
        return ((EXPERTS_PATTERN, CPU_BUFFER),)
    return tuple((rf"blk\.{il}{EXPERTS_PATTERN}", CPU_BUFFER) for il in range(n_layers))


def parse_tensor_overrides(text: str) -> tuple[tuple[str, str], ...]:
    """'exps=CPU,blk\\.1\\.=CUDA0' -> ((pattern, buffer type), ...), as llama-server reads -ot
    (split on ','; the buffer type is checked against the devices when the model loads).
    Raises ValueError for a missing '=' or a pattern that is not a regular expression."""
    out = []
    for item in (part.strip() for part in str(text).split(",")):
        pattern, sep, buffer = item.rpartition("=")
        if not sep or not pattern or not buffer.strip():
            raise ValueError(f"not PATTERN=BUFFER: {item!r} (example: exps=CPU)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from None
        out.append((pattern, buffer.strip()))
    return tuple(out)


def parse_rpc_servers(text: str) -> tuple[str, ...]:
    """'10.0.0.2:50052,[::1]:50052' -> its endpoints, each host:port. Raises ValueError."""
    servers = tuple(s.strip() for s in str(text).split(",") if s.strip())
    if not servers:
        raise ValueError("no RPC server named (host:port)")
    for server in servers:
        _host_port(server)
    return servers


def _host_port(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not host:port: {endpoint!r}")
    return host.strip("[]"), int(port)


# -- ggml's device registry -----------------------------------------------------------------


class _Registry:
    """ggml's device registry (libggml) and device interface (libggml-base), bound once."""

    _lock = threading.Lock()
    _bound: "_Registry | None" = None

    def __init__(self) -> None:
        reg, base = ggml_library("libggml"), ggml_library("libggml-base")  # the copies libllama uses
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        self.dev_count = _bind(reg.ggml_backend_dev_count, ctypes.c_size_t, [])
        self.dev_get = _bind(reg.ggml_backend_dev_get, vp, [ctypes.c_size_t])
        self.dev_by_name = _bind(reg.ggml_backend_dev_by_name, vp, [cp])
        self.dev_by_type = _bind(reg.ggml_backend_dev_by_type, vp, [ctypes.c_int])
        self.reg_by_name = _bind(reg.ggml_backend_reg_by_name, vp, [cp])
        self.register = _bind(reg.ggml_backend_register, None, [vp])
        self.dev_type = _bind(base.ggml_backend_dev_type, ctypes.c_int, [vp])
        self.dev_name = _bind(base.ggml_backend_dev_name, cp, [vp])
        self.dev_description = _bind(base.ggml_backend_dev_description, cp, [vp])
        size_p = ctypes.POINTER(ctypes.c_size_t)
        self.dev_memory = _bind(base.ggml_backend_dev_memory, None, [vp, size_p, size_p])
        self.dev_buffer_type = _bind(base.ggml_backend_dev_buffer_type, vp, [vp])
        self.buft_name = _bind(base.ggml_backend_buft_name, cp, [vp])
        self.proc_address = _bind(base.ggml_backend_reg_get_proc_address, vp, [vp, cp])
        self.rpc_added: dict[str, int] = {}  # endpoint -> its registry, once registered
        self.rpc_lock = threading.Lock()  # engines may load side by side

    @classmethod
    def get(cls) -> "_Registry":
        init_backend()
        with cls._lock:
            if cls._bound is None:
                try:
                    cls._bound = cls()
                except (OSError, AttributeError) as exc:
                    raise LlamaError(f"cannot read ggml's device registry ({exc})") from exc
            return cls._bound


def _bind(fn, restype, argtypes):
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


@dataclass(frozen=True, slots=True)
class DeviceListing:
    name: str  # what -dev takes: CUDA0, RPC0, ...
    description: str
    free: int  # bytes
    total: int


def offload_devices() -> list[DeviceListing]:
    """The devices a model can be offloaded to (every registered one but the CPU), in the
    registry's order: llama-server's --list-devices."""
    ggml = _Registry.get()
    out = []
    for i in range(ggml.dev_count()):
        dev = ggml.dev_get(i)
        if ggml.dev_type(dev) == _CPU:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(DeviceListing(_text(ggml.dev_name(dev)), _text(ggml.dev_description(dev)), free.value, total.value))
    return out


def buffer_types() -> dict[str, int]:
    """Each device's buffer type by name (CPU, CUDA0, RPC0[host:port], ...): what -ot takes,
    as llama-server lists them."""
    ggml = _Registry.get()
    out = {}
    for i in range(ggml.dev_count()):
        buft = ggml.dev_buffer_type(ggml.dev_get(i))
        if buft:
            out[_text(ggml.buft_name(buft))] = buft
    return out


def check_tensor_overrides(overrides: Iterable[tuple[str, str]]) -> None:
    """Raises LlamaError naming the first buffer type no device offers."""
    known = buffer_types()
    for pattern, buffer in overrides:
        if buffer not in known:
            raise LlamaError(f"-ot/--override-tensor {pattern}={buffer}: unknown buffer type {buffer!r} "
                             f"(available: {', '.join(known) or 'none'})")


def format_device_list(devices: Iterable[DeviceListing]) -> str:
    """The listing in llama-server's --list-devices format."""
    lines = ["Available devices:"]
    for d in devices:
        lines.append(f"  {d.name}: {d.description} ({d.total >> 20} MiB, {d.free >> 20} MiB free)")
    if len(lines) == 1:
        lines.append("  (none)")
    return "\n".join(lines)


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace")


def supports_rpc() -> bool:
    return bool(llama_cpp.llama_supports_rpc())


def add_rpc_servers(endpoints: Iterable[str], *, timeout: float = 5.0) -> None:
    """Register each RPC server's devices with ggml (once per endpoint), as llama-server's
    --rpc does. Raises LlamaError without the RPC backend or when a server does not answer.

    NOTE: ggml aborts the whole process when it cannot connect to an RPC server, so each
    endpoint is first tried with a plain TCP connection here."""
    endpoints = list(endpoints)
    if not endpoints:
        return
    if not supports_rpc():
        raise LlamaError(RPC_BUILD_HINT)
    ggml = _Registry.get()
    rpc = ggml.reg_by_name(b"RPC")
    add = ggml.proc_address(rpc, b"ggml_backend_rpc_add_server") if rpc else None
    if not add:
        raise LlamaError("the RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    with ggml.rpc_lock:
        for endpoint in endpoints:
            if endpoint not in ggml.rpc_added:
                _add_rpc_server(ggml, add_server, endpoint, timeout)


def _add_rpc_server(ggml: _Registry, add_server, endpoint: str, timeout: float) -> None:
    _probe(endpoint, timeout)
    reg = add_server(endpoint.encode())
    if not reg:
        raise LlamaError(f"the RPC server {endpoint} offers no device")
    ggml.register(reg)
    ggml.rpc_added[endpoint] = reg
    log.info("RPC server %s added", endpoint)


def _probe(endpoint: str, timeout: float) -> None:
    host, port = _host_port(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise LlamaError(f"cannot reach the RPC server {endpoint}: {exc}") from exc


def serve_rpc(endpoint: str, *, threads: int = 1) -> None:
    """Lend this host's devices (its GPUs, else its CPU) to other processes' --rpc, as
    llama.cpp's rpc-server does; blocks for good. Raises LlamaError without the RPC backend.
    RPC has no authentication: listen on loopback or a trusted network only."""
    _host_port(endpoint)
    if not supports_rpc():
        raise LlamaError(RPC_BUILD_HINT)
    ggml = _Registry.get()
    start = ggml.proc_address(ggml.reg_by_name(b"RPC"), b"ggml_backend_rpc_start_server")
    if not start:
        raise LlamaError("the RPC backend has no ggml_backend_rpc_start_server")
    lent = [ggml.dev_get(i) for i in range(ggml.dev_count()) if ggml.dev_type(ggml.dev_get(i)) not in (_CPU, _ACCEL)]
    lent = lent or [ggml.dev_by_type(_CPU)]
    serve = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))(start)
    log.info("lending %s on %s", ", ".join(_text(ggml.dev_name(d)) for d in lent), endpoint)
    serve(endpoint.encode(), None, threads, len(lent), (ctypes.c_void_p * len(lent))(*lent))


# -- model parameters ------------------------------------------------------------------------


class PlacementParams:
    """A Placement written into a `llama_model_params`. Holds the arrays the params point to,
    so keep it alive until the model is loaded."""

    def __init__(self, placement: Placement) -> None:
        add_rpc_servers(placement.rpc_servers)
        self.placement = placement
        self.split = (ctypes.c_float * MAX_DEVICES)(*placement.tensor_split) if placement.tensor_split else None
        self.devices = _device_array(placement.devices) if placement.devices is not None else None
        self.overrides = _override_array(placement.tensor_overrides) if placement.tensor_overrides else None

    def apply(self, params) -> None:
        p = self.placement
        params.split_mode = SPLIT_MODES[p.split_mode]
        params.main_gpu = p.main_gpu
        if self.split is not None:
            params.tensor_split = ctypes.cast(self.split, ctypes.POINTER(ctypes.c_float))
        if self.devices is not None:
            params.devices = ctypes.addressof(self.devices)
        if self.overrides is not None:
            params.tensor_buft_overrides = ctypes.addressof(self.overrides[0])


class _BuftOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (the bindings declare no such type)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _override_array(overrides: tuple[tuple[str, str], ...]):
    """A NULL-pattern-terminated array of tensor buffer overrides, and the pattern strings it
    points to (llama.cpp keeps the pointers: the array lives as long as the model)."""
    check_tensor_overrides(overrides)
    known = buffer_types()
    patterns = [pattern.encode() for pattern, _ in overrides]
    array = (_BuftOverride * (len(overrides) + 1))(
        *(_BuftOverride(p, known[buffer]) for p, (_, buffer) in zip(patterns, overrides)), _BuftOverride(None, None)
    )
    return array, patterns


def _device_array(names: tuple[str, ...]):
    """A NULL-terminated array of ggml devices (just the NULL for `-dev none`), as
    llama-server builds for -dev."""
    ggml = _Registry.get()
    handles = []
    for name in names:
        dev = ggml.dev_by_name(name.encode())
        if not dev or ggml.dev_type(dev) == _CPU:
            known = ", ".join(d.name for d in offload_devices()) or "none"
            raise LlamaError(f"no device {name!r} to offload to (--list-devices shows: {known})")
        handles.append(dev)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
