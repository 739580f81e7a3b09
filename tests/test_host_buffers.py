"""The pinned-memory arena's extent bookkeeping (pure logic; CUDA is not needed)."""

import random

from warmslot.slots.fitting.host_buffers import HostBuffers, _Chunk


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
