"""How fast a disk-tier entry is read back and verified when it is not in the page cache.

Writes one entry file in the real format (`--state-mib` of state plus `--checkpoints`
checkpoints of `--checkpoint-mib` each with a vocabulary of logits: the shape of a hybrid
model's long conversation) into `--dir` (a directory on a real disk: not a tmpfs), then
`--repeats` times drops it from the page cache (posix_fadvise DONTNEED on the fsynced file)
and times `format.read` of the whole file, and of the state alone when the format can read
a subset of the sections. Prints and writes JSON with the load average at the start and end.

    python scripts/bench_disk_read.py [--state-mib 1024] [--checkpoints 4] [--checkpoint-mib 96] [--dir .] [--out FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common as bc  # noqa: E402
from scripts.page_cache import drop_page_cache  # noqa: E402
from warmslot.cache.checkpoints import Checkpoint  # noqa: E402
from warmslot.cache.disk import Meta  # noqa: E402
from warmslot.cache.disk import format as fmt  # noqa: E402

N_VOCAB = 151_936


def write_entry(directory: Path, state_mib: int, n_checkpoints: int, checkpoint_mib: int, n_tokens: int) -> Path:
    rng = np.random.default_rng(0)
    state = rng.integers(0, 256, state_mib << 20, dtype=np.uint8)
    checkpoints = [
        Checkpoint((i + 1) * n_tokens // (n_checkpoints + 1), rng.integers(0, 256, checkpoint_mib << 20, dtype=np.uint8),
                   rng.standard_normal(N_VOCAB).astype(np.float32))
        for i in range(n_checkpoints)
    ]
    tokens = rng.integers(0, 150_000, n_tokens).tolist()
    meta = Meta("bench-model:f16:f16:0:u", "", n_tokens, time.time(), None)
    name = f"{0:032x}{fmt.SUFFIX}"
    fmt.write(str(directory), name, meta, tokens, state, checkpoints)
    return directory / name


def time_read(path: Path, **kwargs) -> tuple[float, int]:
    drop_page_cache(path)
    t0 = time.perf_counter()
    header, payload = fmt.read(str(path), **kwargs)
    seconds = time.perf_counter() - t0
    return seconds, payload.nbytes + header.head_bytes


def measure(path: Path, repeats: int, **kwargs) -> dict:
    runs = [time_read(path, **kwargs) for _ in range(repeats)]
    seconds = [s for s, _ in runs]
    nbytes = runs[0][1]
    best, median = min(seconds), statistics.median(seconds)
    return {
        "bytes": nbytes,
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(median, 3),
        "gb_per_s_median": round(nbytes / median / 1e9, 3),
        "gb_per_s_best": round(nbytes / best / 1e9, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--checkpoint-mib", type=int, default=96)
    ap.add_argument("--tokens", type=int, default=32_768)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=str(bc.REPO_ROOT), help="where the entry is written (a real disk, not a tmpfs)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix=".bench-disk-read-", dir=args.dir))
    try:
        path = write_entry(work, args.state_mib, args.checkpoints, args.checkpoint_mib, args.tokens)
        result = {
            "file_bytes": path.stat().st_size,
            "directory": str(work),
            "block_bytes": fmt.BLOCK,
            "readers": getattr(fmt, "READERS", 1),
            "whole": measure(path, args.repeats),
        }
        if "checkpoints" in inspect.signature(fmt.read).parameters:
            result["state_only"] = measure(path, args.repeats, checkpoints=())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_start"] = [round(x, 2) for x in load_start]
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
