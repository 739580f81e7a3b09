"""Evicting files from the page cache, so that a benchmark's next read comes from the device.

posix_fadvise(DONTNEED) drops a file's clean pages without root (unlike
/proc/sys/vm/drop_caches) and without touching other files. fdatasync first makes every page
clean: the disk tier fsyncs what it writes, so this is nearly free, and it makes the drop hold
for a file that is still being written back too.
"""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(path: str | os.PathLike) -> int:
    """Evict `path` from the page cache: a file, or each file directly inside a directory.
    Returns the bytes advised."""
    path = Path(path)
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
    n = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return n
