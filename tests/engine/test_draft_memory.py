"""A drafter's own memory (a draft model's KV, the MTP block's) goes where the slot's goes:
into the RAM prompt cache and the disk tier with the slot's contents, back out of them into
whichever slot takes them, and into a fork's target. Real llama.cpp on the tiny models: outputs equal those without
drafts, and the counters show the drafter restored the conversation instead of evaluating it."""

import numpy as np
import pytest

from tests.helpers import REUSE_ENGINE, generate, random_tokens, tiny_engine
from tests.tiny_models import write_tiny_model
from warmslot.slots import GenerateRequest, QueueSink, SamplingParams, SpecConfig

P1, P2, NEW = random_tokens(31, 60), random_tokens(32, 50), random_tokens(33, 10)


def alternate(engine):
    """Conversation 1, then conversation 2 on the one slot (1 goes to the prompt cache), then
    conversation 1's next turn (back from the cache). Returns the three results and what the
    drafter took into its memory during the last turn, by source."""
    first = generate(engine, P1, max_tokens=20, cache_key="one")
    second = generate(engine, P2, max_tokens=20, cache_key="two")
    before = dict(engine.stats.spec_drafter_tokens)
    third = generate(engine, P1 + first.tokens + NEW, max_tokens=10, cache_key="one")
    after = engine.stats.spec_drafter_tokens
    took = {source: after[source] - before.get(source, 0) for source in ("evaluated", "restored")}
    return (first, second, third), took


def test_a_draft_models_sequence_comes_back_from_the_prompt_cache(tiny_models):
    """The tiny attention model drafting for itself, one slot: the returning conversation's
    draft sequence is loaded with the target's from the cache entry, so the draft model
    evaluates only the new tokens (it evaluated the whole history before)."""
    target = tiny_models["attention"]
    outputs = {}
    for config in (SpecConfig(), SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0)):
        engine = tiny_engine(target, spec=config, **REUSE_ENGINE)
        try:
            outputs[config.on], took = alternate(engine)
            if config.on:
                entries = list(engine.cache.entries())
                drafted = [e for e in entries if e.draft is not None]
                assert drafted, "the saved conversations carry the draft model's sequence"
                assert all(e.nbytes == e.state.nbytes + e.checkpoints.nbytes + e.draft.nbytes for e in drafted)
        finally:
            engine.stop()
    plain, fast = outputs[False], outputs[True]
    assert [r.tokens for r in fast] == [r.tokens for r in plain]
    third = fast[2]
    assert third.reuse.source == "ram" and third.usage.cached_tokens >= len(P1) + 19
    assert fast[0].usage.draft_accepted > 0 and third.usage.draft_tokens > 0
    history = len(P1) + len(fast[0].tokens)
    assert took["restored"] >= len(P1), took  # what the draft sequence held when last drafting
    # the new tokens and the pending one, and what the third turn's own output added
    assert took["evaluated"] <= len(NEW) + 12 < history, took


def test_a_fork_copies_the_draft_models_sequence(tiny_models):
    """Slot 0 generates for A; a request that shares A goes to slot 1 as a fork. The draft
    model's sequence of slot 1 takes slot 0's copy of A, and evaluates only what follows."""
    target = tiny_models["attention"]
    prefix = random_tokens(34, 80)
    prompt = prefix + random_tokens(35, 30)
    config = SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0)
    engine = tiny_engine(target, n_parallel=2, spec=config, **REUSE_ENGINE)
    try:
        long_sink = QueueSink()
        engine.submit(GenerateRequest("long", prefix, long_sink, SamplingParams(temperature=0), max_tokens=300))
        first = long_sink.queue.get(timeout=30)
        while not any(ev.tokens for ev in first):
            first = long_sink.queue.get(timeout=30)
        before = dict(engine.stats.spec_drafter_tokens)
        warm = generate(engine, prompt, max_tokens=12)
        restored = engine.stats.spec_drafter_tokens["restored"] - before.get("restored", 0)
        long_sink.collect()
    finally:
        engine.stop()
    assert warm.reuse.source == "fork" and warm.usage.cached_tokens == len(prefix)
    assert restored == len(prefix)
    cold = tiny_engine(target, spec=SpecConfig(), **REUSE_ENGINE)
    try:
        assert generate(cold, prompt, max_tokens=12).tokens == warm.tokens
    finally:
        cold.stop()


def test_a_draft_models_sequence_outlives_the_engine_on_disk(tiny_models, tmp_path):
    """The disk tier writes the draft model's sequence with the slot's contents at shutdown;
    the next engine's returning conversation loads both from the file, so its draft model
    evaluates only the new tokens. The answer equals the one without drafts."""
    target = tiny_models["attention"]
    config = SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0)
    disk = dict(REUSE_ENGINE, cache_disk=str(tmp_path / "disk"), cache_disk_size=64 << 20)
    engine = tiny_engine(target, spec=config, **disk)
    try:
        first = generate(engine, P1, max_tokens=20)
    finally:
        engine.stop()  # the slot's contents go to disk
    follow = P1 + first.tokens + NEW
    engine = tiny_engine(target, spec=config, **disk)
    try:
        warm = generate(engine, follow, max_tokens=10)
        took = dict(engine.stats.spec_drafter_tokens)
    finally:
        engine.stop()
    assert warm.reuse.source == "disk" and warm.usage.draft_tokens > 0
    assert took.get("restored", 0) >= len(P1), took
    assert took.get("evaluated", 0) <= len(NEW) + 12, took
    plain = tiny_engine(target, spec=SpecConfig(), **REUSE_ENGINE)
    try:
        assert generate(plain, follow, max_tokens=10).tokens == warm.tokens
    finally:
        plain.stop()


def test_the_first_token_goes_out_before_the_draft_model_catches_up(tiny_models):
    """A draft model evaluates the history it has not seen before its first draft (the whole
    prompt on a first turn): the token the prefill gave is handed to the request first, so
    the time to the first token is the prefill's alone."""
    target = tiny_models["attention"]
    engine = tiny_engine(target, spec=SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0), **REUSE_ENGINE)
    seen = []
    try:
        drafter = engine.spec.draft_model
        sink = QueueSink()
        draft_batch = drafter.draft_batch

        def watched(requests):
            seen.append(sink.queue.qsize())  # events the request has been handed so far
            return draft_batch(requests)

        drafter.draft_batch = watched
        engine.submit(GenerateRequest("first", P1, sink, SamplingParams(temperature=0), max_tokens=8))
        result = sink.collect()
    finally:
        engine.stop()
    assert result.usage.draft_tokens > 0
    assert seen and seen[0] >= 1, seen


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    return write_tiny_model("hybrid-mtp", tmp_path_factory.mktemp("tiny-mtp") / "hybrid-mtp.gguf")


def test_the_mtp_blocks_sequence_comes_back_from_the_prompt_cache(tiny_mtp):
    """--spec-type draft-mtp on the tiny hybrid model: the returning conversation's MTP
    sequence is loaded with the slot's, so the block attends over the whole history again
    (without it, positions taken from a cache are missing from the block's memory)."""
    outputs = {}
    for config in (SpecConfig(), SpecConfig(type="draft-mtp", n_max=4, p_min=0.0)):
        engine = tiny_engine(tiny_mtp, spec=config, **REUSE_ENGINE)
        try:
            outputs[config.on], took = alternate(engine)
            if config.on:
                assert engine.spec.draft_model.mtp.ctx.seq_pos_min(0) == 0  # the history from position 0
        finally:
            engine.stop()
    plain, fast = outputs[False], outputs[True]
    assert [r.tokens for r in fast] == [r.tokens for r in plain]
    assert fast[2].reuse.source == "ram" and fast[2].usage.draft_tokens > 0
    assert took["restored"] >= len(P1), took


def test_a_copy_of_a_sequence_rolled_back_to_a_snapshot_has_the_state_after_the_rollback(tiny_models):
    """llama.cpp takes a hybrid sequence back to a recurrent snapshot only at its next decode;
    a seq_cp before that decode copies the state from before the rollback unless the snapshot
    is made the state first (Context.seq_cp). Real llama.cpp on the tiny Qwen3.5 model: the
    copy's next logits equal those of a sequence that never saw the rejected tokens."""
    from warmslot.slots.llama_api import Batch, Context, ContextParams, Model

    model = Model(str(tiny_models["hybrid"]), n_gpu_layers=0)
    try:
        ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=3, n_rs_seq=4, type_k="f32", type_v="f32", flash_attn="off"))
        batch = Batch(64, 3)
        try:
            assert ctx.n_rs_seq == 4
            prompt, rejected, nxt = P1[:20], [1, 2, 3], 7

            def decode(tokens, pos, seq):
                batch.clear()
                index = batch.add(tokens, pos, seq, logits_last=True)
                assert ctx.decode(batch) == 0
                return ctx.logits(index)

            decode(prompt[:-1], 0, 0)
            decode(prompt, 0, 2)  # the reference never sees the rejected tokens
            decode(prompt[-1:] + rejected, len(prompt) - 1, 0)  # a verify step: pending token and draft
            assert ctx.seq_rm(0, len(prompt), -1)  # back to the snapshot after the prompt
            ctx.seq_cp(0, 1)
            want = decode([nxt], len(prompt), 2)
            assert np.allclose(decode([nxt], len(prompt), 1), want, atol=1e-4)
            assert np.allclose(decode([nxt], len(prompt), 0), want, atol=1e-4)
        finally:
            ctx.close()
    finally:
        model.close()
