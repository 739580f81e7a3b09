"""The disk tier below the RAM prompt cache: entries that survive restarts.

- `format`: the verified file format (also used for slot files, --slot-save-path), and
  `records`: what it reads and writes (an entry's metadata, head and bytes, rejections);
- `index`: the per-tenant token index of a directory's entries, in LRU order;
- `store`: `DiskCache`, the directory with its budget, writer thread and verified reads
  (its writer thread in `writer`, its directory's lock and start-up index in `directory`).
"""

from .records import REASONS, Meta, Payload, Rejected
from .directory import DiskInUse
from .index import DiskEntry, DiskMatch
from .store import DiskCache, DiskLookup, DiskStats

__all__ = ["REASONS", "DiskCache", "DiskEntry", "DiskInUse", "DiskLookup", "DiskMatch", "DiskStats", "Meta", "Payload", "Rejected"]
