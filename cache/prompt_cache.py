"""The RAM prompt cache: sequence states of conversations that no slot holds any more.

An entry is (tokens, full sequence state, checkpoints, tenant, model fingerprint), and the
drafter's memory of the same conversation where speculative decoding has one (a draft model's
KV, the MTP block's; `DraftState`). Loading an entry into a slot copies it and leaves it in
place: the cache is never consumed, so conversations that alternate on one slot, or share a
long system prompt, all come back warm.

- Budget: `budget` bytes (--cache-ram; 0 disables the cache). An entry's size is its state
  plus its checkpoints and its drafter state; a checkpoint shared by two entries counts in
  both, so the total is an upper bound of the RAM really used. The total never exceeds the
  budget. Several models' caches may share one budget (`shared_budget.py`): a cache's
  budget is then what the others leave, at least its share, and a cache over it after
  another grew gives entries back at its owner's next call of `trim`.
- Eviction: what no waiting request continues, least recently used first (use = insert or
  load); then what the latest waiting request continues (`lookahead.py`: the engine's queue
  is the horizon). An entry that would itself be the first to go is not stored (`refused`).
- Lookup: a token radix tree per tenant (`PrefixTrie`), never a scan of all entries.
- Redundancy: an older entry of the same tenant is dropped when a newer one shares its
  tokens up to the end of its last prompt and can serve that prefix (see `covers`): a strict
  prefix of the newer entry, or the previous turn of the same conversation (whose generated
  reply the next turn re-rendered).
- Segments (attention, sliding-window and hybrid memory, `segment_buffer` set): an entry that shares a prefix of at
  least `chains.SEGMENT_MIN_TOKENS` with one the cache holds stores only the state of its own
  tokens, chained to that entry (`base`, `base_len`; segments.py). So a system prompt and
  tools that many conversations share, and the turns of one conversation, are held once.
  A base is not dropped or evicted while an entry chains to it: it goes right after the
  last entry that needs it. Loading a chained entry joins the chain (`whole_state`).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Container, Iterable, Iterator, Sequence

import numpy as np

from . import chains, segments
from .checkpoints import CheckpointList
from .demand import Demand
from .entries import CacheEntry, CacheStats, DraftState, EntryMatch, Lookup
from .evicted import EvictedKeys
from .lookahead import next_uses, session_uses, victim_order
from .prefix_trie import PrefixTrie, common_prefix, rank
from .shared_budget import SharedBudget


class PromptCache:
    def __init__(
        self, budget: int, fingerprint: str, truncatable: bool, shared: SharedBudget | None = None,
        demand: Demand | None = None, parse: Callable[[np.ndarray], segments.Layout | None] = segments.parse,
        on_evict: Callable[[CacheEntry], None] | None = None,
    ) -> None:
        assert budget > 0
        self._budget = budget
        self.shared = shared  # one budget with other models' caches (see shared_budget.py)
        self.fingerprint = fingerprint
        self.truncatable = truncatable
        self.stats = CacheStats()
        self.nbytes = 0
        self._tries: dict[str, PrefixTrie[CacheEntry]] = {}
        self._lru: OrderedDict[int, CacheEntry] = OrderedDict()  # least recently used first
        self._ids = itertools.count(1)
        # keys of recently evicted entries, so a miss can be explained ("evicted")
        self._evicted = EvictedKeys()
        # called with every entry evicted for room (the disk tier writes it); not for entries
        # dropped as redundant, whose tokens a newer entry serves
        self.on_evict = on_evict
        # the engine's queue, its sessions at work and what its device holds: what eviction
        # keeps (see lookahead.py, held_on_device); None: least recently used first
        self.demand = demand
        self._pinned: CacheEntry | None = None  # an entry being loaded: not evicted meanwhile
        # with a shared budget: when the budget shrinks below what this cache holds (another
        # model's cache grew into its share), `demand.later` has trim() run on the owner's thread
        self.reserved = 0  # RAM the model holds beside the cache out of a shared budget (CPU spare streams)
        # segments (see the module): where chained states are written (the engine's pinned host
        # memory; None: every entry holds its whole state), and how a state parses (a hybrid's)
        self.segment_buffer: Callable[[int], np.ndarray] | None = None
        self.parse = parse
        self._children: dict[int, int] = {}  # entry id -> entries chained to it
        if shared is not None:
            shared.join(self)

    @property
    def budget(self) -> int:
        """The bytes this cache may hold now: its own budget, or what a shared one leaves it."""
        return self.shared.budget_of(self) if self.shared is not None else self._budget

    def budget_changed(self) -> None:
        if self.demand is not None:
            self.demand.later(self.trim)

    def place_segments(self, segment_buffer: Callable[[int], np.ndarray] | None) -> None:
        """Where chained states are written from now on (a loaded context's pinned host
        memory; None: every entry holds its whole state). The cache outlives the contexts
        (sleep): each load names its own."""
        self.segment_buffer = segment_buffer

    def trim(self) -> None:
        """Give back entries until the cache fits its budget again (a shared budget shrank):
        first what no waiting request continues, least recently used first. Mutates."""
        if self.nbytes <= self.budget:
            return
        for key in self._give_up_order():
            if self.nbytes <= self.budget:
                break
            self._evict(self._lru[key])

    @property
    def n_entries(self) -> int:
        return len(self._lru)

    @property
    def n_tokens(self) -> int:
        """Tokens whose state the cache stores: a segment's own, after the prefix its base
        holds, so a shared prefix counts once. Read-only."""
        return sum(len(e) - e.base_len for e in self._lru.values())

    def entries(self) -> Iterator[CacheEntry]:
        """All entries, least recently used first."""
        return iter(list(self._lru.values()))

    # -- lookup (read-only) --------------------------------------------------------------

    def lookup(self, query: Sequence[int], tenant: str, usable: Callable[[CacheEntry, int], int]) -> Lookup:
        """The entry of `tenant` that lets a slot keep the most of `query`, and why it missed.

        `usable(entry, matched)` says how many tokens a slot would keep after loading the
        entry, given `matched` shared tokens (checkpoints decide this on non-truncatable
        memory). Ties go to the most recently used entry. O(len(query)) plus the entries on
        and below the match point. Does not mutate the cache."""
        best: EntryMatch | None = None
        closest: EntryMatch | None = None
        trie = self._tries.get(tenant)
        if trie is not None:
            best, closest = rank(trie.match(query), usable, skip=lambda e: e.fingerprint != self.fingerprint)
        return Lookup(best, None if best is not None else closest, self._evicted.match(query, tenant))

    def covers(self, longer: CacheEntry | tuple, shorter_len: int) -> bool:
        """Whether an entry (or a (tokens, checkpoints) pair) can serve every prompt that an
        entry of its first `shorter_len` tokens could."""
        checkpoints = longer.checkpoints if isinstance(longer, CacheEntry) else longer[1]
        if self.truncatable:
            return True
        ck = checkpoints.at(shorter_len)
        return ck is not None and ck.data is not None

    def find_covering(self, tokens: list[int], tenant: str) -> CacheEntry | None:
        """An existing entry that already serves everything `tokens` could. Read-only."""
        trie = self._tries.get(tenant)
        if trie is None:
            return None
        match = trie.match(tokens)
        if match.depth < len(tokens):
            return None
        for n, entry in match.prefixes:
            if n == len(tokens):
                return entry
        for entry in match.extensions():
            if self.covers(entry, len(tokens)):
                return entry
        return None

    # -- mutation ----------------------------------------------------------------------

    def insert(
        self, tokens: list[int], state: np.ndarray, checkpoints: CheckpointList, tenant: str,
        prompt_end: int | None = None, keep_s: float | None = None, draft: DraftState | None = None,
        transient: bool = False, start: int = 0, session: str = "",
    ) -> CacheEntry | None:
        """Store a copy of a slot's contents (state and checkpoints are shared, read-only
        buffers; a `transient` state is a scratch buffer that the caller reuses: what is kept
        of it is copied). Evicts entries to fit (see the module); drops entries this one
        makes redundant. Returns None when the entry alone exceeds the budget, or when it
        would be the first to go. A `start` above 0 says that the state holds the cells from
        that position on and not all before it (read without what a base holds): it is
        stored only as a segment of a base holding at least `start` of its tokens (and a
        refused one reaches the disk tier as such a segment, for it to join). Mutates."""
        state.flags.writeable = False
        for array in draft.arrays if draft is not None else ():
            array.flags.writeable = False
        entry = CacheEntry(
            tuple(tokens), state, checkpoints.copy(), tenant, self.fingerprint, time.monotonic(), next(self._ids),
            prompt_end=len(tokens) if prompt_end is None else min(prompt_end, len(tokens)), keep_s=keep_s, draft=draft,
            session=session,
        )
        base, shared, cells = None, 0, None
        size = entry.nbytes
        if self.segment_buffer is not None:
            entry.layout = self.parse(state)
            entry.linear = entry.layout is not None and entry.layout.linear(len(tokens), start)
            if entry.linear:
                base, shared = self._base_for(entry.tokens, tenant)
            if base is not None and not chains.cuttable(entry.layout, shared):
                base, shared = None, 0  # a sliding window reaching back before its own tokens: whole
            if base is not None:
                cells = segments.from_(entry.layout, shared)
                size += segments.size([(entry.layout, cells)]) - int(state.nbytes)
        if start and (base is None or shared < start):  # cells it lacks are not held either
            self.stats.refused += 1
            return None
        plan = self._make_room(entry, size, base)
        if plan is None:
            if entry.nbytes <= self.budget and self.on_evict is not None:
                if start:  # a tail read: it goes as a segment of its base, which the disk tier joins
                    self._cut(entry, cells, base, shared, segments.ordinary)
                elif transient:
                    entry.state = self._keep(state, None, segments.ordinary)
                self.on_evict(entry)  # refused: the disk tier still keeps it
            return None
        redundant, victims = plan
        for old in redundant:
            self.remove(old)
            self.stats.dropped_redundant += 1
        for victim in victims:
            self._evict(victim)
        if base is not None:
            self._cut(entry, cells, base, shared, self.segment_buffer)
            self.stats.chained += 1
            # the cells below `shared` that a whole state holds (a state read from `start`
            # on never held them)
            self.stats.chain_bytes_spared += shared * segments.cell_bytes(entry.layout)
            self._children[base.id] = self._children.get(base.id, 0) + 1
        elif transient:
            entry.state = self._keep(state, entry.layout, self.segment_buffer or segments.ordinary)
            entry.layout = self.parse(entry.state) if entry.layout is not None else None
        assert entry.nbytes == size
        self._tries.setdefault(tenant, PrefixTrie()).insert(entry.tokens, entry)
        self._lru[entry.id] = entry
        self.nbytes += entry.nbytes
        self.stats.saved_bytes += entry.nbytes
        assert self.nbytes <= self.budget
        if self.shared is not None:
            self.shared.grew(self)
        return entry

    def _cut(self, entry: CacheEntry, cells: np.ndarray, base: CacheEntry, shared: int, empty: Callable[[int], np.ndarray]) -> None:
        """Make `entry` a segment of `base`: its state becomes its `cells` (those from
        position `shared` on), joined into `empty(n)`."""
        t0 = time.monotonic()
        tail = segments.join([(entry.layout, cells)], empty)
        tail.flags.writeable = False
        self.stats.join_seconds += time.monotonic() - t0
        entry.state, entry.layout, entry.base, entry.base_len = tail, self.parse(tail), base, shared

    def admits(self, tokens: Sequence[int], checkpoints: CheckpointList, tenant: str, prompt_end: int | None,
               nbytes: int, state_bytes: int = 0, session: str = "") -> bool:
        """Whether an entry of `nbytes` would be stored now (insert would not refuse it), so
        that a slot's state is not copied for nothing. With segments, the `state_bytes` of
        it are counted for the tokens that no base holds. Counts a refusal; else read-only."""
        probe = CacheEntry(tuple(tokens), np.empty(0, np.uint8), checkpoints, tenant, self.fingerprint,
                           prompt_end=len(tokens) if prompt_end is None else min(prompt_end, len(tokens)), session=session)
        base, shared = self._base_for(probe.tokens, tenant) if self.segment_buffer is not None else (None, 0)
        if base is not None and tokens:
            nbytes -= state_bytes * shared // len(tokens)
        return self._make_room(probe, nbytes, base) is not None

    def whole_state(self, entry: CacheEntry, empty: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
        """The entry's whole sequence state: its own, or its chain joined into `empty(n)`
        (default: the segment buffer). Read-only but for the join's statistics."""
        if entry.base is None:
            return entry.state
        t0 = time.monotonic()
        whole = chains.join(entry, empty or self.segment_buffer or segments.ordinary)
        self.stats.join_seconds += time.monotonic() - t0
        return whole

    def tail_state(self, entry: CacheEntry, start: int, empty: Callable[[int], np.ndarray]) -> np.ndarray | None:
        """The state of the entry's cells at positions `start` and after, joined from its
        chain into `empty(n)`: what a sequence already holding the entry's first `start`
        tokens lacks. None where the entry's state is not parsed as one run of a position per
        token (segments off, images). Read-only but for the join's statistics."""
        if entry.layout is None or not entry.linear or not 0 < start < len(entry):
            return None
        t0 = time.monotonic()
        tail = chains.join(entry, empty, start)
        self.stats.join_seconds += time.monotonic() - t0
        return tail

    def chain_point(self, tokens: Sequence[int], tenant: str) -> int:
        """How many of `tokens` an entry stored now would share with the entry it chains to
        (0: it would be stored whole). Read-only."""
        return self._base_for(tuple(tokens), tenant)[1] if self.segment_buffer is not None else 0

    def _keep(self, state: np.ndarray, layout: segments.Layout | None, empty: Callable[[int], np.ndarray]) -> np.ndarray:
        """A copy of a scratch state to keep (on threads where it is large)."""
        t0 = time.monotonic()
        if layout is not None:
            kept = segments.join([(layout, np.arange(layout.n))], empty)
        else:
            kept = empty(int(state.nbytes))
            kept[...] = state
        kept.flags.writeable = False
        self.stats.join_seconds += time.monotonic() - t0
        return kept

    def _base_for(self, tokens: tuple[int, ...], tenant: str) -> tuple[CacheEntry | None, int]:
        trie = self._tries.get(tenant)
        return chains.base_for(trie.match(tokens), tokens, self.fingerprint) if trie is not None else (None, 0)

    @contextmanager
    def pinned(self, entry: CacheEntry | None):
        """Keep `entry` (being loaded into a slot) and the bases it needs out of eviction for
        the block."""
        self._pinned = entry
        try:
            yield
        finally:
            self._pinned = None

    def touch(self, entry: CacheEntry) -> None:
        """Mark an entry used (after loading it), and the bases it chains to. Mutates LRU
        order only; an entry already evicted is left alone."""
        now = time.monotonic()
        for node in chains.chain(entry):
            node.last_used = now
            if node.id in self._lru:
                self._lru.move_to_end(node.id)

    def remove(self, entry: CacheEntry) -> None:
        """Take an entry out (never one that others chain to)."""
        assert not self._children.get(entry.id), "an entry chained to goes after its dependents"
        trie = self._tries[entry.tenant]
        removed = trie.remove(entry.tokens, entry)
        assert removed
        del self._lru[entry.id]
        self.nbytes -= entry.nbytes
        if entry.base is not None:
            left = self._children[entry.base.id] - 1
            if left:
                self._children[entry.base.id] = left
            else:
                del self._children[entry.base.id]
        if not len(trie):
            del self._tries[entry.tenant]

    def clear(self) -> None:
        self._tries.clear()
        self._lru.clear()
        self._children.clear()
        self.nbytes = 0

    def sanity_check(self) -> None:
        total = 0
        for trie in self._tries.values():
            trie.sanity_check()
            total += sum(e.nbytes for e in trie.values())
        assert total == self.nbytes, (total, self.nbytes)
        assert sum(e.nbytes for e in self._lru.values()) == total
        assert self.nbytes <= self.budget or self.shared is not None  # a shared one trims after a call
        times = [e.last_used for e in self._lru.values()]
        assert times == sorted(times), "LRU order follows last use"
        children: dict[int, int] = {}
        for e in self._lru.values():
            if e.base is not None:
                assert e.base.id in self._lru, "a base stays while an entry chains to it"
                assert 0 < e.base_len < len(e) and e.base_len <= len(e.base)
                assert e.tokens[:e.base_len] == e.base.tokens[:e.base_len]
                children[e.base.id] = children.get(e.base.id, 0) + 1
        assert children == self._children, (children, self._children)

    def _make_room(self, entry: CacheEntry, nbytes: int, base: CacheEntry | None = None,
                   ) -> tuple[list[CacheEntry], list[CacheEntry]] | None:
        """The entries to drop (redundant) and to evict for `entry` of `nbytes` to fit, or
        None when it does not: larger than the budget, or first in the order of what goes
        (a refusal, counted). `base` (the entry it chains to) and its chain stay. Else
        read-only."""
        if nbytes > self.budget:
            return None
        needed = {e.id for e in chains.chain(base)} if base is not None else set()
        redundant = [e for e in self._redundant(entry) if e.id not in needed and not self._children.get(e.id)]
        gone = {e.id for e in redundant} | needed
        free = self.budget - self.nbytes + sum(e.nbytes for e in redundant)
        if nbytes <= free:
            return redundant, []
        victims = []
        for key in self._give_up_order(gone, entry, freed=redundant):
            if key == -1:
                self.stats.refused += 1
                return None
            victim = self._lru[key]
            victims.append(victim)
            free += victim.nbytes
            if nbytes <= free:
                return redundant, victims
        return None  # unreachable: the entry itself is in the order

    def _give_up_order(self, gone: Container[int] = (), entry: CacheEntry | None = None,
                       freed: Iterable[CacheEntry] = ()) -> list[int]:
        """The keys of the entries to give up, in order (see lookahead.py): all but those in
        `gone` and the one being loaded (with the bases it needs), and `entry` as -1 when it
        is one to weigh. A base comes right after the last entry chained to it (`freed`:
        entries already on their way out). Read-only."""
        pinned = {e.id for e in chains.chain(self._pinned)} if self._pinned is not None else set()
        keys = [k for k in self._lru if k not in gone and k not in pinned]
        candidates = [e for e in self._lru.values() if e.id not in gone]
        if entry is not None:
            keys.append(-1)
            candidates.append(entry)
        demand = self.demand
        upcoming = demand.upcoming() if demand is not None else ()
        uses = next_uses(((-1 if e is entry else e.id, e.tenant, e.tokens, e.prompt_end) for e in candidates), upcoming)
        if demand is not None:
            uses = session_uses(((-1 if e is entry else e.id, e.tenant, e.session) for e in candidates),
                                demand.sessions(), demand.waiting_sessions(), uses)
        order = victim_order(keys, uses)
        held = self.held_on_device()
        if held:  # the device holds them: a request continuing one takes the device's copy
            order = [k for k in order if k in held] + [k for k in order if k not in held]
        return chains.bases_after_dependents(order, self._children, self._lru, freed) if self._children else order

    def give_up_order(self) -> list[CacheEntry]:
        """The entries in the order eviction would give them up now (the one being loaded
        and the bases it needs left out). Read-only."""
        return [self._lru[key] for key in self._give_up_order()]

    def held_on_device(self) -> set[int]:
        """The ids of the entries whose tokens a device sequence starts with (of the same
        tenant), on memory that can be cut back anywhere: losing one costs no computation
        while the sequence stays, and RAM that holds only what the device holds is RAM that
        another conversation needs (sessions outnumbering the device's sequences come back
        from RAM or are computed again). Read-only."""
        if not self.truncatable or self.demand is None:
            return set()
        held: set[int] = set()
        for tenant, tokens in self.demand.on_device():
            trie = self._tries.get(tenant)
            if trie is not None and tokens:
                held.update(e.id for _, e in trie.match(tokens).prefixes)
        return held

    def _evict(self, victim: CacheEntry) -> None:
        self.remove(victim)
        self.stats.evictions += 1
        self._evicted.add(victim.tenant, victim.tokens)
        if self.on_evict is not None:
            self.on_evict(victim)

    def _redundant(self, entry: CacheEntry) -> list[CacheEntry]:
        """Older entries of the same tenant that `entry` covers up to their last prompt: a
        strict prefix of it, or a conversation it continues (what an older entry holds
        beyond its prompt is a reply that the next turn re-rendered). Scans the tenant's
        entries; insertions are rare next to lookups. Read-only."""
        trie = self._tries.get(entry.tenant)
        if trie is None:
            return []
        out = []
        for old in trie.values():
            shared = common_prefix(old.tokens, entry.tokens)
            point = min(old.prompt_end, shared)
            if shared >= old.prompt_end and (point == len(entry) or self.covers(entry, point)):
                out.append(old)
        return out
