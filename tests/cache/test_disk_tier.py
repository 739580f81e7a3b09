"""The disk tier through the real engine, on every memory kind: a conversation that outlives
its engine comes back from disk with the same answer as a cold run, spills run behind the
engine within an exact budget, and the request hints (prompt_cache_key, retention) act."""

import collections
import os

import pytest

from warmslot.cache.disk import format as fmt
from warmslot.slots import GenerateRequest, QueueSink, SamplingParams
from warmslot.slots.reuse.tiers.disk import DiskTier
from tests.helpers import REUSE_ENGINE, assert_close_logits, assert_same_answer, compared_tokens, cold_run, generate, random_tokens, tiny_engine
from tests.tiny_models import KINDS

pytestmark = pytest.mark.model

FIRST = random_tokens(40, 150)
NEXT = FIRST + random_tokens(41, 20)  # the next turn: a new message after the first prompt


def disk_engine(path, directory, **kw):
    args = dict(REUSE_ENGINE, cache_disk=str(directory), cache_disk_size=kw.pop("cache_disk_size", 64 << 20))
    args.update(kw)
    return tiny_engine(path, **args)


def entry_files(directory):
    return sorted(p for p in directory.iterdir() if p.name.endswith(fmt.SUFFIX))


@pytest.mark.parametrize("kind", KINDS)
def test_a_conversation_outlives_its_engine_and_comes_back_from_disk(tiny_models, tmp_path, kind):
    path, directory = tiny_models[kind], tmp_path / "disk"
    engine = disk_engine(path, directory)
    try:
        generate(engine, FIRST, boundaries=(100,))
    finally:
        engine.stop()  # the slot's contents are written on the way out
    (written,) = entry_files(directory)
    assert fmt.read_header(str(written)).tokens[: len(FIRST)] == tuple(FIRST)
    engine = disk_engine(path, directory)
    try:
        warm = generate(engine, NEXT, return_prompt_logits=True, boundaries=(len(FIRST),))
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("disk", len(FIRST))
        assert engine.stats.prompt_tokens["disk"] == len(FIRST)
        view = engine.disk_view
        # the load read the state and the checkpoint it restores (at the prompt end), no other
        header = fmt.read_header(str(written))
        skipped = sum((c.data_bytes or 0) + 4 * (c.n_logits or 0) for c in header.checkpoints if c.n_tokens != len(FIRST))
        if kind != "attention":
            assert 100 in [c.n_tokens for c in header.checkpoints] and skipped > 0
        assert (view.stats.hits, view.stats.reads) == (1, 1) and view.stats.read_bytes == written.stat().st_size - skipped
        assert warm.reuse.state_bytes["disk_to_ram"] == view.stats.read_bytes  # the request says what was read for it
        assert entry_files(directory) == [written]  # loading did not consume the file
        again = generate(engine, NEXT, return_prompt_logits=True)  # and the slot now holds it
        assert again.reuse.source == "slot"
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, NEXT, boundaries=(len(FIRST),)))


def test_a_next_turn_reads_the_state_alone_and_a_divergence_reads_its_checkpoint(tiny_models, tmp_path):
    """The next turn of a conversation (the prompt goes on past the whole entry) reads the
    state and no checkpoint; a later prompt that diverges inside the entry reads the state and
    the one checkpoint it restores from the same file. Both answers equal cold runs."""
    path, directory = tiny_models["hybrid"], tmp_path / "disk"
    engine = disk_engine(path, directory)
    try:
        generate(engine, FIRST, boundaries=(60, 100))
    finally:
        engine.stop()
    (written,) = entry_files(directory)
    header = fmt.read_header(str(written))
    assert {60, 100} <= {c.n_tokens for c in header.checkpoints}

    def read_for(keep):
        return written.stat().st_size - sum(
            (c.data_bytes or 0) + 4 * (c.n_logits or 0) for c in header.checkpoints if c.n_tokens not in keep)

    turn = list(header.tokens) + random_tokens(44, 20)
    edit = FIRST[:100] + random_tokens(45, 30)  # diverges after the checkpoint at 100
    engine = disk_engine(path, directory)
    try:
        warm_turn = generate(engine, turn, return_prompt_logits=True)
        assert (warm_turn.reuse.source, warm_turn.usage.cached_tokens) == ("disk", len(header.tokens))
        assert engine.disk_view.stats.read_bytes == read_for(())
        warm_edit = generate(engine, edit, return_prompt_logits=True)
        assert (warm_edit.reuse.source, warm_edit.usage.cached_tokens) == ("disk", 100)
        view = engine.disk_view
        assert view.stats.reads == 2 and view.stats.read_bytes == read_for(()) + read_for({100})
    finally:
        engine.stop()
    assert_same_answer(warm_turn, cold_run(path, turn))
    assert_same_answer(warm_edit, cold_run(path, edit))


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_a_disk_load_runs_beside_a_generating_slot(tiny_models, tmp_path, kind):
    """One slot generates a long reply while another request's prefix is read from disk and
    loaded into the other slot: both answers equal cold runs."""
    path, directory = tiny_models[kind], tmp_path / "disk"
    engine = disk_engine(path, directory, n_parallel=2)  # the same KV layout as below
    try:
        generate(engine, FIRST)
    finally:
        engine.stop()
    other = random_tokens(43, 60)
    engine = disk_engine(path, directory, n_parallel=2)
    try:
        sink = QueueSink()
        engine.submit(GenerateRequest("long", other, sink, SamplingParams(temperature=0), max_tokens=120))
        early = []
        while not any(ev.tokens for ev in early):
            early += sink.queue.get(timeout=60)
        warm = generate(engine, NEXT, return_prompt_logits=True, boundaries=(len(FIRST),))
        rest = sink.collect()
        assert rest.tokens, "the long reply was still generating when the disk entry was loaded"
        long_tokens = [t for ev in early for t in ev.tokens] + rest.tokens
        long_slot = next(ev.reuse.slot for ev in early if ev.reuse is not None)
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("disk", len(FIRST))
        assert warm.reuse.slot != long_slot and rest.finish == "length" and len(long_tokens) == 120
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, NEXT, boundaries=(len(FIRST),)))
    assert long_tokens == cold_run(path, other, max_tokens=120).tokens


def test_spills_stay_within_the_budget_under_200_alternating_conversations(tiny_models, tmp_path, monkeypatch):
    """200 conversations on one slot, each coming back for a second turn ten conversations
    later. The RAM cache holds about two, so every switch spills to disk; the directory never
    holds more than its budget, and second turns load from disk."""
    # NOTE: the router prices a read at the measured bandwidth and prefill speed; the tiny
    # model computes 36 tokens faster than a 40 KiB read takes on a busy machine, so it would
    # (rightly) compute some turns. This test is about the budget and the loads: reads are free.
    monkeypatch.setattr(DiskTier, "cost_tokens", lambda self, entry, need: 0.0)
    path, directory = tiny_models["attention"], tmp_path / "disk"
    state_bytes = 40 * 1024  # f32 KV of about 40 tokens
    budget = 30 * state_bytes
    engine = disk_engine(path, directory, cache_ram=3 * state_bytes, cache_disk_size=budget, n_batch=64)
    sources, checked = [], None
    try:
        firsts = {}
        for i in range(200):
            firsts[i] = random_tokens(1000 + i, 32)
            generate(engine, firsts[i], max_tokens=1)
            if i >= 10:
                prompt = firsts[i - 10] + random_tokens(5000 + i, 4)
                r = generate(engine, prompt, max_tokens=4 if i == 199 else 1, return_prompt_logits=i == 199)
                sources.append(r.reuse.source)
                checked = (prompt, r)
            on_disk = engine.disk.disk.disk_usage()
            assert sum(on_disk.values()) <= budget, on_disk
            assert engine.disk_view.bytes <= budget
        engine.disk.disk.flush()
        engine.disk.disk.sanity_check()
        view = engine.disk_view
        assert view.stats.writes > 100 and view.stats.evictions > 0 and view.stats.write_errors == 0
    finally:
        engine.stop()
    assert sources.count("disk") >= 150, collections.Counter(sources)
    prompt, r = checked
    ref = cold_run(path, prompt, engine_args=dict(REUSE_ENGINE, n_batch=64), max_tokens=4)
    assert_close_logits(r.prompt_logits, ref.prompt_logits)
    n = compared_tokens(ref)
    assert len(r.tokens) == len(ref.tokens) and r.tokens[:n] == ref.tokens[:n]


def test_retention_in_memory_never_reaches_the_disk(tiny_models, tmp_path):
    path, directory = tiny_models["hybrid"], tmp_path / "disk"
    engine = disk_engine(path, directory, n_parallel=2)
    try:
        generate(engine, FIRST, keep_s=0.0)
        generate(engine, random_tokens(42, 80), keep_s=3600.0)
    finally:
        engine.stop()
    (kept,) = entry_files(directory)
    header = fmt.read_header(str(kept))
    assert header.tokens[:80] == tuple(random_tokens(42, 80)) and header.meta.keep_s == 3600.0


def test_prompt_cache_key_prefers_the_slot_that_served_it(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_parallel=2, **REUSE_ENGINE)
    try:
        a = generate(engine, random_tokens(50, 40), cache_key="agent-a")
        b = generate(engine, random_tokens(51, 40), cache_key="agent-b")
        assert {a.reuse.slot, b.reuse.slot} == {0, 1}
        # nothing to reuse: by age the slot of "a" would go, but "b"'s key brings it home
        again = generate(engine, random_tokens(52, 40), cache_key="agent-b")
        assert again.reuse.slot == b.reuse.slot
        # the key is per tenant: another tenant's "agent-b" gets the least recently used slot
        stranger = generate(engine, random_tokens(53, 40), cache_key="agent-b", tenant="someone-else")
        assert stranger.reuse.slot == a.reuse.slot
        other = generate(engine, random_tokens(54, 40))
        assert other.reuse.slot == b.reuse.slot  # no key: the least recently used slot
    finally:
        engine.stop()


def test_entries_of_another_layout_are_kept_but_not_used(tiny_models, tmp_path):
    path, directory = tiny_models["swa"], tmp_path / "disk"
    engine = disk_engine(path, directory)
    try:
        generate(engine, FIRST)
    finally:
        engine.stop()
    engine = disk_engine(path, directory, swa_full=True)
    try:
        cold = generate(engine, NEXT, return_prompt_logits=True)
        assert cold.usage.cached_tokens == 0 and cold.error is None
        assert engine.disk_view.stats.rejected == {"model": 1}
        assert "rejected (model)" in cold.reuse.reason
    finally:
        engine.stop()
    assert len(entry_files(directory)) == 2  # the other layout's file is still there
    assert os.path.exists(directory / "last-used.json")
