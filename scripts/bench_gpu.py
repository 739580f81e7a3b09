#!/usr/bin/env python3
"""Side-by-side benchmark of warmslot and llama-server on one model (GPU or CPU).

The workloads, the flags and examples are in `python scripts/bench_gpu.py --help` (the text
of gpu_bench/cli.py); the pieces of the benchmark live in scripts/gpu_bench/.
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: the repo root makes the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.gpu_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
