"""The disk tier below the RAM prompt cache: entries that survive restarts.

- `format`: the verified file format (also used for slot files, --slot-save-path);
- `index`: the per-tenant token index of a directory's entries, in LRU order;
- `store`: `DiskCache`, the directory with its budget, writer thread and verified reads.
"""

from .format import REASONS, Meta, Payload, Rejected
from .index import DiskEntry, DiskMatch
from .store import DiskCache, DiskInUse, DiskLookup, DiskStats

__all__ = ["REASONS", "DiskCache", "DiskEntry", "DiskInUse", "DiskLookup", "DiskMatch", "DiskStats", "Meta", "Payload", "Rejected"]
