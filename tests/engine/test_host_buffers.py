"""The pinned-memory arena's extent bookkeeping (pure logic; CUDA is not needed)."""

import contextlib
import ctypes
import mmap
import random
import time

from warmslot.slots.fitting.host_buffers import HostBuffers, Staging, _Chunk, loading
from warmslot.slots.llama_api.backend import _RegisteredHost


def test_chunk_extents_stay_disjoint_merged_and_complete():
    rng = random.Random(0)
    chunk = _Chunk(handle=0, address=0, size=1000)
    taken = []
    for _ in range(3000):
        if taken and rng.random() < 0.5:
            offset, size = taken.pop(rng.randrange(len(taken)))
            chunk.give_back(offset, size)
        else:
            size = rng.randrange(1, 60)
            offset = chunk.take(size)
            if offset is not None:
                taken.append((offset, size))
        free = chunk.free
        assert all(free[i][0] + free[i][1] < free[i + 1][0] for i in range(len(free) - 1)), "sorted and merged"
        spans = sorted([(o, o + n) for o, n in taken] + [(o, o + n) for o, n in free])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "no overlap"
        assert sum(n for _, n in taken) + sum(n for _, n in free) == 1000
    for offset, size in taken:
        chunk.give_back(offset, size)
    assert chunk.free == [[0, 1000]]


def test_without_cuda_buffers_are_plain_arrays():
    host = HostBuffers(allocator=None)
    a = host.empty(5 << 20)
    assert a.nbytes == 5 << 20 and not host.pinned and host.allocated_bytes == 0


class FakePinning:
    """Counts what an arena asks to pin (no memory is locked)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def allocate(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes)

    def address(self, handle: int) -> int:
        return handle << 40

    def view(self, address: int, size: int):
        return (ctypes.c_uint8 * size)()  # memory of its own (the addresses are made up)


@contextlib.contextmanager
def arenas(*reserves: int, limit: int = 64 << 20, idle_chunk: int = 4 << 20, quiet: float = 0.5):
    """One arena per model, each with its own fake pinning, closed at the end; the first is
    the one the test watches (the pinning calls in `.sizes` of its allocator)."""
    made = [HostBuffers(FakePinning(), limit=limit, reserve=reserve) for reserve in reserves]
    for arena in made:
        arena.IDLE_CHUNK, arena.QUIET = idle_chunk, quiet
    try:
        yield made
    finally:
        for arena in made:
            arena.close()


# NOTE: an arena counts a chunk in allocated_bytes when it claims it, before the slow
# allocation; a chunk is in free_bytes once it is pinned and added. Tests that go on to use
# the pinned memory (or count the pinning calls) wait for free_bytes.


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_pinning_after_the_load_stops_at_what_was_asked():
    with arenas(0) as (host,):
        host.CHUNK = 4 << 20
        host.pin_soon(6 << 20)
        wait_for(lambda: host.free_bytes == 6 << 20)
        assert host._lib.sizes == [4 << 20, 2 << 20] and host.allocated_bytes == 6 << 20


class LazyPinning(FakePinning):
    """As FakePinning, with views whose pages are never touched (GiB-sized states)."""

    def view(self, address: int, size: int):
        return mmap.mmap(-1, size)


def test_an_arena_that_holds_whole_states_pins_ahead_so_that_the_next_save_finds_pinned_room():
    pins = LazyPinning()
    host = HostBuffers(pins, limit=10 << 30, reserve=0)
    try:
        host.idle(False)  # its engine works all along: the only model's arena pins anyway
        host.hold_states(3 << 30)  # chunks of 4 GiB; room kept for one 3 GiB state
        wait_for(lambda: len(pins.sizes) == 1)
        assert pins.sizes == [4 << 30] and host.CHUNK == 4 << 30
        first = host.empty(3 << 30)  # a prompt-cache entry takes the room
        wait_for(lambda: len(pins.sizes) == 2)
        assert pins.sizes == [4 << 30, 4 << 30]  # pinned before any state found no room
        second = host.empty(3 << 30)
        assert host.ordinary_bytes == 0
        time.sleep(0.3)
        assert pins.sizes == [4 << 30, 4 << 30]  # 2 GiB left under the limit: too small for a state
        assert host.empty(3 << 30).nbytes == 3 << 30 and host.ordinary_bytes == 3 << 30
        del first
        staging = Staging(host)  # takes room for the largest whole state at once
        assert staging.empty(1 << 30).nbytes == 1 << 30 and staging._buffer.nbytes == 3 << 30
        assert staging.empty(2 << 30).nbytes == 2 << 30 and host.ordinary_bytes == 3 << 30
        del second
    finally:
        host.close()


def test_an_arena_pins_more_only_once_every_engine_of_the_process_has_been_idle_a_while():
    with arenas(8 << 20, 4 << 20, quiet=0.6) as (a, other):  # the other model's engine is busy
        pins = a._lib
        other.idle(False)
        a.idle(True)  # idle, with nothing free: it would pin now
        time.sleep(1.5)  # longer than one wait of the pinning thread
        assert pins.sizes == []  # a pinning call would stall the busy model's steps
        went_idle = time.monotonic()  # read before the change, so never later than its quiet clock
        other.idle(True)
        time.sleep(0.3)
        assert pins.sizes == []  # a request may come a moment after another: not yet
        wait_for(lambda: a.free_bytes == 8 << 20)
        assert time.monotonic() - went_idle >= a.QUIET
        assert pins.sizes == [4 << 20, 4 << 20] and a.free_bytes == 8 << 20


def test_no_arena_pins_while_a_model_loads_and_with_another_model_only_after_a_quiet_while():
    with arenas(4 << 20, 0) as (a, other):  # the other model is idle
        pins = a._lib
        with loading():
            a.idle(True)
            other.idle(True)
            time.sleep(1.2)  # past its quiet time, but a model loads
            assert pins.sizes == []
            done = time.monotonic()  # read before the load ends, so never later than its quiet clock
        wait_for(lambda: bool(pins.sizes))
        assert pins.sizes == [4 << 20] and time.monotonic() - done >= a.QUIET


class FakeRuntime:
    """The two CUDA runtime calls the registering allocator makes: records each registration
    and whether every page of the range was already written (faulted in) when it came."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.registered: list[tuple[int, int, int]] = []
        self.errors_cleared = 0

        def register(address, size, flags):
            pages = (ctypes.c_uint8 * size).from_address(address)
            assert all(pages[i] == 0 for i in range(0, size, mmap.PAGESIZE))
            self.registered.append((address, size, flags))
            return 2 if self.fail else 0  # cudaErrorMemoryAllocation

        def clear():
            self.errors_cleared += 1
            return 0

        self.cudaHostRegister = register
        self.cudaGetLastError = clear


def test_pages_are_written_before_cuda_registers_them_and_buffers_view_them():
    runtime = FakeRuntime()
    host = HostBuffers(_RegisteredHost(runtime), limit=64 << 20, reserve=0)
    try:  # (an arena left open would hold back the next test's pinning)
        host.pin_soon(8 << 20)
        wait_for(lambda: host.free_bytes == 8 << 20)
        assert host.allocated_bytes == 8 << 20
        (address, size, flags), = runtime.registered
        assert size == 8 << 20 and address % mmap.PAGESIZE == 0 and flags == 1  # portable: every device's context
        a = host.empty(3 << 20)
        a[:] = 7
        assert a.ctypes.data == address and host.free_bytes == 5 << 20
        del a
        assert host.free_bytes == 8 << 20
    finally:
        host.close()


def test_a_registration_that_fails_leaves_no_pinned_memory():
    runtime = FakeRuntime(fail=True)
    host = HostBuffers(_RegisteredHost(runtime), limit=64 << 20, reserve=0)
    try:
        host.pin_soon(8 << 20)
        # the arena claims the bytes before the allocation and gives them back after it
        # fails, a moment after the error is cleared: wait for both
        wait_for(lambda: runtime.errors_cleared == 1 and host.allocated_bytes == 0)
        assert host.allocated_bytes == 0 and runtime.errors_cleared == 1
        assert host.empty(2 << 20).nbytes == 2 << 20  # a plain array instead
        host.idle(True)
        time.sleep(0.3)
        assert len(runtime.registered) == 1  # and no new try each time the engine goes idle
    finally:
        host.close()  # else its arena holds every later one's pinning back


def test_the_only_model_pins_after_its_load_and_for_a_state_that_found_no_room_while_its_engine_works():
    with arenas(0, limit=8 << 30) as (a,):
        pins = a._lib
        a.CHUNK = 4 << 20
        a.idle(False)  # its engine works all along
        with loading():
            a.pin_soon(8 << 20)
            time.sleep(1.2)
            assert pins.sizes == []  # never while a model loads
        wait_for(lambda: len(pins.sizes) == 2)
        assert pins.sizes == [4 << 20, 4 << 20]  # right after it, its engine busy or not
        assert a.empty(9 << 20).nbytes == 9 << 20  # no room: ordinary memory
        wait_for(lambda: len(pins.sizes) == 3)
        assert pins.sizes[2] == 1 << 30  # a chunk in whole GiB for the next state its size
        kept = a.empty(9 << 20)
        assert a.free_bytes == (8 << 20) + (1 << 30) - (9 << 20) and kept.nbytes == 9 << 20  # that one is pinned


def test_with_another_model_a_state_that_found_no_room_waits_for_a_quiet_process():
    with arenas(0, 0, limit=8 << 30) as (a, other):
        pins = a._lib
        a.idle(False)
        other.idle(True)
        assert a.empty(3 << 20).nbytes == 3 << 20  # no room: ordinary memory
        time.sleep(1.2)
        assert pins.sizes == []  # its engine works: a pinning call would stall the other model's too
        went_idle = time.monotonic()  # read before the change, so never later than its quiet clock
        a.idle(True)
        wait_for(lambda: bool(pins.sizes))
        assert pins.sizes == [1 << 30] and time.monotonic() - went_idle >= a.QUIET


def test_an_arena_whose_model_unloaded_pins_no_more():
    pins = FakePinning()
    a = HostBuffers(pins, limit=8 << 30, reserve=0)
    a.close()
    assert a.empty(3 << 20).nbytes == 3 << 20  # a state still asked for (ordinary memory)
    a.pin_soon(8 << 20)
    time.sleep(0.5)
    assert pins.sizes == []


def test_a_model_loaded_again_takes_the_pinned_memory_its_unloaded_arena_held_and_pins_nothing_new():
    pins = FakePinning()  # one allocator for the process, as cuda_host_allocator() gives
    first = HostBuffers(pins, limit=64 << 20, reserve=0)
    first.CHUNK = 4 << 20
    first.pin_soon(8 << 20)
    wait_for(lambda: first.free_bytes == 8 << 20)
    kept = first.empty(3 << 20)  # a prompt-cache entry that outlives the model
    first.close()
    assert pins.sizes == [4 << 20, 4 << 20]
    second = HostBuffers(pins, limit=64 << 20, reserve=0)  # the model loads again
    try:
        second.CHUNK = 4 << 20
        assert second.allocated_bytes == 8 << 20 and second.free_bytes == 5 << 20  # the entry keeps its part
        second.pin_soon(8 << 20)
        time.sleep(0.3)
        assert pins.sizes == [4 << 20, 4 << 20]  # nothing new pinned
        del kept
        assert second.free_bytes == 8 << 20  # the entry's part went back to the new arena
        other = HostBuffers(FakePinning(), limit=64 << 20, reserve=0)  # another allocator's chunks are not its
        assert other.allocated_bytes == 0
        other.close()
    finally:
        second.close()


def test_the_staging_buffer_is_pinned_once_and_reused_and_counts_states_that_found_no_room():
    from warmslot.slots.fitting.host_buffers import Staging
    with arenas(0, limit=8 << 30) as (a,):
        pins = a._lib
        a.CHUNK = 16 << 20
        a.pin_soon(16 << 20)
        wait_for(lambda: a.free_bytes == 16 << 20)
        staging = Staging(a)
        first = staging.empty(6 << 20)
        assert a.free_bytes == (16 << 20) - (6 << 20) and a.ordinary_bytes == 0  # carved from the arena
        again = staging.empty(4 << 20)  # smaller: the same memory, no new carve
        assert again.ctypes.data == first.ctypes.data and a.free_bytes == (16 << 20) - (6 << 20)
        del first, again  # (a view still held would keep its carve)
        grown = staging.empty(12 << 20)  # larger: the old one went back first, then a carve its size
        assert grown.nbytes == 12 << 20 and a.ordinary_bytes == 0 and a.free_bytes == (16 << 20) - (12 << 20)
        del grown
        huge = staging.empty(40 << 20)  # no room: ordinary memory, counted, and a chunk is asked for
        assert huge.nbytes == 40 << 20 and a.ordinary_bytes == 40 << 20
        wait_for(lambda: len(pins.sizes) == 2)
        assert pins.sizes[1] == 1 << 30


def test_without_cuda_the_staging_buffer_is_ordinary_memory_kept_for_the_next_state():
    from warmslot.slots.fitting.host_buffers import Staging
    staging = Staging(HostBuffers(allocator=None))
    first = staging.empty(3 << 20)
    assert staging.empty(2 << 20).ctypes.data == first.ctypes.data
    large = Staging.KEEP_UNPINNED + 1  # RAM no budget counts: not kept
    one, two = staging.empty(large), staging.empty(large)
    assert one.ctypes.data != two.ctypes.data


def test_without_cuda_the_staging_buffer_has_room_for_a_conversation_that_grows_up_to_what_it_may_keep():
    from warmslot.slots.fitting.host_buffers import Staging
    staging = Staging(HostBuffers(allocator=None), keep=64 << 20)
    first = staging.empty(10 << 20)
    grown = staging.empty((10 << 20) + (2 << 20))  # the next turn's state, a fifth larger
    assert grown.ctypes.data == first.ctypes.data and grown.nbytes == 12 << 20
    kept = staging.empty(60 << 20)  # larger than a quarter more: a new buffer, within keep
    assert staging.empty(64 << 20).ctypes.data == kept.ctypes.data
    one, two = staging.empty((64 << 20) + 1), staging.empty((64 << 20) + 1)  # beyond keep: not kept
    assert one.ctypes.data != two.ctypes.data
