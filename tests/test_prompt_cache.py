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
