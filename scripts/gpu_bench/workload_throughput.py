"""The `throughput` workload: many distinct requests at once, for a sweep of -np values.

--tp-clients worker threads drain one queue of --tp-requests /v1/completions requests, each a
different prompt (the text factory with a per-request seed) followed by --tp-gen-tokens
generated tokens with ignore_eos and the servers' default sampling. Nothing is shared between
requests, so this measures batching, not prompt reuse. Each -np value gets a fresh server of
every variant: the default of each server in --servers, then each --tp-variants entry (a
server with extra flags), all with -c --tp-ctx-size.
"""

from __future__ import annotations

import queue
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import bench_common as bc

from . import SERVERS, WARMSLOT
from .client import request_record, stream
from .profiling import record_profile, stop_profile
from .servers import Run, Served, counters_delta


class VariantError(ValueError):
    """A --tp-variants entry that is not SERVER:FLAGS."""


@dataclass(frozen=True)
class Variant:
    """A server and the flags added to the common ones; the label names it in the results."""

    server: str
    flags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.server if not self.flags else f"{self.server} {shlex.join(self.flags)}"


def parse_variants(text: str) -> list[Variant]:
    """`warmslot:--cache-ram 0;llama-server:-kvu` -> [Variant(warmslot, (--cache-ram, 0)), ...]."""
    variants = []
    for entry in (e.strip() for e in (text or "").split(";")):
        if not entry:
            continue
        server, sep, flags = entry.partition(":")
        if not sep or server.strip() not in SERVERS:
            raise VariantError(f"--tp-variants entry {entry!r} is not SERVER:FLAGS with SERVER one of {SERVERS}")
        try:
            variants.append(Variant(server.strip(), tuple(shlex.split(flags))))
        except ValueError as exc:
            raise VariantError(f"--tp-variants entry {entry!r}: {exc}") from exc
    return variants


def run_variants(servers: list[str], extra: list[Variant]) -> list[Variant]:
    """Each server's default, then the extra variants; one of each label."""
    out: dict[str, Variant] = {}
    for v in [Variant(s) for s in servers] + list(extra):
        out.setdefault(v.label, v)
    return list(out.values())


def summarise_requests(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate generated tokens/s (all completion tokens over first send to last end), TTFT
    and latency percentiles of the requests that finished."""
    ok = [r for r in rows if r.get("ok")]
    span = (max(r["t_end_s"] for r in ok) - min(r["t_start_s"] for r in ok)) if ok else None
    generated = sum(r.get("completion_tokens") or 0 for r in ok)
    return {
        "requests": len(rows), "ok": len(ok),
        "errors": [r.get("error") for r in rows if not r.get("ok")][:10],
        "completion_tokens": generated,
        "span_s": span,
        "tokens_per_s": generated / span if span else None,
        "ttft_s_p50": bc.percentile([r.get("ttft_s") for r in ok], 50),
        "ttft_s_p95": bc.percentile([r.get("ttft_s") for r in ok], 95),
        "latency_s_p50": bc.percentile([r.get("total_s") for r in ok], 50),
        "prompt_tokens_total": sum(r.get("prompt_tokens") or 0 for r in ok),
        "computed_tokens_total": sum(r.get("computed_tokens") or 0 for r in ok),
    }


def completion_body(prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
    """Default sampling (no temperature, top-k or top-p: each server's own defaults, which are
    the same), a fixed number of generated tokens."""
    return {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "seed": seed}


def send_all(run: Run, srv: Served, prompts: list[str]) -> list[dict[str, Any]]:
    """Every prompt once, --tp-clients at a time; rows in prompt order, times from the first send."""
    a = run.a
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(prompts)):
        todo.put(i)
    rows: list[dict[str, Any] | None] = [None] * len(prompts)
    t0 = time.perf_counter()

    def client() -> None:
        while not run.budget.spent():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            r = stream(srv.url, "/v1/completions", completion_body(prompts[i], a.tp_gen_tokens, i),
                       timeout=run.timeout())
            start = r["t_start"] - t0
            rows[i] = {"request": i, "t_start_s": start, "t_end_s": start + (r.get("total_s") or 0.0),
                       **request_record(r)}

    threads = [threading.Thread(target=client, daemon=True) for _ in range(max(1, min(a.tp_clients, len(prompts))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(run.timeout() * len(prompts) / len(threads) + 30)
    return [r if r is not None else {"request": i, "ok": False, "error": "not sent (time budget spent)"}
            for i, r in enumerate(rows)]


def profile_path(run: Run, np_: int) -> Path:
    out = Path(run.a.out)
    return out.with_name(f"{out.stem}-throughput-np{np_}-warmslot.pyspy.txt")


def measure(run: Run, srv: Served, prompts: list[str], profile: bool) -> dict[str, Any]:
    """One run: the requests, their summary, the state counters around it and, if asked, a profile."""
    profiler, note = (record_profile(srv.pid, run.a.profile_warmslot, run.a.profile_rate,
                                     profile_path(run, srv.info["np"]), run.a.python) if profile else (None, {}))
    before = srv.state_counters()
    rows = send_all(run, srv, prompts)
    after = srv.state_counters()
    out = {"requests": rows, "summary": summarise_requests(rows), "counters_before": before,
           "counters_after": after, "counters_delta": counters_delta(before, after)}
    note = stop_profile(profiler, note)
    if profile:
        out["profile"] = note
        out["profiled"] = profiler is not None
    return out


def run_one(run: Run, variant: Variant, np_: int, profile: bool) -> dict[str, Any]:
    a = run.a
    res: dict[str, Any] = {"np": np_}
    with Served(run, variant.server, np_, a.tp_ctx_size, f"throughput-np{np_}", list(variant.flags)) as srv:
        res["server"] = srv.info
        if not srv.ok:
            return res
        prompts = [run.texts.text("prose", f"throughput-{i}", a.tp_prompt_tokens) for i in range(a.tp_requests)]
        res.update(measure(run, srv, prompts, profile))
        s = res["summary"]
        run.log(f"  {variant.label:24s} -np {np_:2d}: {s['ok']}/{s['requests']} ok, {s['tokens_per_s'] or 0:.1f} "
                f"tok/s, TTFT p50 {(s['ttft_s_p50'] or 0) * 1000:.0f} ms p95 {(s['ttft_s_p95'] or 0) * 1000:.0f} ms")
    return res


def workload_throughput(run: Run) -> dict[str, Any]:
    a = run.a
    variants = run_variants(a.servers, a.tp_variants)
    profiled = next((v for v in variants if v.server == WARMSLOT), None) if a.profile_warmslot > 0 else None
    out: dict[str, Any] = {"settings": {
        "clients": a.tp_clients, "requests": a.tp_requests, "prompt_tokens": a.tp_prompt_tokens,
        "gen_tokens": a.tp_gen_tokens, "np": a.tp_np, "ctx": a.tp_ctx_size, "endpoint": "/v1/completions",
        "variants": [v.label for v in variants], "profile_seconds": a.profile_warmslot,
        "profiled_variant": profiled.label if profiled else None}, "servers": {}}
    for v in variants:
        out["servers"][v.label] = {"name": v.server, "flags": list(v.flags), "runs": {}}
    run.result["workloads"]["throughput"] = out  # each run.save() below writes what is measured so far
    for np_ in a.tp_np:
        for v in variants:
            runs = out["servers"][v.label]["runs"]
            if run.budget.spent():
                runs[str(np_)] = {"np": np_, "skipped": "time budget spent"}
                continue
            runs[str(np_)] = run_one(run, v, np_, profile=v == profiled and np_ == max(a.tp_np))
            run.save()
    return out
