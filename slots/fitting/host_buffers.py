"""Host memory for sequence states: an arena of page-locked (pinned) chunks on CUDA GPUs.

The allocator itself (pages registered with the CUDA runtime, `llama_api.cuda_host_allocator`)
is reached through `llama_api`; this module only keeps the arena's bookkeeping.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
import weakref
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("warmslot.engine")


class PinnedAllocator(Protocol):
    """Page-locked host memory in large allocations (`llama_api.cuda_host_allocator`)."""

    def allocate(self, size: int) -> int:
        """A new allocation's handle, or 0 when there is no memory for it."""

    def address(self, handle: int) -> int:
        """Where an allocation's memory starts."""

    def view(self, address: int, size: int) -> Any:
        """A buffer-protocol object over `size` bytes at `address`; the memory stays in use
        while it lives."""


class HostBuffers:
    """Host memory for sequence states (checkpoints, prompt-cache entries).

    When the model runs on a CUDA GPU the buffers are page-locked (pinned), so state copies
    between RAM and VRAM run at bus speed instead of being staged through pageable memory.
    Pinning is slow (every page is faulted in and locked), so pinned memory comes from an
    arena of large chunks, added by a background thread: `pin_soon()` asks for what a model
    should have after its load, a state that found no room asks for a chunk its size, and
    `reserve` bytes are kept free, up to `limit` bytes in all. Once `hold_states()` has named
    the size of a whole sequence state, the arena also pins ahead: while no chunk has room
    for one such state it pins another whole chunk, so the next slot save finds pinned room
    (a save of a multi-GB state through ordinary memory runs at a fraction of the bus speed,
    and chunks that cached entries have filled no longer hold one).

    A pinning call holds CUDA's driver (about 0.07 s a GiB with the registering allocator, 0.6
    s with cudaMallocHost), stalling every other CUDA call of the process meanwhile. So when
    the arena is the process's only one, it pins as soon as no model is loading, its own
    engine busy or not: the stall falls on the engine whose copies it speeds up (a 4 GiB state
    loads in 0.6 s from ordinary memory and 0.08 s from pinned; its chunk holds the driver
    about 0.3 s, once). With other models' arenas in the process, it pins only once every
    engine has been idle (`idle(True)`) for `QUIET` seconds, which keeps it out of a run of
    requests, where each request's gap to the next is a few milliseconds.

    A request for a buffer never waits for pinning: when the arena has no room, it gets a
    plain numpy array. Buffers are carved first-fit from the chunks and go back to them when
    the last array viewing them is collected. Thread-safe.

    Pinned memory is never given back to the system: prompt-cache entries that outlive their
    model may still view it. When a model unloads (`close`), its chunks go to the process's
    pool, and the next arena takes them from there when it is made, before it pins anything:
    a model that loads again (after sleeping, or by name) starts with its pinned memory at no
    cost, and loads and unloads never pin more than the most that was ever held at once.
    """

    CHUNK = 4 << 30  # pinned for pin_soon(); the loader raises it to hold a whole sequence's state
    IDLE_CHUNK = 2 << 30  # pinned to keep `reserve` free: smaller, so a request arriving meanwhile waits less
    QUIET = 2.0  # seconds every engine has been idle before pinning starts, with other models in the process

    def __init__(self, allocator: PinnedAllocator | None, limit: int = 16 << 30, reserve: int = 4 << 30) -> None:
        self._lib = allocator
        self.pinned = self._lib is not None
        self.limit = limit
        self.reserve = min(reserve, limit)
        self.allocated_bytes = 0  # pinned bytes held by the arena
        self.free_bytes = 0
        self.ordinary_bytes = 0  # bytes of states that found no pinned room (a count, of every such buffer)
        self._wanted = 0  # the largest state that found no room since the last pinning
        self._initial = 0  # what pin_soon() asked for
        self.state_room = 0  # the arena pins ahead to keep room for a state this size (hold_states)
        self._closed = False
        self._chunks: list[_Chunk] = []
        self._lock = _CHUNKS  # one lock for every arena's chunks: a closed arena's go to the next
        self._wake = threading.Event()
        if self.pinned:
            self._adopt()
            with _ALL_IDLE:
                _ARENAS.add(id(self))
            threading.Thread(target=self._grow_when_idle, name="warmslot-pinned", daemon=True).start()

    def pin_soon(self, initial: int) -> None:
        """Pin `initial` bytes in the background, as soon as the arena may (see the class)."""
        self._initial = min(initial, self.limit)
        self._wake.set()

    def hold_states(self, state_bytes: int) -> None:
        """Whole sequence states are up to `state_bytes`: chunks are made to hold one (up to
        16 GiB), and the arena keeps room for the next one (see the class)."""
        self.CHUNK = max(self.CHUNK, min(-(-state_bytes // _GIB) * _GIB, 16 << 30))
        self.state_room = min(state_bytes, self.CHUNK)
        self._wake.set()

    def idle(self, idle: bool) -> None:
        """The engine says whether it is idle (see the class for when that matters)."""
        if not self.pinned:
            return
        self._busy(not idle)
        if idle:
            self._wake.set()

    def close(self) -> None:
        """Its engine is gone (the model unloaded): it pins no more, no longer holds the
        others' pinning back, and its chunks go to the pool for the next arena (buffers still
        viewing them keep their part until they are collected)."""
        self._closed = True
        self._busy(False)
        with _ALL_IDLE:
            _ARENAS.discard(id(self))
        with self._lock:
            for chunk in self._chunks:
                chunk.owner = None
            _POOL.extend((self._lib, chunk) for chunk in self._chunks)
            self._chunks.clear()
        self._wake.set()

    def _busy(self, busy: bool) -> None:
        _mark_busy(id(self), busy)

    def empty(self, size: int) -> np.ndarray:
        """An uninitialized uint8 array of `size` bytes."""
        if self._lib is None or size < _PINNED_MIN:
            return np.empty(size, dtype=np.uint8)
        found = self.empty_pinned(size)
        if found is None:
            self.ordinary_bytes += size
            return np.empty(size, dtype=np.uint8)
        return found

    def empty_pinned(self, size: int) -> np.ndarray | None:
        """An uninitialized uint8 array of `size` bytes in pinned memory, or None when the
        arena has no room for it now (it is then asked for a chunk that size)."""
        if self._lib is None:
            return None
        need = -(-max(size, 1) // _PAGE) * _PAGE
        with self._lock:
            found = self._take(need)
            short = self.state_room and self._largest_free() < self.state_room
        if short:  # pin ahead for the next whole state (even when this one found no room)
            self._wake.set()
        if found is None:
            self._wanted = max(self._wanted, need)
            self._wake.set()
            return None
        chunk, offset = found
        raw = self._lib.view(chunk.address + offset, need)
        weakref.finalize(raw, _give_back, chunk, offset, need)
        return np.frombuffer(raw, dtype=np.uint8, count=size)

    def _take(self, size: int) -> tuple["_Chunk", int] | None:
        for chunk in self._chunks:
            offset = chunk.take(size)
            if offset is not None:
                self.free_bytes -= size
                return chunk, offset
        return None

    def _largest_free(self) -> int:
        """The largest free extent of its chunks (under the lock)."""
        return max((length for chunk in self._chunks for _, length in chunk.free), default=0)

    def _adopt(self) -> None:
        """Take the pool's chunks (a closed arena's, already pinned) up to the limit."""
        with self._lock:
            for lib, chunk in list(_POOL):
                if lib is self._lib and self.allocated_bytes + chunk.size <= self.limit:
                    _POOL.remove((lib, chunk))
                    chunk.owner = self
                    self._chunks.append(chunk)
                    self.allocated_bytes += chunk.size
                    self.free_bytes += sum(length for _, length in chunk.free)
        if self._chunks:
            log.info("took %.1f GiB of pinned host memory an unloaded model held", self.allocated_bytes / _GIB)

    def _add_chunk(self, size: int) -> bool:
        with self._lock:
            if size <= 0 or self.allocated_bytes + size > self.limit:
                return False
            self.allocated_bytes += size  # claimed before the slow allocation
        handle = self._lib.allocate(size)
        with self._lock:
            if not handle:
                self.allocated_bytes -= size
                return False
            self._chunks.append(_Chunk(handle, self._lib.address(handle), size, self))
            self.free_bytes += size
        return True

    def _grow_when_idle(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            while not self._closed:
                size, why = self._next_chunk()
                if size <= 0:
                    break
                if not self._may_pin(timeout=1.0) or self._closed:
                    if id(self) in _BUSY and not self._alone():
                        break  # it waits for a quiet process: its engine's next idle wakes this again
                    continue  # a model loads, or another engine works: wait
                if why.startswith("for states"):
                    self._wanted = 0
                if not self._pin(size, why):  # no memory for it: states use ordinary memory from now on
                    log.info("pinning %.1f GiB more host memory failed; %.1f GiB stays pinned", size / _GIB, self.allocated_bytes / _GIB)
                    self.limit = self.allocated_bytes
                    break

    def _next_chunk(self) -> tuple[int, str]:
        """The size of the next chunk to pin, and why; 0 when none is needed."""
        room = self.limit - self.allocated_bytes
        wanted = self._wanted
        if wanted:  # a state went to ordinary memory: room for the next one its size
            size = max(self.IDLE_CHUNK, -(-wanted // _GIB) * _GIB)
            if size <= room:
                return size, f"for states of {wanted / _GIB:.1f} GiB"
            self._wanted = 0
        if self.allocated_bytes < self._initial:
            return min(self.CHUNK, self._initial - self.allocated_bytes, room), "after the load"
        if self.state_room:
            with self._lock:
                short = self._largest_free() < self.state_room
            if short and room >= self.state_room:
                return min(self.CHUNK, room), "to keep room for a whole state"
        if self.free_bytes < self.reserve:
            return min(self.IDLE_CHUNK, room), "to keep some free"
        return 0, ""

    def _alone(self) -> bool:
        with _ALL_IDLE:
            return _ARENAS <= {id(self)}

    def _may_pin(self, timeout: float) -> bool:
        """Whether a pinning call may run now, waiting up to `timeout` for it."""
        return _idle_but(id(self), timeout) if self._alone() else _quiet(self.QUIET, timeout)

    def _pin(self, size: int, why: str) -> bool:
        pinned, t0 = self.allocated_bytes, time.monotonic()
        if not self._add_chunk(size):
            return False
        log.info(
            "pinned %.1f GiB more host memory %s in %.2f s (%.1f GiB in all)",
            (self.allocated_bytes - pinned) / _GIB, why, time.monotonic() - t0, self.allocated_bytes / _GIB,
        )
        return True


# the arenas (one per loaded model) whose engine is busy, and the models loading: pinning
# waits until none is, and has not been for a while (when the set last changed)
_BUSY: set[int] = set()
_ARENAS: set[int] = set()  # the arenas of the loaded models
_LAST_CHANGE = [0.0]
_ALL_IDLE = threading.Condition()


@contextlib.contextmanager
def loading():
    """A model loads meanwhile: no arena pins (a pinning call would slow the load, and the
    first requests that wait for it), and the quiet time starts when it is done."""
    token = object()
    _mark_busy(id(token), True)
    try:
        yield
    finally:
        _mark_busy(id(token), False)


def _mark_busy(key: int, busy: bool) -> None:
    """An engine (or a load) starts or stops working: the quiet time starts again."""
    with _ALL_IDLE:
        if busy:
            _BUSY.add(key)
        else:
            _BUSY.discard(key)
        _LAST_CHANGE[0] = time.monotonic()
        _ALL_IDLE.notify_all()


def _idle_but(arena: int, timeout: float) -> bool:
    """Wait up to `timeout` until no engine but `arena`'s is busy (nor a model loading)."""
    with _ALL_IDLE:
        return _ALL_IDLE.wait_for(lambda: not (_BUSY - {arena}), timeout)


def _quiet(seconds: float, timeout: float) -> bool:
    """Wait up to `timeout` until no engine has been busy for `seconds`."""
    deadline = time.monotonic() + timeout
    with _ALL_IDLE:
        while True:
            now = time.monotonic()
            quiet_until = _LAST_CHANGE[0] + seconds
            if not _BUSY and now >= quiet_until:
                return True
            if now >= deadline:
                return False
            _ALL_IDLE.wait(deadline - now if _BUSY else min(deadline, quiet_until) - now)


_CHUNKS = threading.RLock()  # every arena's chunks, and the pool (reentrant: a finalizer may run under it)
_POOL: list[tuple[Any, "_Chunk"]] = []  # (allocator, chunk) of closed arenas, pinned still, for the next arena


def _give_back(chunk: "_Chunk", offset: int, size: int) -> None:
    """A buffer's last view is gone: its bytes go back to their chunk (and its arena's count)."""
    with _CHUNKS:
        chunk.give_back(offset, size)
        if chunk.owner is not None:
            chunk.owner.free_bytes += size


class _Chunk:
    """One pinned allocation, its free extents (sorted, merged) and its arena (None: pooled)."""

    def __init__(self, handle: int, address: int, size: int, owner: "HostBuffers | None" = None) -> None:
        self.handle = handle
        self.address = address
        self.size = size
        self.owner = owner
        self.free: list[list[int]] = [[0, size]]  # [offset, length]

    def take(self, size: int) -> int | None:
        for i, extent in enumerate(self.free):
            if extent[1] >= size:
                offset = extent[0]
                if extent[1] == size:
                    del self.free[i]
                else:
                    extent[0] += size
                    extent[1] -= size
                return offset
        return None

    def give_back(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self.free, [offset, 0])
        self.free.insert(i, [offset, size])
        if i + 1 < len(self.free) and offset + size == self.free[i + 1][0]:
            self.free[i][1] += self.free.pop(i + 1)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == offset:
            self.free[i - 1][1] += self.free.pop(i)[1]


_GIB = 1 << 30
_PINNED_MIN = 1 << 20  # smaller states (logits, tiny models) gain nothing from pinning
_PAGE = 4096


class Staging:
    """A pinned buffer for whole states that live only while they are copied: a state read
    from the device whose tail the prompt cache keeps (segments), a chain joined for a load.
    Without it each such state is carved from the arena anew, and once small entries have
    cut the chunks up, a multi-GB state finds no room and goes through ordinary memory, at a
    fraction of the bus speed. It grows to the largest state asked for; while the arena has
    no room it gives ordinary memory. On CUDA it takes room for the largest whole state
    (`HostBuffers.hold_states`) at once. Without CUDA it keeps ordinary memory, up to `keep`
    bytes (what the loader allows it beside the prompt cache's budget: up to a whole state),
    else up to KEEP_UNPINNED: fresh memory costs a page fault per page at its first write, which made a
    save into a new buffer several times slower than one into a kept buffer (on 2 CPU
    cores, 47 MB: 54-98 ms against 12-13 ms). It grows by a quarter more than asked, so a
    conversation that grows turn by turn still finds it large enough. A view it returns is
    valid until the next call: the caller copies what it keeps. Engine thread only."""

    KEEP_UNPINNED = 256 << 20  # without CUDA, and no room taken for it: the most kept for the next state

    def __init__(self, host: HostBuffers, keep: int = 0) -> None:
        self.host = host
        self.keep = keep or self.KEEP_UNPINNED
        self._buffer: np.ndarray | None = None

    def empty(self, size: int) -> np.ndarray:
        if self._buffer is not None and self._buffer.nbytes >= size:
            return self._buffer[:size]
        self._buffer = None  # the smaller one goes back first
        if self.host.pinned and size >= _PINNED_MIN:
            # room for the largest whole state at once: a buffer that grew state by state
            # would cut the arena's chunks up on the way
            found = self.host.empty_pinned(max(size, self.host.state_room))
            if found is None:  # not kept: the arena may have room the next time
                self.host.ordinary_bytes += size
                return np.empty(size, dtype=np.uint8)
        elif size <= self.keep:  # no pinned memory: ordinary memory, kept (with room to grow)
            found = np.empty(min(self.keep, size + size // 4), dtype=np.uint8)
        else:  # a large one would be RAM that no budget counts: not kept
            return np.empty(size, dtype=np.uint8)
        self._buffer = found
        return found[:size]
