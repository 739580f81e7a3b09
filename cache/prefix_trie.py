"""A token radix tree: which stored token sequences share the longest prefix with a query.

Keys are token sequences; each node holds the values whose key ends exactly there. Edges
are compressed (a node has one child per distinct next token), so a lookup walks at most
one node per divergence point and compares tokens edge by edge.

Cost: `match` is O(len(query)) token comparisons plus one dict lookup per node on the path;
`insert` and `remove` are O(len(key)). Listing the values below the match point is
O(values there). Nothing is ever a linear scan over all stored keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import itertools
from typing import Callable, Generic, Iterator, Sequence, TypeVar

V = TypeVar("V")


@dataclass(eq=False, slots=True)
class _Node(Generic[V]):
    edge: tuple[int, ...]  # tokens from the parent to this node
    parent: "_Node[V] | None"
    children: dict[int, "_Node[V]"] = field(default_factory=dict)
    values: list[V] = field(default_factory=list)

    def depth_below(self) -> Iterator["_Node[V]"]:
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


@dataclass(slots=True)
class Match(Generic[V]):
    """The result of a lookup: `depth` query tokens matched the tree."""

    depth: int
    prefixes: list[tuple[int, V]]  # (key length, value) for keys that are prefixes of the query
    below: list["_Node[V]"]  # subtrees whose keys all share exactly `depth` tokens with the query

    def extensions(self) -> Iterator[V]:
        """Values whose keys continue past the match point (they share `depth` tokens)."""
        for top in self.below:
            for node in top.depth_below():
                yield from node.values



@dataclass(frozen=True, slots=True)
class Candidate(Generic[V]):
    """A value found for a query: the tokens its key shares with the query, and how many of
    them a slot keeps after loading it."""

    entry: V
    matched: int
    usable: int


def rank(match: Match[V], usable: Callable[[V, int], int], skip: Callable[[V], bool] = lambda v: False) -> tuple[Candidate[V] | None, Candidate[V] | None]:
    """The candidate that lets a slot keep the most (ties: the most recently used; values have
    `last_used`), and the one sharing the most tokens with the query (for explanations),
    among the values on and below the match point that `skip` lets through."""
    best: Candidate[V] | None = None
    closest: Candidate[V] | None = None
    for matched, entry in itertools.chain(match.prefixes, ((match.depth, e) for e in match.extensions())):
        if matched == 0 or skip(entry):
            continue
        keep = usable(entry, matched)
        if keep > 0 and (best is None or (keep, entry.last_used) > (best.usable, best.entry.last_used)):
            best = Candidate(entry, matched, keep)
        if closest is None or (matched, entry.last_used) > (closest.matched, closest.entry.last_used):
            closest = Candidate(entry, matched, keep)
    return best, closest

class PrefixTrie(Generic[V]):
    def __init__(self) -> None:
        self._root: _Node[V] = _Node((), None)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def insert(self, key: Sequence[int], value: V) -> None:
        """Attach `value` at `key`. Mutates."""
        node = self._root
        i = 0
        key = tuple(key)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                leaf = _Node(key[i:], node)
                node.children[key[i]] = leaf
                node = leaf
                i = len(key)
                break
            n = _shared(child.edge, key, i)
            if n < len(child.edge):
                child = self._split(child, n)
            node = child
            i += n
        node.values.append(value)
        self._size += 1

    def remove(self, key: Sequence[int], value: V) -> bool:
        """Detach `value` from `key` (by identity); prune empty nodes. Mutates."""
        node = self._find(tuple(key))
        if node is None:
            return False
        for i, v in enumerate(node.values):
            if v is value:
                del node.values[i]
                self._size -= 1
                self._prune(node)
                return True
        return False

    def match(self, query: Sequence[int]) -> Match[V]:
        """The longest shared prefix of `query` with the stored keys. Read-only; `query` is
        any sequence of ints and is not copied whole."""
        node = self._root
        i = 0
        prefixes: list[tuple[int, V]] = [(0, v) for v in node.values]
        while i < len(query):
            child = node.children.get(query[i])
            if child is None:
                return Match(i, prefixes, list(node.children.values()))
            n = _shared(child.edge, query, i)
            i += n
            if n < len(child.edge):
                return Match(i, prefixes, [child])
            node = child
            prefixes.extend((i, v) for v in node.values)
        return Match(i, prefixes, list(node.children.values()))

    def values(self) -> Iterator[V]:
        for node in self._root.depth_below():
            yield from node.values

    def sanity_check(self) -> None:
        count = 0
        for node in self._root.depth_below():
            count += len(node.values)
            for token, child in node.children.items():
                assert child.parent is node and child.edge and child.edge[0] == token
            if node is not self._root:
                assert node.values or node.children, "empty nodes are pruned"
        assert count == self._size, (count, self._size)

    # -- internals ---------------------------------------------------------------------

    def _find(self, key: tuple[int, ...]) -> _Node[V] | None:
        node = self._root
        i = 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None or key[i : i + len(child.edge)] != child.edge:
                return None
            node = child
            i += len(child.edge)
        return node

    def _split(self, child: _Node[V], n: int) -> _Node[V]:
        """Split `child`'s edge after n tokens; returns the new middle node."""
        parent = child.parent
        middle = _Node(child.edge[:n], parent)
        parent.children[child.edge[0]] = middle
        child.edge = child.edge[n:]
        child.parent = middle
        middle.children[child.edge[0]] = child
        return middle

    def _prune(self, node: _Node[V]) -> None:
        while node is not self._root and not node.values and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        # merge a valueless node with its only child to keep edges compressed
        if node is not self._root and not node.values and len(node.children) == 1:
            (child,) = node.children.values()
            child.edge = node.edge + child.edge
            child.parent = node.parent
            node.parent.children[child.edge[0]] = child


def common_prefix(a: Sequence[int], b: Sequence[int], step: int = 512) -> int:
    """Length of the longest common prefix of two token sequences.

    Compares slices of `step` tokens in C and scans only the first unequal slice, which is
    several times faster than converting long lists to arrays."""
    if type(a) is not type(b):
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(n, i + step)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def _shared(edge: tuple[int, ...], key: Sequence[int], start: int) -> int:
    """How many tokens of `edge` match key[start:]."""
    segment = key[start : start + len(edge)]
    return common_prefix(edge, segment if type(segment) is tuple else tuple(segment))


def distinct_tokens(held: Sequence[Sequence[int]]) -> int:
    """The tokens of the sequences in `held` with each prefix they share counted once: the
    nodes of their prefix tree, which is the cells they take in one pool of KV cells where
    sequences that share a prefix share its cells."""
    ordered = sorted(list(h) for h in held)
    return sum(map(len, ordered)) - sum(common_prefix(a, b) for a, b in zip(ordered, ordered[1:]))
