"""Prompt cache, routing and cross-slot sharing through the real engine, on every memory kind.

Every warm answer is compared with a cold run (logits of the last prompt token within
LOGITS_ATOL of tests/helpers.py, the 16 greedy tokens identical up to any near-tie), and each test asserts which path served it.
"""

import threading

import pytest

from warmslot.slots import GenerateRequest, QueueSink, SamplingParams
from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine
from tests.tiny_models import KINDS

pytestmark = pytest.mark.model

SHARED = random_tokens(10, 200)  # a long shared system prompt
A = SHARED + random_tokens(11, 60)
B = SHARED + random_tokens(12, 60)
C = SHARED + random_tokens(13, 60)


@pytest.mark.parametrize("kind", KINDS)
def test_alternating_conversations_share_prefix(tiny_models, kind):
    """One slot; conversations A, B, C share a prefix and run A, B, C, A. The cache is never
    consumed, so A comes back whole, and so does B after it."""
    path = tiny_models[kind]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        first = {}
        for name, prompt in (("A", A), ("B", B), ("C", C)):
            first[name] = generate(engine, prompt, boundaries=(len(SHARED),))
        hits = engine.cache.stats.hits
        entries, nbytes = engine.cache.n_entries, engine.cache.nbytes
        again = generate(engine, A, return_prompt_logits=True)
        assert again.usage.cached_tokens == len(A)  # the whole prompt, with its saved logits
        assert again.reuse.source == "ram"
        # what it moved: C saved to take the slot (unless the cache held it), A loaded
        assert again.reuse.state_bytes.get("ram_to_device", 0) > 0
        assert engine.cache.stats.hits == hits + 1
        # loading A took nothing out of the cache (C was saved into it, A is still there)
        assert engine.cache.n_entries >= entries and engine.cache.nbytes >= nbytes
        assert any(e.tokens[: len(A)] == tuple(A) for e in engine.cache.entries())
        assert again.tokens == first["A"].tokens
        # continuing A: its previous prompt and reply are reused
        cont = A + first["A"].tokens + random_tokens(14, 20)
        r = generate(engine, cont, return_prompt_logits=True)
        assert r.usage.cached_tokens >= len(A)
        b_again = generate(engine, B + random_tokens(15, 10), return_prompt_logits=True)
        assert b_again.usage.cached_tokens >= len(B)
        engine.cache.sanity_check()
    finally:
        engine.stop()
    assert_same_answer(again, cold_run(path, A))
    assert_same_answer(r, cold_run(path, cont, boundaries=(len(A),)))
    assert_same_answer(b_again, cold_run(path, B + random_tokens(15, 10), boundaries=(len(B),)))


# forks between KV streams are not made on sliding-window memory (see Engine._load)
FORKING = [(kind, mode) for kind in KINDS for mode in ("on", "off") if (kind, mode) != ("swa", "off")]


@pytest.mark.parametrize("kind,unified", FORKING)
def test_a_busy_slot_shares_its_prefix_through_seq_cp(tiny_models, kind, unified):
    """Slot 0 is generating a long reply for A; a request sharing A's prompt goes to slot 1
    and copies the prefix from slot 0 on the device instead of recomputing it (cells shared
    in a unified pool, a stream copy otherwise)."""
    path = tiny_models[kind]
    prompt = A + random_tokens(16, 30)
    ref = cold_run(path, prompt, boundaries=(len(A),))
    engine = tiny_engine(path, n_parallel=2, kv_unified=unified, **REUSE_ENGINE)
    try:
        long_sink = QueueSink()
        engine.submit(GenerateRequest("long", A, long_sink, SamplingParams(temperature=0), max_tokens=400))
        first = long_sink.queue.get(timeout=30)  # started: A's prompt is being evaluated
        while not any(ev.tokens for ev in first):
            first = long_sink.queue.get(timeout=30)
        warm = generate(engine, prompt, return_prompt_logits=True)
        assert warm.reuse.source == "fork"
        assert warm.reuse.slot == 1
        assert warm.usage.cached_tokens == len(A)
        assert (warm.usage.source, warm.usage.cached_tokens, warm.usage.computed_tokens) == ("fork", len(A), 30)
        long_sink.collect()
    finally:
        engine.stop()
    assert_same_answer(warm, ref)


@pytest.mark.parametrize("kind,unified", FORKING)
def test_concurrent_requests_with_a_shared_prefix_compute_it_once(tiny_models, kind, unified):
    """Two requests sharing a 1K-token prefix arrive together on two slots. The second waits
    for the first to pass the shared prefix, then forks it; both answers equal cold runs."""
    path = tiny_models[kind]
    shared = random_tokens(20, 1000)
    p1, p2 = shared + random_tokens(21, 20), shared + random_tokens(22, 20)
    big = dict(n_ctx=4096, n_batch=128, n_ubatch=128)
    refs = [cold_run(path, p, engine_args=big, boundaries=(len(shared),)) for p in (p1, p2)]
    engine = tiny_engine(path, n_parallel=2, kv_unified=unified, **dict(big, n_ctx=8192 if unified == "off" else 4096))
    try:
        sinks = [QueueSink(), QueueSink()]
        for i, (p, sink) in enumerate(zip((p1, p2), sinks)):
            engine.submit(GenerateRequest(f"r{i}", p, sink, SamplingParams(temperature=0), max_tokens=16, return_prompt_logits=True))
        results = [s.collect() for s in sinks]
    finally:
        engine.stop()
    computed = sorted(r.usage.computed_tokens for r in results)
    assert computed == [20, len(p1)]  # the shared 1000 tokens were evaluated once
    second = min(results, key=lambda r: r.usage.computed_tokens)
    assert second.reuse.source == "fork" and second.usage.cached_tokens == len(shared)
    for r, ref in zip(results, refs):
        assert_same_answer(r, ref)


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_another_tenant_gets_nothing_cached(tiny_models, kind):
    engine = tiny_engine(tiny_models[kind], n_parallel=2, **REUSE_ENGINE)
    try:
        generate(engine, A, tenant="alice")
        assert generate(engine, A, tenant="alice").usage.cached_tokens == len(A)
        other = generate(engine, A, tenant="bob")
        assert other.usage.cached_tokens == 0
        assert other.reuse.matched == 0  # bob cannot even see that alice's prefix exists
        anonymous = generate(engine, A + random_tokens(30, 5))
        assert anonymous.usage.cached_tokens == 0
    finally:
        engine.stop()


@pytest.mark.parametrize("kind", ["attention", "swa", "recurrent", "hybrid"])
def test_kv_pressure_moves_idle_slots_to_ram_instead_of_failing(tiny_models, kind):
    """A pool of 512 cells; slot 0 idles with 420 tokens; slot 1 needs 420 more. Slot 0's
    contents move to the prompt cache, and its conversation later comes back from RAM."""
    path = tiny_models[kind]
    # idle slots stay in the pool (no parking), so the pressure shows up in llama_decode
    engine = tiny_engine(path, n_parallel=2, n_ctx=512, n_batch=64, n_ubatch=64, park_idle=False, kv_unified="on")
    p0, p1 = random_tokens(40, 400), random_tokens(41, 400)
    try:
        r0 = generate(engine, p0, max_tokens=20)
        r1 = generate(engine, p1, max_tokens=20)  # would not fit next to slot 0's cells
        assert r1.error is None and len(r1.tokens) == 20
        back = generate(engine, p0, max_tokens=20, return_prompt_logits=True)
        assert back.error is None
        if kind in ("attention", "hybrid"):  # these keep every position in the KV pool
            assert engine.stats.kv_evictions >= 1
            assert back.reuse.source == "ram" and back.usage.cached_tokens == len(p0)
        assert back.tokens == r0.tokens
    finally:
        engine.stop()


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_idle_slots_are_parked_in_ram_when_another_request_starts(tiny_models, kind):
    engine = tiny_engine(tiny_models[kind], n_parallel=2, kv_unified="on", **REUSE_ENGINE)
    try:
        first = generate(engine, A)
        generate(engine, random_tokens(60, 100))  # shares nothing: goes to the empty slot, parks A's
        view = engine.snapshot(detail=True)
        assert engine.stats.parked == 1
        assert sorted(s.n_tokens > 0 for s in view.slots) == [False, True]
        assert any(e.n_tokens >= len(A) for e in view.cache.entries)
        back = generate(engine, A, return_prompt_logits=True)
        assert back.reuse.source == "ram" and back.usage.cached_tokens == len(A)
        assert back.tokens == first.tokens
    finally:
        engine.stop()


def test_nothing_idle_left_fails_only_the_newest_request(tiny_models):
    """Two prompts that together need more cells than the pool, with no generation past its
    fair share to end: the newer one fails with a clear error, the older one finishes, and
    the engine keeps serving."""
    engine = tiny_engine(tiny_models["attention"], n_parallel=2, n_ctx=512, n_batch=64, n_ubatch=64, kv_unified="on")
    try:
        sinks = [QueueSink(), QueueSink()]
        hold = threading.Event()
        engine.call(lambda e: hold.wait(30))  # pause the engine: both prefill side by side
        engine.submit(GenerateRequest("p0", random_tokens(50, 200), sinks[0], SamplingParams(temperature=0), max_tokens=50))
        engine.submit(GenerateRequest("p1", random_tokens(51, 330), sinks[1], SamplingParams(temperature=0), max_tokens=50))
        hold.set()
        older, newer = (s.collect() for s in sinks)
        assert newer.error is not None and "KV cache is full" in newer.error.message
        assert older.error is None and len(older.tokens) == 50
        assert generate(engine, random_tokens(52, 50)).error is None
    finally:
        engine.stop()


def test_prompt_cache_memory_stays_within_budget_over_many_alternations(tiny_models):
    budget = 200_000
    engine = tiny_engine(tiny_models["hybrid"], cache_ram=budget, **REUSE_ENGINE)
    try:
        for i in range(60):
            generate(engine, SHARED + random_tokens(100 + i % 12, 40), max_tokens=4)
            assert engine.cache.nbytes <= budget
        engine.call(lambda e: e.cache.sanity_check()).result()
        assert engine.cache.stats.evictions > 0
    finally:
        engine.stop()



def test_a_request_can_opt_out_of_reuse(tiny_models):
    engine = tiny_engine(tiny_models["attention"], **REUSE_ENGINE)
    try:
        warm = generate(engine, A)
        assert generate(engine, A).usage.cached_tokens == len(A)
        cold_run = generate(engine, A, reuse_prefix=False)
        assert cold_run.usage.cached_tokens == 0 and cold_run.tokens == warm.tokens
    finally:
        engine.stop()


def test_a_conversation_that_rerenders_its_tail_is_not_saved_again(tiny_models):
    """The next turn diverges a few tokens before the previous prompt's end (a template that
    re-renders the generation prompt): it continues the conversation, so no copy is made."""
    engine = tiny_engine(tiny_models["hybrid"], **REUSE_ENGINE)
    try:
        generate(engine, A, boundaries=(len(A) - 4,))
        saved = engine.cache.stats.saved_bytes
        r = generate(engine, A[:-2] + random_tokens(70, 30), return_prompt_logits=True)
        assert r.usage.cached_tokens == len(A) - 4  # restored the checkpoint before the tail
        assert engine.cache.stats.saved_bytes == saved
        other = generate(engine, random_tokens(71, 50))  # a different conversation: now A is saved
        assert other.error is None and engine.cache.stats.saved_bytes > saved
    finally:
        engine.stop()


@pytest.mark.parametrize("kind", ["attention", "recurrent"])
def test_two_concurrent_requests_both_load_a_cached_prefix(tiny_models, kind):
    engine = tiny_engine(tiny_models[kind], n_parallel=2, kv_unified="on", **REUSE_ENGINE)
    try:
        generate(engine, A)
        generate(engine, random_tokens(80, 100))  # goes to the other slot: A's slot is parked in RAM
        assert engine.stats.parked == 1
        hits = engine.cache.stats.hits
        sinks = [QueueSink(), QueueSink()]
        for i, sink in enumerate(sinks):
            engine.submit(GenerateRequest(f"both{i}", A + random_tokens(90 + i, 20), sink, SamplingParams(temperature=0), max_tokens=8))
        results = [s.collect() for s in sinks]
        assert all(r.usage.cached_tokens >= len(A) - 1 for r in results)
        assert {r.reuse.source for r in results} <= {"ram", "fork"}
        assert engine.cache.stats.hits >= hits + 1
    finally:
        engine.stop()
