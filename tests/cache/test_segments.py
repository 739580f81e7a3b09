"""Prompt-cache entries stored as segments (cache/segments.py): conversations that share a
system prompt, and the turns of one conversation, hold the shared state once in RAM, and
come back with the same answer as a cold run, through the real engine, on attention,
sliding-window and hybrid memory."""

import numpy as np
import pytest

from warmslot.cache import segments
from tests.helpers import LOGITS_ATOL_FLASH, REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine
from warmslot.slots.reuse.tiers.disk import DiskTier
from warmslot.slots.stats import CopyCause
from tests.cache.test_disk_tier import disk_engine, entry_files

pytestmark = pytest.mark.model

SHARED = random_tokens(80, 200)  # a system prompt and tools that every conversation sends
CONVERSATIONS = [SHARED + random_tokens(81 + i, 50) for i in range(4)]


def whole_bytes(engine, entry) -> int:
    return engine.call(lambda e: int(e.cache.whole_state(entry).nbytes)).result()


def slot_state(path, prompt):
    """A fresh engine's answer to `prompt` (4 tokens) and the bytes of the slot's state after it."""
    probe = tiny_engine(path, **REUSE_ENGINE)
    try:
        answer = generate(probe, prompt, max_tokens=4)
        return answer, probe.call(lambda e: e.ctx.state_size(0)).result()
    finally:
        probe.stop()


# one slot in a unified pool; two slots with a stream each, flash attention off (transposed V)
# and on (V by rows)
LAYOUTS = {
    "unified": dict(n_parallel=1),
    "streams": dict(n_parallel=2, kv_unified="off"),
    "streams-flash": dict(n_parallel=2, kv_unified="off", flash_attn="on"),
}


CASES = [("attention", layout) for layout in LAYOUTS] + [(kind, layout) for kind in ("swa", "hybrid") for layout in ("unified", "streams")]


@pytest.mark.parametrize("kind,layout", CASES)
def test_conversations_sharing_a_system_prompt_store_it_once_and_come_back_as_cold(tiny_models, kind, layout):
    """On sliding-window memory too: each conversation's own tokens outnumber the window
    (8 tokens on the tiny model), so its segment holds its whole window."""
    path = tiny_models[kind]
    args = {**REUSE_ENGINE, **LAYOUTS[layout]}
    engine = tiny_engine(path, **args)
    try:
        for prompt in CONVERSATIONS:
            r = generate(engine, prompt, max_tokens=4)
            assert r.error is None
        # every slot's conversation goes to RAM: one more conversation per slot
        for i in range(args["n_parallel"]):
            generate(engine, random_tokens(90 + i, 70), max_tokens=4)
        cache = engine.cache
        stats = cache.stats
        assert stats.chained >= 3 and stats.chain_bytes_spared > 0
        held = [e for e in cache.entries() if e.tokens[:len(SHARED)] == tuple(SHARED)]
        assert len(held) == 4
        chained = [e for e in held if e.chained]
        assert len(chained) == 3 and all(e.base_len == len(SHARED) for e in chained)
        # RAM holds the shared 200 tokens once: a chained entry holds about its own 54 tokens
        # of 254 (and, on sliding-window memory, its window; on hybrid memory, its recurrent
        # state, as large as 66 tokens' KV on the tiny model, and its checkpoints beside)
        for e in chained:
            if kind == "hybrid":
                assert whole_bytes(engine, e) - e.state.nbytes >= len(SHARED) * engine.info.kv_bytes_per_token
                assert e.layout.recurrent is not None
            else:
                assert e.nbytes < 0.4 * whole_bytes(engine, e)
        engine.call(lambda e: e.cache.sanity_check()).result()
        # on the CPU the whole states that passed through on their way to segments went into
        # one buffer, kept for the next (written into memory already mapped); the capacity
        # names its room beside the prompt cache
        staging = engine.call(lambda e: e.memory.staging).result()
        assert staging._buffer is not None and staging.keep == engine.info.capacity.staging_ram_bytes > 0
        assert "kept for whole states in passing" in engine.info.capacity.table()
        hits, joins = stats.hits, stats.join_seconds
        warm = [generate(engine, prompt, return_prompt_logits=True) for prompt in CONVERSATIONS[1:3]]
        for prompt, r in zip(CONVERSATIONS[1:3], warm):
            assert (r.reuse.source, r.usage.cached_tokens) == ("ram", len(prompt))
        assert stats.hits >= hits + 2 and stats.join_seconds > joins
        # and a next turn of a chained conversation goes on from it
        turn = CONVERSATIONS[3] + random_tokens(95, 20)
        nxt = generate(engine, turn, return_prompt_logits=True)
        assert nxt.usage.cached_tokens >= len(CONVERSATIONS[3])
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()
    cold_args = {**REUSE_ENGINE, **{k: v for k, v in LAYOUTS[layout].items() if k == "flash_attn"}}
    same = assert_same_answer if "flash" not in layout else same_with_flash
    for prompt, r in zip(CONVERSATIONS[1:3], warm):
        same(r, cold_run(path, prompt, engine_args=cold_args))
    same(nxt, cold_run(path, turn, engine_args=cold_args, boundaries=(len(CONVERSATIONS[3]),)))


@pytest.mark.parametrize("layout", ["unified", "stream", "stream-flash"])
def test_a_slot_given_to_another_conversation_sends_ram_only_the_cells_it_lacks(tiny_models, layout):
    """Conversations taking turns on one slot: when a slot goes to another conversation, its
    contents are saved, and the cells that the cache holds already (the shared system prompt,
    the conversation's earlier turn) never cross to RAM again; each conversation still comes
    back as a cold run would answer it."""
    path = tiny_models["attention"]
    flash = {"flash_attn": "on"} if layout.endswith("flash") else {}
    args = {**REUSE_ENGINE, "n_parallel": 1, **({"kv_unified": "off"} if layout.startswith("stream") else {}), **flash}
    a1, b1 = CONVERSATIONS[0], CONVERSATIONS[1]
    a2, b2 = a1 + random_tokens(110, 60), b1 + random_tokens(111, 60)
    engine = tiny_engine(path, **args)
    stats = engine.stats
    try:
        assert engine.call(lambda e: (len(e.slots), e.ctx.unified)).result() == (1, layout == "unified")
        for prompt in (a1, b1):  # a1 goes to RAM whole (the cache held nothing)
            assert generate(engine, prompt, max_tokens=4).error is None
        reads = stats.tail_reads
        a2_warm = generate(engine, a2, return_prompt_logits=True)  # b1 goes: without the shared 200
        assert (a2_warm.reuse.source, a2_warm.usage.cached_tokens) == ("ram", len(a1))
        assert stats.tail_reads == reads + 1
        (b1_entry,) = [e for e in engine.cache.entries() if e.tokens[:len(b1)] == tuple(b1)]
        assert b1_entry.chained and b1_entry.base_len == len(SHARED)
        saved = dict(stats.copy_bytes)
        b2_warm = generate(engine, b2, return_prompt_logits=True)  # a2 goes: without a1's cells
        assert (b2_warm.reuse.source, b2_warm.usage.cached_tokens) == ("ram", len(b1))
        assert stats.tail_reads == reads + 2
        (a2_entry,) = [e for e in engine.cache.entries() if e.tokens[:len(a2)] == tuple(a2)]
        assert a2_entry.chained and a2_entry.base_len == len(a1)
        read = sum(n - saved.get(cause, 0) for cause, n in stats.copy_bytes.items() if cause is not CopyCause.LOAD)
        whole = whole_bytes(engine, a2_entry)
        assert 0 < read < 0.4 * whole  # about 64 of a2's 324 cells, where a whole read takes all
        a3_warm = generate(engine, a2 + random_tokens(112, 20), return_prompt_logits=True)
        assert a3_warm.usage.cached_tokens >= len(a2)
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()
    cold_args = {**REUSE_ENGINE, **flash}
    same = same_with_flash if flash else assert_same_answer
    same(a2_warm, cold_run(path, a2, engine_args=cold_args, boundaries=(len(a1),)))
    same(b2_warm, cold_run(path, b2, engine_args=cold_args, boundaries=(len(b1),)))
    same(a3_warm, cold_run(path, a2 + random_tokens(112, 20), engine_args=cold_args, boundaries=(len(a2),)))


def same_with_flash(warm, ref) -> None:
    """With flash attention: the same answer within LOGITS_ATOL_FLASH (tests/helpers.py)."""
    assert_same_answer(warm, ref, LOGITS_ATOL_FLASH)


def test_a_slot_that_keeps_its_prefix_sends_ram_only_its_tail_and_it_comes_back_as_cold(tiny_models):
    """An editor's completions at the cursor of one file: each prompt keeps most of the slot,
    and RAM holds that prefix already (the previous save). The slot's save reads only its cells
    after that prefix, through the scratch sequence, and leaves the slot whole: the request
    goes on from the slot's own cells, and the saved entry, loaded later, answers as a cold
    run would."""
    path = tiny_models["attention"]
    head = random_tokens(120, 300)  # the file above the cursor
    a, b, c = (head + random_tokens(121 + i, 60) for i in range(3))
    engine = tiny_engine(path, **REUSE_ENGINE, n_parallel=1)
    stats = engine.stats
    try:
        assert generate(engine, a, max_tokens=4).error is None
        assert generate(engine, b, max_tokens=4).reuse.source == "slot"  # a goes to RAM whole
        reads, scratch = stats.tail_reads, stats.scratch_reads
        c_warm = generate(engine, c, return_prompt_logits=True)  # b goes: its cells after the 300
        assert (c_warm.reuse.source, c_warm.usage.cached_tokens) == ("slot", len(head))
        assert (stats.tail_reads, stats.scratch_reads) == (reads + 1, scratch + 1)
        (b_entry,) = [e for e in engine.cache.entries() if e.tokens[:len(b)] == tuple(b)]
        assert b_entry.chained and b_entry.base_len == len(head)
        read = sum(c_warm.reuse.state_bytes.values())
        assert 0 < read < 0.3 * whole_bytes(engine, b_entry)  # 64 of b's 364 cells
        assert engine.call(lambda e: e.ctx.seq_pos_min(e.loaded.memory.scratch)).result() == -1  # cleared
        d = b + random_tokens(124, 20)
        d_warm = generate(engine, d, return_prompt_logits=True)  # the slot holds c: b comes from RAM
        assert (d_warm.reuse.source, d_warm.usage.cached_tokens) == ("ram", len(b))
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()
    assert_same_answer(c_warm, cold_run(path, c, boundaries=(len(head),)))
    assert_same_answer(d_warm, cold_run(path, d, boundaries=(len(b),)))


def entry_of(engine, tokens):
    (entry,) = [e for e in engine.cache.entries() if e.tokens[:len(tokens)] == tuple(tokens)]
    return entry


def test_a_conversation_back_from_ram_is_written_after_the_prefix_its_slot_holds_and_answers_as_cold(tiny_models):
    """Two conversations on one slot take turns, sharing a system prompt: each comes back from
    RAM while the slot holds the other. The slot keeps the shared prefix, and the load writes
    only the returning conversation's own cells (through the scratch sequence); its answer is
    a cold run's."""
    path = tiny_models["attention"]
    a1, b1 = (SHARED + random_tokens(130 + i, 60) for i in range(2))
    a2, b2 = a1 + random_tokens(140, 20), b1 + random_tokens(141, 20)
    engine = tiny_engine(path, **REUSE_ENGINE, n_parallel=1)
    stats = engine.stats
    warm = {}
    try:
        for prompt in (a1, b1):
            assert generate(engine, prompt, max_tokens=4).error is None
        for name, prompt, back in (("a2", a2, a1), ("b2", b2, b1)):
            loads = stats.tail_loads
            r = warm[name] = generate(engine, prompt, return_prompt_logits=True)
            assert (r.reuse.source, r.usage.cached_tokens) == ("ram", len(back))
            assert stats.tail_loads == loads + 1
            written = r.reuse.state_bytes.get("ram_to_device", 0)
            assert 0 < written < 0.4 * whole_bytes(engine, entry_of(engine, back))  # 64 of 264 cells
        assert engine.call(lambda e: e.ctx.seq_pos_min(e.loaded.memory.scratch)).result() == -1  # cleared
        engine.call(lambda e: e.cache.sanity_check()).result()
        # the tokens RAM holds (warmslot_prompt_cache_tokens): each chained entry's own only
        cache = engine.cache
        assert cache.n_tokens == sum(len(e) - e.base_len for e in cache.entries()) < sum(map(len, cache.entries()))
    finally:
        engine.stop()
    assert_same_answer(warm["a2"], cold_run(path, a2, boundaries=(len(a1),)))
    assert_same_answer(warm["b2"], cold_run(path, b2, boundaries=(len(b1),)))


def test_a_load_into_a_slot_without_the_prefix_forks_it_from_the_slot_that_holds_it(tiny_models):
    """In one pool of two slots: a conversation comes back from RAM into the slot that holds
    an unrelated prompt, while the other slot holds the shared system prompt. The load forks
    that prefix (the pool's cells are shared, not copied) and writes only the conversation's
    own cells; the answer is a cold run's."""
    path = tiny_models["attention"]
    a1, b1 = (SHARED + random_tokens(150 + i, 60) for i in range(2))
    other = random_tokens(152, 70)
    a2 = a1 + random_tokens(153, 20)
    engine = tiny_engine(path, **REUSE_ENGINE, n_parallel=2, kv_unified="on")
    stats = engine.stats
    try:
        for prompt in (a1, other, b1):  # b1 takes a1's slot, which keeps the shared prefix: a1 to RAM
            assert generate(engine, prompt, max_tokens=4).error is None
        loads, forks = stats.tail_loads, stats.tail_load_forks
        a2_warm = generate(engine, a2, return_prompt_logits=True)  # into the least recently used slot
        assert (a2_warm.reuse.source, a2_warm.usage.cached_tokens) == ("ram", len(a1))
        assert (stats.tail_loads, stats.tail_load_forks) == (loads + 1, forks + 1)
        assert 0 < a2_warm.reuse.state_bytes.get("ram_to_device", 0) < 0.4 * whole_bytes(engine, entry_of(engine, a1))
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()
    assert_same_answer(a2_warm, cold_run(path, a2, boundaries=(len(a1),)))


def test_idle_conversations_keep_their_cells_in_the_pool_within_cache_vram_and_share_the_prefix(tiny_models):
    """One pool of attention memory with --cache-vram: four conversations on two slots sharing
    a system prompt. Each new one forks the prefix, so the pool holds it once; with room for
    every conversation's own cells, each comes back to its own sequence with nothing copied
    and answers as cold. With room for two conversations' own cells only, the others move to
    RAM when a request starts (`parked`), and come back from there."""
    path = tiny_models["attention"]
    first = [SHARED + random_tokens(160 + i, 50) for i in range(4)]
    second = [p + random_tokens(170 + i, 10) for i, p in enumerate(first)]
    engine = tiny_engine(path, **REUSE_ENGINE, n_parallel=2, kv_unified="on", cache_vram=1 << 30)
    try:
        per_token = engine.call(lambda e: e.loaded.model.kv_bytes_per_token("f32", "f32")).result()
        assert "cells in one pool, a prefix that sequences share held once" in engine.info.capacity.table()
        assert engine.call(lambda e: e.loaded.layout.n_spare).result() > 2
        for prompt in first:
            assert generate(engine, prompt, max_tokens=4).error is None
        forks = engine.stats.prompt_tokens["fork"]
        assert forks >= 3 * len(SHARED)  # the prefix forked, not computed again
        snap = engine.call(lambda e: e._take_snapshot(detail=False)).result()
        # the tokens the device holds (warmslot_kv_cells_used) count the shared prefix once
        assert snap.device_tokens == sum(s.n_tokens for s in snap.slots) - 3 * len(SHARED)
        warm = [generate(engine, p, return_prompt_logits=True) for p in second]
        for r, p in zip(warm, first):
            assert (r.reuse.source, r.usage.cached_tokens, r.reuse.state_bytes) == ("slot", len(p), {})
        assert engine.stats.parked == 0
    finally:
        engine.stop()
    assert_same_answer(warm[0], cold_run(path, second[0], boundaries=(len(first[0]),)))

    engine = tiny_engine(path, **REUSE_ENGINE, n_parallel=2, kv_unified="on", cache_vram=120 * per_token)
    try:
        for prompt in first:
            assert generate(engine, prompt, max_tokens=4).error is None
        assert engine.stats.parked >= 1  # the oldest conversation went to RAM
        # newest first: the latest conversations come back from the pool, the oldest from RAM
        sources = [generate(engine, p, max_tokens=4).reuse.source for p in reversed(second)]
        assert sources[0] == "slot" and sources[-1] == "ram"
    finally:
        engine.stop()


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_a_joined_chain_is_the_state_the_slot_held(tiny_models, kind):
    """The state a chained entry joins into holds the same cells, position for position and
    byte for byte, as the state saved from the slot (and on hybrid memory the same recurrent
    state)."""
    engine = tiny_engine(tiny_models[kind], **REUSE_ENGINE)
    try:
        def saved_and_joined(e):
            slot = e.slots[0]
            return e.ctx.state_get(slot.id, partial=False)
        generate(engine, CONVERSATIONS[0], max_tokens=4)
        generate(engine, CONVERSATIONS[1], max_tokens=4)
        original = engine.call(saved_and_joined).result()  # the slot now holds conversation 1
        generate(engine, random_tokens(97, 70), max_tokens=4)  # conversation 1 goes to RAM
        (entry,) = [e for e in engine.cache.entries() if e.tokens[:len(CONVERSATIONS[1])] == tuple(CONVERSATIONS[1])]
        assert entry.chained
        joined = engine.call(lambda e: e.cache.whole_state(entry)).result()
    finally:
        engine.stop()
    a, b = segments.parse(original, kind == "hybrid"), segments.parse(joined, kind == "hybrid")
    assert a is not None and b is not None and a.n == b.n
    if kind == "hybrid":
        assert a.recurrent is not None and np.array_equal(a.recurrent, b.recurrent)
    ia, ib = np.argsort(a.pos), np.argsort(b.pos)
    assert np.array_equal(a.pos[ia], b.pos[ib])
    for (_, ka), (_, kb) in zip(a.k + a.v, b.k + b.v):
        assert np.array_equal(ka[ia] if ka.ndim == 2 else ka[:, ia], kb[ib] if kb.ndim == 2 else kb[:, ib])


def test_memory_that_is_more_than_its_cells_keeps_whole_entries(tiny_models):
    engine = tiny_engine(tiny_models["recurrent"], **REUSE_ENGINE)
    try:
        for prompt in CONVERSATIONS[:3]:
            generate(engine, prompt, max_tokens=4)
        assert engine.cache.n_entries >= 2
        assert engine.cache.stats.chained == 0 and not any(e.chained for e in engine.cache.entries())
    finally:
        engine.stop()


def test_bases_leave_ram_only_after_what_chains_to_them_and_the_budget_holds(tiny_models):
    """A budget of about three whole conversations, twelve conversations on one system
    prompt: entries are evicted, a base never before the entries chained to it, and the
    cache stays within its budget; a conversation still held comes back as cold."""
    path = tiny_models["attention"]
    _, whole = slot_state(path, CONVERSATIONS[0])
    budget = 3 * whole
    engine = tiny_engine(path, cache_ram=budget, **REUSE_ENGINE)
    try:
        prompts = [SHARED + random_tokens(200 + i, 50) for i in range(12)]
        for prompt in prompts:
            assert generate(engine, prompt, max_tokens=4).error is None
            assert engine.cache.nbytes <= budget
            engine.call(lambda e: e.cache.sanity_check()).result()
        stats = engine.cache.stats
        assert stats.evictions > 0 and stats.chained > 3
        # more conversations are held than whole states would fit
        held = [e for e in engine.cache.entries() if e.tokens[:len(SHARED)] == tuple(SHARED)]
        assert len(held) > 3
        last_held = max((e for e in held if e.chained), key=lambda e: e.last_used)
        prompt = list(last_held.tokens[:len(SHARED) + 50])
        warm = generate(engine, prompt, return_prompt_logits=True)
        assert warm.reuse.source == "ram" and warm.usage.cached_tokens == len(prompt)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, prompt))


def test_a_chained_entry_goes_to_disk_whole_and_its_base_is_not_written_twice(tiny_models, tmp_path):
    path, directory = tiny_models["attention"], tmp_path / "disk"
    engine = disk_engine(path, directory)
    try:
        first = CONVERSATIONS[0]
        r1 = generate(engine, first, max_tokens=4)
        generate(engine, random_tokens(97, 60), max_tokens=4)  # the first turn goes to RAM
        turn = first + r1.tokens + random_tokens(99, 30)  # the next turn: chains to the first
        assert generate(engine, turn, max_tokens=4).reuse.source == "ram"
        generate(engine, random_tokens(98, 60), max_tokens=4)  # the conversation goes to RAM
        assert engine.cache.stats.chained >= 1
    finally:
        engine.stop()  # RAM entries are written on the way out, the newest first
    files = entry_files(directory)
    from warmslot.cache.disk import format as fmt
    headers = [fmt.read_header(str(f)) for f in files]
    conv = [h for h in headers if h.tokens[:len(first)] == tuple(first)]
    # the first turn, which only served as the next one's base, is not written: the next serves it
    assert len(conv) == 1 and len(conv[0].tokens) >= len(turn)
    engine = disk_engine(path, directory)
    try:
        prompt = turn + random_tokens(96, 10)
        warm = generate(engine, prompt, return_prompt_logits=True, boundaries=(len(turn),))
        assert warm.reuse.source == "disk" and warm.usage.cached_tokens == len(turn)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, prompt, boundaries=(len(turn),)))


def test_a_tail_read_that_ram_refuses_reaches_the_disk_joined_and_comes_back_as_cold(tiny_models, tmp_path):
    """RAM holds the first turn and has no room for the next one's cells: the slot's save
    reads only those cells, RAM refuses them, and the disk tier writes them joined to the
    first turn, whole, so that the conversation comes back from disk after a restart."""
    path, directory = tiny_models["attention"], tmp_path / "disk"
    first = CONVERSATIONS[0]
    r1, whole = slot_state(path, first)
    engine = disk_engine(path, directory, cache_ram=whole + 2048)  # the first turn, and not 34 cells more
    try:
        assert generate(engine, first, max_tokens=4).tokens == r1.tokens
        generate(engine, random_tokens(97, 60), max_tokens=4)  # the first turn goes to RAM
        turn = first + r1.tokens + random_tokens(99, 30)
        assert generate(engine, turn, max_tokens=4).reuse.source == "ram"
        refused, reads = engine.cache.stats.refused, engine.stats.tail_reads
        generate(engine, random_tokens(98, 60), max_tokens=4)  # the next turn goes: RAM refuses it
        assert engine.stats.tail_reads == reads + 1 and engine.cache.stats.refused > refused
        assert not any(e.tokens[:len(turn)] == tuple(turn) for e in engine.cache.entries())
    finally:
        engine.stop()
    engine = disk_engine(path, directory)
    try:
        prompt = turn + random_tokens(96, 10)
        warm = generate(engine, prompt, return_prompt_logits=True, boundaries=(len(turn),))
        assert warm.reuse.source == "disk" and warm.usage.cached_tokens >= len(turn)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, prompt, boundaries=(len(turn),)))


def test_a_sliding_window_reaching_back_before_its_own_tokens_keeps_the_entry_whole(tiny_models):
    """A turn that adds fewer tokens than the window: its window holds its base's cells, which
    the base's own state does not keep at that point, so it is stored whole."""
    path = tiny_models["swa"]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        first = CONVERSATIONS[0]
        generate(engine, first, max_tokens=1)
        generate(engine, random_tokens(120, 70), max_tokens=1)  # the first goes to RAM
        short = first + random_tokens(121, 3)  # 3 + 1 new tokens: fewer than the window of 8
        r = generate(engine, short, max_tokens=1)
        assert r.reuse.source == "ram"
        generate(engine, random_tokens(122, 70), max_tokens=1)  # the short turn goes to RAM
        held = [e for e in engine.cache.entries() if e.tokens[:len(short)] == tuple(short)]
        assert len(held) == 1 and not held[0].chained
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()


def test_after_the_model_slept_chained_entries_come_back_and_new_ones_use_the_new_context(tiny_models):
    """Sleeping unloads the model and keeps the prompt cache: a chained entry loads into the
    new context as cold, and the cache writes new segments into the new context's memory."""
    path = tiny_models["attention"]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        for prompt in CONVERSATIONS[:2]:
            generate(engine, prompt, max_tokens=4)
        generate(engine, random_tokens(130, 70), max_tokens=4)  # both go to RAM
        assert engine.cache.stats.chained >= 1
        assert engine.sleep().result(30)
        engine.wake().result(60)
        host = engine.call(lambda e: e.ctx.host).result()
        assert engine.cache.segment_buffer == host.empty
        warm = generate(engine, CONVERSATIONS[1], return_prompt_logits=True)
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("ram", len(CONVERSATIONS[1]))
        engine.call(lambda e: e.cache.sanity_check()).result()
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, CONVERSATIONS[1]))


@pytest.mark.parametrize("kind", ["attention", "swa", "hybrid"])
def test_conversations_sharing_a_system_prompt_go_to_disk_as_segments_and_come_back_as_cold(tiny_models, tmp_path, kind):
    """The disk tier writes a conversation that shares the system prompt with an entry it
    holds as a segment of that entry; after a restart each comes back from its chain of
    files with the cold answer. A segment whose base file is gone is rejected, never used."""
    path, directory = tiny_models[kind], tmp_path / "disk"
    streams = LAYOUTS["streams"]  # two slots: RAM chains join cells that two sequences wrote
    engine = disk_engine(path, directory, **streams)
    try:
        for prompt in CONVERSATIONS:
            generate(engine, prompt, max_tokens=4)
    finally:
        engine.stop()  # the slots' conversations and the RAM entries are written, the newest first
    from warmslot.cache.disk import format as fmt
    headers = {f.name: fmt.read_header(str(f)) for f in entry_files(directory)}
    assert len(headers) == len(CONVERSATIONS)
    (root,) = [name for name, h in headers.items() if h.base is None]
    segs = [h for h in headers.values() if h.base is not None]
    assert all(h.base.name == root and h.base.n_tokens == len(SHARED) for h in segs)
    # a segment holds its own ~54 tokens' cells of ~254 (and, on a hybrid, its recurrent state)
    for h in segs:
        if kind == "hybrid":
            assert headers[root].state_bytes - h.state_bytes >= 0.6 * len(SHARED) / len(h.tokens) * headers[root].state_bytes
        else:
            assert h.state_bytes < 0.4 * headers[root].state_bytes
    prompts = [c + random_tokens(120 + i, 10) for i, c in enumerate(CONVERSATIONS)]
    engine = disk_engine(path, directory, **streams)
    try:
        warm = []
        for prompt, conversation in zip(prompts[:2], CONVERSATIONS):
            warm.append(generate(engine, prompt, return_prompt_logits=True, boundaries=(len(conversation),)))
            assert (warm[-1].reuse.source, warm[-1].usage.cached_tokens) == ("disk", len(conversation))
        view = engine.disk_view
        assert view.stats.hits == 2 and view.stats.rejected["base"] == 0
    finally:
        engine.stop()
    chained = next(i for i, c in enumerate(CONVERSATIONS) if any(h.tokens[:len(c)] == tuple(c) for h in segs))
    (directory / root).unlink()  # the segments' base is gone
    engine = disk_engine(path, directory, **streams)
    try:
        assert engine.disk_view.stats.rejected["base"] >= 1
        lost = generate(engine, prompts[chained], return_prompt_logits=True, boundaries=(len(CONVERSATIONS[chained]),))
        assert lost.reuse.source != "disk"
        engine.disk.disk.sanity_check()
    finally:
        engine.stop()
    for prompt, conversation, r in zip(prompts, CONVERSATIONS, warm):
        assert_same_answer(r, cold_run(path, prompt, boundaries=(len(conversation),)))
    assert_same_answer(lost, cold_run(path, prompts[chained], boundaries=(len(CONVERSATIONS[chained]),)))


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_disk_segments_leave_with_their_base_and_the_disk_budget_holds(tiny_models, tmp_path, kind, monkeypatch):
    """Ten conversations on one system prompt through one slot, RAM for about one of them and
    disk for about four: every switch spills, the disk tier writes segments, evicts the
    least recently used and never a base before what continues it, stays within its budget,
    and a conversation comes back from its chain as cold."""
    monkeypatch.setattr(DiskTier, "cost_tokens", lambda self, entry, need: 0.0)  # reads are free (see test_disk_tier)
    path, directory = tiny_models[kind], tmp_path / "disk"
    conversations = [SHARED + random_tokens(130 + i, 40) for i in range(10)]
    _, whole = slot_state(path, conversations[0])
    # one whole entry and a few segments (a hybrid's carry their recurrent state and checkpoints)
    budget = int((1.7 if kind == "attention" else 3.0) * whole)
    engine = disk_engine(path, directory, cache_ram=int(1.5 * whole), cache_disk_size=budget)
    try:
        for prompt in conversations:
            generate(engine, prompt, max_tokens=4)
            assert sum(engine.disk.disk.disk_usage().values()) <= budget and engine.disk_view.bytes <= budget
        store = engine.disk.disk
        store.flush()
        store.sanity_check()  # a segment's base is held and used no less recently than it
        stats = engine.disk_view.stats
        assert stats.chained >= 2 and stats.chain_bytes_spared > 0 and stats.evictions >= 1
        kept = {e.tokens[:len(SHARED) + 40]: e for e in store.entries()}
        back = next(c for c in reversed(conversations[:-2]) if tuple(c) in kept and kept[tuple(c)].base is not None)
        prompt = back + random_tokens(140, 10)
        warm = generate(engine, prompt, return_prompt_logits=True, boundaries=(len(back),))
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("disk", len(back))
        store.flush()
        store.sanity_check()
        # a base damaged on disk after it was indexed: the chained read rejects it, and the
        # base goes with every segment continuing it
        kept = {e.tokens[:len(SHARED) + 40]: e for e in store.entries()}
        other = next(kept[tuple(c)] for c in conversations if c is not back and tuple(c) in kept and kept[tuple(c)].base is not None)
        base = other.base
        with open(directory / base.name, "r+b") as f:
            f.seek(base.header.head_bytes + 100)  # inside its state
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        damaged_prompt = list(other.tokens[:len(SHARED) + 40]) + random_tokens(141, 10)
        damaged = generate(engine, damaged_prompt, return_prompt_logits=True)
        assert damaged.reuse.source != "disk" and engine.disk_view.stats.rejected["checksum"] == 1
        assert not base.alive and not other.alive
        store.flush()
        store.sanity_check()
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, prompt, boundaries=(len(back),)))
    assert_same_answer(damaged, cold_run(path, damaged_prompt))
