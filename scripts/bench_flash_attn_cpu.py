#!/usr/bin/env python3
"""Flash attention on and off, phase by phase and depth by depth, on llama.cpp directly.

llama.cpp fixes flash attention when a context is made (the V cache is stored transposed
without it), so a server picks one setting for every phase. This measures what each costs a
single sequence, with nothing else in its memory: at each depth D of `--depths`, the prefill
of `--new` tokens after D tokens of its own, then `--decode` one-token steps after them. The
sequence is filled up to each depth once per setting (not timed) and cut back after each
measurement, so the work is one prefill to the deepest depth per setting and round.

`--rounds` alternates the order of the settings (off then on, on then off), and the medians
are over rounds. The summary gives per depth on / off for the prefill time and the time per
decoded token (lower is better for flash attention).

    python scripts/bench_flash_attn_cpu.py -m MODEL [--depths 0,2048,8192,16384] [--new 512]
        [--decode 32] [--rounds 2] [-t 2] [--out FILE]
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (before numpy)

import argparse
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts.bench_pool_layout import decode_steps, fill  # noqa: E402
from warmslot.slots.llama_api import Batch, Context, ContextParams, Model  # noqa: E402


def run_setting(model: Model, a: argparse.Namespace, fa: str) -> list[dict]:
    """One context with flash attention `fa`; a row per depth."""
    n_ctx = max(a.depths) + a.new + a.decode + 256
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=a.threads,
                                       flash_attn=fa, kv_unified=True))
    batch = Batch(512, 1)
    vocab = model.n_vocab
    own = [(7 * i + 11) % vocab for i in range(max(a.depths))]
    new = [(13 * i + 5) % vocab for i in range(a.new)]
    rows, held = [], 0
    try:
        for depth in sorted(a.depths):
            if depth > held:
                fill(ctx, batch, 0, own[held:depth], held)
                held = depth
            prefill = fill(ctx, batch, 0, new, depth)
            step = decode_steps(ctx, batch, 0, depth + a.new, a.decode, new[-1])
            ctx.seq_rm(0, depth)
            rows.append({"flash_attn": fa, "depth": depth, "prefill_s": prefill, "decode_ms_per_token": 1000 * step})
            print(f"fa {fa:3s} depth {depth:6d}: prefill {a.new} in {prefill:.3f} s, decode {1000 * step:.2f} ms/token",
                  flush=True)
    finally:
        ctx.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2048, 8192, 16384])
    p.add_argument("--new", type=int, default=512, help="tokens of the measured prefill at each depth")
    p.add_argument("--decode", type=int, default=32, help="measured one-token steps after it")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--out", help="write the results here (JSON)")
    a = p.parse_args(argv)
    path = a.model or bc.default_model()
    model = Model(path, n_gpu_layers=0)
    started = bc.now_iso()
    rows = []
    for r in range(a.rounds):
        for fa in (("off", "on") if r % 2 == 0 else ("on", "off")):
            rows += [{"round": r, **row} for row in run_setting(model, a, fa)]
    summary = []
    for depth in sorted(a.depths):
        med = {fa: {k: statistics.median(x[k] for x in rows if x["depth"] == depth and x["flash_attn"] == fa)
                    for k in ("prefill_s", "decode_ms_per_token")} for fa in ("off", "on")}
        summary.append({"depth": depth, **{f"{k}_{fa}": round(med[fa][k], 4) for fa in med for k in med[fa]},
                        "prefill_on_over_off": round(med["on"]["prefill_s"] / med["off"]["prefill_s"], 3),
                        "decode_on_over_off": round(med["on"]["decode_ms_per_token"] / med["off"]["decode_ms_per_token"], 3)})
    print(bc.format_table(["depth", f"prefill {a.new} off s", "on s", "on/off", "decode off ms", "on ms", "on/off"],
                         [[s["depth"], s["prefill_s_off"], s["prefill_s_on"], s["prefill_on_over_off"],
                           s["decode_ms_per_token_off"], s["decode_ms_per_token_on"], s["decode_on_over_off"]]
                          for s in summary]))
    if a.out:
        bc.write_json(Path(a.out), {"benchmark": "flash-attn-cpu", "started": started, "finished": bc.now_iso(),
                                    "machine": bc.machine_info(), "model": bc.file_info(path),
                                    "settings": {k: v for k, v in vars(a).items() if k != "out"},
                                    "summary": summary, "runs": rows})
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
