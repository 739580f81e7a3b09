"""One invocation's state (settings, texts, budget, result) and the servers it starts: the
same flags for both servers, a warm-up request, and /metrics and /slots scrapes (warmslot's /engine)."""

from __future__ import annotations

import argparse
import re
import shlex
import time
from pathlib import Path
from typing import Any

from scripts import bench_common as bc
from scripts import server_process as sp
from scripts.bench_client import get_json, get_text

from . import LLAMA_SERVER, WARMSLOT
from .client import request_record, sampling_body, stream
from .text import TextFactory


class Budget:
    """The run's wall-clock budget (0: none): workloads stop early once it is spent."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds if seconds > 0 else None

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.left() <= 0


def round_up(x: int, m: int) -> int:
    """Context sizes are multiples of 1024 (`round_up(n, 1024)`), as servers allocate them."""
    return (x + m - 1) // m * m


# The counters of state work and prompt sources that the throughput and multiagent workloads
# diff around a run: every warmslot byte and second counter (saves, loads, checkpoints, prefill
# and decode time), plus these, and llama-server's own totals.
_COUNTER_PATTERN = re.compile(r"^warmslot_\w*(bytes|seconds)_total$")
_COUNTER_NAMES = (
    "warmslot_generated_tokens_total", "warmslot_prefill_tokens_total", "warmslot_decode_tokens_total",
    "warmslot_prompt_cache_hits_total", "warmslot_prompt_cache_misses_total", "warmslot_slots_parked_total",
    "warmslot_checkpoints_created_total", "warmslot_checkpoints_restored_total", "warmslot_kv_evictions_total",
    "warmslot_state_tail_reads_total", "warmslot_state_tail_loads_total",
    "warmslot_quick_starts_total",
    "warmslot_full_prefills_total", "warmslot_prompt_cache_chained_total", "warmslot_prompt_cache_chain_bytes_spared_total",
    "warmslot_prompt_cache_evictions_total", "warmslot_disk_cache_hits_total", "warmslot_disk_cache_reads_total",
    "warmslot_disk_cache_writes_total", "warmslot_disk_cache_chained_total", "llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total",
)


def state_counters(metrics: dict[str, float]) -> dict[str, float]:
    """The counters (parsed /metrics) worth diffing around a run; see _COUNTER_PATTERN."""
    return {k: v for k, v in metrics.items()
            if _COUNTER_PATTERN.match(k) or k in _COUNTER_NAMES
            or k.startswith(("warmslot_prompt_tokens_total{", "warmslot_state_copy_bytes_total{", "warmslot_state_copy_seconds_total{"))
            or k == "warmslot_filler_tokens_total"}


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every counter in `after` (a counter absent before counts from 0)."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


class Run:
    """Shared state of one invocation: settings, texts, the result document, the budget."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.texts = TextFactory()
        self.budget = Budget(a.time_budget)
        self.result: dict[str, Any] = {}
        self.llama_server = bc.find_llama_server(a.llama_server)
        self.model_meta: dict[str, Any] | None = None
        self.log_dir = Path(a.log_dir) if a.log_dir else None

    def save(self) -> None:
        self.result["finished"] = bc.now_iso()
        self.result["calibration"] = {"chars_per_token": self.texts.chars_per_token,
                                      "calibrated_on": self.texts.calibrated_on}
        bc.write_json(self.a.out, self.result)

    def log(self, msg: str) -> None:
        left = self.budget.left()
        tag = f"[{time.strftime('%H:%M:%S')}" + (f" {left:.0f}s left]" if left != float("inf") else "]")
        print(f"{tag} {msg}", flush=True)

    def timeout(self) -> float:
        return max(5.0, min(self.a.request_timeout, self.budget.left() + 30.0))

    def flags(self, server: str, np_: int, ctx: int, extra: list[str] | None = None) -> list[str]:
        a = self.a
        f = ["-c", str(ctx), "-np", str(np_), "-fa", a.flash_attn, "-ctk", a.cache_type_k, "-ctv", a.cache_type_v,
             "-b", str(a.batch_size), "-ub", str(a.ubatch_size), "-ngl", str(a.n_gpu_layers)]
        if a.threads:
            f += ["-t", str(a.threads), "-tb", str(a.threads)]
        f += placement_flags(a)
        if server == LLAMA_SERVER:
            f += ["--jinja", "--metrics", "--slots"]
            if np_ > 1 and a.llama_server_kvu:
                f += ["-kvu"]  # opt-in: one KV pool shared by the slots, as warmslot has (default: ctx/np each)
            if a.chat_template_file:
                f += ["--chat-template-file", a.chat_template_file]
            f += shlex.split(a.llama_server_args)
        else:
            if a.chat_template_file:
                f += ["--chat-template", a.chat_template_file]
            f += shlex.split(a.warmslot_args)
        return f + list(extra or [])

    def command(self, server: str, np_: int, ctx: int, extra: list[str] | None = None) -> list[str]:
        flags = self.flags(server, np_, ctx, extra)
        if server == WARMSLOT:
            return sp.warmslot_command(self.a.model, flags, python=self.a.python)
        return sp.llama_server_command(self.a.model, flags,
                                       binary=self.llama_server or self.a.llama_server or "llama-server")


def placement_flags(a: argparse.Namespace) -> list[str]:
    """-sm, -ts, -mg, -dev and --rpc as given (both servers take the same flags)."""
    out: list[str] = []
    for flag, value in (("-sm", a.split_mode), ("-ts", a.tensor_split), ("-mg", a.main_gpu),
                        ("-dev", a.device), ("--rpc", a.rpc)):
        if value is not None:
            out += [flag, str(value)]
    return out


class Served:
    """A started server (or the error that kept it from starting), as a context manager."""

    def __init__(self, run: Run, server: str, np_: int, ctx: int, label: str, extra: list[str] | None = None) -> None:
        self.run, self.server, self.label = run, server, label
        self.cmd = run.command(server, np_, ctx, extra)
        self.proc: sp.ServerProcess | None = None
        self.info: dict[str, Any] = {"command": self.cmd, "np": np_, "ctx": ctx}

    def __enter__(self) -> Served:
        run = self.run
        if self.server == LLAMA_SERVER and run.llama_server is None:
            self.info["error"] = "llama-server not found (pass --llama-server)"
            return self
        log_path = run.log_dir / f"{self.label}-{self.server}.log" if run.log_dir else None
        run.log(f"starting {self.server} ({self.label}): {shlex.join(self.cmd)}")
        try:
            env = sp.source_env(run.a.warmslot_src) if self.server == WARMSLOT else None
            self.proc = sp.ServerProcess(self.server, self.cmd, env=env, log_path=log_path,
                                         ready_timeout=min(run.a.ready_timeout, max(30.0, run.budget.left())))
            self.info["load_s"] = round(self.proc.load_s or 0, 2)
            run.log(f"{self.server} ready in {self.proc.load_s:.1f}s on {self.proc.url}")
            self._warmup()
            if self.server == LLAMA_SERVER:
                caps = (get_json(self.url, "/props") or {}).get("chat_template_caps")
                self.info["chat_template_caps"] = caps
                if caps and caps.get("supports_tools") is False and run.a.tools_in == "api" and run.a.n_tools:
                    self.info["warning"] = (
                        "the chat template does not support tools: llama-server leaves `tools` out of the prompt "
                        "while warmslot injects them, so the prompts differ; pass --chat-template-file with a "
                        "template that renders tools, or --tools-in text")
                    run.log("WARNING: " + self.info["warning"])
            if run.model_meta is None and self.server == WARMSLOT:
                models = get_json(self.proc.url, "/v1/models") or {}
                data = models.get("data") or [{}]
                run.model_meta = data[0].get("meta")
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            self.info["error"] = f"{type(exc).__name__}: {exc}"[:4000]
            run.log(f"{self.server} failed to start: {str(exc)[:400]}")
            self.proc = None
        return self

    def _warmup(self) -> None:
        assert self.proc is not None
        self.run.texts.calibrate(self.server, self.url)
        body = {**sampling_body(self.run.a, 4), "prompt": "Warm-up request."}
        r = stream(self.url, "/v1/completions", body, timeout=self.run.timeout())
        self.info["warmup"] = request_record(r)

    @property
    def ok(self) -> bool:
        return self.proc is not None

    @property
    def url(self) -> str:
        assert self.proc is not None
        return self.proc.url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def scrape(self) -> dict[str, Any]:
        """The server's /metrics (parsed, selected) and /slots or /engine (summarised)."""
        out: dict[str, Any] = {}
        text = get_text(self.url, "/metrics")
        if text:
            m = bc.parse_prometheus(text)
            out["metrics"] = {k: v for k, v in m.items()
                              if k.startswith(("warmslot_prompt", "warmslot_checkpoint", "warmslot_logits",
                                               "warmslot_full_prefills", "warmslot_kv", "warmslot_prefill",
                                               "warmslot_decode", "warmslot_generated", "warmslot_engine",
                                               "warmslot_time_to_first_token_seconds_sum",
                                               "warmslot_time_to_first_token_seconds_count", "llamacpp:"))}
        slots = get_json(self.url, "/engine" if self.server == WARMSLOT else "/slots")  # warmslot's whole view
        if slots is not None:
            out["slots"] = summarise_slots(slots)
        return out

    def counters(self) -> dict[str, float]:
        """Generation counters of /metrics (warmslot's engine decode time, llama-server's predicted time)."""
        text = get_text(self.url, "/metrics") or ""
        m = bc.parse_prometheus(text) if text else {}
        keys = ("warmslot_decode_tokens_total", "warmslot_decode_seconds_total", "warmslot_generated_tokens_total",
                "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total")
        return {k: m[k] for k in keys if k in m}

    def state_counters(self) -> dict[str, float]:
        """state_counters() of the server's /metrics now ({} when it has none)."""
        text = get_text(self.url, "/metrics") or ""
        return state_counters(bc.parse_prometheus(text)) if text else {}

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.info["log_tail"] = self.proc.output_tail(25)
            rc = self.proc.stop()
            self.info["exit_code"] = rc
            self.run.log(f"stopped {self.server}")
        self.proc = None


def summarise_slots(slots: Any) -> Any:
    """/slots without prompt texts: warmslot's checkpoint view, llama-server's per-slot counters."""
    def trim(v: Any, depth: int = 0) -> Any:
        if isinstance(v, str):
            return v if len(v) <= 200 else v[:200] + f"...({len(v)} chars)"
        if isinstance(v, list):
            if len(v) > 64 and all(isinstance(x, (int, float)) for x in v):
                return f"[{len(v)} numbers]"
            return [trim(x, depth + 1) for x in v[:64]]
        if isinstance(v, dict):
            return {k: trim(x, depth + 1) for k, x in v.items() if k not in ("prompt", "tokens", "generated")}
        return v

    out: dict[str, Any] = {"raw": trim(slots)}
    if isinstance(slots, dict) and "slots" in slots:  # warmslot
        out["checkpoint_bytes"] = sum(s.get("checkpoint_bytes", 0) for s in slots["slots"])
        out["checkpoints"] = sum(len(s.get("checkpoints", [])) for s in slots["slots"])
        cache = slots.get("cache") or {}
        out["prompt_cache_bytes"] = cache.get("bytes")
        out["prompt_cache_entries"] = len(cache.get("entries") or [])
    return out
