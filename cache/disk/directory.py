"""The disk tier's directory: opened (created owner-only) and locked against other
processes, and its index rebuilt at start from the entries' heads: damaged files and those
left by interrupted writes are deleted, files of another model or format version are kept
but evicted first, segments are linked to their bases (one whose base is gone or was
written again is deleted), and the directory is evicted down to its budget. Part of `DiskCache`
(store.py)."""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import time

from . import format as fmt
from .index import DiskEntry
from .records import Rejected

log = logging.getLogger("warmslot.cache.disk")

LRU_FILE = "last-used.json"
LOCK_FILE = ".lock"


class DiskInUse(Exception):
    """Another process holds the directory."""


class DiskDirectory:
    """Opening `DiskCache`'s directory and indexing it at start (the constructor's thread)."""

    def _open_directory(self) -> int:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        mode = os.stat(self.directory).st_mode
        if mode & 0o077:
            log.warning("disk cache: %s is accessible to other users; its entries are owner-only files", self.directory)
        fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DiskInUse(f"{self.directory} is in use by another process") from None
        return fd

    def _rebuild(self) -> None:
        """Index the directory from the entries' heads; delete damaged files and those left
        by interrupted writes; evict down to the budget."""
        t0 = time.monotonic()
        lru = self._read_lru()
        now = self._clock()
        n = 0
        segments: list[DiskEntry] = []
        for de in os.scandir(self.directory):
            name = de.name
            if name in (LOCK_FILE, LRU_FILE):
                continue
            n += 1
            path = os.path.join(self.directory, name)
            if name.startswith(".") and name.endswith(".tmp"):
                self.reject(Rejected("incomplete", "a write that never finished; deleted"), name)
                unlink(path)
                continue
            if not name.endswith(fmt.SUFFIX) or not de.is_file(follow_symlinks=False):
                self.reject(Rejected("not_entry", "not a cache entry; left alone"), name)
                continue
            try:
                header = fmt.read_header(path)
            except Rejected as exc:
                self.reject(exc, name)
                if exc.reason in ("empty", "truncated", "checksum"):
                    unlink(path)
                elif exc.reason == "version":
                    self._add_stale(name, de, lru, exc.reason)
                continue
            meta = header.meta
            last_used = max(meta.last_used, lru.get(name, 0.0))
            if meta.fingerprint != self.fingerprint:
                self.reject(Rejected("model", f"written for {meta.fingerprint}, this server is {self.fingerprint}"), name, meta.tenant, header.tokens)
                self._add_stale(name, de, lru, "model", header=header)
                continue
            entry = DiskEntry(
                name=name, tokens=header.tokens, tenant=meta.tenant, fingerprint=meta.fingerprint,
                nbytes=header.file_bytes, state_bytes=header.state_bytes, infos=header.checkpoints,
                prompt_end=meta.prompt_end, last_used=last_used, keep_s=meta.keep_s, header=header, linear=header.linear,
            )
            if entry.expired(now):
                self.stats.expired += 1
                unlink(path)
                continue
            if header.base is not None:
                segments.append(entry)
                continue
            self._index.add(entry)
        self._link(segments)
        while self._index.nbytes > self.budget:
            self._drop(self._index.lru_victim(), "evicted")
        self._run_jobs(block=False)
        self.stats.index_seconds = time.monotonic() - t0
        self.stats.index_files = n
        log.info(
            "disk cache %s: %d entries (%.1f MiB of %.1f MiB) indexed from %d files in %.3f s%s",
            self.directory, self._index.n_usable, self._index.nbytes / (1 << 20), self.budget / (1 << 20), n,
            self.stats.index_seconds, _rejected_text(self.stats.rejected),
        )

    def _link(self, segments: list[DiskEntry]) -> None:
        """Index the segments whose bases are indexed (bases first: a chain links in as many
        passes as it has links); delete the others."""
        while segments:
            left, waiting = [], {e.name for e in segments}
            for entry in segments:
                ref = entry.header.base
                base = self._index.get(ref.name)
                if base is None and ref.name in waiting:
                    left.append(entry)  # its base is a segment not linked yet
                    continue
                why = _unlinkable(entry, base, self.parse is not None)
                if why:
                    self.reject(Rejected("base", why), entry.name, entry.tenant, entry.tokens)
                    unlink(os.path.join(self.directory, entry.name))
                    continue
                entry.base, entry.base_len = base, ref.n_tokens
                self._index.add(entry)
            if len(left) == len(segments):  # a cycle: only a damaged directory has one
                for entry in left:
                    self.reject(Rejected("base", "its chain of bases loops"), entry.name)
                    unlink(os.path.join(self.directory, entry.name))
                return
            segments = left

    def _add_stale(self, name: str, de: os.DirEntry, lru: dict, reason: str, header: fmt.Header | None = None) -> None:
        st = de.stat(follow_symlinks=False)
        self._index.add(DiskEntry(
            name=name, tokens=(), tenant="", fingerprint="", nbytes=st.st_size, state_bytes=0, infos=(),
            prompt_end=0, last_used=lru.get(name, header.meta.last_used if header else st.st_mtime), keep_s=None,
            stale=reason,
        ))

    def _read_lru(self) -> dict[str, float]:
        try:
            with open(os.path.join(self.directory, LRU_FILE), "rb") as f:
                doc = json.loads(f.read())
            return {str(k): float(v) for k, v in doc["last_used"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("disk cache: ignoring %s (%s); last uses come from the entries' headers", LRU_FILE, exc)
            return {}


def unlink(path: str) -> None:
    """Delete a file; one that is already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unlinkable(entry: DiskEntry, base: DiskEntry | None, parses: bool) -> str:
    """Why a segment cannot continue `base` (the entry its header names), or ""."""
    ref = entry.header.base
    if not parses:
        return "this server reads no segments of this memory"
    if base is None or base.stale is not None:
        return f"its base {ref.name} is gone"
    if base.header is None or base.header.crcs[0] != ref.state_crcs or not base.linear:
        return f"its base {ref.name} was written again"
    if ref.n_tokens > len(base) or base.tenant != entry.tenant or base.tokens[:ref.n_tokens] != entry.tokens[:ref.n_tokens]:
        return f"its base {ref.name} holds other tokens"
    return ""


def _rejected_text(rejected: collections.Counter) -> str:
    if not rejected:
        return ""
    return "; skipped " + ", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items()))
