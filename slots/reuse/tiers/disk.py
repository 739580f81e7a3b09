"""The disk tier (cache/disk/) as the router and the engine see it: lookups priced by their
read, spills, fetches, loads and the shutdown flush.

- **Match.** `match` looks the prompt up in the store's index and offers the best entry as
  a `FromDisk` route when its usable prefix outweighs the price of reading it (`cost_tokens`).
- **Spill.** The RAM cache hands every entry it evicts to `put` (loader.py builds the cache
  with it), which queues it for the disk writer (its read-only arrays are shared, nothing is
  copied): index work only, so the decode step that caused the eviction does not wait.
- **Fetch.** A request whose best source is a disk entry that is not in memory yet gets a
  `Fetch` route: a reader thread reads and verifies what the load uses (the state, and only
  the checkpoint the prompt restores, if any: `DiskEntry.needed`) while the engine goes on
  with the other slots; when it is done the engine is woken and routes the request again. Entries
  still being written are in memory already (their bytes wait in the write queue).
- **Load.** `take` turns the fetched bytes into a prompt-cache entry that the slot loads like
  a RAM one; the entry also stays in RAM when it fits in a quarter of its budget (the next
  request that shares it loads it from memory). The file is never consumed: a later prompt
  that diverges inside the entry reads the checkpoint it needs from it then.
- **Ranking.** `cost_tokens` prices a read in prompt tokens: the seconds the read takes at
  the measured disk bandwidth, times the measured prefill speed. The router compares a disk
  candidate by its usable prefix minus that price.
- **Shutdown.** Idle slots' contents and the RAM entries are written (most recently used
  first; those already on disk are only touched), then the writer is drained.

Everything here runs on the engine thread except the reads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable

from warmslot.cache import segments
from warmslot.cache.checkpoints import CheckpointList
from warmslot.cache.disk import DiskCache, DiskEntry, DiskMatch, DiskStats, Payload, Rejected
from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache

from ...requests import GenerateRequest, Source
from ...stats import EngineStats
from .base import Found, Release, TierCounters, TierMatch, entry_usable
from .routes import Candidate, FromDisk

log = logging.getLogger("warmslot.engine")

READ_BANDWIDTH_PRIOR = 1e9  # bytes/s assumed until reads were measured
PREFILL_PRIOR = 1000.0  # tokens/s assumed until prefill was measured
READ_LATENCY = 0.002  # seconds a read costs besides its bytes (open, head, wake-up)
FETCHED_KEPT = 8  # fetched payloads waiting for their request (an aborted one's is dropped)
RAM_SHARE = 4  # a fetched entry also stays in RAM when it is at most 1/RAM_SHARE of the budget


@dataclass(frozen=True, slots=True)
class DiskView:
    """The disk tier's sizes and counters at one instant (any thread)."""

    directory: str
    budget_bytes: int
    bytes: int
    n_entries: int
    stats: DiskStats


def wall_time(monotonic: float) -> float:
    """A time.monotonic() instant as wall-clock seconds (last uses persist across restarts)."""
    return time.time() - (time.monotonic() - monotonic)


class DiskTier:
    source = Source.DISK

    def __init__(
        self,
        disk: DiskCache,
        ram: PromptCache,
        stats: EngineStats,
        checkpoint_limits: tuple[int, int],
        wake: Callable[[Callable[[], None]], None],
    ) -> None:
        """`wake(fn)` runs fn on the engine thread between steps (and wakes it)."""
        self.disk = disk
        self.ram = ram
        self.stats = stats
        self.checkpoint_limits = checkpoint_limits
        self._wake = wake
        self._reader = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="warmslot-disk-read")
        self._inflight: dict[str, concurrent.futures.Future] = {}  # entry name -> read
        self._fetched: collections.OrderedDict[str, Payload] = collections.OrderedDict()
        self._waiting: dict[str, str] = {}  # request id -> entry name it waits for
        self.taken_bytes = 0  # what the last `take` read from the disk (0: its bytes were in memory)

    # -- routing ---------------------------------------------------------------------------

    def match(self, req: GenerateRequest) -> TierMatch:
        """The best entry priced by its read, or what explains a disk miss: the entry sharing
        the most, or one that was rejected. Read-only but for keeping the bytes of an entry
        still being written (see `_in_memory`)."""
        lookup = self.disk.lookup(req.tokens, req.scope, entry_usable(req.tokens, self.ram.truncatable))
        found = []
        if lookup.best is not None:
            found.append(self._priced(lookup.best, len(req.tokens)))
        elif lookup.closest is not None:
            e = lookup.closest
            found.append(Found(None, Candidate(Source.DISK, e.matched, e.entry.tokens, 0,
                                               "the disk entry has no checkpoint at or before the divergence")))
        if lookup.rejected is not None:
            matched, tokens, reason = lookup.rejected
            found.append(Found(None, Candidate(Source.DISK, matched, tokens, 0,
                                               f"a disk entry sharing {matched} tokens was rejected ({reason})")))
        return TierMatch(tuple(found))

    def _priced(self, e: DiskMatch, n_prompt: int) -> Found:
        """The entry as an offer when its usable prefix outweighs its read, else as a
        candidate that says why not."""
        need = e.entry.needed(e.usable, n_prompt)
        cost = self.cost_tokens(e.entry, need)
        if e.usable - cost > 0:
            return Found(FromDisk(None, e.entry, e.usable, cost=cost, need=need), Candidate(Source.DISK, e.matched, e.entry.tokens, e.usable))
        return Found(None, Candidate(Source.DISK, e.matched, e.entry.tokens, 0,
                                     f"computing {e.usable} tokens is faster than reading their {e.entry.bytes_for(need)} bytes from disk"))

    def ready(self, offer: FromDisk) -> bool:
        """Whether the offer's bytes are in memory (else the request waits for a `Fetch`)."""
        return self._in_memory(offer.entry, offer.need)

    def _in_memory(self, entry: DiskEntry, need: frozenset[int]) -> bool:
        """Whether the entry's state and the checkpoints at the positions `need` are in
        memory (fetched, or still queued for writing: those bytes are kept as fetched)."""
        fetched = self._fetched.get(entry.name)
        if fetched is not None and need <= {c.n_tokens for c in fetched.checkpoints}:
            return True
        pending = entry.pending
        if pending is not None:
            self._keep_fetched(entry.name, pending)
            return True
        return False

    def cost_tokens(self, entry: DiskEntry, need: frozenset[int]) -> float:
        """What loading the entry (its state and the checkpoints at `need`) costs, in prompt
        tokens the same time would compute."""
        if self._in_memory(entry, need):
            return 0.0
        s = self.disk.stats
        bandwidth = s.read_bytes / s.read_seconds if s.read_bytes >= (1 << 20) and s.read_seconds > 0 else READ_BANDWIDTH_PRIOR
        st = self.stats
        prefill = st.prefill_tokens / st.prefill_seconds if st.prefill_tokens >= 256 and st.prefill_seconds > 0 else PREFILL_PRIOR
        return (entry.bytes_for(need) / bandwidth + READ_LATENCY) * prefill

    # -- fetching (engine thread) ----------------------------------------------------------

    def fetch(self, entry: DiskEntry, request_id: str, need: frozenset[int]) -> None:
        """Start reading the entry's state and the checkpoints at `need` for a request (one
        read of an entry at a time: a request that needs more is routed again after it);
        the engine is woken when the read is done."""
        self._waiting[request_id] = entry.name
        if entry.name in self._inflight:
            return
        future = self._reader.submit(self._read, entry, need)
        self._inflight[entry.name] = future
        future.add_done_callback(lambda f, entry=entry: self._wake(lambda: self._on_read(entry, f)))

    def waiting(self, request_id: str) -> bool:
        """Whether the request waits for a read still in flight (the engine need not step
        for it)."""
        name = self._waiting.get(request_id)
        return name is not None and name in self._inflight

    def _read(self, entry: DiskEntry, need: frozenset[int]) -> Payload | None:
        try:
            return self.disk.read(entry, need)
        except Rejected:
            return None  # counted and logged by the disk cache; the request is routed again

    def _on_read(self, entry: DiskEntry, future: concurrent.futures.Future) -> None:
        self._inflight.pop(entry.name, None)
        for req, name in list(self._waiting.items()):
            if name == entry.name:
                del self._waiting[req]
        try:
            payload = future.result()
        except Exception:  # noqa: BLE001 - a failed read is a miss, never a crash
            log.exception("disk cache: reading %s failed", entry.name)
            payload = None
        if payload is not None:
            self._keep_fetched(entry.name, payload)

    def _keep_fetched(self, name: str, payload: Payload) -> None:
        self._fetched[name] = payload
        self._fetched.move_to_end(name)
        while len(self._fetched) > FETCHED_KEPT:
            self._fetched.popitem(last=False)

    def take(self, offer: FromDisk) -> CacheEntry | None:
        """The fetched entry as a prompt-cache entry to load into a slot (kept in RAM too
        when that pays), or None when its bytes are not in memory. The disk entry stays;
        mutates the fetched bytes, the RAM cache and the counters."""
        entry = offer.entry
        payload = self._fetched.pop(entry.name, None)
        if payload is None:
            return None
        self.taken_bytes = payload.read_bytes
        checkpoints = CheckpointList(*self.checkpoint_limits)
        for c in payload.checkpoints:
            checkpoints.add(c)
        cached = None
        if payload.nbytes * RAM_SHARE <= self.ram.budget and self.ram.find_covering(list(entry.tokens), entry.tenant) is None:
            cached = self.ram.insert(
                list(entry.tokens), payload.state, checkpoints, entry.tenant, entry.prompt_end, entry.keep_s, draft=payload.draft,
            )
        if cached is None:
            cached = CacheEntry(
                entry.tokens, payload.state, checkpoints, entry.tenant, self.ram.fingerprint, time.monotonic(),
                prompt_end=entry.prompt_end, keep_s=entry.keep_s, draft=payload.draft,
            )
        self.disk.touch(entry)
        self.disk.stats.hits += 1
        return cached

    # -- writing (engine thread) -----------------------------------------------------------

    def put(self, entry: CacheEntry) -> bool:
        """Queue a RAM entry for the disk (the RAM cache evicts it). Index work only, but
        for joining a chained entry's state. Mutates; False: not queued (a disk entry
        serves it already, or the store refused it)."""
        if self._on_disk_already(entry):
            return False
        return self.disk.put(entry.tokens, self.ram.whole_state(entry, segments.ordinary), list(entry.checkpoints), entry.tenant,
                             entry.prompt_end, wall_time(entry.last_used), entry.keep_s, entry.draft) is not None

    def shutdown(
        self, slots, state_of: Callable[[int], object], timeout: float | None = None, draft_of: Callable[[object], object] | None = None,
    ) -> None:
        """Write what is worth keeping, most recently used first: every slot's contents
        (`state_of(slot_id)` reads a sequence's state, `draft_of(slot)` its drafter's), then
        the RAM entries; wait for the writer and close the directory."""
        queued = 0
        for slot in sorted(slots, key=lambda s: s.last_used, reverse=True):
            if not slot.tokens or slot.keep_s == 0 or self.ram.find_covering(slot.tokens, slot.tenant) is not None:
                continue
            state = state_of(slot.id)
            draft = draft_of(slot) if draft_of is not None else None
            for array in (state, *(draft.arrays if draft is not None else ())):
                array.flags.writeable = False  # shared with the writer thread
            if self.disk.put(slot.tokens, state, list(slot.checkpoints), slot.tenant,
                             slot.prompt_end, wall_time(slot.last_used or time.monotonic()), slot.keep_s, draft):
                queued += 1
        for entry in reversed(list(self.ram.entries())):
            if entry.keep_s != 0 and not self._on_disk_already(entry) and self.disk.put(entry.tokens, self.ram.whole_state(entry, segments.ordinary), list(entry.checkpoints), entry.tenant,
                                                   entry.prompt_end, wall_time(entry.last_used), entry.keep_s, entry.draft):
                queued += 1
        t0 = time.monotonic()
        self.disk.close(timeout)
        self._reader.shutdown(wait=False, cancel_futures=True)
        log.info("disk cache: %d entries kept at shutdown (%.1f MiB in all) in %.2f s",
                 queued, self.disk.nbytes / (1 << 20), time.monotonic() - t0)

    def _on_disk_already(self, entry: CacheEntry) -> bool:
        """Whether, with segments, a disk entry serves everything `entry` could: a base that
        RAM kept for the entries chained to it, once one of them is written. Attention
        memory only, where any prefix of an entry serves."""
        if self.ram.segment_buffer is None or not self.ram.truncatable:
            return False
        end = entry.prompt_end or len(entry)
        found = self.disk.lookup(entry.tokens[:end], entry.tenant, lambda e, matched: matched).best
        return found is not None and found.matched >= end

    def give_up(self) -> list[Release]:
        """The entries, least recently used first (the store's order of eviction).
        Read-only."""
        return [Release(e, len(e), e.nbytes, len(e)) for e in sorted(self.disk.entries(), key=lambda e: e.last_used)]

    def counters(self) -> TierCounters:
        """Entries, bytes, loads served, evictions, and the prompt tokens disk gave. Any
        thread."""
        d = self.disk
        return TierCounters(self.source, d.n_entries, d.nbytes, d.stats.hits, d.stats.evictions, self.stats.prompt_tokens["disk"])

    def view(self) -> DiskView:
        """Sizes and a copy of the counters; any thread."""
        d = self.disk
        stats = replace(d.stats, rejected=collections.Counter(d.stats.rejected))
        return DiskView(d.directory, d.budget, d.nbytes, d.n_entries, stats)
