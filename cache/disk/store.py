"""The disk tier: entries the RAM cache evicts, kept in a directory across restarts.

`DiskCache` owns one directory (--cache-disk). It is used from three threads:

- the engine thread: `lookup`, `put` (queue a write), `touch`; each is index work only,
  O(prompt length), under a short lock, so a decode step never waits for the disk;
- a writer thread: writes queued entries (write, fsync, rename), deletes evicted files, and
  saves the last-use times every few seconds;
- readers (`read`, on any thread but the engine's): a load reads and verifies a file.

An entry being written keeps its bytes (`pending`, read-only arrays shared with the RAM
entry it was spilled from): a load that wants it meanwhile takes them from memory and never
opens a half-written file.

Budget: the sum of the sizes of the entry files (queued ones included) never exceeds
`budget`. Room is made before a write is queued, and the single writer deletes evicted
files before it writes the entries queued after them, so the directory holds at most
`budget` bytes of entries at any time (a write's temporary file counts as its entry).
Eviction is least recently used across restarts: last-use times are in each file's header
and in `last-used.json` (rewritten when they change, at most every few seconds, and at
close).

Segments: with `write_segments` on (and `parse`, the memory kind's state parser: attention,
sliding-window and hybrid memory), an entry that shares at least 64 tokens with one the directory holds is
written as a segment of it, as the RAM cache stores its entries (cache/segments.py): its file
holds the state of its own tokens only. The entry waits in the write queue whole, so a load
meanwhile takes it as it is; the writer cuts it. A load of a segment reads its chain's
states (each verified) and joins them. A base goes only with the segments continuing it:
dropping it (evicted, expired, damaged) drops them too, and a use of a segment touches its
chain, so least-recently-used eviction meets the segments first.

Rejections: a file this server cannot trust or use is skipped, logged and counted by reason
(`records.REASONS`). Damaged files (empty, truncated, checksum) are deleted. Files of another
model, layout or format version stay (a restart with the old flags finds them) but count
against the budget and are evicted first. Files that are not entries are left alone.

The store is one class in three modules: store.py (the index and the API), writer.py (the
writer thread) and directory.py (the directory: its lock, and its index rebuilt at start).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .. import chains, segments
from ..prefix_trie import PrefixTrie
from ..entries import DraftState
from ..shared_budget import SharedBudget
from . import format as fmt
from .directory import DiskDirectory
from .index import DiskEntry, DiskIndex, DiskMatch
from .records import Meta, Payload, Rejected
from .writer import DiskWriter

log = logging.getLogger("warmslot.cache.disk")

REJECTED_REMEMBERED = 256  # rejected keys kept to explain misses


@dataclass
class DiskStats:
    """Counters (plain numbers). The read and rejection counters are written under a lock
    (several threads read); the others by one thread each, or under the index lock."""

    reads: int = 0  # files read for loads
    read_bytes: int = 0
    read_seconds: float = 0.0
    memory_reads: int = 0  # loads served from an entry's pending bytes (still being written)
    writes: int = 0
    write_bytes: int = 0
    write_seconds: float = 0.0
    write_errors: int = 0
    hits: int = 0  # requests that loaded an entry
    evictions: int = 0  # entries deleted to make room (least recently used first)
    expired: int = 0  # entries deleted because their retention ran out
    dropped_redundant: int = 0  # entries deleted because a newer one serves everything they could
    refused: int = 0  # entries not written: larger than the budget, or older than everything kept
    chained: int = 0  # entries written as segments of another entry
    chain_bytes_spared: int = 0  # state bytes those entries did not write (their bases hold them)
    queued_bytes: int = 0  # bytes waiting to be written
    index_seconds: float = 0.0  # the startup index rebuild
    index_files: int = 0  # files it looked at
    rejected: collections.Counter = field(default_factory=collections.Counter)  # by reason


@dataclass(frozen=True, slots=True)
class DiskLookup:
    best: DiskMatch | None  # the entry that lets a slot keep the most of the query
    closest: DiskMatch | None  # when none is usable: the one sharing the most tokens
    rejected: tuple[int, tuple[int, ...], str] | None  # (shared tokens, key, reason) of a rejected entry


class DiskCache(DiskDirectory, DiskWriter):
    def __init__(
        self,
        directory: str,
        budget: int,
        fingerprint: str,
        truncatable: bool,
        *,
        allocate: Callable[[int], np.ndarray] | None = None,
        background: bool = True,
        clock: Callable[[], float] = time.time,
        shared: SharedBudget | None = None,
        parse: Callable[[np.ndarray], segments.Layout | None] | None = None,
        write_segments: bool = False,
    ) -> None:
        """Open (or create, owner-only) `directory`, lock it and index its entries from
        their headers (no state is read). `background=False`: no writer thread; queued work
        runs in `flush()` on the caller's thread. `parse`: the memory kind's state parser,
        which reads segments (without it, segments found are rejected); `write_segments`:
        write them. Raises DiskInUse, OSError."""
        assert budget > 0
        self.directory = os.path.abspath(directory)
        self._budget = budget
        self.shared = shared  # one budget with other models' disk tiers (cache/shared_budget.py)
        self.reserved = 0
        self.fingerprint = fingerprint
        self.truncatable = truncatable
        self.stats = DiskStats()
        self._allocate = allocate
        self._clock = clock
        self.parse = parse
        self.writes_segments = write_segments and parse is not None
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._index = DiskIndex()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lru_dirty = False
        self._lru_saved_at = 0.0
        self._swept_at = time.monotonic()
        self._rejected: dict[str, PrefixTrie[tuple[tuple[int, ...], str]]] = {}
        self._rejected_order: collections.deque = collections.deque()
        self._closed = False
        self._lock_fd = self._open_directory()
        try:
            self._rebuild()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._writer, name="warmslot-disk-writer", daemon=True)
            self._thread.start()

    # -- sizes (any thread) ------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return self._index.nbytes

    @property
    def budget(self) -> int:
        """The bytes the store may hold now: its own budget, or what a shared one leaves it."""
        return self.shared.budget_of(self) if self.shared is not None else self._budget

    def budget_changed(self) -> None:
        """A shared budget shrank (another model's store grew into its share): evict, least
        recently used first, until this store fits again. Thread-safe, so done at once."""
        with self._lock:
            while self._index.nbytes > self.budget:
                victim = self._index.lru_victim()
                if victim is None:
                    break
                self._drop(victim, "evicted")

    @property
    def n_entries(self) -> int:
        return len(self._index)

    # -- lookup (engine thread) ----------------------------------------------------------

    def lookup(self, query: Sequence[int], tenant: str, usable: Callable[[DiskEntry, int], int]) -> DiskLookup:
        """The entry of `tenant` that lets a slot keep the most of `query`, and what explains
        a miss (the entry sharing the most, or a rejected one). O(len(query)). Drops entries
        past their retention that it meets (mutates only then)."""
        with self._lock:
            best, closest, expired = self._index.lookup(query, tenant, usable, self._clock())
            for entry in expired:
                self._drop(entry, "expired")
            rejected = self._rejected_match(query, tenant)
        return DiskLookup(best, None if best is not None else closest, rejected)

    def get(self, name: str) -> DiskEntry | None:
        with self._lock:
            return self._index.get(name)

    def entries(self) -> list[DiskEntry]:
        with self._lock:
            return list(self._index.entries())

    # -- mutation (engine thread) ----------------------------------------------------------

    def put(
        self,
        tokens: Sequence[int],
        state: np.ndarray,
        checkpoints,
        tenant: str,
        prompt_end: int,
        last_used: float,
        keep_s: float | None = None,
        draft: DraftState | None = None,
    ) -> DiskEntry | None:
        """Queue an entry for writing. `state`, the checkpoints' arrays and the drafter's
        sequence (`draft`, speculative decoding) are shared, never copied or changed (they
        must be read-only); the writer thread writes them (a segment's cut too: see the
        module). Makes room first (least recently used first; stale files before any) and
        drops older entries this one serves. An entry holding exactly these tokens is only
        touched. Returns None when the entry is not kept: retention in memory only
        (keep_s == 0), larger than the budget, or older than every entry it would evict.
        Index work only: O(len(tokens) + evictions), and the state's parse. Mutates."""
        if keep_s == 0 or not tokens:
            return None
        tokens = tuple(tokens)
        prompt_end = min(prompt_end, len(tokens)) if prompt_end > 0 else len(tokens)
        layout = self.parse(state) if self.writes_segments else None
        linear = layout is not None and layout.linear(len(tokens))
        with self._lock:
            if self._closed:
                return None
            existing = self._index.exact(tokens, tenant)
            if existing is not None:
                self._index.touch(existing, last_used)
                self._lru_dirty = True
                return existing
            meta = Meta(self.fingerprint, tenant, prompt_end, last_used, keep_s)
            entry = DiskEntry(
                name=secrets.token_hex(16) + fmt.SUFFIX, tokens=tokens, tenant=tenant, fingerprint=self.fingerprint,
                nbytes=0, state_bytes=0, infos=fmt.checkpoint_infos(checkpoints), prompt_end=prompt_end,
                last_used=last_used, keep_s=keep_s, pending=Payload(state, tuple(checkpoints), draft), meta=meta, linear=linear,
            )
            if linear:
                self._chain(entry, layout)
            self._plan(entry)
            if entry.nbytes > self.budget:
                self.stats.refused += 1
                return None
            chain = {id(e) for e in entry.chain()}
            for old in self._index.covered_by(entry, self.truncatable):
                if id(old) not in chain:
                    self._drop(old, "redundant")
            while self._index.nbytes + entry.nbytes > self.budget:
                victim = self._index.lru_victim()
                assert victim is not None
                if victim.stale is None and victim.last_used > last_used:
                    self.stats.refused += 1  # everything kept was used more recently
                    return None
                if id(victim) in chain:  # its base is the one to go: the entry goes whole
                    entry.base, entry.base_len, entry.cut, chain = None, 0, None, set()
                    self._plan(entry)
                    continue
                self._drop(victim, "evicted")
            if entry.base is not None:
                self.stats.chained += 1
                self.stats.chain_bytes_spared += int(state.nbytes) - entry.state_bytes
            self._index.add(entry)
            self.stats.queued_bytes += entry.nbytes
            self._lru_dirty = True
        self._jobs.put(("write", entry))
        if self.shared is not None:
            self.shared.grew(self)  # outside the lock: another store takes its own
        return entry

    def _chain(self, entry: DiskEntry, layout: segments.Layout) -> None:
        """Make `entry` a segment of the entry it continues, if there is one (see the
        module). Lock held."""
        base, shared = self._index.base_for(entry.tokens, entry.tenant, self.fingerprint)
        if base is None or not chains.cuttable(layout, shared):
            return  # nothing to continue, or a sliding window reaching back before its own tokens
        entry.base, entry.base_len, entry.cut = base, shared, (layout, segments.from_(layout, shared))

    def _plan(self, entry: DiskEntry) -> None:
        """Size the entry's file, whole or as a segment. Lock held."""
        state = entry.pending.state
        ref = None
        entry.state_bytes = int(state.nbytes)
        if entry.base is not None:
            entry.state_bytes = segments.size([entry.cut])
            ref = fmt.base_placeholder(entry.base.name, entry.base_len, entry.base.state_bytes)
        draft = fmt.DraftInfo.of(entry.pending.draft, entry.tokens) if entry.pending.draft is not None else None
        entry.nbytes = fmt.plan(entry.meta, len(entry.tokens), entry.state_bytes, entry.infos, draft, entry.linear, ref).file_bytes

    def touch(self, entry: DiskEntry) -> None:
        """Mark an entry used now. O(log n). Mutates LRU order only."""
        with self._lock:
            self._index.touch(entry, self._clock())
            self._lru_dirty = True

    # -- reads (any thread but the engine's) -------------------------------------------------

    def read(self, entry: DiskEntry, checkpoints: frozenset[int] | None = None) -> Payload | None:
        """The entry's bytes, verified against its checksums: from memory while its write is
        queued or running (all of them), else from its file (the state and the checkpoints at
        the positions `checkpoints`; None: all). None when the entry is gone (evicted). A
        file that fails verification is rejected: counted, logged, deleted and dropped from
        the index, and Rejected is raised. Blocking: disk I/O. The entry stays indexed."""
        with self._lock:
            if not entry.alive:
                return None
            links = [(e, e.pending, e.header) for e in entry.chain()]
        if links[0][1] is not None:
            with self._stats_lock:  # reads run on several threads
                self.stats.memory_reads += 1
            return links[0][1]  # whole while it waits to be written
        t0 = time.monotonic()
        if len(links) == 1:
            payload = self._read_file(entry, links[0][2], self._allocate, checkpoints)
        else:
            payload = self._read_chain(links, checkpoints)
        if payload is None:
            return None
        nbytes = entry.bytes_for(checkpoints)
        with self._stats_lock:
            self.stats.reads += 1
            self.stats.read_bytes += nbytes
            self.stats.read_seconds += time.monotonic() - t0
        return dataclasses.replace(payload, read_bytes=nbytes)

    def _read_file(self, entry: DiskEntry, expect, allocate, checkpoints, draft: bool = True) -> Payload | None:
        """One entry file, verified; None when it was evicted and deleted meanwhile. A file
        that fails verification is rejected (and dropped, with what continues it)."""
        try:
            return fmt.read(os.path.join(self.directory, entry.name), allocate, expect, checkpoints, draft)[1]
        except Rejected as exc:
            with self._lock:
                gone = not entry.alive
            if gone and exc.reason == "io":
                return None  # evicted and deleted while the read started
            self.reject(exc, entry.name, entry.tenant, entry.tokens)
            with self._lock:
                self._drop(entry, None)
            raise

    def _read_chain(self, links, checkpoints) -> Payload | None:
        """A segment's whole state: its own file (with the checkpoints asked for and its
        drafter's sequence) and its bases' states, joined; a base still waiting to be
        written gives its cells from memory."""
        parsed: list = []
        own: Payload | None = None  # the segment's own file: its checkpoints and drafter's sequence
        for i, (e, pending, expect) in enumerate(links):
            if pending is not None:  # whole: the chain ends here
                parsed.append((self.parse(pending.state), 0))
                break
            payload = self._read_file(e, expect, None, checkpoints if i == 0 else frozenset(), draft=i == 0)
            if payload is None:
                return None
            if i == 0:
                own = payload
            parsed.append((self.parse(payload.state), e.base_len))
        if any(layout is None for layout, _ in parsed):
            raise Rejected("checksum", f"{links[0][0].name}: a link of its chain does not parse as a state")
        state = chains.join_links(parsed, len(links[0][0]), self._allocate or segments.ordinary)
        state.flags.writeable = False
        return Payload(state, own.checkpoints, own.draft)

    def reject(self, exc: Rejected, name: str, tenant: str | None = None, tokens: Sequence[int] | None = None) -> None:
        """Count and log a rejected file (from here or a slot file); remember its key, when
        known, to explain misses. Thread-safe."""
        with self._stats_lock:
            self.stats.rejected[exc.reason] += 1
        log.warning("disk cache: skipped %s (%s)", name, exc)
        if tokens:
            with self._lock:
                self._remember_rejected(tenant or "", tuple(tokens), exc.reason)

    # -- lifetime --------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write queued so far is on disk (and the last-use times saved).
        Without a writer thread, runs the queued work here. False on timeout."""
        if self._thread is None:
            self._run_jobs(block=False)
            self._save_lru()
            return True
        done = threading.Event()
        self._jobs.put(("sync", done))
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued writes, save the last-use times, stop the writer and unlock
        the directory. Later puts are refused."""
        if self._closed:
            return
        self.flush(timeout)
        with self._lock:
            self._closed = True
        if self._thread is not None:
            self._jobs.put(("stop", None))
            self._thread.join(timeout)
        self._save_lru()
        os.close(self._lock_fd)

    def sanity_check(self) -> None:
        """The index adds up and stays within the budget; after `flush`, the directory
        holds exactly the indexed entry files with their indexed sizes."""
        with self._lock:
            self._index.sanity_check()
            assert self._index.nbytes <= self.budget or self.shared is not None, (self._index.nbytes, self.budget)
            names = {e.name: e.nbytes for e in self._index.entries()}
            pending = any(e.pending is not None for e in self._index.entries())
        if not pending:
            files = {n: s for n, s in self.disk_usage().items() if n.endswith(fmt.SUFFIX)}
            assert files == names, (sorted(files), sorted(names))

    def disk_usage(self) -> dict[str, int]:
        """Sizes of the entry files (and temporary files) in the directory now."""
        out = {}
        for de in os.scandir(self.directory):
            if de.name.endswith(fmt.SUFFIX) or de.name.endswith(".tmp"):
                try:
                    out[de.name] = de.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
        return out

    # -- internals -------------------------------------------------------------------------

    def _drop(self, entry: DiskEntry, why: str | None) -> None:
        """Take an entry out of the index, with the segments continuing it, and queue their
        files' deletion. Lock held."""
        if not entry.alive:
            return
        for dependent in list(entry.dependents):
            self._drop(dependent, why)
        self._index.remove(entry)
        if why == "evicted":
            self.stats.evictions += 1
        elif why == "expired":
            self.stats.expired += 1
        elif why == "redundant":
            self.stats.dropped_redundant += 1
        self._lru_dirty = True
        self._jobs.put(("delete", entry.name))

    def _remember_rejected(self, tenant: str, tokens: tuple[int, ...], reason: str) -> None:
        self._rejected.setdefault(tenant, PrefixTrie()).insert(tokens, (tokens, reason))
        self._rejected_order.append((tenant, tokens))
        while len(self._rejected_order) > REJECTED_REMEMBERED:
            old_tenant, old_tokens = self._rejected_order.popleft()
            trie = self._rejected[old_tenant]
            for _, value in trie.match(old_tokens).prefixes:
                if value[0] is old_tokens:
                    trie.remove(old_tokens, value)
                    break
            if not len(trie):
                del self._rejected[old_tenant]

    def _rejected_match(self, query: Sequence[int], tenant: str) -> tuple[int, tuple[int, ...], str] | None:
        trie = self._rejected.get(tenant)
        if trie is None:
            return None
        match = trie.match(query)
        found = [v for _, v in match.prefixes] + list(itertools.islice(match.extensions(), 1))
        if not found or match.depth == 0:
            return None
        tokens, reason = found[-1]
        return match.depth, tokens, reason
