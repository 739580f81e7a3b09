"""llama.cpp's backend: initialisation, its log, the devices it sees, pinned host memory."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import mmap
import os
import threading
from dataclasses import dataclass

from .native_log import NativeLog

log = logging.getLogger("warmslot.llama")

_native = NativeLog()


class LlamaError(RuntimeError):
    """llama.cpp refused an operation (a model that does not load, a context it cannot make)."""


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    _native.write(level, text.decode("utf-8", errors="replace"))


_backend_lock = threading.Lock()
_backend_ready = False


def init_backend() -> None:
    """Initialize llama.cpp once per process and route its log into Python logging."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


def ggml_build() -> tuple[str, str]:
    """(ggml's version, the llama.cpp commit it was built from), e.g. ("0.25.3", "0c1e570")."""
    try:
        base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
        base.ggml_version.restype = ctypes.c_char_p
        base.ggml_commit.restype = ctypes.c_char_p
        return base.ggml_version().decode(), base.ggml_commit().decode()
    except (OSError, AttributeError):
        return "unknown", "unknown"


class _CudaHost:
    """ggml's CUDA host buffer type (page-locked memory), as `host_buffers.PinnedAllocator`."""

    def __init__(self, cuda: ctypes.CDLL, base: ctypes.CDLL) -> None:
        cuda.ggml_backend_cuda_host_buffer_type.restype = ctypes.c_void_p
        cuda.ggml_backend_cuda_host_buffer_type.argtypes = []
        base.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
        base.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        base.ggml_backend_buffer_get_base.restype = ctypes.c_void_p
        base.ggml_backend_buffer_get_base.argtypes = [ctypes.c_void_p]
        base.ggml_backend_buffer_free.restype = None
        base.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
        self.buft = cuda.ggml_backend_cuda_host_buffer_type()
        self.alloc = base.ggml_backend_buft_alloc_buffer
        self.base = base.ggml_backend_buffer_get_base
        self.free = base.ggml_backend_buffer_free

    def allocate(self, size: int) -> int:
        return self.alloc(self.buft, size) or 0

    def address(self, handle: int) -> int:
        return self.base(handle)

    def view(self, address: int, size: int):
        return (ctypes.c_uint8 * size).from_address(address)


class _RegisteredHost:
    """Page-locked host memory that CUDA registers (cudaHostRegister) after Python wrote it,
    as `host_buffers.PinnedAllocator`.

    Pinning costs two things: faulting in every page, and the driver locking and mapping them.
    cudaMallocHost does both while it holds the driver, so every CUDA call of the process waits
    (2 GiB: 1.2 s on an H200 host). Here the pages are written first, with no CUDA call, and the
    driver only maps pages that exist (2 GiB: 0.12 s; `scripts/gpu_bench/pin_stall.py`).
    Faulting in 4 KiB pages took 0.6-0.8 s a GiB on one H200 host: the pages are written on a
    few threads (10 GiB in 2.9-3.7 s there, against 6.3-7.8 s on one), after asking for
    transparent huge pages (where the kernel gives them on request, far fewer faults)."""

    TOUCH = 64 << 20  # bytes written per numpy call
    TOUCH_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))

    def __init__(self, runtime: ctypes.CDLL) -> None:
        runtime.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        runtime.cudaHostRegister.restype = ctypes.c_int
        self._register = runtime.cudaHostRegister
        self._clear_error = runtime.cudaGetLastError
        self._held: list[tuple[mmap.mmap, ctypes.c_char]] = []  # never unmapped: buffers may outlive a model

    def allocate(self, size: int) -> int:
        import numpy as np  # (llama_cpp is imported first, see the package docstring)

        try:
            memory = mmap.mmap(-1, size)
        except (OSError, ValueError):
            return 0
        with contextlib.suppress(AttributeError, OSError):  # huge pages: far fewer faults to take
            memory.madvise(mmap.MADV_HUGEPAGE)
        pages = np.frombuffer(memory, dtype=np.uint8)

        def touch(start: int) -> None:  # numpy lets go of the GIL while it writes
            pages[start:start + self.TOUCH] = 0

        # every page faulted in, outside the driver, on a few threads (faults are taken in parallel)
        with concurrent.futures.ThreadPoolExecutor(self.TOUCH_THREADS) as pool:
            list(pool.map(touch, range(0, size, self.TOUCH)))
        del pages
        anchor = ctypes.c_char.from_buffer(memory)
        if self._register(ctypes.addressof(anchor), size, _HOST_REGISTER_PORTABLE) != 0:
            self._clear_error()
            del anchor
            memory.close()
            return 0
        self._held.append((memory, anchor))
        return len(self._held)

    def address(self, handle: int) -> int:
        return ctypes.addressof(self._held[handle - 1][1])

    view = _CudaHost.view


_HOST_REGISTER_PORTABLE = 1  # pinned for every device's context, not only the current one


def _cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library ggml's CUDA backend loaded, if it is a shared one."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "/libcudart.so" in line})
        return ctypes.CDLL(paths[0]) if paths else None
    except OSError:
        return None


@functools.cache
def cuda_host_allocator() -> _RegisteredHost | _CudaHost | None:
    """Pinned host memory for states, when llama.cpp was built with CUDA and sees a GPU: pages
    registered with the CUDA runtime, or ggml's CUDA host buffer type where the runtime cannot
    be reached. One for the process: every model's arena pins through it, and a model that
    unloads leaves its chunks to the next (host_buffers.HostBuffers)."""
    if not llama_cpp.llama_supports_gpu_offload():
        return None
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        cuda = ctypes.CDLL(os.path.join(lib_dir, "libggml-cuda.so"))
        base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
        host = _CudaHost(cuda, base)
    except (OSError, AttributeError) as exc:
        log.info("no pinned host memory for states (%s)", exc)
        return None
    if not host.buft:
        return None
    runtime = _cuda_runtime()
    try:
        return _RegisteredHost(runtime) if runtime is not None else host
    except AttributeError:
        return host


def ggml_library(name: str) -> ctypes.CDLL:
    """The copy of a ggml library ('libggml', 'libggml-base') that libllama itself uses.

    NOTE: llama-cpp-python's wheel holds each library under several names as separate files
    (libggml.so, libggml.so.0, ...), and opening one by path loads a second copy, with a device
    registry of its own: RPC servers registered there would never reach llama.cpp. libllama
    loaded the `.so.0` names, which dlopen finds already loaded."""
    try:
        return ctypes.CDLL(f"{name}.so.0", mode=os.RTLD_NOLOAD)
    except OSError:
        return ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", f"{name}.so"))


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    kind: str  # cpu, gpu, igpu or accel
    free: int  # bytes
    total: int


_DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel")  # enum ggml_backend_dev_type


def devices() -> list[Device]:
    """The devices ggml sees, with their free and total memory."""
    init_backend()
    try:
        reg = ggml_library("libggml")  # the device registry
        base = ggml_library("libggml-base")  # the device interface
        reg.ggml_backend_dev_count.restype = ctypes.c_size_t
        reg.ggml_backend_dev_get.restype = ctypes.c_void_p
        reg.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        base.ggml_backend_dev_type.restype = ctypes.c_int
        base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_name.restype = ctypes.c_char_p
        base.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_memory.restype = None
        base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    except (OSError, AttributeError) as exc:
        log.warning("cannot list devices (%s)", exc)
        return []
    out = []
    for i in range(reg.ggml_backend_dev_count()):
        dev = reg.ggml_backend_dev_get(i)
        kind = base.ggml_backend_dev_type(dev)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = base.ggml_backend_dev_name(dev).decode()
        out.append(Device(name, _DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else "other", free.value, total.value))
    return out


def gpu_memory() -> list[Device]:
    """The GPUs ggml sees (none without GPU offload)."""
    return [d for d in devices() if d.kind == "gpu"]
