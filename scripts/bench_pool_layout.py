#!/usr/bin/env python3
"""What other conversations' cells cost one sequence: a stream of its own or one shared pool.

In one pool (`kv_unified`), idle conversations stay on the device as sequences whose cells
sit among the busy ones', and sequences that share a prefix share its cells. The price: a
sequence's attention spans every cell up to the highest one in use, its own or not, and
masks the others. This measures that price on llama.cpp directly (no server), for one
sequence that prefills `--new` tokens after `--depth` tokens of its own and then decodes
`--decode` tokens, with:

- `stream`: a context whose pool holds nothing else (what a stream per slot gives it);
- `pool`: a unified pool where other sequences hold `--others` cells below it (copies of
  one 2K-token state, each in cells of its own), the worst
  place: its own cells come after all of theirs, so every step spans all of them;

each with flash attention on and off. Per case the medians of `--reps` runs, in turn.

    python scripts/bench_pool_layout.py -m MODEL [--others 20000] [--depth 1200] [--new 512]
        [--decode 32] [--reps 3] [-t 2] [-ngl 0] [--out FILE]
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (before numpy)

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from warmslot.slots.llama_api import Batch, Context, ContextParams, Model


OTHER_TOKENS = 2048


def fill(ctx: Context, batch: Batch, seq: int, tokens: list[int], pos0: int = 0) -> float:
    """Prefill `tokens` into `seq` from `pos0` in batches; seconds taken."""
    t0 = time.perf_counter()
    for i in range(0, len(tokens), batch.capacity):
        batch.clear()
        part = tokens[i : i + batch.capacity]
        batch.add(part, pos0 + i, seq, logits_last=i + len(part) == len(tokens))
        if ctx.decode(batch) != 0:
            raise RuntimeError("decode failed")
    ctx.synchronize()
    return time.perf_counter() - t0


def decode_steps(ctx: Context, batch: Batch, seq: int, pos: int, n: int, token: int) -> float:
    """n one-token steps of `seq` from `pos`; seconds per step."""
    t0 = time.perf_counter()
    for k in range(n):
        batch.clear()
        batch.add((token,), pos + k, seq, logits_last=True)
        if ctx.decode(batch) != 0:
            raise RuntimeError("decode failed")
        ctx.logits(0)
    return (time.perf_counter() - t0) / n


def case(model: Model, a, layout: str, fa: str) -> dict:
    # the cells below: copies of one state of OTHER_TOKENS (a state load writes cells of its
    # own, so no prefill of all of them is needed)
    n_other = -(-a.others // OTHER_TOKENS)
    n_ctx = n_other * OTHER_TOKENS + a.depth + a.new + a.decode + 1024
    n_seq = 1 + n_other
    params = ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_seq_max=n_seq, n_threads=a.threads,
                           flash_attn=fa, kv_unified=True)
    ctx = Context(model, params)
    batch = Batch(512, n_seq)
    vocab = model.n_vocab
    own = [(7 * i + 11) % vocab for i in range(a.depth)]
    new = [(13 * i + 5) % vocab for i in range(a.new)]
    other = [(3 * i + 1) % vocab for i in range(min(a.others, OTHER_TOKENS))]
    try:
        if layout == "pool":
            fill(ctx, batch, 1, other)
            state = ctx.state_get(1, partial=False)
            for seq in range(2, 1 + n_other):
                if not ctx.state_set(seq, state, partial=False):
                    raise RuntimeError("no room for the other sequences")
        prefill, decode = [], []
        for _ in range(a.reps):
            ctx.seq_clear(0)
            fill(ctx, batch, 0, own)
            prefill.append(fill(ctx, batch, 0, new, a.depth))
            decode.append(decode_steps(ctx, batch, 0, a.depth + a.new, a.decode, new[-1]))
        return {"layout": layout, "flash_attn": fa, "cells_below": n_other * len(other) if layout == "pool" else 0,
                "prefill_s": statistics.median(prefill), "prefill_runs_s": prefill,
                "decode_ms_per_token": 1000 * statistics.median(decode),
                "decode_runs_ms": [1000 * d for d in decode]}
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--others", type=int, default=20000, help="cells other sequences hold below it (pool)")
    p.add_argument("--depth", type=int, default=1200, help="its own tokens before the measured prefill")
    p.add_argument("--new", type=int, default=512, help="tokens of the measured prefill")
    p.add_argument("--decode", type=int, default=32, help="measured one-token steps")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    p.add_argument("--out", help="write the results here (JSON)")
    a = p.parse_args(argv)
    model = Model(a.model, n_gpu_layers=a.n_gpu_layers)
    rows = []
    for fa in ("off", "on"):
        for layout in ("stream", "pool"):
            r = case(model, a, layout, fa)
            rows.append(r)
            print(f"{layout:6s} fa {fa:3s}: prefill {a.new} at {a.depth}: {r['prefill_s']:.3f} s, "
                  f"decode {r['decode_ms_per_token']:.2f} ms/token", flush=True)
    by = {(r["layout"], r["flash_attn"]): r for r in rows}
    ratios = {fa: {"prefill": by["pool", fa]["prefill_s"] / by["stream", fa]["prefill_s"],
                   "decode": by["pool", fa]["decode_ms_per_token"] / by["stream", fa]["decode_ms_per_token"]}
              for fa in ("off", "on")}
    for fa, r in ratios.items():
        print(f"pool / stream, fa {fa}: prefill {r['prefill']:.2f}x, decode {r['decode']:.2f}x")
    if a.out:
        out = {"benchmark": "pool-layout", "model": Path(a.model).name, "machine": platform.processor() or platform.machine(),
               "settings": {k: v for k, v in vars(a).items() if k != "out"}, "cases": rows, "pool_over_stream": ratios}
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
