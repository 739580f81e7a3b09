"""Tests of reuse and the tiers: prefix reuse, the router, the RAM prompt cache, the disk tier, device streams."""
