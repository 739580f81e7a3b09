"""Sampling the tokens of one step, on several threads when there are many.

After a decode, every generating slot samples from its row of logits with its own native
sampler chain. Each sample is a ctypes call that releases the GIL and spends most of its
time in C over the whole vocabulary (building the candidate array, top-k): with 16 slots and
a 150K vocabulary that is a third of a step's time on one thread. The calls touch only their
own sampler and a read-only row of logits, so they run side by side on a small pool.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Sequence

from ..llama_api import Context, Sampler, SamplingFailed

# below this many samples in a step, handing them to threads costs more than it saves
MIN_PARALLEL = 4


def sampling_threads(n_parallel: int) -> int:
    """Threads for sampling: none on small machines (sampling then runs on the engine thread
    between decodes, while llama.cpp's own threads are idle anyway)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n_parallel < MIN_PARALLEL or cores < 8:
        return 0
    return min(n_parallel, cores // 2, 8)


class BatchSampler:
    def __init__(self, ctx: Context, threads: int) -> None:
        self.ctx = ctx
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="warmslot-sample") if threads > 0 else None
        )

    def sample(self, work: Sequence[tuple[Sampler, int]]) -> list[int | SamplingFailed]:
        """Sample one token per (sampler, batch output index), in order; a row that gives no
        token gives its `SamplingFailed` instead, and the others are sampled all the same.
        The decode must have finished (the engine synchronized with the device before)."""
        if not work:
            return []
        if self._pool is None or len(work) < MIN_PARALLEL:
            return [self._one(job) for job in work]
        # llama.cpp reorders its output rows on the first read of logits after a decode:
        # let that happen here, on one thread, before the rows are read side by side
        self.ctx.prepare_outputs(work[0][1])
        return list(self._pool.map(self._one, work))

    def _one(self, job: tuple[Sampler, int]) -> int | SamplingFailed:
        sampler, index = job
        try:
            return sampler.sample(self.ctx, index)
        except SamplingFailed as failed:
            return failed

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
