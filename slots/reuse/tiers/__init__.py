"""The tiers a conversation lives in, behind one interface (`Tier`, base.py): the device's
sequences (device.py), the RAM prompt cache (ram.py) and the disk (disk.py). The router
(slots/reuse/router.py) asks them in that order; routes.py holds the routes they offer."""

from .base import Found, Release, Tier, TierCounters, TierMatch
from .device import DeviceTier
from .disk import DiskTier
from .ram import RamTier

__all__ = ["DeviceTier", "DiskTier", "Found", "RamTier", "Release", "Tier", "TierCounters", "TierMatch"]
