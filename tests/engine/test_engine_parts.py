"""The engine's parts, each built without an `Engine` from the collaborators its constructor
names: the router with the engine's demand (pure logic), and the admission of waiting
requests (`Admitter`) and the step (`Stepper`) on a model loaded as the engine loads it."""

from __future__ import annotations

import pytest

from warmslot.cache.checkpoints import CheckpointList
from warmslot.slots import EngineConfig, FinishReason, GenerateRequest, QueueSink, SamplingParams
from warmslot.slots.engine.admission import Admission, PromptLimits
from warmslot.slots.engine.admitter import Admitter
from warmslot.slots.engine.demand import EngineDemand
from warmslot.slots.engine.loaded import load
from warmslot.slots.engine.stepper import Stepper
from warmslot.slots.engine.lifecycle import Lifecycle
from warmslot.slots.step.outbox import Outbox
from warmslot.slots.reuse.router import Router
from warmslot.slots.reuse.sessions import Sessions
from warmslot.slots.slot import Slot
from warmslot.slots.stats import EngineStats
from tests.helpers import THREADS, cold_run, random_tokens


def _request(rid: str, tokens: list[int], max_tokens: int = 8, **kw) -> GenerateRequest:
    return GenerateRequest(rid, tokens, QueueSink(), SamplingParams(temperature=0.0), max_tokens=max_tokens, ignore_eos=True, **kw)


def _queue(admission: Admission, *reqs: GenerateRequest) -> None:
    """Submit, and take the inbox as the engine thread does before a step."""
    for req in reqs:
        admission.submit(req)
    admission.take(lambda: True, lambda idle: None, lambda call: None)


# -- the router, with what the engine knows about demand ------------------------------------

def test_the_router_keeps_the_idle_slot_a_waiting_request_continues():
    """Two idle slots hold two conversations; a new conversation takes the least recently
    used one, unless a waiting request continues it (the engine's queue, through its demand)."""
    a, b = random_tokens(1, 300), random_tokens(2, 300)
    slots = [Slot(i, CheckpointList(4, 1 << 20)) for i in range(2)]
    slots[0].tokens, slots[0].last_used = list(a), 1.0  # the least recently used
    slots[1].tokens, slots[1].last_used = list(b), 2.0
    stats = EngineStats()
    admission = Admission(stats, max_queue=8, n_parallel=2)
    admission.open(PromptLimits(1024, 256), slots)
    demand = EngineDemand(admission, Sessions(), lambda: slots, lambda fn: None)
    router = Router(slots, None, lambda slot: (lambda n: True), True, demand=demand)
    new = _request("new", random_tokens(3, 30))

    assert router.route(new).target is slots[0]
    _queue(admission, _request("a-next", a + random_tokens(4, 10)))
    assert [r.id for r in demand.waiting()] == ["a-next"]
    assert router.route(new).target is slots[1]  # a's conversation comes back next: b gives way


def test_the_demand_tells_what_waits_and_what_the_device_holds():
    slots = [Slot(i, CheckpointList(4, 1 << 20)) for i in range(2)]
    slots[1].tokens, slots[1].tenant = [5, 6, 7], "t"
    admission = Admission(EngineStats(), max_queue=8, n_parallel=2)
    admission.open(PromptLimits(1024, 256), slots)
    ran = []
    demand = EngineDemand(admission, Sessions(), lambda: slots, lambda fn: ran.append(fn(None)))
    req = _request("w", [1, 2, 3], session="s")
    _queue(admission, req)
    assert list(demand.upcoming()) == [("", [1, 2, 3])]
    assert list(demand.waiting_sessions()) == [("", "s")]
    assert list(demand.on_device()) == [("t", [5, 6, 7])]
    assert list(demand.sessions()) == []
    demand.later(lambda: 42)
    assert ran == [42]


# -- the admission and the step, on a loaded model -------------------------------------------

class _Running:
    """What the lifecycle may do to running requests (lifecycle.Running), over the parts."""

    def __init__(self, slots, outbox):
        self.slots, self.outbox = slots, outbox

    def call(self, fn):
        raise AssertionError("no call in these tests")

    def running(self):
        return (s for s in self.slots if s.active is not None)

    def end(self, slot, error):
        self.outbox.finish(slot, FinishReason.STOP, error)

    def deliver(self):
        self.outbox.flush(self.slots)

    def n_running(self):
        return sum(1 for _ in self.running())


@pytest.fixture()
def parts(tiny_models):
    """A model loaded as the engine loads it (engine/loaded.py), with the engine's
    collaborators beside it, and no engine."""
    config = EngineConfig(
        model_path=str(tiny_models["attention"]), n_parallel=2, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=THREADS,
        flash_attn="off", type_k="f32", type_v="f32", cache_vram=0,
    )
    stats = EngineStats()
    admission = Admission(stats, config.max_queue, config.n_parallel)
    outbox = Outbox(stats)
    slots: list[Slot] = []
    demand = EngineDemand(admission, outbox.sessions, lambda: slots, lambda fn: None)
    loaded = load(config, stats, lambda p: None, outbox=outbox, demand=demand)
    slots[:] = loaded.slots
    admission.open(PromptLimits(loaded.ctx.n_ctx_seq, loaded.model.n_vocab), loaded.slots)
    admitter = Admitter(admission, loaded.router, loaded.prefixes, loaded.memory, loaded.post, loaded.model, loaded.ctx, stats,
                        disk=loaded.disk)
    try:
        yield config, stats, admission, outbox, loaded, admitter
    finally:
        loaded.close()


@pytest.mark.model
def test_the_admitter_gives_waiting_requests_slots_in_arrival_order(parts):
    config, stats, admission, outbox, loaded, admitter = parts
    reqs = [_request(f"r{i}", random_tokens(10 + i, 20)) for i in range(3)]
    _queue(admission, *reqs)
    assert admission.n_queued == 3
    admitter.admit()
    running = {s.active.req.id for s in loaded.slots if s.active is not None}
    assert running == {"r0", "r1"}  # two slots: the first two, the third waits
    assert [r.id for r in admission.waiting] == ["r2"] and admission.n_queued == 1
    assert stats.queue_wait.snapshot()[2] == 2


@pytest.mark.model
def test_the_stepper_runs_a_request_to_its_end_as_the_engine_does(parts, tiny_models):
    config, stats, admission, outbox, loaded, admitter = parts
    lifecycle = Lifecycle(_Running(loaded.slots, outbox), admission)
    stepper = Stepper(loaded, admitter, admission, outbox, lifecycle, config, stats)
    prompt = random_tokens(20, 40)
    req = _request("s", prompt, max_tokens=6)
    _queue(admission, req)
    for _ in range(100):
        if not stepper.has_work():
            break
        stepper.step()
    result = req.sink.collect(timeout=5)
    assert result.error is None and result.finish is FinishReason.LENGTH and len(result.tokens) == 6
    assert all(s.active is None for s in loaded.slots) and stats.step_seconds > 0
    reference = cold_run(tiny_models["attention"], prompt, dict(n_parallel=2), max_tokens=6, ignore_eos=True)
    assert result.tokens == reference.tokens


@pytest.mark.model
def test_on_a_cpu_a_requests_first_token_and_its_end_go_out_with_the_step_that_made_them(parts, tiny_models):
    """llama_decode computes on a CPU before it returns, so what a client waits on (its first
    token, its end) goes to the request at the end of the step that sampled it, not after the
    next decode; the tokens between follow one decode later, as on a GPU."""
    config, stats, admission, outbox, loaded, admitter = parts
    if loaded.on_gpu:
        pytest.skip("on a GPU a step's events go out once the next decode is launched")
    stepper = Stepper(loaded, admitter, admission, outbox, Lifecycle(_Running(loaded.slots, outbox), admission), config, stats)
    prompt = random_tokens(21, 40)
    req = _request("t", prompt, max_tokens=4)
    _queue(admission, req)
    events, delivered = [], []
    for _ in range(4):
        stepper.step()
        while not req.sink.queue.empty():
            events += req.sink.queue.get()
        delivered.append(len([t for ev in events for t in ev.tokens]))
    # step 1 computes the prompt and samples the first token, each step after samples one
    assert delivered == [1, 1, 2, 4]
    assert events[0].started and events[-1].finish is FinishReason.LENGTH
    reference = cold_run(tiny_models["attention"], prompt, dict(n_parallel=2), max_tokens=4, ignore_eos=True)
    assert [t for ev in events for t in ev.tokens] == reference.tokens
