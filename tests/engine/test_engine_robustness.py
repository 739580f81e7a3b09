"""The engine outlives failures: a broken step fails only the running requests, bad token ids
are rejected, aborts free the slot, and the queue bound holds."""

import pytest

from warmslot.slots import ErrorKind, GenerateRequest, QueueFull, QueueSink, Rejected, SamplingParams
from tests.helpers import generate, tiny_engine

pytestmark = pytest.mark.model


@pytest.fixture()
def engine(tiny_models):
    eng = tiny_engine(tiny_models["attention"], n_parallel=1, max_queue=2)
    yield eng
    eng.stop()


def test_an_unexpected_error_fails_the_running_request_and_the_engine_goes_on(engine):
    original = engine.stepper._run
    calls = {"n": 0}

    def broken_once(entries):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return original(entries)

    engine.stepper._run = broken_once
    failed = generate(engine, list(range(30)))
    assert failed.error is not None and failed.error.kind is ErrorKind.INTERNAL
    ok = generate(engine, list(range(30)))
    assert ok.error is None and len(ok.tokens) == 16
    assert engine.snapshot(detail=True).slots[0].state == "idle"


def test_token_ids_outside_the_vocabulary_are_rejected(engine):
    with pytest.raises(Rejected) as raised:
        generate(engine, [1, 2, 10**6])
    assert raised.value.error.kind is ErrorKind.INVALID
    assert generate(engine, [1, 2, 3]).error is None


def test_a_prompt_that_cannot_fit_a_slot_is_rejected_at_submission(engine):
    with pytest.raises(Rejected) as raised:
        generate(engine, [1] * engine.ctx.n_ctx_seq)
    assert raised.value.error.kind is ErrorKind.CONTEXT
    assert engine.queue_depth == 0


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
    assert engine.snapshot(detail=True).slots[0].state == "idle"
    assert engine.queue_depth == 0


def test_a_burst_counts_only_requests_beyond_the_idle_slots_against_the_queue(tiny_models):
    """--max-queue bounds requests waiting for a slot: a burst that idle slots will take
    at the next step is not refused, even before the engine has admitted any of it."""
    import threading

    eng = tiny_engine(tiny_models["attention"], n_parallel=2, max_queue=1)
    try:
        hold = threading.Event()
        eng.call(lambda e: hold.wait(30))  # the engine thread is busy: nothing is admitted
        sinks = [QueueSink() for _ in range(3)]
        for i, sink in enumerate(sinks):  # two take the idle slots, one waits
            eng.submit(GenerateRequest(f"b{i}", list(range(10, 30)), sink, SamplingParams(temperature=0), max_tokens=4))
        with pytest.raises(QueueFull):
            eng.submit(GenerateRequest("b3", [1, 2], QueueSink(), max_tokens=1))
        hold.set()
        assert all(s.collect().error is None for s in sinks)
    finally:
        eng.stop()
