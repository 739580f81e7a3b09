"""Deadlines and aborts act during a long prefill: a step is cut to about half a second
at the measured prefill rate, and never below one ubatch, and deadlines and aborts are seen between steps."""

from __future__ import annotations

import time

from tests.helpers import random_tokens, tiny_engine
from warmslot.slots import ErrorKind, GenerateRequest, QueueSink, SamplingParams
from warmslot.slots.step.scheduler import timed_prefill_cap

N_PROMPT = 16_000  # one decode of it took a minute on a loaded 2-core machine


def test_a_step_is_cut_to_the_time_target_in_whole_ubatches():
    assert timed_prefill_cap(0.0, 512) == 512  # no rate measured yet: one ubatch
    assert timed_prefill_cap(10_000.0, 512, 0.25) == 2048  # 2500 tokens fit: four ubatches
    assert timed_prefill_cap(10_000.0, 512, 0.5) == 4608  # 5000 fit: nine ubatches
    assert timed_prefill_cap(1_000.0, 512, 0.25) == 512  # never less than one ubatch
    assert timed_prefill_cap(1.0, 512, 0.25) == 512


def long_request(deadline: float | None = None) -> tuple[GenerateRequest, QueueSink]:
    sink = QueueSink()
    sampling = SamplingParams(temperature=0.0)
    return GenerateRequest(f"long-{time.monotonic()}", random_tokens(1, N_PROMPT), sink, sampling, max_tokens=1, deadline=deadline), sink


def test_a_long_prefill_with_a_short_timeout_ends_in_time(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_ctx=N_PROMPT + 64, n_batch=N_PROMPT, n_ubatch=512)
    try:
        started = time.monotonic()
        req, sink = long_request(deadline=started + 1.0)
        engine.submit(req)
        result = sink.collect()
        elapsed = time.monotonic() - started
        assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result.error
        assert elapsed < 6, elapsed  # about 1 s; one whole-prompt step took 60 s
    finally:
        engine.stop()


def test_an_abort_during_a_long_prefill_frees_the_slot_within_seconds(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_ctx=N_PROMPT + 64, n_batch=N_PROMPT, n_ubatch=512)
    try:
        req, sink = long_request()
        engine.submit(req)
        time.sleep(1.0)
        aborted = time.monotonic()
        engine.abort(req.id)
        while engine.n_unfinished():
            assert time.monotonic() - aborted < 6, "the slot was still busy"
            time.sleep(0.05)
    finally:
        engine.stop()
