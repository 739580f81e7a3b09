"""The token radix tree agrees with a brute-force search."""

import random

from warmslot.cache.prefix_trie import PrefixTrie


def common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def brute(keys, query):
    depth = max((common(k, query) for k in keys), default=0)
    prefixes = sorted((len(k), i) for i, k in enumerate(keys) if common(k, query) == len(k))
    extensions = sorted(i for i, k in enumerate(keys) if common(k, query) == depth and len(k) > depth)
    return depth, prefixes, extensions


def check(trie, keys, query):
    depth, prefixes, extensions = brute(keys, query)
    m = trie.match(query)
    assert m.depth == depth
    assert sorted(m.prefixes) == prefixes
    assert sorted(m.extensions()) == extensions


def test_match_agrees_with_brute_force_on_random_keys():
    rng = random.Random(7)
    trie: PrefixTrie[int] = PrefixTrie()
    keys = []
    base = [rng.randrange(5) for _ in range(40)]
    for i in range(200):
        cut = rng.randrange(len(base))
        key = base[:cut] + [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
        keys.append(key)
        trie.insert(key, i)
    trie.sanity_check()
    for _ in range(300):
        cut = rng.randrange(len(base))
        query = base[:cut] + [rng.randrange(5) for _ in range(rng.randrange(0, 30))]
        check(trie, keys, query)


def test_remove_prunes_and_keeps_answers_right():
    rng = random.Random(3)
    trie: PrefixTrie[int] = PrefixTrie()
    keys = {}
    for i in range(100):
        key = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
        keys[i] = key
        trie.insert(key, i)
    for i in list(keys)[::2]:
        assert trie.remove(keys[i], i)
        del keys[i]
        trie.sanity_check()
    assert len(trie) == len(keys)
    order = list(keys)
    for _ in range(200):
        query = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        depth, prefixes, extensions = brute([keys[i] for i in order], query)
        m = trie.match(query)
        assert m.depth == depth
        assert sorted((n, order.index(v)) for n, v in m.prefixes) == prefixes
        assert sorted(order.index(v) for v in m.extensions()) == extensions


def test_identical_keys_hold_several_values():
    trie: PrefixTrie[str] = PrefixTrie()
    trie.insert([1, 2, 3], "a")
    trie.insert([1, 2, 3], "b")
    m = trie.match([1, 2, 3, 4])
    assert sorted(v for _, v in m.prefixes) == ["a", "b"]
    assert trie.remove([1, 2, 3], "a")
    assert [v for _, v in trie.match([1, 2, 3]).prefixes] == ["b"]
    assert not trie.remove([1, 2], "b")
