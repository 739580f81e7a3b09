"""The disk tier's writer thread: it writes the queued entries (write, fsync, rename),
deletes evicted files, drops entries past their retention, and saves the last-use times
every few seconds. Without a thread (`background=False`) the same jobs run in `flush()`.
Part of `DiskCache` (store.py)."""

from __future__ import annotations

import json
import logging
import os
import queue
import time

from .. import segments
from . import format as fmt
from .directory import LRU_FILE, unlink
from .index import DiskEntry

log = logging.getLogger("warmslot.cache.disk")

LRU_EVERY = 5.0  # seconds between saves of changed last-use times
SWEEP_EVERY = 60.0  # seconds between sweeps for entries past their retention


class DiskWriter:
    """The jobs `DiskCache` queues (write, delete, sync, stop), run on the writer thread."""

    def _writer(self) -> None:
        while True:
            try:
                if not self._run_jobs(block=True):
                    return
            except Exception:  # noqa: BLE001 - the writer must outlive any one failure
                log.exception("disk cache: the writer failed a job")

    def _run_jobs(self, block: bool) -> bool:
        """Run queued jobs (one, waiting for it, when `block`; else all there are). False
        once told to stop."""
        while True:
            try:
                kind, arg = self._jobs.get(timeout=LRU_EVERY) if block else self._jobs.get_nowait()
            except queue.Empty:
                kind, arg = None, None
            if kind == "write":
                self._write(arg)
            elif kind == "delete":
                unlink(os.path.join(self.directory, arg))
            elif kind == "sync":
                self._save_lru()
                arg.set()
            elif kind == "stop":
                return False
            if block:
                self._housekeeping()
                return True
            if kind is None:
                return True

    def _write(self, entry: DiskEntry) -> None:
        with self._lock:
            payload, base = entry.pending, entry.base
            if not entry.alive:
                self.stats.queued_bytes -= entry.nbytes
                entry.pending = None
                return
            # a base is queued before what continues it, and goes with it: it is written
            ref = fmt.BaseRef(base.name, entry.base_len, base.header.crcs[0]) if base is not None else None
        t0 = time.monotonic()
        try:
            state = payload.state if entry.cut is None else segments.join([entry.cut], segments.ordinary)
            # the planned header (a later touch changes last_used, whose digits change the size)
            header = fmt.write(self.directory, entry.name, entry.meta, entry.tokens, state, payload.checkpoints, payload.draft,
                               entry.linear, ref)
            if header.file_bytes != entry.nbytes:
                unlink(os.path.join(self.directory, entry.name))
                raise OSError(f"wrote {header.file_bytes} bytes, {entry.nbytes} were planned")
        except OSError as exc:
            log.error("disk cache: writing %s failed: %s", entry.name, exc)
            self.stats.write_errors += 1
            with self._lock:
                self.stats.queued_bytes -= entry.nbytes
                entry.pending, entry.cut = None, None
                self._drop(entry, None)  # with the segments continuing it
            return
        self.stats.writes += 1
        self.stats.write_bytes += header.file_bytes
        self.stats.write_seconds += time.monotonic() - t0
        with self._lock:
            entry.header = header
            entry.pending, entry.cut = None, None
            self.stats.queued_bytes -= entry.nbytes
            alive = entry.alive
        if not alive:  # evicted while it was being written
            unlink(os.path.join(self.directory, entry.name))

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= SWEEP_EVERY:
            self._swept_at = now
            wall = self._clock()
            with self._lock:
                for entry in [e for e in self._index.entries() if e.stale is None and e.expired(wall)]:
                    self._drop(entry, "expired")
        if self._lru_dirty and now - self._lru_saved_at >= LRU_EVERY:
            self._save_lru()

    def _save_lru(self) -> None:
        """Write the last-use times atomically (temporary file, fsync, rename)."""
        with self._lock:
            if not self._lru_dirty:
                return
            self._lru_dirty = False
            times = {e.name: round(e.last_used, 3) for e in self._index.entries()}
        self._lru_saved_at = time.monotonic()
        path = os.path.join(self.directory, LRU_FILE)
        tmp = os.path.join(self.directory, f".{LRU_FILE}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
            with os.fdopen(fd, "wb") as f:  # a buffered file writes all of it
                f.write(json.dumps({"version": 1, "last_used": times}).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("disk cache: saving the last-use times failed: %s", exc)
            unlink(tmp)
