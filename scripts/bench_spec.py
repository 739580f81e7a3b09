#!/usr/bin/env python3
"""Speculative decoding: decode tokens/s with and without drafts, in the engine itself.

The workload is an agent's "write this file back with one change": a ~1,500-token Python file
in the prompt, then the request to rewrite it, greedy, `--n-predict` tokens. Each case runs on
a fresh engine (one slot, every layer on the GPU when there is one) with the same settings;
decode speed is (completion_tokens - 1) / decode_s of the request's usage (from its first
token to its last), the median over `--reps` requests whose prompts differ in their first
line (so none reuses another's prefill).

Cases:
- `off`: no speculation (the baseline);
- `ngram-simple`: drafts from the slot's own tokens (`--spec-type ngram-simple`);
- `copy`: the same verification, but each draft is the baseline's own output from that point
  on (an oracle drafter). A random-weight benchmark model does not copy the file it is shown,
  so `ngram-simple` is accepted there only where greedy decoding falls into a loop. `copy`
  drafts --draft-max tokens at every step, so its step time is the real cost of verifying a
  full draft; (1 + --draft-max) tokens per such step is what a model that writes the file
  back verbatim gets (`full_copy_tokens_per_s`). Its own acceptance stays below 1 wherever
  the batched verification rounds a near-tie of the random logits the other way than the
  one-token baseline did: from there on the oracle's drafts are misaligned;
- `free`: free text at temperature 0.8 (little to accept), off and ngram-simple, for the cost
  of drafting and verifying when the drafts are rejected.

    python scripts/bench_spec.py --model qwen3-8b [--scale real] [--vocab PATH] \
        [--n-predict 256] [--reps 3] [--draft-max 16] --json OUT.json

`--verify-cost 1,4,8` measures instead what verification costs when nothing is accepted, with
that many slots decoding at once (one request each, started together): `off` against `reject`,
whose drafter proposes a token the model never emits at every step (greedy, so every draft is
rejected and the adaptive draft length stays at its floor), and free text at temperature 0.8
`off` against `ngram-simple`. Tokens/s is the generated tokens of all slots over the median
request's decode time. The default policy compares an n-gram request's drafts with what it
then emits before it verifies one (speculator._shadow): `reject` reports those drafts as
checked (`reject_checked`) and the ones verified (`reject_drafted`, tokens). `reject_verified`
runs the same drafter with every draft verified, the cost that policy avoids.

Benchmark models come from scripts/bench_models.py (written to /tmp/models unless given with
--gguf).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402,F401,I001  (before numpy, see slots/llama_api)

from warmslot.slots import Engine, EngineConfig, GenerateRequest, QueueSink, SamplingParams, SpecConfig  # noqa: E402
from warmslot.slots.speculation import speculator as speculative  # noqa: E402

from scripts import bench_common as bc  # noqa: E402


def source_file(n_functions: int = 40) -> str:
    """A deterministic Python file of small, similar functions (about 37 tokens each)."""
    parts = ['"""Geometry helpers."""\n\nimport math\n\n']
    for i in range(n_functions):
        parts.append(
            f"def shape_{i}(width, height, depth={i % 7 + 1}):\n"
            f"    \"\"\"Volume of box {i}.\"\"\"\n"
            f"    area = width * height + {i}\n"
            f"    return math.sqrt(area * depth)\n\n\n"
        )
    return "".join(parts)


def rewrite_prompt(i: int) -> str:
    return (
        f"Request {i}.\nHere is a file, geometry.py:\n```python\n{source_file()}```\n"
        "Write the whole file back with one change: rename `depth` to `length`. Output only the file.\n"
        "```python\n"
    )


FREE_PROMPT = "Request {i}.\nWrite a short story about a lighthouse keeper and the ships he logged.\n"


class OracleDrafter:
    """Drafts the expected output from the request's position on (the `copy` case)."""

    expected: list[int] = []
    n_prompt = 0

    def __init__(self, n: int, m: int, *memory) -> None:
        pass

    def draft(self, tokens, pending: int, limit: int) -> list[int]:
        done = len(tokens) + 1 - OracleDrafter.n_prompt  # tokens generated so far
        return list(OracleDrafter.expected[done : done + limit])


class RejectDrafter:
    """Drafts `token` (one the model never emits here) at every step: every draft is rejected."""

    token = 0

    def __init__(self, n: int, m: int, *memory) -> None:
        self.m = m

    def draft(self, tokens, pending: int, limit: int) -> list[int]:
        return [RejectDrafter.token] * min(self.m, limit)


def engine_for(gguf: str, spec: SpecConfig, args, n_parallel: int = 1) -> Engine:
    config = EngineConfig(
        model_path=gguf, n_parallel=n_parallel, n_ctx=args.ctx_size * n_parallel, n_gpu_layers=args.n_gpu_layers, spec=spec,
        cache_ram=0, flash_attn="auto",
    )
    engine = Engine(config)
    engine.start()
    engine.wait_ready(600)
    return engine


def run(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams) -> dict:
    sink = QueueSink()
    engine.submit(GenerateRequest(f"r{time.monotonic_ns()}", prompt, sink, sampling, max_tokens=n, ignore_eos=True))
    r = sink.collect(timeout=600)
    assert r.error is None, r.error
    u = r.usage
    steps = u.completion_tokens - 1 - u.draft_accepted  # decode steps: each emits 1 + the accepted drafts
    return {
        "completion_tokens": u.completion_tokens,
        "decode_s": u.decode_s,
        "decode_steps": steps,
        "step_ms": 1000 * u.decode_s / steps if steps > 0 else 0.0,
        "tokens_per_s": (u.completion_tokens - 1) / u.decode_s if u.decode_s > 0 else 0.0,
        "drafted": u.draft_tokens,
        "accepted": u.draft_accepted,
        "tokens": r.tokens,
    }


def case(engine: Engine, prompts: list[list[int]], n: int, sampling: SamplingParams, oracle: list[list[int]] | None = None) -> dict:
    runs = []
    run(engine, prompts[0], 8, sampling)  # warm-up (graphs, allocations)
    rolled = (engine.stats.spec_rollbacks, engine.stats.spec_rollback_seconds)
    for i, prompt in enumerate(prompts):
        if oracle is not None:
            OracleDrafter.expected, OracleDrafter.n_prompt = oracle[i], len(prompt)
        runs.append(run(engine, prompt, n, sampling))
    drafted = sum(r["drafted"] for r in runs)
    accepted = sum(r["accepted"] for r in runs)
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "step_ms": statistics.median(r["step_ms"] for r in runs),
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else 0.0,
        # recurrent and hybrid memory: drafts rolled back, and the time it took
        "rollbacks": engine.stats.spec_rollbacks - rolled[0],
        "rollback_s": round(engine.stats.spec_rollback_seconds - rolled[1], 4),
        "_tokens": [r["tokens"] for r in runs],
    }


def batch(engine: Engine, prompts: list[list[int]], n: int, sampling: SamplingParams) -> dict:
    """All prompts at once, one slot each: generated tokens of all over the median decode time."""
    sinks = []
    for i, prompt in enumerate(prompts):
        sink = QueueSink()
        engine.submit(GenerateRequest(f"b{time.monotonic_ns()}-{i}", prompt, sink, sampling, max_tokens=n, ignore_eos=True))
        sinks.append(sink)
    st = engine.stats
    before = (st.steps, st.step_seconds, st.decode_call_seconds, st.device_wait_seconds, st.spec_verify_steps,
              st.spec_rollbacks, st.spec_rollback_seconds)
    usages = []
    for sink in sinks:
        r = sink.collect(timeout=600)
        assert r.error is None, r.error
        usages.append(r.usage)
    after = (st.steps, st.step_seconds, st.decode_call_seconds, st.device_wait_seconds, st.spec_verify_steps,
             st.spec_rollbacks, st.spec_rollback_seconds)
    # where the engine's time went: its steps, the llama_decode calls, the wait for the device
    engine_time = dict(zip(("steps", "step_s", "decode_call_s", "device_wait_s", "verify_steps", "rollbacks", "rollback_s"),
                           (round(b - a, 4) for a, b in zip(before, after))))
    decode_s = statistics.median(u.decode_s for u in usages)
    generated = sum(u.completion_tokens - 1 for u in usages)
    drafted = sum(u.draft_tokens for u in usages)
    return {"tokens_per_s": generated / decode_s if decode_s > 0 else 0.0, "decode_s": decode_s,
            "generated": generated, "drafted": drafted, "accepted": sum(u.draft_accepted for u in usages),
            "engine": engine_time}


def _greedy_and_free(gguf: str, config: SpecConfig, args, np_: int, drafter=None,
                     verify_all: bool = False) -> tuple[list[dict], list[dict]]:
    """On a fresh engine of np_ slots: the greedy runs of the rewrite prompt (with `drafter`
    in place of ngram-simple, if given; `verify_all`: every draft verified, none only checked),
    then the free-text runs at temperature 0.8. Each greedy run carries `checked`, the drafts
    compared with the output instead of verified."""
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1)
    engine = engine_for(gguf, config, args, n_parallel=np_)
    real, shadow = speculative.NgramDrafter, speculative._shadow
    try:
        def prompts(rep, kind):
            body = FREE_PROMPT.split("\n", 1)[1] if kind == "free" else rewrite_prompt(0)[:2000]
            return [engine.model.tokenize(f"Request {rep * 100 + j}.\n{body}", add_special=True) for j in range(np_)]
        batch(engine, prompts(99, "free"), 8, greedy)  # warm-up
        speculative.NgramDrafter = drafter or real
        if verify_all:
            speculative._shadow = lambda active, draft: True
        try:
            rewrite = []
            for r in range(args.reps):
                checked = engine.stats.spec_drafts_checked
                rewrite.append(batch(engine, prompts(r, "reject"), args.n_predict, greedy))
                rewrite[-1]["checked"] = engine.stats.spec_drafts_checked - checked
        finally:
            speculative.NgramDrafter, speculative._shadow = real, shadow
        free = [batch(engine, prompts(r, "free"), args.n_predict, sampled) for r in range(args.reps)]
    finally:
        engine.stop()
    return rewrite, free


def verify_cost(gguf: str, args, spec: SpecConfig) -> dict:
    """The cost of verifying drafts that are all rejected, by number of slots decoding at once."""
    out: dict = {}
    for np_ in [int(x) for x in args.verify_cost.split(",")]:
        row: dict = {}
        row["off"], row["free_off"] = _greedy_and_free(gguf, SpecConfig(), args, np_)
        row["reject"], row["free_ngram-simple"] = _greedy_and_free(gguf, spec, args, np_, RejectDrafter)
        row["reject_verified"], _ = _greedy_and_free(gguf, spec, args, np_, RejectDrafter, verify_all=True)
        med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in row.items()}
        out[str(np_)] = {
            "tokens_per_s": med,
            "reject_cost": 1 - med["reject"] / med["off"] if med["off"] else None,
            "reject_verified_cost": 1 - med["reject_verified"] / med["off"] if med["off"] else None,
            "free_ratio": med["free_ngram-simple"] / med["free_off"] if med["free_off"] else None,
            "reject_checked": sum(x["checked"] for x in row["reject"]),
            "reject_drafted": sum(x["drafted"] for x in row["reject"]),
            "reject_accepted": sum(x["accepted"] for x in row["reject"]),
            "reject_verified_drafted": sum(x["drafted"] for x in row["reject_verified"]),
            "reject_verified_accepted": sum(x["accepted"] for x in row["reject_verified"]),
            "runs": row,
        }
        r = out[str(np_)]
        print(f"np {np_}: off {med['off']:.1f} reject {med['reject']:.1f} tok/s (cost {r['reject_cost']:.1%}, "
              f"{r['reject_checked']} drafts checked, {r['reject_drafted']} tokens verified); every draft verified "
              f"{med['reject_verified']:.1f} (cost {r['reject_verified_cost']:.1%}, {r['reject_verified_drafted']} tokens, "
              f"{r['reject_verified_accepted']} accepted); free off {med['free_off']:.1f} ngram {med['free_ngram-simple']:.1f}",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-8b", help="bench_models.py name")
    p.add_argument("--scale", default="real")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--vocab", default=None)
    p.add_argument("--gguf", default=None, help="an existing GGUF instead of writing a bench model")
    p.add_argument("--n-predict", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--draft-max", type=int, default=16)
    p.add_argument("--ngram-n", type=int, default=12, help="--spec-ngram-size-n")
    p.add_argument("--rs-snapshots", type=int, default=-1, help="--spec-rs-snapshots (recurrent and hybrid models)")
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--n-gpu-layers", type=int, default=-1)
    p.add_argument("--verify-cost", default=None, metavar="NP,...",
                   help="measure the cost of rejected drafts at these numbers of slots instead")
    p.add_argument("--reject-token", type=int, default=0, help="the token the `reject` drafter proposes")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    t0 = time.monotonic()
    gguf = args.gguf
    if gguf is None:
        from scripts.bench_models import write_bench_model

        gguf = str(write_bench_model(args.model, f"/tmp/models/{args.model}-{args.scale}.gguf", args.vocab, args.scale, args.layers))
    spec = SpecConfig(type="ngram-simple", n_max=args.draft_max, ngram_n=args.ngram_n, rs_snapshots=args.rs_snapshots)
    if args.verify_cost:
        RejectDrafter.token = args.reject_token
        out = {"benchmark": "speculative decoding, the cost of rejected drafts", "model": args.model,
               "scale": args.scale, "gguf": gguf,
               "settings": {"n_predict": args.n_predict, "reps": args.reps, "draft_max": args.draft_max,
                            "ngram_n": args.ngram_n, "rs_snapshots": args.rs_snapshots, "ctx_size_per_slot": args.ctx_size,
                            "n_gpu_layers": args.n_gpu_layers, "reject_token": args.reject_token},
               "by_np": verify_cost(gguf, args, spec), "machine": bc.machine_info(),
               "seconds": round(time.monotonic() - t0, 1)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        return 0
    greedy = SamplingParams(temperature=0.0)
    sampled = SamplingParams(temperature=0.8, seed=1)
    results: dict = {}

    base = engine_for(gguf, SpecConfig(), args)
    try:
        rewrite = [base.model.tokenize(rewrite_prompt(i), add_special=True) for i in range(args.reps)]
        free = [base.model.tokenize(FREE_PROMPT.format(i=i), add_special=True) for i in range(args.reps)]
        results["off"] = case(base, rewrite, args.n_predict, greedy)
        results["free_off"] = case(base, free, args.n_predict, sampled)
    finally:
        base.stop()
    drafting = engine_for(gguf, spec, args)
    try:
        results["ngram-simple"] = case(drafting, rewrite, args.n_predict, greedy)
        results["free_ngram-simple"] = case(drafting, free, args.n_predict, sampled)
        real = speculative.NgramDrafter
        speculative.NgramDrafter = OracleDrafter  # the `copy` case: drafts of the baseline's output
        try:
            results["copy"] = case(drafting, rewrite, args.n_predict, greedy, oracle=results["off"]["_tokens"])
        finally:
            speculative.NgramDrafter = real
    finally:
        drafting.stop()
    same = results["ngram-simple"]["_tokens"] == results["off"]["_tokens"]
    for r in results.values():
        del r["_tokens"]
    off = results["off"]["tokens_per_s"]
    summary = {
        "ngram_speedup": results["ngram-simple"]["tokens_per_s"] / off if off else None,
        "copy_speedup": results["copy"]["tokens_per_s"] / off if off else None,
        "free_ratio": (results["free_ngram-simple"]["tokens_per_s"] / results["free_off"]["tokens_per_s"]
                       if results["free_off"]["tokens_per_s"] else None),
        "greedy_output_identical": same,
        # every step of `copy` verifies the pending token and --draft-max drafted ones: a model
        # that writes the file back verbatim emits all of them per step of this length
        "verify_step_ms": results["copy"]["step_ms"],
        "decode_step_ms": results["off"]["step_ms"],
        "full_copy_tokens_per_s": (1 + args.draft_max) * 1000 / results["copy"]["step_ms"] if results["copy"]["step_ms"] else None,
    }
    if off and summary["full_copy_tokens_per_s"]:
        summary["full_copy_speedup"] = summary["full_copy_tokens_per_s"] / off
    out = {
        "benchmark": "speculative decoding, rewrite-a-file workload",
        "model": args.model, "scale": args.scale, "gguf": gguf,
        "settings": {"n_predict": args.n_predict, "reps": args.reps, "draft_max": args.draft_max, "rs_snapshots": args.rs_snapshots,
                     "ngram_n": args.ngram_n, "ctx_size": args.ctx_size, "n_gpu_layers": args.n_gpu_layers, "np": 1},
        "summary": summary,
        "results": results,
        "machine": bc.machine_info(),
        "seconds": round(time.monotonic() - t0, 1),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"summary": summary, **{k: {"tokens_per_s": round(v["tokens_per_s"], 1), "acceptance": round(v["acceptance"], 3)}
                                             for k, v in results.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
