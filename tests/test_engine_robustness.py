"""The engine outlives failures: a broken step fails only the running requests, bad token ids
are rejected, aborts free the slot, and the queue bound holds."""

import pytest

from warmslot.slots import ErrorKind, GenerateRequest, QueueFull, QueueSink, SamplingParams
from tests.helpers import generate, tiny_engine

pytestmark = pytest.mark.model


@pytest.fixture()
def engine(tiny_models):
    eng = tiny_engine(tiny_models["attention"], n_parallel=1, max_queue=2)
    yield eng
    eng.stop()


def test_an_unexpected_error_fails_the_running_request_and_the_engine_goes_on(engine):
    original = engine._run
    calls = {"n": 0}

    def broken_once(entries):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return original(entries)

    engine._run = broken_once
    failed = generate(engine, list(range(30)))
    assert failed.error is not None and failed.error.kind is ErrorKind.INTERNAL
    ok = generate(engine, list(range(30)))
    assert ok.error is None and len(ok.tokens) == 16
    assert engine.snapshot()["slots"][0]["state"] == "idle"


def test_token_ids_outside_the_vocabulary_are_rejected(engine):
    r = generate(engine, [1, 2, 10**6])
    assert r.error is not None and r.error.kind is ErrorKind.INVALID
    assert generate(engine, [1, 2, 3]).error is None


def test_abort_frees_the_slot_and_the_waiting_queue_is_bounded(engine):
    sinks = [QueueSink() for _ in range(3)]
    for i, sink in enumerate(sinks):
        engine.submit(GenerateRequest(f"q{i}", list(range(20)), sink, SamplingParams(temperature=0), max_tokens=100000, ignore_eos=True))
        if i == 0:
            assert sink.queue.get(timeout=30)[0].started  # the first one holds the only slot
    assert engine.queue_depth == 2
    with pytest.raises(QueueFull):
        engine.submit(GenerateRequest("q3", [1], QueueSink(), max_tokens=1))
    assert engine.stats.queue_rejected == 1
    for i in range(3):
        engine.abort(f"q{i}")
    for sink in sinks:
        assert sink.collect().finish.value == "abort"
    assert engine.snapshot()["slots"][0]["state"] == "idle"
    assert engine.queue_depth == 0
