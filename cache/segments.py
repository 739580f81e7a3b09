"""A sequence state cut into segments and joined again: the prompt cache stores once what
conversations share.

A conversation that extends another one the cache holds (its next turn, or another session
on the same system prompt and tools) is stored as a segment: the state of its own tokens
only, chained to the entry whose first tokens it shares (`CacheEntry.base`). Loading it
joins the chain into one whole state in host memory and loads that, so the device receives
what it always did, while RAM holds each shared prefix once.

This works on attention memory, where a position's K and V rows are all a position holds,
and on sliding-window memory, whose state is the whole layers' cells and then the window
layers' last window: a chain's cells come from the whole layers of each link, the window
from the last link alone (the cache chains only an entry whose window lies in its own
tokens). The state format is llama.cpp's sequence state (`llama_state_seq_get_data_ext`,
flags 0), read from its writer (`llama_kv_cache::state_write`, the iSWA cache's two in turn)
and checked by the tests of every build this package pins:

    u32 magic, i32 sequence id
    per memory part (one, or two for a sliding window):
    u32 n_stream; per stream: u32 cell count, and when it is not 0:
        cells: i32 position, u32 number of sequence ids, [12 bytes of M-RoPE extension], i32 ids
        u32 v_trans, u32 n_layer
        per layer, K: i32 type, u64 row bytes, a row per cell
        per layer, V: the same; transposed (v_trans): i32 type, u32 element bytes, u32 n_embd,
            then per embedding column the element of every cell

A hybrid model's state (attention layers, then recurrent ones: llama.cpp's hybrid memory
writes its attention cache's part, then its recurrent memory's) parses with `recurrent`: one
attention part, then the recurrent part, kept whole as `Layout.recurrent`. That part is the
state after the sequence's last token, so a chain's recurrent part comes from its last link
alone, as a sliding window does.

A blob that does not parse exactly (another memory kind, a cell of several sequences, bytes
left over) is not cut: its entry stays whole. Nothing here calls llama.cpp.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

SEQ_MAGIC = 0xAF143CD8  # the first four bytes of every sequence state
HEADER = struct.Struct("<Ii")
EXTENSION_BYTES = 12  # a cell's M-RoPE extension
MAX_PARTS = 2  # attention memory writes one part; sliding-window memory two


@dataclass(frozen=True, eq=False)
class Layout:
    """Where a sequence state's parts lie: read-only views into its blob."""

    blob: np.ndarray
    seq: int
    n_stream: int
    stream: int  # the stream holding the cells
    cells: np.ndarray  # (n, record bytes) uint8: the cells' records
    pos: np.ndarray  # (n,) int32
    v_trans: int
    k: tuple[tuple[bytes, np.ndarray], ...]  # per layer: header bytes, (n, row) rows
    v: tuple[tuple[bytes, np.ndarray], ...]  # per layer: header bytes, (n, row) or (n_embd, n, el)
    # the parts after the first, each a Layout of its own: a sliding-window memory's window
    # (llama.cpp's iSWA cache writes the whole layers' cells, then the window layers')
    rest: tuple["Layout", ...] = ()
    recurrent: np.ndarray | None = None  # a hybrid's recurrent part, whole (see the module)

    @property
    def n(self) -> int:
        return len(self.pos)

    def linear(self, n_tokens: int, start: int = 0) -> bool:
        """Whether it holds positions start..n_tokens-1, each once, as a plain token run does
        (not media, whose positions differ from token indices); cells before `start` are
        not looked at (a state read without the cells a base holds: see PromptCache.insert)."""
        pos = self.pos[self.pos >= start] if start else self.pos
        if len(pos) != n_tokens - start:
            return False
        if n_tokens == start:
            return True
        if pos.min() < start or pos.max() >= n_tokens:
            return False
        seen = np.zeros(n_tokens - start, dtype=bool)
        seen[pos - start] = True
        return bool(seen.all())


def parse(blob: np.ndarray, recurrent: bool = False) -> Layout | None:
    """The layout of an attention sequence state (with `recurrent`: a hybrid model's, whose
    recurrent part follows the attention part), or None when the blob is not one."""
    for extension in (0, EXTENSION_BYTES):
        try:
            layout = _parse(blob, extension, recurrent)
        except (ValueError, struct.error):
            continue
        if layout is not None:
            return layout
    return None


def _parse(blob: np.ndarray, extension: int, recurrent: bool = False) -> Layout | None:
    raw = memoryview(blob).cast("B")
    size = len(raw)
    at = 0

    def take(n: int) -> memoryview:
        nonlocal at
        if n < 0 or at + n > size:
            raise ValueError("truncated")
        part = raw[at:at + n]
        at += n
        return part

    magic, seq = HEADER.unpack(take(HEADER.size))
    if magic != SEQ_MAGIC or seq < 0:  # -1: every sequence's state, not one
        return None

    def part() -> Layout | None:
        """One memory's part: the cells of one stream, or of none."""
        (n_stream,) = struct.unpack("<I", take(4))
        if not 0 < n_stream <= 4096:
            return None
        record = 12 + extension
        found = Layout(blob, seq, n_stream, -1, np.empty((0, record), np.uint8), np.empty(0, np.int32), 0, (), ())
        seen = False
        for stream in range(n_stream):
            (n,) = struct.unpack("<I", take(4))
            if n == 0:
                continue
            if seen:
                return None  # a sequence's cells lie in one stream
            seen = True
            start = at
            cells = np.frombuffer(blob, np.uint8, n * record, start).reshape(n, record)
            take(n * record)
            words = cells[:, :8].copy().view("<i4")  # position, number of ids
            if not np.all(words[:, 1] == 1):
                return None
            # NOTE: each cell records one sequence id, which a load into a sequence discards
            # (llama_kv_cache::state_read_meta). A joined chain keeps each link's, so ids may
            # differ from cell to cell: they are not compared.
            pos = np.ascontiguousarray(words[:, 0]).astype(np.int32)
            v_trans, n_layer = struct.unpack("<II", take(8))
            if v_trans > 1 or not 0 < n_layer <= 4096:
                return None
            k = []
            for _ in range(n_layer):
                header = bytes(take(12))
                row = struct.unpack("<iQ", header)[1]
                k.append((header, _rows(blob, take, at, n, row)))
            v = []
            for _ in range(n_layer):
                header = bytes(take(12))
                if not v_trans:
                    row = struct.unpack("<iQ", header)[1]
                    v.append((header, _rows(blob, take, at, n, row)))
                else:
                    _, el, emb = struct.unpack("<iII", header)
                    begin = at
                    take(emb * n * el)
                    v.append((header, np.frombuffer(blob, np.uint8, emb * n * el, begin).reshape(emb, n, el)))
            found = Layout(blob, seq, n_stream, stream, cells, pos, v_trans, tuple(k), tuple(v))
        return found

    parts = []
    while at < size and len(parts) < (1 if recurrent else MAX_PARTS):
        found = part()
        if found is None:
            return None
        parts.append(found)
    tail = None
    if recurrent:  # a recurrent part of the sequence's one cell: u32 cell count (1), then the cell
        if size - at < 4 or struct.unpack("<I", raw[at:at + 4])[0] != 1:
            return None
        tail, at = np.frombuffer(blob, np.uint8, size - at, at), size
    if at != size or not parts or parts[0].n == 0:
        return None
    return dataclasses.replace(parts[0], rest=tuple(parts[1:]), recurrent=tail)


def _rows(blob: np.ndarray, take, at: int, n: int, row: int) -> np.ndarray:
    if row == 0 or row > 1 << 24:
        raise ValueError("row size")
    take(n * row)
    return np.frombuffer(blob, np.uint8, n * row, at).reshape(n, row)


Piece = tuple[Layout, np.ndarray]  # a state and the indices of the cells taken from it


def ordinary(n: int) -> np.ndarray:
    """A buffer of ordinary (not pinned) memory for a state: one the disk writer holds, or
    where no segment buffer is given."""
    return np.empty(n, dtype=np.uint8)


def size(pieces: Sequence[Piece]) -> int:
    """Bytes of the state `join` would make of `pieces`."""
    last = pieces[-1][0]
    recurrent = len(last.recurrent) if last.recurrent is not None else 0
    return HEADER.size + _part_size(pieces) + sum(_part_size([(p, np.arange(p.n))]) for p in last.rest) + recurrent


def _part_size(pieces: Sequence[Piece]) -> int:
    head = pieces[-1][0]
    n = sum(len(idx) for _, idx in pieces)
    total = 4 + 4 * head.n_stream
    if n == 0:
        return total
    return total + 8 + 12 * (len(head.k) + len(head.v)) + n * cell_bytes(head)


def cell_bytes(layout: Layout) -> int:
    """Bytes one cell takes in the first part of a state of this layout: its record, and
    its row of K and of V in every layer."""
    total = layout.cells.shape[1]
    for _, rows in layout.k:
        total += rows.shape[1]
    for _, rows in layout.v:
        total += rows.shape[1] if rows.ndim == 2 else rows.shape[0] * rows.shape[2]
    return total


def join(pieces: Sequence[Piece], empty: Callable[[int], np.ndarray]) -> np.ndarray:
    """One state of the chosen cells of each piece, in order (a chain's prefix first): what
    llama.cpp loads whole. The parts after the first (a sliding window, a hybrid's recurrent
    part) come whole from the last piece. `empty(n)` gives the output buffer (pinned memory,
    where the device will read it). Every piece must come from one model and context layout."""
    head = pieces[-1][0]
    for layout, _ in pieces:
        if (layout.n_stream, layout.v_trans, len(layout.k), layout.cells.shape[1], len(layout.rest), layout.recurrent is None) != (
                head.n_stream, head.v_trans, len(head.k), head.cells.shape[1], len(head.rest), head.recurrent is None):
            raise ValueError("the pieces come from different layouts")
    out = empty(size(pieces))
    out[:HEADER.size] = np.frombuffer(HEADER.pack(SEQ_MAGIC, head.seq), np.uint8)
    copies: list[Callable[[], None]] = []  # the row copies, run at the end (on threads when large)
    at = _write_part(out, HEADER.size, pieces, copies)
    for part in head.rest:
        at = _write_part(out, at, [(part, np.arange(part.n))], copies)
    if head.recurrent is not None:
        out[at:at + len(head.recurrent)] = head.recurrent
        at += len(head.recurrent)
    assert at == len(out)
    _run(copies, len(out))
    return out


def _write_part(out: np.ndarray, at: int, pieces: Sequence[Piece], copies: list[Callable[[], None]]) -> int:
    """Write one memory's part of the pieces' chosen cells at `at`; the row copies go to
    `copies`. Returns where the part ends."""
    head = pieces[-1][0]
    n = sum(len(idx) for _, idx in pieces)

    def put(data: bytes) -> None:
        nonlocal at
        out[at:at + len(data)] = np.frombuffer(data, np.uint8)
        at += len(data)

    def gather(parts: Sequence[np.ndarray], width: int) -> None:
        """The chosen rows of each piece's (n, width) array, one after another."""
        nonlocal at
        dst = out[at:at + n * width].reshape(n, width)
        row = 0
        for part, (_, idx) in zip(parts, pieces):
            copies.append(functools.partial(_take, part, idx, dst[row:row + len(idx)]))
            row += len(idx)
        at += n * width

    put(struct.pack("<I", head.n_stream))
    stream = head.stream if n else -1
    for s in range(head.n_stream):
        put(struct.pack("<I", n if s == stream else 0))
        if s != stream:
            continue
        gather([layout.cells for layout, _ in pieces], head.cells.shape[1])
        put(struct.pack("<II", head.v_trans, len(head.k)))
        for layer, (header, rows) in enumerate(head.k):
            put(header)
            gather([layout.k[layer][1] for layout, _ in pieces], rows.shape[1])
        for layer, (header, rows) in enumerate(head.v):
            put(header)
            if rows.ndim == 2:
                gather([layout.v[layer][1] for layout, _ in pieces], rows.shape[1])
                continue
            emb, _, el = rows.shape
            dst = out[at:at + emb * n * el].reshape(emb, n, el)
            col = 0
            for layout, idx in pieces:
                copies.append(functools.partial(_take_columns, layout.v[layer][1], idx, dst[:, col:col + len(idx)]))
                col += len(idx)
            at += emb * n * el
    return at


COPY_THREADS = min(8, os.cpu_count() or 1)  # a host copy of GBs runs at several times one core's speed
THREADED_BYTES = 64 << 20


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="warmslot-join")


def _run(copies: list[Callable[[], None]], nbytes: int) -> None:
    """Run the copies; numpy lets go of the GIL while it copies, so large joins use threads."""
    if nbytes < THREADED_BYTES or COPY_THREADS < 2:
        for copy in copies:
            copy()
        return
    for future in [_pool().submit(copy) for copy in copies]:
        future.result()


def _take_columns(src: np.ndarray, idx: np.ndarray, dst: np.ndarray) -> None:
    """dst = src[:, idx] (a transposed V cache's cells), as `_take` does rows. A run of
    consecutive cells (most tails) is copied from a slice: numpy's gather by an index array
    on the middle axis of these byte arrays runs about 20 times slower (a 300-cell tail of 30
    layers: 41 ms against 2 ms)."""
    _take(src, idx, dst, axis=1)


def _take(src: np.ndarray, idx: np.ndarray, dst: np.ndarray, axis: int = 0) -> None:
    """dst = src[idx] along `axis`, without a temporary copy where idx is a run of
    consecutive cells."""
    if len(idx) == 0:
        return
    first, last = int(idx[0]), int(idx[-1])
    if last - first + 1 == len(idx):
        dst[...] = src[first:last + 1] if axis == 0 else src[:, first:last + 1]
    else:
        np.take(src, idx, axis=axis, out=dst)


def below(layout: Layout, end: int) -> np.ndarray:
    """The indices of the cells at positions below `end`, in the order they lie."""
    return np.flatnonzero(layout.pos < end)


def from_(layout: Layout, start: int) -> np.ndarray:
    """The indices of the cells at `start` and after."""
    return np.flatnonzero(layout.pos >= start)
