"""A KV stream per slot (the default with several slots on attention, sliding-window and
hybrid models) against a unified pool: batch layout, forks between streams, the auto choice."""

import time

import pytest

from warmslot.cache.checkpoints import CheckpointList
from warmslot.slots import GenerateRequest, MemoryKind, QueueSink, SamplingParams
from warmslot.slots.fitting.layout import kv_unified
from warmslot.slots.llama_api import Batch
from warmslot.slots.step.scheduler import plan_batch
from warmslot.slots.slot import Active, Slot
from warmslot.slots.step.text import TextStream
from warmslot.slots.requests import Reuse

from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine


def test_auto_gives_each_slot_a_stream_on_attention_models_only():
    assert kv_unified("auto", MemoryKind.ATTENTION, 4) is False
    assert kv_unified("auto", MemoryKind.SWA, 16) is False
    assert kv_unified("auto", MemoryKind.ATTENTION, 1) is True
    assert kv_unified("auto", MemoryKind.HYBRID, 4) is False  # spare streams keep idle conversations apart
    assert kv_unified("auto", MemoryKind.HYBRID, 1) is True
    assert kv_unified("auto", MemoryKind.RECURRENT, 4) is True
    assert kv_unified("on", MemoryKind.ATTENTION, 4) is True
    assert kv_unified("off", MemoryKind.HYBRID, 4) is False


def _slot(i: int, prompt_len: int, done: int, decoding: bool) -> Slot:
    slot = Slot(i, CheckpointList(4, 1 << 20))
    req = GenerateRequest(f"r{i}", list(range(1, prompt_len + 1)), QueueSink(), SamplingParams())
    active = Active(req=req, sampler=None, text=TextStream(), reuse=Reuse(), cuts=[])
    active.admitted = float(10 - i)  # later slots were admitted first
    slot.tokens = list(range(done))
    if decoding:
        active.prefill_done = True
        active.pending = 7
    slot.active = active
    return slot


def test_streams_lay_the_batch_out_in_sequence_order():
    """Decoding slots 0, 1 and 3 with slot 2 prefilling: in sequence order, llama.cpp can
    put one token of every slot in one micro-batch; decode tokens first would split it."""
    slots = [_slot(0, 5, 10, True), _slot(1, 5, 10, True), _slot(2, 300, 0, False), _slot(3, 5, 10, True)]
    batch = Batch(512, 4)
    entries = plan_batch(slots, batch, 256, by_sequence=True)
    assert [e.slot.id for e in entries] == [0, 1, 2, 3]
    assert list(batch.pos[:4]) == [10, 10, 0, 1] and batch.n == 3 + 256
    assert [int(batch.seq_ptrs[i] - batch.seq_ptrs[0]) // 4 for i in (0, 1, 2, 258)] == [0, 1, 2, 3]
    unified = plan_batch(slots, batch, 256)
    assert [e.slot.id for e in unified] == [0, 1, 3, 2]  # decode tokens first, then the chunk


@pytest.mark.model
@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_a_fork_between_streams_is_copied_even_when_no_decode_follows(tiny_models, kind):
    """A stream copy is pending until the next llama_decode. When nothing is decoded after a
    fork, the engine runs a one-token decode itself, so the copy lands before either stream
    changes; attention memory then cuts that token off, memory that cannot be cut drops the
    target's contents rather than keep a state one token ahead."""
    path = tiny_models[kind]
    A = random_tokens(1, 120)
    engine = tiny_engine(path, n_parallel=2, kv_unified="off", **REUSE_ENGINE)
    try:
        generate(engine, A, max_tokens=1)
        (donor,) = {s.id for s in engine.slots if s.tokens}
        target = 1 - donor
        engine.call(lambda e: e.memory.fork(e.slots[donor], e.slots[target], len(A))).result(10)
        engine.call(lambda e: None).result(10)  # one more step: the fork was settled before it
        assert not engine.memory.fork_pending
        engine.call(lambda e: e.memory.clear(e.slots[donor])).result(10)  # the donor's stream goes
        held = list(engine.slots[target].tokens)
        if kind == "hybrid":
            assert held == []
            return
        assert held[: len(A)] == A
        prompt = held + random_tokens(2, 20)
        warm = generate(engine, prompt, return_prompt_logits=True)
        assert warm.reuse.source == "slot" and warm.reuse.slot == target
        assert warm.usage.cached_tokens == len(held)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, prompt))


@pytest.mark.model
def test_sampling_on_threads_gives_the_tokens_of_sampling_in_turn(tiny_models):
    """Four streams sampled side by side on a pool give the same tokens (seeded, not greedy)
    as the same four sampled one after the other."""
    from warmslot.slots.sampling.parallel import BatchSampler

    prompts = [random_tokens(30 + i, 40) for i in range(4)]

    def run(threads: int) -> list[list[int]]:
        engine = tiny_engine(tiny_models["attention"], n_parallel=4, kv_unified="off", **REUSE_ENGINE)
        try:
            engine.call(lambda e: setattr(e.loaded, "sampling", BatchSampler(e.ctx, threads))).result(10)
            sinks = [QueueSink() for _ in prompts]
            for i, (p, sink) in enumerate(zip(prompts, sinks)):
                params = SamplingParams(temperature=0.9, top_k=20, seed=100 + i)
                engine.submit(GenerateRequest(f"s{i}", p, sink, params, max_tokens=24, ignore_eos=True))
            return [sink.collect().tokens for sink in sinks]
        finally:
            engine.stop()

    assert run(4) == run(0)


def _spare_layout_engine(path, n_spare: int, **kw):
    """An engine with two slots and `n_spare` spare streams (device memory for exactly that)."""
    from warmslot.slots.fitting.layout import stream_state_bytes
    from warmslot.slots.llama_api import Model, classify_memory

    n_ctx = kw.pop("n_ctx", 1024)
    model = Model(str(path), n_gpu_layers=0, vocab_only=True)
    stream = stream_state_bytes(model, classify_memory(model.info, False), n_ctx // 2, "f32", "f32")
    engine = tiny_engine(path, n_parallel=2, n_ctx=n_ctx, kv_unified="off", cache_vram=n_spare * stream, **kw)
    assert engine.layout.n_spare == n_spare and len(engine.slots) == 2 + n_spare
    return engine


def _fill_streams(engine, convs) -> dict[int, int]:
    """Run each conversation once, in order; {its index: the stream that holds it}."""
    for c in convs:
        generate(engine, c, max_tokens=4)
    return {i: next(s.id for s in engine.slots if s.tokens[: len(c)] == c) for i, c in enumerate(convs)}


def test_auto_spares_of_one_model_of_several_leave_the_device_memory_to_the_others(monkeypatch):
    from warmslot.slots.fitting import layout

    class FakeModel:
        info = type("Info", (), {"n_ctx_train": 8192})()

        def kv_bytes_per_token(self, type_k, type_v):
            return 1 << 20  # a stream of 1024 cells is 1 GiB

    device = type("Device", (), {"free": 40 << 30, "total": 100 << 30})()
    monkeypatch.setattr(layout, "gpu_memory", lambda: [device])
    kw = dict(n_parallel=4, n_ctx=4096, kv_unified_setting="auto", type_k="f16", type_v="f16", on_gpu=True, cache_vram=None)
    # 40 GiB free, less the slots' 4, 10% of the device and 1 GiB: 25 spare streams for one model
    assert layout.plan_layout(FakeModel(), MemoryKind.ATTENTION, **kw).n_spare == 25
    assert layout.plan_layout(FakeModel(), MemoryKind.ATTENTION, spare_share=2, **kw).n_spare == 12
    # a hybrid's streams the same way, with its recurrent state on top (here 1 GiB more):
    # 40 GiB free, less the slots' 8, 10% and 1 GiB: 10 spares of 2 GiB
    FakeModel.recurrent_bytes_per_seq = lambda self: 1 << 30
    assert layout.plan_layout(FakeModel(), MemoryKind.HYBRID, **kw).n_spare == 10


@pytest.mark.model
def test_a_hybrid_streams_size_is_what_llama_cpp_allocates(tiny_models):
    """Spare streams of a hybrid are sized from its metadata before the context exists: KV
    bytes for its attention layers only (1 of its 4), and a recurrent state per sequence that
    llama.cpp's buffers match (its log gives them in MiB with two decimals: within 5%)."""
    engine = tiny_engine(tiny_models["hybrid"], n_parallel=2, n_ctx=2048, cache_vram=8 << 20)
    try:
        capacity, layout = engine.info.capacity, engine.layout
        assert not layout.unified and layout.n_spare >= 8
        assert sum(capacity.kv_bytes.values()) == pytest.approx(capacity.kv_bytes_per_token * layout.n_ctx, rel=0.05)
        assert engine.model.recurrent_bytes_per_seq() == pytest.approx(capacity.recurrent_bytes_per_slot, rel=0.05)
    finally:
        engine.stop()


def test_spare_streams_are_sized_from_the_memory_given():
    from warmslot.slots.fitting.layout import plan_layout
    from warmslot.slots.llama_api import Model

    class FakeModel:
        info = type("Info", (), {"n_ctx_train": 8192})()

        def kv_bytes_per_token(self, type_k, type_v):
            return 1000

        def recurrent_bytes_per_seq(self):
            return 24 * 1000

    kw = dict(n_parallel=4, n_ctx=4096, kv_unified_setting="auto", type_k="f16", type_v="f16", on_gpu=False)
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=3 * 1024 * 1000, **kw).n_spare == 3
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=None, **kw).n_spare == 0  # no GPU, no RAM given
    # auto on the CPU: a quarter of the prompt cache's RAM, at most 3 a slot
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=None, cache_ram=20 * 1024 * 1000, **kw).n_spare == 5
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=None, cache_ram=1 << 40, **kw).n_spare == 3 * 4
    layout = plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=2 * 1024 * 1000, **kw)
    assert (layout.n_seq, layout.n_ctx) == (6, 6 * 1024)  # each slot keeps its 1024 cells
    assert plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=None, **kw).n_spare == 0  # auto, no GPU
    assert plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=0, **dict(kw, on_gpu=True)).n_spare == 0
    # a hybrid's spare is a stream and a recurrent state: 1024 cells and 24 cells' worth
    hybrid = plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=2 * 1048 * 1000, **kw)
    assert not hybrid.unified and (hybrid.n_seq, hybrid.n_ctx) == (6, 6 * 1024)
    assert plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=2 * 1048 * 1000 - 1, **kw).n_spare == 1
    one_pool = plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=None, **dict(kw, on_gpu=True, kv_unified_setting="on"))
    assert one_pool.unified and (one_pool.n_seq, one_pool.n_ctx) == (12, 4096)  # spares share the pool
    assert plan_layout(FakeModel(), MemoryKind.SWA, cache_vram=2 * 1024 * 1000, **kw).n_spare == 2  # streams too
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=1 << 40, **kw).n_spare == 256 - 4  # llama.cpp's most
    assert plan_layout(FakeModel(), MemoryKind.RECURRENT, cache_vram=1 << 30, **dict(kw, kv_unified_setting="off")).n_spare == 0
    # one pool: attention models get spare sequences only with a size (their cells share the
    # pool; park_idle keeps them within it), at most 16 a slot and 64 in all
    pool = dict(kw, kv_unified_setting="on")
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=None, **dict(pool, on_gpu=True)).n_spare == 0
    assert plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=0, **pool).n_spare == 0
    attention_pool = plan_layout(FakeModel(), MemoryKind.ATTENTION, cache_vram=1000, **pool)
    assert attention_pool.unified and (attention_pool.n_seq, attention_pool.n_ctx) == (4 + 64, 4096)
    # a hybrid's spares in one pool with a size: as many recurrent states as it holds (two a
    # slot at least)
    assert plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=20 * 24 * 1000, **pool).n_spare == 20
    assert plan_layout(FakeModel(), MemoryKind.HYBRID, cache_vram=24 * 1000, **pool).n_spare == 8


def test_a_gap_in_the_sequence_ids_gets_a_filler_token():
    slots = [_slot(0, 5, 10, True), _slot(1, 5, 10, True), _slot(2, 5, 10, True), _slot(3, 5, 10, True)]
    slots[1].active = None  # idle, holding 10 tokens
    batch = Batch(64, 4)
    entries = plan_batch(slots, batch, 32, by_sequence=True, filler_budget=1000)
    assert [(e.slot.id, e.filler) for e in entries] == [(0, False), (1, True), (2, False), (3, False)]
    assert entries[1].start == 10 and entries[1].out_index == -1 and not entries[1].is_decode
    assert [e.slot.id for e in plan_batch(slots, batch, 32, by_sequence=True)] == [0, 2, 3]
    # a gap whose filler would cost more than the micro-batch it saves stays a gap
    assert [e.slot.id for e in plan_batch(slots, batch, 32, by_sequence=True, filler_budget=10)] == [0, 2, 3]
    slots[1].tokens = list(range(50))  # longer than the busy ones: a filler would lengthen every stream's attention
    assert [e.slot.id for e in plan_batch(slots, batch, 32, by_sequence=True, filler_budget=1000)] == [0, 2, 3]


def test_a_filler_never_overfills_a_batch_that_prefill_filled():
    """A prefill chunk that takes every place the decode tokens left leaves none for a
    filler: the gap stays a gap (the engine's step raised here and failed its running
    requests, with four slots and spare streams under a full queue)."""
    slots = [_slot(0, 5, 10, True), _slot(1, 5, 10, True), _slot(2, 5, 10, True), _slot(3, 500, 0, False)]
    slots[1].active = None  # idle, between busy streams 0 and 2
    batch = Batch(64, 4)
    entries = plan_batch(slots, batch, 1000, by_sequence=True, filler_budget=10**6)
    assert [(e.slot.id, e.n) for e in entries] == [(0, 1), (2, 1), (3, 62)] and batch.n == 64
    entries = plan_batch(slots, batch, 61, by_sequence=True, filler_budget=10**6)  # one place left: the filler
    assert [(e.slot.id, e.n, e.filler) for e in entries] == [(0, 1, False), (1, 1, True), (2, 1, False), (3, 61, False)]


@pytest.mark.model
@pytest.mark.parametrize("kind", ["attention", "swa", "hybrid"])
def test_conversations_come_back_to_their_spare_stream_without_a_copy(tiny_models, kind):
    """Two slots and two spare streams hold four conversations: each comes back to its own
    stream with every token reused and nothing copied to or from RAM, even while the slots
    around it decode (attention memory: filler tokens in its stream are cut off again;
    sliding-window memory gets none, and the step takes a micro-batch more)."""
    path = tiny_models[kind]
    convs = [random_tokens(40 + i, 260 + 10 * i) for i in range(4)]  # long enough to keep apart (APART_MIN_KEEP)
    engine = _spare_layout_engine(path, 2, **REUSE_ENGINE)
    try:
        for c in convs:
            generate(engine, c, max_tokens=8)
        assert sorted(s.id for s in engine.slots if s.tokens) == [0, 1, 2, 3]
        # two conversations at once, around an idle one
        held = {s.id: list(s.tokens) for s in engine.slots}
        assert all(held[i][: len(c)] == c for i, c in enumerate(convs))  # each in a stream of its own
        sinks = [QueueSink(), QueueSink()]
        for i, sink in zip((0, 2), sinks):
            prompt = held[i] + random_tokens(60 + i, 10)
            engine.submit(GenerateRequest(f"c{i}", prompt, sink, SamplingParams(temperature=0), max_tokens=12))
        both = [sink.collect() for sink in sinks]
        assert (engine.stats.filler_tokens > 0) == (kind == "attention")  # stream 1 sat between the two busy ones
        assert all(r.reuse.source == "slot" and r.usage.cached_tokens == len(held[i]) for r, i in zip(both, (0, 2)))
        again = generate(engine, held[1] + random_tokens(70, 10), return_prompt_logits=True)
        assert again.reuse.source == "slot" and again.reuse.slot == 1 and again.usage.cached_tokens == len(held[1])
        assert engine.stats.copy_bytes == {}  # nothing went to or came from RAM
    finally:
        engine.stop()
    assert_same_answer(again, cold_run(path, held[1] + random_tokens(70, 10)))


@pytest.mark.model
@pytest.mark.parametrize("kind", ["hybrid", "recurrent"])
def test_alternating_conversations_stay_in_spare_sequences_of_one_pool(tiny_models, kind):
    """One slot and one spare sequence in a unified pool: A and B alternate, and each comes
    back to the sequence that holds it, with nothing copied to or from RAM."""
    path = tiny_models[kind]
    A, B = random_tokens(80, 90), random_tokens(81, 70)
    engine = tiny_engine(path, n_parallel=1, cache_vram=1, **REUSE_ENGINE)
    try:
        assert engine.layout.unified and engine.layout.n_spare == 2
        generate(engine, A, max_tokens=4)
        generate(engine, B, max_tokens=4)
        held = {s.id: list(s.tokens) for s in engine.slots}
        a_seq = next(i for i, t in held.items() if t[: len(A)] == A)
        back = generate(engine, held[a_seq] + random_tokens(82, 10), return_prompt_logits=True)
        assert back.reuse.source == "slot" and back.reuse.slot == a_seq
        assert back.usage.cached_tokens == len(held[a_seq])
        assert engine.stats.copy_bytes == {} and engine.stats.parked == 0
    finally:
        engine.stop()
    assert_same_answer(back, cold_run(path, held[a_seq] + random_tokens(82, 10)))


def test_devices_are_listed_with_their_memory():
    from warmslot.slots.llama_api import devices

    found = devices()
    assert any(d.kind == "cpu" and d.total > 0 for d in found), found


def test_a_new_conversation_goes_next_to_the_busy_streams():
    """With a stream per sequence, the receiver of a new conversation keeps the busy ids in
    one run: the empty stream next to them, else the least recently used one next to them."""
    from warmslot.slots.reuse.router import Router

    slots = [Slot(i, CheckpointList(4, 1 << 20)) for i in range(6)]
    for i, slot in enumerate(slots):
        slot.tokens, slot.last_used = [1, 2, 3], float(10 - i)  # slot 5 is the least recently used
    slots[2].active = slots[3].active = object()
    router = Router(slots, None, lambda slot: (lambda n: True), True, contiguous=True)
    idle = [s for s in slots if s.active is None]
    req = GenerateRequest("new", [9, 9], QueueSink(), SamplingParams())  # no prompt_cache_key
    assert router._receiver(idle, None, req).id == 4  # next to the run 2..3
    slots[0].tokens = []
    assert router._receiver(idle, None, req).id == 0  # an empty stream comes first
    unified = Router(slots, None, lambda slot: (lambda n: True), True)
    slots[0].tokens = [1]
    assert unified._receiver(idle, None, req).id == 5  # one pool: least recently used


@pytest.mark.model
def test_a_conversation_back_in_a_stream_apart_from_the_busy_ones_is_copied_next_to_them(tiny_models):
    """Four conversations in two slots and two spare streams, stream 1 emptied. While
    stream 0 decodes, the conversation in stream 3 comes back: it is copied on the device
    into stream 1, next to the busy one (no filler tokens, nothing to or from RAM), reuses
    all it held, and answers as a cold run does."""
    path = tiny_models["attention"]
    convs = [random_tokens(90 + i, 50 + 10 * i) for i in range(4)]
    engine = _spare_layout_engine(path, 2, **REUSE_ENGINE)
    try:
        for c in convs:
            generate(engine, c, max_tokens=4)
        held = {s.id: list(s.tokens) for s in engine.slots}
        assert all(held[i][: len(c)] == c for i, c in enumerate(convs))
        engine.call(lambda e: e.memory.clear(e.slots[1])).result(10)
        long_sink, back_sink = QueueSink(), QueueSink()
        prompt = held[3] + random_tokens(95, 10)
        engine.submit(GenerateRequest("busy", held[0] + random_tokens(96, 5), long_sink, SamplingParams(temperature=0),
                                      max_tokens=300, ignore_eos=True))
        engine.submit(GenerateRequest("back", prompt, back_sink, SamplingParams(temperature=0), max_tokens=16,
                                      return_prompt_logits=True))
        back, busy = back_sink.collect(), long_sink.collect()
        assert busy.reuse.slot == 0
        assert (back.reuse.source, back.reuse.slot, back.usage.cached_tokens) == ("fork", 1, len(held[3]))
        assert engine.stats.filler_tokens == 0 and engine.stats.copy_bytes == {}
        assert back.reuse.state_bytes == {}  # and the request says so
        assert engine.slots[3].tokens == held[3]  # the stream it left keeps its copy
    finally:
        engine.stop()
    assert_same_answer(back, cold_run(path, prompt))


def test_a_slot_whose_tokens_another_holds_is_held_elsewhere():
    from warmslot.slots.reuse.router import held_elsewhere

    slots = [Slot(i, CheckpointList(4, 1 << 20)) for i in range(3)]
    slots[0].tokens, slots[1].tokens, slots[2].tokens = [1, 2, 3, 4], [1, 2, 3], [1, 2, 5]
    assert held_elsewhere(slots[1], slots, None)  # slot 0 holds all of it and more
    assert not held_elsewhere(slots[2], slots, None) and not held_elsewhere(slots[0], slots, None)
    slots[0].tenant = "other"
    assert not held_elsewhere(slots[1], slots, None)  # another tenant's memory is not its own


def test_a_short_prefix_in_a_stream_apart_from_the_busy_ones_is_computed_next_to_them():
    """Streams 2 and 3 are busy. A request sharing three tokens with stream 5 starts fresh
    next to the busy ones rather than leave a gap; one sharing a long prefix with it keeps
    its stream there (no stream next to them is free to take a copy)."""
    from warmslot.slots.reuse.router import APART_MIN_KEEP, Fresh, KeepSlot, Router

    slots = [Slot(i, CheckpointList(4, 1 << 20)) for i in range(6)]
    for i, slot in enumerate(slots):
        slot.tokens, slot.last_used = [100 + i] * 4, float(i)
    slots[5].tokens = list(range(1, APART_MIN_KEEP + 11))
    slots[2], slots[3] = _slot(2, 5, 4, True), _slot(3, 5, 4, True)
    router = Router(slots, None, lambda slot: (lambda n: True), True, contiguous=True)
    short = router.route(GenerateRequest("short", [1, 2, 3, 99, 99], QueueSink(), SamplingParams()))
    assert isinstance(short, Fresh) and short.target.id == 1  # next to the run, least recently used of those
    assert "apart from the busy streams" in short.seen.reason  # the miss explanation says why
    long = router.route(GenerateRequest("long", slots[5].tokens + [99], QueueSink(), SamplingParams()))
    assert isinstance(long, KeepSlot) and long.target.id == 5


@pytest.mark.model
def test_no_slot_is_available_when_parallel_requests_run_though_spare_streams_are_idle(default_model):
    """GET /slots lists the --parallel slots, as llama-server does, and GET /engine the spare
    streams beside them; fail_on_no_slot answers 503 once --parallel requests run, whatever
    the idle spares."""
    import httpx

    from tests.helpers import warmslot_server

    server = warmslot_server(default_model, "-np", "2", "-c", "2048", "-no-kvu", "--cache-vram", "64MiB")
    client = httpx.Client(timeout=60)
    try:
        slots = client.get(server.url + "/slots").json()
        assert [s["id"] for s in slots] == [0, 1] and client.get(server.url + "/slots?fail_on_no_slot=1").status_code == 200
        assert len(client.get(server.url + "/engine").json()["slots"]) > 2
        body = {"prompt": "a b c", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        running = [client.send(client.build_request("POST", server.url + "/v1/completions", json=body), stream=True) for _ in range(2)]
        lines = [r.iter_lines() for r in running]  # kept: a stream closed ends its request
        for it in lines:
            next(it)  # it runs
        assert sum(s["is_processing"] for s in client.get(server.url + "/slots").json()) == 2
        assert client.get(server.url + "/slots?fail_on_no_slot=1").status_code == 503
    finally:
        client.close()
        server.stop()


class _FinishOrder(QueueSink):
    """A sink that also notes, in a list shared by several, when its request finished."""

    def __init__(self, name: str, order: list[str]) -> None:
        super().__init__()
        self.name, self.order = name, order

    def push(self, events) -> None:
        if any(ev.finish is not None or ev.error is not None for ev in events):
            self.order.append(self.name)
        super().push(events)


@pytest.mark.model
@pytest.mark.parametrize("kind", ["attention", "hybrid"])
@pytest.mark.parametrize("quick_tokens", [512, 0])
def test_a_quick_continuation_starts_beside_a_running_request(tiny_models, kind, quick_tokens):
    """One slot and a spare stream. While a long request runs in the slot, a request that
    continues the conversation the spare holds, with a few new tokens, starts at once beside
    it (quick), reuses the spare's every token and finishes first, with the cold answer; with
    --quick-tokens 0 it waits for the slot and finishes after the long one."""
    path = tiny_models[kind]
    convo = random_tokens(90, 120)
    engine = tiny_engine(path, n_parallel=1, kv_unified="off", cache_vram=1 << 30, quick_tokens=quick_tokens, **REUSE_ENGINE)
    try:
        assert engine.layout.n_spare >= 1
        generate(engine, convo, max_tokens=4)
        held = next(list(s.tokens) for s in engine.slots if s.tokens)
        order: list[str] = []
        long_sink, quick_sink = _FinishOrder("long", order), _FinishOrder("quick", order)
        engine.submit(GenerateRequest("long", random_tokens(91, 300), long_sink, SamplingParams(temperature=0), max_tokens=300, ignore_eos=True))
        while not any(s.active is not None for s in engine.slots):
            time.sleep(0.001)
        prompt = held + random_tokens(92, 12)
        engine.submit(GenerateRequest("quick", prompt, quick_sink, SamplingParams(temperature=0), max_tokens=16, ignore_eos=True, return_prompt_logits=True))
        quick = quick_sink.collect()
        long_sink.collect()
        assert order == (["quick", "long"] if quick_tokens else ["long", "quick"])
        assert engine.stats.quick_starts == (1 if quick_tokens else 0)
        assert quick.reuse.source == "slot" and quick.usage.cached_tokens == len(held)
    finally:
        engine.stop()
    assert_same_answer(quick, cold_run(path, prompt))


@pytest.mark.model
def test_when_every_stream_holds_a_conversation_the_least_recently_used_one_goes_to_ram(tiny_models):
    """Four streams (two slots, two spares) hold conversations A-D; E takes the stream of the
    least recently used one (A, after B-D and a return of B), which is saved to the prompt
    cache first and comes back from RAM whole; the others stay where they are."""
    path = tiny_models["attention"]
    convs = [random_tokens(120 + i, 300) for i in range(5)]
    engine = _spare_layout_engine(path, 2, **REUSE_ENGINE)
    try:
        home = _fill_streams(engine, convs[:4])
        back_b = generate(engine, engine.slots[home[1]].tokens + random_tokens(130, 5), max_tokens=4)
        assert back_b.reuse.source == "slot"
        assert engine.stats.copy_bytes == {}  # four conversations, four streams: nothing moved yet
        new = generate(engine, convs[4], max_tokens=4)
        assert new.reuse.slot == home[0]  # A's stream, the least recently used
        assert new.reuse.state_bytes.get("device_to_ram", 0) > 0  # A saved before it was overwritten
        assert all(engine.slots[home[i]].tokens[: len(convs[i])] == convs[i] for i in (1, 2, 3))
        again = generate(engine, convs[0], return_prompt_logits=True)
        assert again.reuse.source == "ram" and again.usage.cached_tokens == len(convs[0])
    finally:
        engine.stop()
    assert_same_answer(again, cold_run(path, convs[0]))


@pytest.mark.model
def test_sessions_queued_past_the_cache_keep_what_the_queue_needs_next(tiny_models):
    """Four conversations take turns on one slot with room in RAM for two: A-D's first turns
    and then their second turns are all queued at once. Least-recently-used eviction would
    evict each conversation just before it returns (no second turn warm); the queue keeps
    what its next requests continue: A and B return from RAM whole, C's and D's contents are
    never copied to RAM (nothing there would have lasted until their turn), and A's answer
    is the cold one."""
    from warmslot.slots.llama_api import Model

    path = tiny_models["attention"]
    firsts = [random_tokens(200 + i, 180) for i in range(4)]
    seconds = [p + random_tokens(210 + i, 20) for i, p in enumerate(firsts)]
    per_token = Model(str(path), n_gpu_layers=0, vocab_only=True).kv_bytes_per_token("f32", "f32")
    entry = per_token * (180 + 4)
    engine = tiny_engine(path, n_parallel=1, cache_vram=0, cache_ram=int(2.5 * entry), **REUSE_ENGINE)
    try:
        sinks = [QueueSink() for _ in range(8)]
        for i, (prompt, sink) in enumerate(zip(firsts + seconds, sinks)):
            engine.submit(GenerateRequest(f"q{i}", prompt, sink, SamplingParams(temperature=0),
                                          max_tokens=16 if i == 4 else 4, return_prompt_logits=(i == 4)))
        results = [sink.collect() for sink in sinks]
        stats = engine.cache.stats
    finally:
        engine.stop()
    assert all(r.error is None for r in results)
    back = results[4:]
    assert [r.reuse.source for r in back[:2]] == ["ram", "ram"]
    assert [r.usage.cached_tokens for r in back[:2]] == [180, 180]
    assert [r.usage.cached_tokens for r in back[2:]] == [0, 0]
    assert stats.hits == 2 and stats.refused >= 2  # C's and D's contents were not copied to RAM
    assert_same_answer(back[0], cold_run(path, seconds[0]))


@pytest.mark.model
def test_a_new_conversation_takes_the_stream_no_waiting_request_continues(tiny_models):
    """Four streams hold A-D (A the least recently used). E and A's next turn arrive
    together: E takes B's stream (the least recently used one that no waiting request
    continues), not A's, so A's turn comes back from its own stream with nothing loaded,
    and its answer is the cold one."""
    path = tiny_models["attention"]
    convs = [random_tokens(140 + i, 300) for i in range(5)]
    engine = _spare_layout_engine(path, 2, **REUSE_ENGINE)
    try:
        home = _fill_streams(engine, convs[:4])
        a_next = engine.slots[home[0]].tokens + random_tokens(150, 5)
        sinks = [QueueSink(), QueueSink()]
        engine.submit(GenerateRequest("e", convs[4], sinks[0], SamplingParams(temperature=0), max_tokens=4))
        engine.submit(GenerateRequest("a2", a_next, sinks[1], SamplingParams(temperature=0), max_tokens=16, return_prompt_logits=True))
        new, back = (sink.collect() for sink in sinks)
    finally:
        engine.stop()
    assert new.reuse.slot == home[1]  # B's stream: A's is wanted by the queue
    assert back.reuse.source == "slot" and back.reuse.slot == home[0] and back.usage.cached_tokens == len(a_next) - 5
    assert back.reuse.state_bytes.get("ram_to_device", 0) == 0
    assert_same_answer(back, cold_run(path, a_next))
