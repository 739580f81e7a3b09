"""How long the disk tier's startup index rebuild takes for many entries.

Writes `--entries` entry files (real format, random tokens of `--tokens` each, `--state-bytes`
of state each, two checkpoints) into a fresh directory, then opens a `DiskCache` on it
`--repeats` times: with the files in the page cache (a restart right after a stop) and with
them dropped from it first (posix_fadvise DONTNEED on the fsynced files: a restart after the
machine did other things). The rebuild reads each entry's head only (preamble, JSON header,
tokens), never its state. Prints and writes JSON with the load average at the start and end.

    python scripts/bench_disk_index.py [--entries 1000] [--tokens 2000,16000] [--out docs/benchmarks/disk-index.json]
"""

from __future__ import annotations

import argparse
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
from warmslot.cache.disk import DiskCache, Meta  # noqa: E402
from warmslot.cache.disk import format as fmt  # noqa: E402

FINGERPRINT = "bench-model:f16:f16:0:u"


def write_entries(directory: Path, n: int, n_tokens: int, state_bytes: int) -> int:
    rng = np.random.default_rng(0)
    state = rng.integers(0, 256, state_bytes, dtype=np.uint8)
    ck = [Checkpoint(n_tokens // 2, state[:4096]), Checkpoint(n_tokens, None, np.zeros(1000, np.float32))]
    total = 0
    for i in range(n):
        tokens = rng.integers(0, 150000, n_tokens).tolist()
        meta = Meta(FINGERPRINT, f"tenant{i % 8}", n_tokens, time.time() - i, None)
        total += fmt.write(str(directory), f"{i:032x}{fmt.SUFFIX}", meta, tokens, state, ck).file_bytes
    return total


def time_open(directory: Path, budget: int, cold: bool) -> tuple[float, int]:
    if cold:
        drop_page_cache(directory)
    t0 = time.perf_counter()
    cache = DiskCache(str(directory), budget, FINGERPRINT, True, background=False)
    seconds = time.perf_counter() - t0
    n = cache.n_entries
    cache.close()
    return seconds, n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--tokens", default="2000,16000", help="tokens per entry, one run per value")
    p.add_argument("--state-bytes", type=int, default=65536, help="state bytes per entry (never read by the rebuild)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None, help="parent of the scratch directory (default: the system temp dir)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    result = {"benchmark": "disk-index-rebuild", "started": bc.now_iso(), "machine": bc.machine_info(),
              "load_average_start": os.getloadavg(), "entries": a.entries, "state_bytes": a.state_bytes, "runs": []}
    for n_tokens in (int(x) for x in a.tokens.split(",")):
        directory = Path(tempfile.mkdtemp(prefix="disk-index-", dir=a.dir))
        try:
            t0 = time.perf_counter()
            nbytes = write_entries(directory, a.entries, n_tokens, a.state_bytes)
            write_s = time.perf_counter() - t0
            run = {"tokens_per_entry": n_tokens, "bytes": nbytes, "write_s": round(write_s, 2)}
            for cold in (False, True):
                times = []
                for _ in range(a.repeats):
                    seconds, n = time_open(directory, 1 << 50, cold)
                    assert n == a.entries, n
                    times.append(seconds)
                run["cold_page_cache" if cold else "warm_page_cache"] = {
                    "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
                    "max_s": round(max(times), 4)}
            result["runs"].append(run)
            print(f"{a.entries} entries of {n_tokens} tokens ({nbytes / 1e6:.0f} MB): rebuild "
                  f"{run['warm_page_cache']['median_s'] * 1000:.0f} ms in the page cache, "
                  f"{run['cold_page_cache']['median_s'] * 1000:.0f} ms after dropping it (median of {a.repeats})")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()
    result["finished"] = bc.now_iso()
    print(f"load average {result['load_average_start']} at the start, {result['load_average_end']} at the end")
    if a.out:
        bc.write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
