"""A KV stream per slot (the default with several slots on attention and sliding-window
models) against a unified pool: batch layout, forks between streams, the auto choice."""

import pytest

from warmslot.cache.checkpoints import CheckpointList
from warmslot.slots import GenerateRequest, MemoryKind, QueueSink, SamplingParams
from warmslot.slots.engine import kv_unified
from warmslot.slots.llama_api import Batch
from warmslot.slots.scheduler import plan_batch
from warmslot.slots.slot import Active, Slot
from warmslot.slots.text import TextStream
from warmslot.slots.requests import Reuse

from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine


def test_auto_gives_each_slot_a_stream_on_attention_models_only():
    assert kv_unified("auto", MemoryKind.ATTENTION, 4) is False
    assert kv_unified("auto", MemoryKind.SWA, 16) is False
    assert kv_unified("auto", MemoryKind.ATTENTION, 1) is True
    assert kv_unified("auto", MemoryKind.HYBRID, 4) is True
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
