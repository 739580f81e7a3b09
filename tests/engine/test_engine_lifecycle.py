"""A request's life beyond its tokens, on the engine: deadlines end it and free its slot,
a drain fails the waiting requests and refuses new ones while running ones go on, and in
one shared KV pool a long generation cannot starve the others."""

from __future__ import annotations

import time

import pytest

from tests.helpers import random_tokens, tiny_engine
from warmslot.slots import ErrorKind, FinishReason, GenerateRequest, QueueSink, SamplingParams, ShuttingDown

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)


def submit(engine, rid, tokens, *, max_tokens=100_000, ignore_eos=True, deadline=None) -> QueueSink:
    sink = QueueSink()
    engine.submit(GenerateRequest(rid, list(tokens), sink, GREEDY, max_tokens=max_tokens, ignore_eos=ignore_eos, deadline=deadline))
    return sink


def wait_started(sink: QueueSink, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = sink.queue.get(timeout=timeout)
        if any(ev.started for ev in events):
            return
    raise AssertionError("the request never started")


def all_idle(engine) -> bool:
    return all(s.state == "idle" for s in engine.snapshot(detail=True).slots)


@pytest.fixture()
def engine(tiny_models):
    # a context large enough that an unbounded generation runs for many seconds
    eng = tiny_engine(tiny_models["attention"], n_parallel=1, n_ctx=32768, max_queue=4)
    yield eng
    eng.stop()


def test_a_running_request_ends_at_its_deadline_and_frees_its_slot(engine):
    t0 = time.monotonic()
    sink = submit(engine, "d0", range(20), deadline=t0 + 1.0)
    result = sink.collect(timeout=60)
    elapsed = time.monotonic() - t0
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert "1 s" in result.error.message
    assert 1.0 <= elapsed < 20  # within a step or so of the deadline (generous for a loaded machine)
    assert result.tokens, "it generated until the deadline"
    assert all_idle(engine)
    ok = submit(engine, "d1", range(20), max_tokens=4).collect()
    assert ok.error is None and len(ok.tokens) == 4
    assert engine.stats.requests["timeout"] == 1


def test_a_waiting_request_ends_at_its_deadline_while_the_slot_stays_busy(engine):
    busy = submit(engine, "w0", range(20))
    wait_started(busy)
    t0 = time.monotonic()
    waiting = submit(engine, "w1", range(30, 50), deadline=t0 + 0.5)
    result = waiting.collect(timeout=60)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.usage is None and not result.tokens  # it never ran
    assert engine.queue_depth == 0
    assert engine.snapshot(detail=True).slots[0].state == "decode"  # the other one goes on
    engine.abort("w0")
    assert busy.collect().finish is FinishReason.ABORT


def test_drain_fails_the_waiting_at_once_refuses_new_ones_and_lets_running_ones_finish(engine):
    running = submit(engine, "r0", range(20), max_tokens=200)
    wait_started(running)
    waiting = [submit(engine, f"r{i}", range(i, 20 + i)) for i in (1, 2)]
    engine.drain().result(30)
    for sink in waiting:
        result = sink.collect(timeout=30)
        assert result.error is not None and result.error.kind is ErrorKind.SHUTDOWN
    with pytest.raises(ShuttingDown):
        submit(engine, "r3", range(10))
    assert engine.draining and engine.n_unfinished() >= 0
    done = running.collect(timeout=120)
    assert done.error is None and done.finish is FinishReason.LENGTH and len(done.tokens) == 200


def test_end_running_ends_every_running_request_with_a_shutdown_error(engine):
    running = submit(engine, "e0", range(20))
    wait_started(running)
    engine.drain().result(30)
    engine.end_running().result(30)
    result = running.collect(timeout=30)
    assert result.error is not None and result.error.kind is ErrorKind.SHUTDOWN
    assert result.tokens  # what it had generated was streamed before the error
    assert all_idle(engine)
    deadline = time.monotonic() + 10
    while engine.n_unfinished() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.n_unfinished() == 0


def read_tokens(sink: QueueSink, at_least: int, timeout: float = 120.0) -> int:
    """Read a running request's events until it has generated `at_least` tokens."""
    n, deadline = 0, time.monotonic() + timeout
    while n < at_least:
        for ev in sink.queue.get(timeout=max(0.1, deadline - time.monotonic())):
            assert ev.error is None and ev.finish is None, "it ended too early"
            n += len(ev.tokens)
    return n


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_four_requests_on_a_small_shared_pool_all_complete(tiny_models, kind):
    """-np 2 on one pool of 2048 cells: a generation without max_tokens holds 1,500 cells
    when three requests of 600 prompt tokens arrive. They failed with kv_cache_full; now the
    generation past its fair share (1,024 cells) ends with "length" when they need the room."""
    import threading

    eng = tiny_engine(tiny_models[kind], n_parallel=2, n_ctx=2048, kv_unified="on", cache_ram=0)
    try:
        greedy = submit(eng, "g", random_tokens(1, 40), max_tokens=None)
        read_tokens(greedy, 1500)
        hold = threading.Event()
        eng.call(lambda e: hold.wait(30))  # pause the engine: the three arrive together
        others = [submit(eng, f"o{i}", random_tokens(10 + i, 600), max_tokens=24) for i in range(3)]
        hold.set()
        results = [s.collect(timeout=120) for s in others]
        for r in results:
            assert r.error is None, r.error
            assert r.finish is FinishReason.LENGTH and len(r.tokens) == 24
        g = greedy.collect(timeout=120)
        assert g.error is None and g.finish is FinishReason.LENGTH
        assert eng.stats.requests.get("busy", 0) == 0
        assert all_idle(eng)
    finally:
        eng.stop()
