"""How pinning host memory stalls the CUDA work of other threads, and how fast copies run.

    python -m scripts.gpu_bench.pin_stall -m MODEL.gguf --out pin-stall.json

One thread decodes one token at a time on MODEL (all layers on the GPU) and records each
step's time, as an engine of another model would. A second thread wakes every 5 ms (it
needs the GIL to run), and a third allocates and writes 1 MiB of new memory at a time (a
page fault needs the process's memory map, which pinning may hold). Meanwhile another
thread pins host memory, one way after the other, each after a quiet second:

- `cuda_host_alloc`: ggml's CUDA host buffer type (cudaMallocHost), as the state arena pins;
- `register_touched`: pages allocated and written first (outside CUDA), then
  cudaHostRegister'ed whole;
- `register_pieces`: the same pages registered in pieces of --piece MiB;
- `warmslot_allocator`: what the state arena uses (`llama_api.cuda_host_allocator`), its
  writing of the pages included.

For each: how long pinning took and the slowest decode step, wake-up and allocation while
it ran, against their medians with nothing pinning. Then the copy speed host -> device of --copy MiB from pageable
memory, from one registration, and from a range spanning several adjacent registrations
(whether a state may span the pieces of an arena pinned piece by piece).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import threading
import time

import llama_cpp  # before numpy (the GPU bundle's trap)
import numpy as np

MIB = 1 << 20


def cudart() -> ctypes.CDLL:
    """The CUDA runtime that ggml-cuda loaded (the one the state arena registers with)."""
    from warmslot.slots.llama_api.backend import _cuda_runtime

    _ggml_libs()
    rt = _cuda_runtime()
    assert rt is not None, "no shared CUDA runtime in the process"
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    return rt


class Decoder(threading.Thread):
    """Decodes one token per step until stopped; `steps` holds (start, seconds)."""

    def __init__(self, model_path: str) -> None:
        super().__init__(daemon=True)
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 999
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 512, 512
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        self.batch = llama_cpp.llama_batch_init(1, 0, 1)
        self.steps: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        mem = llama_cpp.llama_get_memory(self.ctx)
        pos = 0
        while not self.stop.is_set():
            if pos >= 4000:
                llama_cpp.llama_memory_clear(mem, True)
                pos = 0
            b = self.batch
            b.n_tokens = 1
            b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = 100 + pos % 1000, pos, 1, 0, 1
            t0 = time.perf_counter()
            assert llama_cpp.llama_decode(self.ctx, b) == 0
            llama_cpp.llama_get_logits_ith(self.ctx, 0)
            self.steps.append((t0, time.perf_counter() - t0))
            pos += 1


class Ticker(threading.Thread):
    """Runs `work` in a loop and records (start, seconds) of each round."""

    def __init__(self, work) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.steps: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.work()
            self.steps.append((t0, time.perf_counter() - t0))


def _fault() -> None:
    a = np.empty(MIB, dtype=np.uint8)
    a[::4096] = 1  # one write a page: every page faults in
    time.sleep(0.002)


def steps_during(dec, t0: float, t1: float) -> list[float]:
    return [d for s, d in dec.steps if s + d >= t0 and s <= t1]


def worst(dec, t0: float, t1: float) -> float | None:
    during = steps_during(dec, t0, t1)
    return round(1000 * max(during), 2) if during else None


def pin_ways(rt: ctypes.CDLL, size: int, piece: int):
    """ggml's allocator, what the ways keep, a function that writes `size` new bytes, and
    (name, pin) for each way of pinning `size` bytes."""
    kept: dict[str, object] = {}

    def alloc():
        kept["h"] = kept["ggml"].allocate(size)

    def touched():
        a = np.ones(size, dtype=np.uint8)
        kept["a"] = a
        return a

    def register_whole():
        a = kept["a2"]
        assert rt.cudaHostRegister(a.ctypes.data, size, 0) == 0

    def register_pieces():
        a = kept["a3"]
        for off in range(0, size, piece):
            assert rt.cudaHostRegister(a.ctypes.data + off, min(piece, size - off), 0) == 0

    from warmslot.slots.llama_api import backend

    ours = kept["ours"] = backend.cuda_host_allocator()

    def warmslot_allocator():
        assert isinstance(ours, backend._RegisteredHost) and ours.allocate(size)

    ways = [("cuda_host_alloc", alloc), ("register_touched", register_whole), ("register_pieces", register_pieces)]
    return backend._CudaHost(*_ggml_libs()), kept, touched, ways + [("warmslot_allocator", warmslot_allocator)]


def _ggml_libs():
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    return ctypes.CDLL(os.path.join(lib_dir, "libggml-cuda.so")), ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))


def copy_speed(rt: ctypes.CDLL, host_ptr: int, size: int, reps: int = 3) -> dict[str, object]:
    """GB/s host -> device and device -> host, or the CUDA error code of a failed copy."""
    dev = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(dev), size) == 0
    out: dict[str, object] = {}
    for name, dst, src, kind in (("h2d", dev, ctypes.c_void_p(host_ptr), 1), ("d2h", ctypes.c_void_p(host_ptr), dev, 2)):
        rc = rt.cudaMemcpy(dst, src, size, kind)  # warm
        t0 = time.perf_counter()
        for _ in range(reps):
            rc = rc or rt.cudaMemcpy(dst, src, size, kind)
        dt = time.perf_counter() - t0
        out[name] = f"error {rc}" if rc else round(reps * size / dt / 1e9, 2)
        rt.cudaGetLastError()
    rt.cudaFree(dev)
    return out


_QUIET = llama_cpp.llama_log_callback(lambda level, text, user_data: None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--size", type=int, default=2048, help="MiB pinned each way")
    p.add_argument("--piece", type=int, default=64, help="MiB a piece (register_pieces)")
    p.add_argument("--copy", type=int, default=1024, help="MiB copied per copy-speed measurement")
    a = p.parse_args()
    rt = cudart()
    llama_cpp.llama_log_set(_QUIET, None)
    dec = Decoder(a.model)
    tick, fault = Ticker(lambda: time.sleep(0.005)), Ticker(_fault)
    for t in (dec, tick, fault):
        t.start()
    size, piece = a.size * MIB, a.piece * MIB
    host, kept, touched, ways = pin_ways(rt, size, piece)
    kept["ggml"] = host
    results: dict[str, object] = {"size_mib": a.size, "piece_mib": a.piece}
    time.sleep(2.0)
    t0 = time.perf_counter()
    time.sleep(1.0)
    t1 = time.perf_counter()
    for name, t in (("step", dec), ("wake", tick), ("fault", fault)):
        results[f"quiet_{name}_ms"] = {
            "p50": round(1000 * statistics.median(steps_during(t, t0, t1)), 3), "max": worst(t, t0, t1),
        }
    kept["a2"], kept["a3"] = touched(), touched()  # touched before timing: the pages exist
    for name, pin in ways:
        time.sleep(1.0)
        t0 = time.perf_counter()
        pin()
        t1 = time.perf_counter()
        time.sleep(0.5)  # a step blocked meanwhile is recorded when it ends
        results[name] = {
            "pin_s": round(t1 - t0, 4), "steps": len(steps_during(dec, t0, t1)), "max_step_ms": worst(dec, t0, t1),
            "max_wake_ms": worst(tick, t0, t1), "max_fault_ms": worst(fault, t0, t1),
        }
        print(name, results[name], flush=True)
    t0 = time.perf_counter()
    touched()
    results["touch_s"] = round(time.perf_counter() - t0, 4)
    for t in (dec, tick, fault):
        t.stop.set()
        t.join()
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    n = a.copy * MIB
    pageable = np.ones(n, dtype=np.uint8)
    results["copy_gbps"] = {
        "pageable": copy_speed(rt, pageable.ctypes.data, n),
        "one_registration": copy_speed(rt, kept["a2"].ctypes.data, n),
        "across_pieces": copy_speed(rt, kept["a3"].ctypes.data + piece // 2, n),
        "within_one_piece": copy_speed(rt, kept["a3"].ctypes.data, min(n, piece)),
        "cuda_host_alloc": copy_speed(rt, host.address(kept["h"]), n),
        "warmslot_allocator": copy_speed(rt, kept["ours"].address(1), n),
    }
    print(json.dumps(results, indent=1), flush=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
