"""Helpers the test modules share: tiny engines, greedy requests, cold reference runs, servers.

Test modules import these from here, never from each other or from conftest.py, so that a
module's tests can move or go without breaking another module's imports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import numpy as np
import pytest

from scripts.server_process import ServerProcess, warmslot_command
from warmslot.slots import Engine, EngineConfig, GenerateRequest, QueueSink, Result, SamplingParams

# Small batches keep the sliding-window cache small enough that long prompts evict it.
REUSE_ENGINE = dict(n_batch=64, n_ubatch=64, n_ctx=1024)
# llama.cpp threads of a test's engine or server: two on two cores, one where tests run two at
# a time (pytest-xdist, see conftest.py), so that no engine's threads wait on a core another holds
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


def tiny_engine(path, **overrides) -> Engine:
    """An engine on a tiny model, with settings that keep numerics reproducible: F32 KV and
    no flash attention, so the order in which cells are summed barely matters."""
    config = EngineConfig(
        model_path=str(path),
        n_parallel=overrides.pop("n_parallel", 1),
        n_ctx=overrides.pop("n_ctx", 1024),
        n_batch=overrides.pop("n_batch", 512),
        n_ubatch=overrides.pop("n_ubatch", 512),
        n_threads=THREADS,
        flash_attn=overrides.pop("flash_attn", "off"),
        type_k="f32",
        type_v="f32",
        # no spare streams unless a test asks for them: the tests of slots and of the RAM tier
        # see the slots alone (a server started by its command line gets the default)
        cache_vram=overrides.pop("cache_vram", 0),
        **overrides,
    )
    engine = Engine(config)
    engine.start()
    engine.wait_ready(60)
    return engine


_ids = iter(range(10**9))


def generate(engine: Engine, tokens, *, max_tokens=16, **kw) -> Result:
    """Submit a greedy request and wait for its result."""
    sink = QueueSink()
    sampling = kw.pop("sampling", None) or SamplingParams(temperature=0.0)
    req = GenerateRequest(f"t{next(_ids)}", list(tokens), sink, sampling, max_tokens=max_tokens, **kw)
    engine.submit(req)
    return sink.collect()


def random_tokens(seed: int, n: int) -> list[int]:
    """Token ids of the tiny models' byte vocabulary, the same for a given seed."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def cold_run(path, prompt, engine_args=REUSE_ENGINE, **kw) -> Result:
    """The reference answer: `prompt` on a fresh engine that has nothing to reuse."""
    engine = tiny_engine(path, **engine_args)
    try:
        # the two most likely tokens at each step: where they nearly tie (assert_same_answer)
        return generate(engine, prompt, return_prompt_logits=True, **{"logprobs": 2, **kw})
    finally:
        engine.stop()


# How far two computations of one prompt's logits may differ and still be the same answer.
#
# llama.cpp promises no bitwise equality between two ways of computing the same tokens. The CPU
# backend picks its matrix kernels by the batch's shape (a vector dot product for one row, tiled
# GEMM for many), and each instruction set sums in its own order (16 float lanes with AVX-512, 8
# with AVX2), so a prefix computed alone, then reused, forked into a unified pool or restored,
# gives logits that differ in the last bits, and the model's layers carry that on. llama.cpp's own
# check of a backend against the CPU (tests/test-backend-ops.cpp) accepts per operation a
# normalized mean squared error of 1e-7, an RMS error of 3e-4 of the values; nothing tighter
# holds across shapes and instruction sets.
#
# Measured on the tiny models (F32 weights and KV, no flash attention, logits spread over 12-20),
# warm against cold along every reuse path of tests/cache/test_routing_and_cache.py: at most 9.2e-4 on
# AVX-512 and 1.4e-3 on an AVX2-only build, both on sliding-window memory (every other kind stays
# under 1e-5). 5e-3 is that worst case with room to spare, and still far below what a reuse bug
# does: one token of a 300-token prefix lost moves the row by 2 to 11, one token changed by 0.06
# to 0.4. (A token changed 150 tokens back in a recurrent state moves it by 1e-3 only: there the
# cached and computed token counts are what catch a wrong restore.)
LOGITS_ATOL = 5e-3
# With flash attention the CPU sums V in half precision in cell order, so the same state in other
# cells moves logits by up to a few 1e-2 (docs/state-segments.md, section 5).
LOGITS_ATOL_FLASH = 5e-2


def assert_close_logits(warm: np.ndarray, ref: np.ndarray, atol: float = LOGITS_ATOL) -> None:
    """The two rows of logits agree within `atol` (see LOGITS_ATOL for why that much)."""
    diff = float(np.abs(warm - ref).max())
    assert diff < atol, f"logits differ by {diff:.3g}, more than {atol:g}"


def compared_tokens(ref: Result, atol: float = LOGITS_ATOL) -> int:
    """How many of `ref`'s greedy tokens any computation within `atol` must repeat: all of them,
    or those before the first step whose two most likely tokens are within 2 * atol of each
    other (each run's logits may move by atol, so either could win there, and what follows
    differs). A reference without log-probabilities is compared whole."""
    for i, step in enumerate(ref.logprobs[: len(ref.tokens)]):
        if len(step.top) >= 2 and step.top[0][1] - step.top[1][1] < 2 * atol:
            return i
    return len(ref.tokens)


def assert_same_answer(warm: Result, ref: Result, atol: float = LOGITS_ATOL) -> None:
    """A reused prefix changed nothing: last-prompt-token logits within `atol`, 16 tokens, and the
    same greedy tokens wherever greedy decoding has no near-tie (`compared_tokens`)."""
    assert warm.error is None and ref.error is None
    assert_close_logits(warm.prompt_logits, ref.prompt_logits, atol)
    assert len(warm.tokens) == len(ref.tokens) == 16
    n = compared_tokens(ref, atol)
    assert warm.tokens[:n] == ref.tokens[:n], (n, warm.tokens, ref.tokens)


# the test session's fork server (tests/server_forks.py, started by conftest.py), if it runs
FORKS: list = []


class ForkedServer(ServerProcess):
    """A `python -m warmslot.server` forked from the process that has imported it already
    (about 0.7 s less per start on two cores); the same server, arguments, folder and log."""

    def _spawn(self, log):
        return FORKS[0].spawn(self.cmd[3:], env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, session=True)


def warmslot_server(model, *args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """A started `python -m warmslot.server` on THREADS threads; the caller stops it. Forked from
    the test session's fork server unless `env` adds to the environment (a module may read
    it when imported, and the fork server imported them all before)."""
    kind = ForkedServer if FORKS and env is None else ServerProcess
    return kind("warmslot", warmslot_command(model, ["-t", str(THREADS), *args]), env=env, ready_timeout=180)


def metric(server: ServerProcess, name: str) -> float:
    """A counter or gauge of the server's /metrics: `name`'s value, summed over its labels
    (`name{label="x"}` gives that series alone)."""
    text = httpx.get(server.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{"))


def abort_while_streaming(server: ServerProcess, body: dict) -> str:
    """Stream `body` from /v1/chat/completions and send the server SIGABRT at its first
    event; the stream ends with the process, which is waited for (up to 30 s). Returns the
    request's id (the completion id without its `chatcmpl-` prefix)."""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        request_id = json.loads(first[len("data: "):])["id"].removeprefix("chatcmpl-")
        os.kill(server.pid, signal.SIGABRT)
        with pytest.raises(httpx.HTTPError):
            for _ in lines:  # the stream ends with the process
                pass
    deadline = time.monotonic() + 30
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return request_id
