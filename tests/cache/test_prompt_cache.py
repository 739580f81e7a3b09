"""The RAM prompt cache on its own: budget, LRU order, non-consuming lookups, redundancy."""

import numpy as np

from warmslot.cache.checkpoints import Checkpoint, CheckpointList
from warmslot.cache.prompt_cache import PromptCache


def state(n_bytes: int) -> np.ndarray:
    return np.zeros(n_bytes, dtype=np.uint8)


def checkpoints(*positions, nbytes=10):
    lst = CheckpointList(8, 1 << 30)
    for p in positions:
        lst.add(Checkpoint(p, state(nbytes)))
    return lst


def usable_truncatable(entry, matched):
    return matched


class Demand:
    """What an engine would tell its cache of demand (warmslot.cache.demand.Demand): the
    prompts waiting (tenant, tokens), the sessions at work, what the device holds; the lists
    are read as they are at each question. `later(fn)` is recorded, not run."""

    def __init__(self, upcoming=None, sessions=None, on_device=None, told=None, name=""):
        self.prompts = upcoming if upcoming is not None else []
        self.running = sessions if sessions is not None else []
        self.device = on_device if on_device is not None else []
        self.told = told if told is not None else []
        self.name = name

    def waiting(self):
        return []

    def upcoming(self):
        return iter(self.prompts)

    def sessions(self):
        return iter(self.running)

    def waiting_sessions(self):
        return iter(())

    def on_device(self):
        return iter(self.device)

    def later(self, fn):
        self.told.append(self.name)


def test_budget_holds_under_many_inserts_and_eviction_is_exactly_lru():
    cache = PromptCache(budget=10_000, fingerprint="m", truncatable=True)
    inserted = []
    for i in range(200):
        tokens = [i, i + 1, i + 2]
        entry = cache.insert(tokens, state(300 + (i % 7) * 100), CheckpointList(4, 1 << 20), tenant="")
        inserted.append(entry)
        if i % 5 == 0 and i > 10:
            cache.touch(inserted[i - 10])  # an old entry used again moves to the back
        cache.sanity_check()
        assert cache.nbytes <= 10_000
    # evictions happened, and the survivors are exactly the most recently used
    assert cache.stats.evictions > 0
    order = sorted(inserted, key=lambda e: e.last_used)
    survivors = list(cache.entries())
    assert survivors == order[len(order) - len(survivors):]


def test_lookup_and_load_do_not_consume_the_entry():
    cache = PromptCache(budget=1 << 20, fingerprint="m", truncatable=True)
    cache.insert([1, 2, 3, 4, 5], state(1000), CheckpointList(4, 1 << 20), tenant="")
    before = (cache.n_entries, cache.nbytes)
    for _ in range(3):
        cand = cache.lookup([1, 2, 3, 9], "", usable_truncatable).best
        assert cand is not None and cand.matched == 3 and cand.usable == 3
        cache.touch(cand.entry)
    assert (cache.n_entries, cache.nbytes) == before


def test_tenants_never_see_each_others_entries():
    cache = PromptCache(budget=1 << 20, fingerprint="m", truncatable=True)
    cache.insert([1, 2, 3], state(10), CheckpointList(4, 1 << 20), tenant="alice")
    assert cache.lookup([1, 2, 3, 4], "bob", usable_truncatable).best is None
    assert cache.lookup([1, 2, 3, 4], "", usable_truncatable).best is None
    assert cache.lookup([1, 2, 3, 4], "alice", usable_truncatable).best.matched == 3


def test_a_strict_prefix_of_a_newer_entry_is_dropped_when_covered():
    cache = PromptCache(budget=1 << 20, fingerprint="m", truncatable=True)
    cache.insert([1, 2, 3], state(10), CheckpointList(4, 1 << 20), tenant="")
    cache.insert([1, 2, 3, 4, 5], state(10), CheckpointList(4, 1 << 20), tenant="")
    assert cache.n_entries == 1
    assert cache.stats.dropped_redundant == 1
    cache.sanity_check()


def test_on_recurrent_memory_a_prefix_entry_stays_unless_a_checkpoint_covers_it():
    cache = PromptCache(budget=1 << 20, fingerprint="m", truncatable=False)
    cache.insert([1, 2, 3], state(10), checkpoints(), tenant="")
    cache.insert([1, 2, 3, 4, 5], state(10), checkpoints(2), tenant="")
    assert cache.n_entries == 2  # the longer entry cannot go back to 3 tokens
    cache.insert([1, 2, 3, 4, 5, 6], state(10), checkpoints(3, 5), tenant="")
    # the newest entry has checkpoints at 3 and 5: both older entries are covered
    assert cache.n_entries == 1
    cache.sanity_check()


def test_entries_of_another_model_are_ignored():
    cache = PromptCache(budget=1 << 20, fingerprint="m1", truncatable=True)
    cache.insert([1, 2, 3], state(10), CheckpointList(4, 1 << 20), tenant="")
    cache.fingerprint = "m2"
    assert cache.lookup([1, 2, 3, 4], "", usable_truncatable).best is None


def test_an_entry_larger_than_the_budget_is_not_stored():
    cache = PromptCache(budget=100, fingerprint="m", truncatable=True)
    assert cache.insert([1], state(1000), CheckpointList(4, 1 << 20), tenant="") is None
    assert cache.n_entries == 0 and cache.nbytes == 0


def test_the_previous_turn_of_a_conversation_is_dropped_when_the_next_one_is_saved():
    cache = PromptCache(budget=1 << 20, fingerprint="m", truncatable=True)
    # turn 1: prompt [1, 2, 3, 4] and a generated reply [7, 8]
    cache.insert([1, 2, 3, 4, 7, 8], state(10), CheckpointList(4, 1 << 20), tenant="", prompt_end=4)
    # turn 2 re-rendered the reply ([7, 9]) and added a message: it covers turn 1's prompt
    cache.insert([1, 2, 3, 4, 7, 9, 5, 6], state(10), CheckpointList(4, 1 << 20), tenant="", prompt_end=8)
    assert cache.n_entries == 1 and cache.stats.dropped_redundant == 1
    # another conversation that shares less than the old prompt is kept
    cache.insert([1, 2, 9], state(10), CheckpointList(4, 1 << 20), tenant="", prompt_end=3)
    assert cache.n_entries == 2
    cache.sanity_check()


# -- what the waiting queue needs stays (cache/lookahead.py) ---------------------------------

SYSTEM = list(range(1000, 1100))  # a system prompt every conversation shares


def turn(conv: int, n: int) -> list[int]:
    """A conversation's prompt after n turns: the shared system prompt, then its own tokens."""
    return SYSTEM + [conv * 10_000 + i for i in range(100 * n)]


def test_the_entry_a_waiting_request_continues_stays_and_lru_would_have_evicted_it():
    waiting: list[tuple[str, list[int]]] = []
    cache = PromptCache(budget=2 * 1000, fingerprint="m", truncatable=True, demand=Demand(upcoming=waiting))
    a = cache.insert(turn(1, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    b = cache.insert(turn(2, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    waiting[:] = [("", turn(1, 2))]  # a's next turn waits: b goes, though a is the older
    c = cache.insert(turn(3, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    assert c is not None and {e.id for e in cache.entries()} == {a.id, c.id}
    cache.sanity_check()
    # the same inserts with no queue: least recently used first
    lru = PromptCache(budget=2 * 1000, fingerprint="m", truncatable=True)
    for conv in (1, 2, 3):
        lru.insert(turn(conv, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    assert [e.tokens[-1] for e in lru.entries()] == [turn(2, 1)[-1], turn(3, 1)[-1]]


def test_an_entry_whose_tokens_a_device_sequence_holds_is_given_up_first_on_attention_memory_only():
    for truncatable in (True, False):
        device: list[tuple[str, list[int]]] = []
        cache = PromptCache(budget=3 * 1000, fingerprint="m", truncatable=truncatable, demand=Demand(on_device=device))
        a = cache.insert(turn(1, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
        b = cache.insert(turn(2, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
        c = cache.insert(turn(3, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
        # conversation 3 went on to its next turn in a device sequence; another tenant's
        # sequence with the same tokens is not a copy of this tenant's
        device[:] = [("", turn(3, 2)), ("other", turn(2, 1))]
        d = cache.insert(turn(4, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
        kept = {e.id for e in cache.entries()}
        cache.sanity_check()
        if truncatable:  # c goes though a is the least recently used
            assert kept == {a.id, b.id, d.id}
        else:  # the device's copy cannot be cut back to c's tokens: least recently used first
            assert kept == {b.id, c.id, d.id}


def test_an_entry_of_a_session_with_a_request_running_stays_and_lru_would_have_evicted_it():
    # s1's sub-agent runs: its main agent comes back after
    cache = PromptCache(budget=2 * 1000, fingerprint="m", truncatable=True, demand=Demand(sessions=[("", "s1")]))
    a = cache.insert(turn(1, 1), state(1000), CheckpointList(4, 1 << 20), tenant="", session="s1")
    b = cache.insert(turn(2, 1), state(1000), CheckpointList(4, 1 << 20), tenant="", session="s2")
    c = cache.insert(turn(3, 1), state(1000), CheckpointList(4, 1 << 20), tenant="", session="s3")
    assert c is not None and {e.id for e in cache.entries()} == {a.id, c.id}
    cache.sanity_check()


def test_an_entry_needed_after_everything_the_cache_holds_is_not_stored():
    waiting: list[tuple[str, list[int]]] = []
    cache = PromptCache(budget=2 * 1000, fingerprint="m", truncatable=True, demand=Demand(upcoming=waiting))
    cache.insert(turn(1, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    cache.insert(turn(2, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    waiting[:] = [("", turn(1, 2)), ("", turn(2, 2)), ("", turn(3, 2))]
    probe = turn(3, 1)
    assert not cache.admits(probe, CheckpointList(4, 1 << 20), "", None, 1000)
    assert cache.insert(probe, state(1000), CheckpointList(4, 1 << 20), tenant="") is None
    assert cache.stats.refused == 2 and cache.stats.evictions == 0 and cache.n_entries == 2  # admits, insert
    # a request for another tenant, or one that only shares the system prompt, protects nothing
    waiting[:] = [("bob", turn(1, 2)), ("", SYSTEM + [7] * 300), ("", turn(3, 2))]
    assert cache.admits(probe, CheckpointList(4, 1 << 20), "", None, 1000)
    assert cache.insert(probe, state(1000), CheckpointList(4, 1 << 20), tenant="") is not None
    assert cache.stats.evictions == 1
    cache.sanity_check()


def test_a_refused_entry_still_reaches_the_disk_tier_and_the_entry_being_loaded_is_never_evicted():
    written = []
    cache = PromptCache(budget=2 * 1000, fingerprint="m", truncatable=True, demand=Demand(upcoming=[("", turn(2, 2)), ("", turn(3, 2))]),
                        on_evict=written.append)
    a = cache.insert(turn(1, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    cache.insert(turn(2, 1), state(1000), CheckpointList(4, 1 << 20), tenant="")
    with cache.pinned(a):  # a is no waiting request's, but a slot is loading it
        assert cache.insert(turn(3, 1), state(1000), CheckpointList(4, 1 << 20), tenant="") is None
    assert a in cache.entries() and [e.tokens for e in written] == [tuple(turn(3, 1))]
    assert cache.insert(turn(3, 1), state(1000), CheckpointList(4, 1 << 20), tenant="") is not None
    assert a not in cache.entries() and written[-1] is a  # not pinned now: no request needs it


def test_a_shared_budget_lends_what_the_other_caches_leave_and_gives_each_its_share_back():
    from warmslot.cache.shared_budget import SharedBudget

    pool = SharedBudget(1000)
    told: list[str] = []
    a = PromptCache(1000, "a", True, shared=pool, demand=Demand(told=told, name="a"))
    b = PromptCache(1000, "b", True, shared=pool, demand=Demand(told=told, name="b"))
    empty = CheckpointList(4, 1 << 20)
    # a busy model fills the whole budget while the other holds nothing
    kept = [a.insert([i, i, i], state(100), empty, "") for i in range(9)]
    assert a.nbytes == 900 and a.budget == 1000 and b.budget == 500  # b still has its share
    assert a.insert([50], state(200), empty, "") is not None and a.nbytes == 1000  # one evicted for it
    assert a.stats.evictions == 1 and kept[0] not in list(a.entries())
    # the other model comes back: it grows into its share, and the first is told to give back
    assert b.insert([7], state(300), empty, "") is not None
    assert told == ["a"] and a.nbytes > a.budget == 700
    a.trim()  # on its own engine thread: least recently used first
    assert a.nbytes <= a.budget and pool.nbytes <= 1000
    assert kept[1] not in list(a.entries()) and kept[8] in list(a.entries())
    # what a model holds beside its cache (spare streams in RAM) counts against the budget
    b.reserved = 200
    assert b.budget == max(500, 1000 - a.nbytes) - 200
    a.sanity_check()
    b.sanity_check()


# -- segments (cache/segments.py): entries that share a prefix store it once -------------

ROW = 16  # bytes of a K row and of a V row per cell, one layer


def attention_state(n: int, seed: int = 0) -> np.ndarray:
    """A sequence state in llama.cpp's format for attention memory: n cells at positions
    0..n-1 of sequence 0, one layer, K and V rows whose bytes name their position."""
    import struct
    from warmslot.cache import segments
    cells = np.zeros((n, 3), "<i4")
    cells[:, 0], cells[:, 1] = np.arange(n), 1
    rows = (np.arange(n, dtype=np.uint32)[:, None] * 7 + seed).astype(np.uint8).repeat(ROW, 1)
    raw = (struct.pack("<IiII", segments.SEQ_MAGIC, 0, 1, n) + cells.tobytes() + struct.pack("<II", 0, 1)
           + struct.pack("<iQ", 1, ROW) + rows.tobytes() + struct.pack("<iQ", 1, ROW) + rows.tobytes())
    return np.frombuffer(raw, np.uint8).copy()


def segment_cache(budget: int) -> PromptCache:
    cache = PromptCache(budget=budget, fingerprint="m", truncatable=True)
    cache.segment_buffer = lambda n: np.empty(n, np.uint8)
    return cache


def test_an_entry_sharing_a_prefix_stores_its_own_cells_and_joins_back_whole():
    cache = segment_cache(1 << 20)
    shared = list(range(1000, 1100))
    a = cache.insert(shared + [1] * 20, attention_state(120), CheckpointList(4, 1 << 20), tenant="")
    b = cache.insert(shared + [2] * 30, attention_state(130, seed=1), CheckpointList(4, 1 << 20), tenant="")
    assert not a.chained and b.chained and (b.base, b.base_len) == (a, 100)
    whole_b = attention_state(130, seed=1)
    assert b.nbytes < whole_b.nbytes * 0.3  # 30 of 130 cells
    joined = cache.whole_state(b)
    # the shared cells come from a, the rest from b: the rows name their position and seed
    from warmslot.cache import segments
    layout = segments.parse(joined)
    assert layout is not None and layout.linear(130)
    assert all(int(layout.k[0][1][p, 0]) == (p * 7) % 256 for p in range(100))
    assert all(int(layout.k[0][1][p, 0]) == (p * 7 + 1) % 256 for p in range(100, 130))
    assert cache.stats.chained == 1
    cache.sanity_check()


def test_a_base_is_evicted_right_after_the_entries_chained_to_it_and_never_dropped_as_redundant():
    whole = attention_state(120).nbytes
    cache = segment_cache(3 * whole)
    shared = list(range(1000, 1100))
    base = cache.insert(shared + [1] * 20, attention_state(120), CheckpointList(4, 1 << 20), tenant="")
    # the next turn of the base's conversation: the base is a strict prefix, yet it stays
    turn = cache.insert(shared + [1] * 20 + [5] * 10, attention_state(130), CheckpointList(4, 1 << 20), tenant="")
    assert turn.base is base and base in list(cache.entries())
    others = [cache.insert(shared + [10 + i] * 20, attention_state(120), CheckpointList(4, 1 << 20), tenant="")
              for i in range(30)]
    cache.sanity_check()
    assert cache.stats.evictions > 0 and cache.nbytes <= 3 * whole
    held = list(cache.entries())
    # many more entries than three whole states fit, each chained to the base
    assert len(held) > 6 and all(e.base is base for e in held if e is not base)
    assert others[-1] in held
    # the base went last: every entry evicted before it, none after
    cache.touch(held[-1])
    for i in range(3):
        cache.insert(list(range(5000 + i * 200, 5000 + i * 200 + 120)), attention_state(120), CheckpointList(4, 1 << 20), tenant="")
        cache.sanity_check()
    assert base not in list(cache.entries()) and not any(e.base is base for e in cache.entries())
