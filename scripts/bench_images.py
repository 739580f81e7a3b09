#!/usr/bin/env python3
"""Images in an agent loop, server against server: warmslot and llama-server `--mmproj` on the
same model, projector, flags and requests.

A computer-use-shaped loop: a system prompt, then --turns turns, each a user message with one
new screenshot-sized image (a different PNG every turn) and a line of text; the reply (greedy,
--n-predict tokens) is appended before the next turn. Every request sends the whole
conversation, streamed. Per turn: TTFT (request sent to the first token), prompt, cached and
computed tokens, the ideal (what the turn added: its image and text, the template glue, minus
the previous reply the slot already holds), and warmslot's image encodes and images decoded
and preprocessed (`warmslot_media_encodes_total`, `warmslot_media_preprocessed_total`;
llama-server reports neither at its default verbosity: its computed tokens show what it
encoded).

With --write-models DIR the random-weight models are generated first (scripts/bench_models.py
for the text model; the projector matched to its width). `--projector clip-l-336` (the
default) is a CLIP ViT-L/14 encoder at 336 px with LLaVA's MLP projector, 576 tokens per
image; `--projector qwen2vl-7b` is Qwen2-VL-7B's vision tower (32 layers of 1280, 14 px
patches, 2x2 merged: a 1280x800 screenshot is 46x29 = 1334 tokens), whose images take M-RoPE
positions in a Qwen3.5 text model (46 positions for those 1334 tokens):

    python scripts/bench_images.py --write-models /tmp/models --shape qwen3-8b --ngl 99 --out OUT.json
    python scripts/bench_images.py --write-models /tmp/models --shape qwen35-9b --projector qwen2vl-7b --out OUT.json
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import server_process as sp  # noqa: E402
from scripts.bench_client import stream_request  # noqa: E402

# CLIP ViT-L/14 at 336 px (LLaVA-1.5's encoder): 24 layers, 576 patches, so 576 tokens an image
CLIP_L_336 = dict(image_size=336, patch_size=14, n_embd=1024, n_ff=4096, n_head=16, n_layer=24)
# Qwen2-VL-7B's vision tower: 32 layers of 1280, 16 heads, MLP 5120, 14 px patches merged 2x2
QWEN2VL_7B = dict(image_size=560, patch_size=14, n_embd=1280, n_ff=5120, n_head=16, n_layer=32)
PROJECTORS = {"clip-l-336": ("mlp", CLIP_L_336), "qwen2vl-7b": ("qwen2vl", QWEN2VL_7B)}
SYSTEM = ("You are a computer-use agent. Each turn you get a screenshot of the desktop and the user's instruction. "
          "Describe what you see that matters, then say the next action (click, type, scroll) in one line.")


def screenshot(turn: int, size: tuple[int, int] = (1280, 800)) -> str:
    """A data URL of a screenshot-sized PNG, different every turn (windows, text-like bars)."""
    import base64
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(turn)
    img = Image.new("RGB", size, (rng.randrange(200, 256), rng.randrange(200, 256), rng.randrange(200, 256)))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = rng.randrange(0, size[0] - 200), rng.randrange(0, size[1] - 120)
        w, h = rng.randrange(150, 500), rng.randrange(80, 300)
        draw.rectangle([x, y, x + w, y + h], fill=tuple(rng.randrange(0, 256) for _ in range(3)), outline=(0, 0, 0))
        for line in range(y + 10, y + h - 8, 14):
            draw.rectangle([x + 8, line, x + 8 + rng.randrange(20, w - 16), line + 6], fill=(30, 30, 30))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def write_models(folder: Path, shape: str, vocab: str | None, projector: str, f16: bool) -> tuple[Path, Path]:
    from scripts.bench_models import resolve_shape, write_bench_model
    from tests.tiny_models import write_tiny_mmproj

    folder.mkdir(parents=True, exist_ok=True)
    model = write_bench_model(shape, folder / f"{shape}.gguf", vocab)
    mmproj = folder / f"{shape}-{projector}-{'f16' if f16 else 'f32'}-mmproj.gguf"
    if not mmproj.exists():
        t0 = time.perf_counter()
        kind, dims = PROJECTORS[projector]
        write_tiny_mmproj(mmproj, shape=dims, n_embd_text=resolve_shape(shape).n_embd, name=f"{projector}-random", projector=kind, f16=f16)
        print(f"{mmproj}: {mmproj.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", flush=True)
    return model, mmproj


def server_command(server: str, a: argparse.Namespace) -> list[str]:
    common = ["-np", "1", "-c", str(a.ctx_size), "-ngl", str(a.ngl), "--mmproj", str(a.mmproj), *shlex.split(a.flags)]
    if server == "warmslot":
        return sp.warmslot_command(a.model, common, python=a.python)
    return sp.llama_server_command(a.model, [*common, "--jinja"], binary=a.llama_server)


def media_counts(server: str, srv: sp.ServerProcess, client: httpx.Client) -> tuple[int, int] | None:
    """warmslot's (encodes, images preprocessed) so far; llama-server logs neither at its
    default verbosity (its computed tokens show what it encoded)."""
    if server != "warmslot":
        return None
    text = client.get(srv.url + "/metrics").text
    return tuple(int(float(re.search(rf"^warmslot_media_{name}_total (\S+)", text, re.M).group(1))) for name in ("encodes", "preprocessed"))


def run_server(server: str, a: argparse.Namespace) -> dict:
    cmd = server_command(server, a)
    out: dict = {"server": server, "command": cmd, "turns": []}
    print(f"[{server}] {shlex.join(cmd)}", flush=True)
    with sp.ServerProcess(server, cmd, log_path=Path(a.log_dir) / f"{server}.log") as srv, httpx.Client(timeout=900) as client:
        out["load_s"] = srv.load_s
        warm = stream_request(srv.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
                              client=client)
        if not warm.ok:
            raise RuntimeError(f"{server}: warm-up failed: {warm.error}\n{srv.output_tail()}")
        messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        held = 0  # tokens the slot holds after the previous turn: its prompt and its reply
        for turn in range(a.turns):
            messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Step {turn + 1}: open the settings and turn on dark mode."},
                {"type": "image_url", "image_url": {"url": screenshot(turn)}},
            ]})
            before = media_counts(server, srv, client)
            r = stream_request(srv.url, "/v1/chat/completions", {
                "messages": messages, "max_tokens": a.n_predict, "temperature": 0, "ignore_eos": True,
            }, client=client)
            if not r.ok:
                raise RuntimeError(f"{server} turn {turn + 1}: {r.error}\n{srv.output_tail()}")
            timings = r.timings or {}
            cached = r.cached_tokens if r.cached_tokens is not None else timings.get("cache_n", 0)
            row = {
                "turn": turn + 1, "ttft_s": r.ttft_s, "prompt_tokens": r.prompt_tokens, "cached_tokens": cached,
                "computed_tokens": r.prompt_tokens - cached, "ideal_tokens": r.prompt_tokens - held,
                "completion_tokens": r.completion_tokens,
            }
            if before is not None:
                after = media_counts(server, srv, client)
                row["encodes"], row["preprocessed"] = after[0] - before[0], after[1] - before[1]
            out["turns"].append(row)
            print(f"  {server:12s} turn {turn + 1}: ttft {r.ttft_s * 1000:7.1f} ms, prompt {r.prompt_tokens}, "
                  f"computed {row['computed_tokens']} (ideal {row['ideal_tokens']}), encodes {row.get('encodes', '-')}, "
                  f"preprocessed {row.get('preprocessed', '-')}", flush=True)
            held = r.prompt_tokens + r.completion_tokens
            messages.append({"role": "assistant", "content": r.content})
    later = out["turns"][1:]
    out["summary"] = {
        "ttft_last_s": out["turns"][-1]["ttft_s"],
        "ttft_p50_after_first_s": statistics.median(t["ttft_s"] for t in later) if later else None,
        "computed_tokens": sum(t["computed_tokens"] for t in later),
        "ideal_tokens": sum(t["ideal_tokens"] for t in later),
        "encodes": sum(t["encodes"] for t in out["turns"]) if server == "warmslot" else None,
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="the text model (with --write-models: written there)")
    ap.add_argument("--mmproj", help="its projector (with --write-models: written there)")
    ap.add_argument("--write-models", metavar="DIR", help="generate the random-weight text model and projector in DIR")
    ap.add_argument("--shape", default="qwen3-8b", help="scripts/bench_models.py shape of the text model")
    ap.add_argument("--projector", default="clip-l-336", choices=sorted(PROJECTORS), help="the projector --write-models writes")
    ap.add_argument("--projector-f16", action="store_true", help="its weights in F16, as published projectors are (F32 otherwise)")
    ap.add_argument("--vocab", default=None, help="vocab-only GGUF for the text model (bench_models.py's default otherwise)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("-c", "--ctx-size", type=int, default=32768)
    ap.add_argument("--ngl", default="99")
    ap.add_argument("--flags", default="", help="more flags for both servers")
    ap.add_argument("--servers", default="warmslot,llama-server")
    ap.add_argument("--llama-server", default="llama-server")
    ap.add_argument("--python", default=None)
    ap.add_argument("--log-dir", default="/tmp/bench-images-logs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.write_models:
        model, mmproj = write_models(Path(a.write_models), a.shape, a.vocab, a.projector, a.projector_f16)
        a.model, a.mmproj = a.model or str(model), a.mmproj or str(mmproj)
    if not (a.model and a.mmproj):
        ap.error("give -m and --mmproj, or --write-models DIR")
    sp.install_signal_handlers()
    results: dict = {"model": a.model, "mmproj": a.mmproj, "shape": a.shape, "projector": {"name": a.projector, "f16": a.projector_f16, **PROJECTORS[a.projector][1]}, "turns": a.turns,
                     "n_predict": a.n_predict, "ctx_size": a.ctx_size, "flags": a.flags, "servers": {}}
    for server in a.servers.split(","):
        results["servers"][server] = run_server(server, a)
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    servers = results["servers"]
    if "warmslot" in servers and "llama-server" in servers:
        ws, ls = servers["warmslot"]["summary"], servers["llama-server"]["summary"]
        results["ratio"] = {
            "ttft_last": ws["ttft_last_s"] / ls["ttft_last_s"],
            "ttft_p50_after_first": ws["ttft_p50_after_first_s"] / ls["ttft_p50_after_first_s"],
            "warmslot_computed_over_ideal": ws["computed_tokens"] / ws["ideal_tokens"],
        }
        print(json.dumps(results["ratio"]), flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
