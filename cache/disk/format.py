"""The file format of a saved sequence state: disk-tier entries and saved slots alike.

    preamble   magic b"WSLOTKV\\n", format version (u32 LE), header length (u32 LE)
    header     UTF-8 JSON: model fingerprint, tenant, lengths, checkpoint positions, and the
               CRC32 of every body block; a segment names its base (below)
    tokens     int32 LE, n_tokens of them
    crc        CRC32 of preamble + header + tokens (u32 LE)
    body       the state bytes, then each checkpoint's state and logits, in header order,
               then the drafter's sequence state and its extra arrays, when it has one

The head (everything before the body) is all that the startup index reads: a 30K-token entry
has a 120 KB head next to a state of gigabytes. The body is checksummed in blocks of `BLOCK`
bytes per section, so a load verifies each block as soon as it is read (on other threads) and
a flipped byte anywhere is caught before the state is used. The file size is fixed by the
head, so a truncated file is recognised from its size alone.

Files are written to a temporary name, fsynced, renamed into place and the directory fsynced:
a crash leaves the old file or none, never a partial one under the final name. Checksums are
written as fixed-width hex, so an entry's exact size is known before its bytes are
checksummed (`plan`), which keeps a byte budget exact while writes are queued.

A segment (version 2) holds the state of its own tokens only, from the point where it
continues another entry of the directory: its header names that base file, the tokens they
share and the checksums of the base's state as written, which the base must still have (a
base written again under the same name does not match). Whole entries stay version 1, so
a server that reads only version 1 never takes a segment for a whole state.

The records this reads and writes (`Meta`, `Header`, `Payload`, ...) are in records.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import struct
import zlib
from typing import Callable, Collection, Sequence

import numpy as np

from ..checkpoints import Checkpoint
from ..entries import DraftState
from .records import BaseRef, CheckpointInfo, DraftInfo, Header, Meta, Payload, Plan, Rejected, Section, checkpoint_infos

MAGIC = b"WSLOTKV\n"
VERSION = 1  # a whole entry
SEGMENT_VERSION = 2  # an entry continuing another one (its header names the base)
BLOCK = 16 << 20  # bytes per body checksum
_PREAMBLE = struct.Struct("<8sII")
_CRC = struct.Struct("<I")
MAX_HEADER = 1 << 20  # a header is JSON of a few hundred bytes plus 9 bytes per body block
SUFFIX = ".wsc"

# NOTE: a load reads several blocks at once, each on its own thread (pread and the checksum
# release the GIL). One sequential reader keeps one request in flight at a time, and a
# virtio or NVMe device only reaches its bandwidth with a deeper queue: on the GPU host a
# single reader got 1.6-1.9 GB/s. Six readers (shared by concurrent loads) keep the device
# busy without holding more than 6 x BLOCK of reads in flight.
READERS = 6
_read_pool = concurrent.futures.ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="warmslot-disk-block")


def _sections(state_bytes: int, infos: Sequence[CheckpointInfo], draft: DraftInfo | None = None) -> tuple[Section, ...]:
    out = [Section(state_bytes, "u1")]
    for c in infos:
        if c.data_bytes is not None:
            out.append(Section(c.data_bytes, "u1"))
        if c.n_logits is not None:
            out.append(Section(c.n_logits * 4, "f4"))
    if draft is not None:
        out += [Section(n, "u1") for n in draft.section_bytes()]
    return tuple(out)


def _blocks(nbytes: int) -> int:
    return (nbytes + BLOCK - 1) // BLOCK


def _header_json(meta: Meta, n_tokens: int, state_bytes: int, infos, crcs, draft: DraftInfo | None = None,
                 linear: bool = False, base: BaseRef | None = None) -> bytes:
    doc = {
        "fingerprint": meta.fingerprint,
        "tenant": meta.tenant,
        "n_tokens": n_tokens,
        "prompt_end": meta.prompt_end,
        "last_used": round(meta.last_used, 3),
        "keep_s": meta.keep_s,
        "state_bytes": state_bytes,
        "checkpoints": [[c.n_tokens, c.data_bytes, c.n_logits] for c in infos],
        "block": BLOCK,
        # fixed width, so the size is known before the checksums are
        "crc": [[f"{x:08x}" for x in section] for section in crcs],
    }
    if draft is not None:
        doc["draft"] = {
            "fingerprint": draft.fingerprint, "n_shared": draft.n_shared, "tail": list(draft.tail),
            "state_bytes": draft.state_bytes, "extra": [[d, list(shape)] for d, shape in draft.extra],
        }
    if linear:
        doc["linear"] = True
    if base is not None:
        doc["base"] = {"name": base.name, "n_tokens": base.n_tokens, "crc": [f"{x:08x}" for x in base.state_crcs]}
    return json.dumps(doc, separators=(",", ":")).encode()


def plan(meta: Meta, n_tokens: int, state_bytes: int, checkpoints: Sequence[CheckpointInfo], draft: DraftInfo | None = None,
         linear: bool = False, base: BaseRef | None = None) -> Plan:
    """The exact layout of an entry. O(header); reads no state. A base's checksums may be
    placeholders: only their number counts (the base's state blocks)."""
    infos = tuple(checkpoints)
    sections = _sections(state_bytes, infos, draft)
    placeholder = [[0] * _blocks(s.nbytes) for s in sections]
    text = _header_json(meta, n_tokens, state_bytes, infos, placeholder, draft, linear, base)
    head = _PREAMBLE.size + len(text) + 4 * n_tokens + _CRC.size
    return Plan(meta, n_tokens, state_bytes, infos, sections, head, draft, linear, base)


def base_placeholder(name: str, n_tokens: int, state_bytes: int) -> BaseRef:
    """A base reference whose checksums are not known yet (the base is still being written):
    enough to plan the segment's size."""
    return BaseRef(name, n_tokens, (0,) * _blocks(state_bytes))


def _section_arrays(state: np.ndarray, checkpoints, draft: DraftState | None = None) -> list[np.ndarray]:
    out = [state]
    for c in checkpoints:
        if c.data is not None:
            out.append(c.data)
        if c.logits is not None:
            out.append(np.ascontiguousarray(c.logits, dtype=np.float32))
    if draft is not None:
        out += draft.arrays
    return out


def write(
    directory: str, name: str, meta: Meta, tokens: Sequence[int], state: np.ndarray, checkpoints, draft: DraftState | None = None,
    linear: bool = False, base: BaseRef | None = None,
) -> Header:
    """Write an entry atomically as `directory/name`: a temporary file (owner-only), fsync,
    rename, fsync of the directory. Returns its head (`file_bytes` is the size written).
    Reads the arrays, never changes them; safe on any thread. Raises OSError (the temporary
    file is removed). `base`: the entry a segment continues (`state` then holds the cells
    from base.n_tokens on)."""
    infos = checkpoint_infos(checkpoints)
    draft_info = DraftInfo.of(draft, tokens) if draft is not None else None
    layout = plan(meta, len(tokens), int(state.nbytes), infos, draft_info, linear, base)
    arrays = _section_arrays(state, checkpoints, draft)
    token_bytes = np.asarray(tokens, dtype="<i4").tobytes()
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    final = os.path.join(directory, name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.lseek(fd, layout.head_bytes, os.SEEK_SET)  # the head goes in last: it holds the checksums
        crcs = []
        for arr in arrays:
            view = memoryview(np.ascontiguousarray(arr)).cast("B")
            section = []
            for start in range(0, len(view), BLOCK):
                block = view[start : start + BLOCK]
                section.append(zlib.crc32(block))
                _write_all(fd, block)
            crcs.append(section)
        text = _header_json(meta, len(tokens), int(state.nbytes), infos, crcs, draft_info, linear, base)
        header = _parse(json.loads(text), np.frombuffer(token_bytes, dtype="<i4"), layout.head_bytes)
        version = SEGMENT_VERSION if base is not None else VERSION
        head = _PREAMBLE.pack(MAGIC, version, len(text)) + text + token_bytes
        head += _CRC.pack(zlib.crc32(head))
        assert len(head) == layout.head_bytes
        os.pwrite(fd, head, 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, final)
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(directory)
    return header


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        n = os.write(fd, data)
        data = data[n:]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(path: str, *, fd: int | None = None) -> Header:
    """Parse and verify a file's head (not its body). Raises Rejected. Reads the head only:
    the preamble, the JSON and the tokens."""
    own = fd is None
    try:
        if own:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Rejected("io", str(exc)) from None
    try:
        return _read_header(fd)
    except OSError as exc:
        raise Rejected("io", str(exc)) from None
    finally:
        if own:
            os.close(fd)


def _read_header(fd: int) -> Header:
    size = os.fstat(fd).st_size
    if size == 0:
        raise Rejected("empty", "the file is empty")
    pre = os.pread(fd, _PREAMBLE.size, 0)
    if len(pre) < _PREAMBLE.size:
        if MAGIC.startswith(pre[: len(MAGIC)]):
            raise Rejected("truncated", f"{size} bytes: the preamble is cut")
        raise Rejected("not_entry", "no entry magic")
    magic, version, n_json = _PREAMBLE.unpack(pre)
    if magic != MAGIC:
        raise Rejected("not_entry", "no entry magic")
    if version not in (VERSION, SEGMENT_VERSION):
        raise Rejected("version", f"format version {version}, this server reads {VERSION} and {SEGMENT_VERSION}")
    if n_json > MAX_HEADER:
        raise Rejected("checksum", f"a header of {n_json} bytes")
    text = os.pread(fd, n_json, _PREAMBLE.size)
    if len(text) < n_json:
        raise Rejected("truncated", f"{size} bytes: the header is cut")
    try:
        doc = json.loads(text)
        n_tokens = int(doc["n_tokens"])
    except (ValueError, KeyError, TypeError):
        # the head's checksum follows the tokens, whose count is in the JSON: a damaged JSON
        # cannot be verified first, so it is a checksum failure whichever byte changed
        raise Rejected("checksum", "the header is not valid JSON") from None
    if not 0 < n_tokens < (1 << 28):
        raise Rejected("checksum", f"n_tokens {n_tokens}")
    start = _PREAMBLE.size + n_json
    rest = os.pread(fd, 4 * n_tokens + _CRC.size, start)
    if len(rest) < 4 * n_tokens + _CRC.size:
        raise Rejected("truncated", f"{size} bytes: the tokens are cut")
    (crc,) = _CRC.unpack(rest[-_CRC.size :])
    if zlib.crc32(rest[: -_CRC.size], zlib.crc32(text, zlib.crc32(pre))) != crc:
        raise Rejected("checksum", "the head does not match its checksum")
    try:
        header = _parse(doc, np.frombuffer(rest[: -_CRC.size], dtype="<i4"), start + 4 * n_tokens + _CRC.size)
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected("checksum", f"a malformed header ({exc})") from None
    if (header.base is not None) != (version == SEGMENT_VERSION):
        raise Rejected("checksum", f"format version {version} with{'out' if header.base is None else ''} a base")
    if size < header.file_bytes:
        raise Rejected("truncated", f"{size} bytes of {header.file_bytes}")
    if size > header.file_bytes:
        raise Rejected("checksum", f"{size - header.file_bytes} bytes after the end")
    return header


def _parse(doc: dict, tokens: np.ndarray, head_bytes: int) -> Header:
    meta = Meta(
        fingerprint=str(doc["fingerprint"]),
        tenant=str(doc["tenant"]),
        prompt_end=int(doc["prompt_end"]),
        last_used=float(doc["last_used"]),
        keep_s=None if doc.get("keep_s") is None else float(doc["keep_s"]),
    )
    infos = tuple(
        CheckpointInfo(int(n), None if d is None else int(d), None if g is None else int(g))
        for n, d, g in doc["checkpoints"]
    )
    state_bytes = int(doc["state_bytes"])
    if int(doc["block"]) != BLOCK or state_bytes < 0:
        raise ValueError("block size or state size")
    draft = None
    if doc.get("draft") is not None:
        d = doc["draft"]
        draft = DraftInfo(
            str(d["fingerprint"]), int(d["n_shared"]), tuple(int(t) for t in d["tail"]), int(d["state_bytes"]),
            tuple((str(np.dtype(t).str), tuple(int(x) for x in shape)) for t, shape in d["extra"]),
        )
        if not 0 <= draft.n_shared <= len(tokens) or min(draft.section_bytes()) < 0:
            raise ValueError("the draft sequence")
    sections = _sections(state_bytes, infos, draft)
    crcs = tuple(tuple(int(x, 16) for x in s) for s in doc["crc"])
    if len(crcs) != len(sections) or any(len(c) != _blocks(s.nbytes) for c, s in zip(crcs, sections)):
        raise ValueError("the checksum list does not match the sections")
    if any(c.n_tokens <= 0 or c.n_tokens > len(tokens) or (c.data_bytes is None and c.n_logits is None) for c in infos):
        raise ValueError("a checkpoint position")
    if not 0 <= meta.prompt_end <= len(tokens):
        raise ValueError("the prompt end")
    base = None
    if doc.get("base") is not None:
        b = doc["base"]
        base = BaseRef(str(b["name"]), int(b["n_tokens"]), tuple(int(x, 16) for x in b["crc"]))
        if not 0 < base.n_tokens < len(tokens) or "/" in base.name:
            raise ValueError("the base reference")
    body = sum(s.nbytes for s in sections)
    return Header(meta, tuple(tokens.tolist()), state_bytes, infos, sections, crcs, head_bytes, head_bytes + body, draft,
                  bool(doc.get("linear", False)), base)


def read(
    path: str,
    allocate: Callable[[int], np.ndarray] | None = None,
    expect: Header | None = None,
    checkpoints: Collection[int] | None = None,
    draft: bool = True,
) -> tuple[Header, Payload]:
    """Read and verify a file: its head, then the body blocks it returns, each against its
    checksum (`READERS` blocks read and verified at once, on reader threads). `allocate(n)`
    gives the uint8 buffers (pinned host memory, say); `expect`: the head this file had when
    it was indexed, which it must still have; `checkpoints`: the positions of the checkpoints
    to read (None: all of them; the state is always read, other sections are skipped);
    `draft`: whether to read the drafter's sequence (a segment's base needs only its state).
    Raises Rejected; never returns unverified bytes."""
    allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Rejected("io", str(exc)) from None
    try:
        header = _read_header(fd)
        if expect is not None and (header.tokens, header.meta.fingerprint, header.meta.tenant, header.crcs) != (
            expect.tokens, expect.meta.fingerprint, expect.meta.tenant, expect.crcs
        ):
            raise Rejected("checksum", "the file changed since it was indexed")
        wanted = _wanted(header, checkpoints, draft)
        buffers = _read_body(fd, header, allocate, wanted)
    except OSError as exc:
        raise Rejected("io", str(exc)) from None
    finally:
        os.close(fd)
    return header, _payload(header, buffers)


def _wanted(header: Header, checkpoints: Collection[int] | None, draft: bool = True) -> list[bool]:
    """Per body section, whether a read with these checkpoint positions returns it."""
    out = [True]
    for c in header.checkpoints:
        take = checkpoints is None or c.n_tokens in checkpoints
        out += [take] * ((c.data_bytes is not None) + (c.n_logits is not None))
    return out + [draft] * (len(header.sections) - len(out))  # the drafter's sequence



def _read_body(fd: int, header: Header, allocate, wanted: Sequence[bool] | None = None) -> list[np.ndarray | None]:
    """The wanted body sections (all by default) into buffers from `allocate` (None for the
    others), each block read and checked against its checksum on a reader thread, `READERS`
    blocks in flight. Raises Rejected (the first failing block in file order) once no reader
    touches the buffers any more."""
    wanted = [True] * len(header.sections) if wanted is None else wanted
    buffers = [allocate(s.nbytes) if w else None for s, w in zip(header.sections, wanted)]
    jobs = []
    offset = header.head_bytes
    for si, (buf, crcs, section) in enumerate(zip(buffers, header.crcs, header.sections)):
        if buf is None:
            offset += section.nbytes
            continue
        view = memoryview(buf).cast("B")
        for bi, start in enumerate(range(0, len(view), BLOCK)):
            block = view[start : start + BLOCK]
            jobs.append(_read_pool.submit(_read_block, fd, block, offset, crcs[bi], si))
            offset += len(block)
    done, pending = concurrent.futures.wait(jobs, return_when=concurrent.futures.FIRST_EXCEPTION)
    if pending:  # a block failed: stop the others, and wait for those already reading
        for job in pending:
            job.cancel()
        concurrent.futures.wait(jobs)
    for job in jobs:
        if not job.cancelled() and job.exception() is not None:
            raise job.exception()
    return buffers


def _read_block(fd: int, block: memoryview, offset: int, want: int, section: int) -> None:
    """Read one block at `offset` into `block` and verify it (a reader thread; both the read
    and the checksum release the GIL)."""
    got = 0
    while got < len(block):
        n = os.preadv(fd, [block[got:]], offset + got)
        if n == 0:
            raise Rejected("truncated", "the file ended early")
        got += n
    if zlib.crc32(block) != want:
        raise Rejected("checksum", f"a block of section {section} does not match its checksum")


def _payload(header: Header, buffers: list[np.ndarray | None]) -> Payload:
    for b in buffers:
        if b is not None:
            b.flags.writeable = False
    it = iter(buffers)
    state = next(it)
    checkpoints = []
    for c in header.checkpoints:
        data = next(it) if c.data_bytes is not None else None
        logits = next(it) if c.n_logits is not None else None
        if data is None and logits is None:
            continue  # not read
        checkpoints.append(Checkpoint(c.n_tokens, data, None if logits is None else logits.view(np.float32)))
    draft = None
    if header.draft is not None and buffers[-1] is not None:
        d = header.draft
        draft_state = next(it)
        extra = tuple(next(it).view(np.dtype(dtype)).reshape(shape) for dtype, shape in d.extra)
        draft = DraftState(header.tokens[: d.n_shared] + d.tail, draft_state, extra, d.fingerprint)
    return Payload(state, tuple(checkpoints), draft)
