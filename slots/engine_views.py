"""What the HTTP side reads of the engine: the snapshot of its slots, queue and prompt cache
(the light one published after every step, or a detailed one taken between steps), and the
prompt cache's and disk tier's counters. Part of `Engine` (engine.py)."""

from __future__ import annotations

import time
from typing import Callable

from .snapshot import EngineSnapshot, take_snapshot

# a step publishes the light snapshot when a slot's request or phase changed, else at most
# this often: describing every sequence is work that grows with the spare sequences, and a
# decode step of one stream need not pay for dozens of idle ones each time
PUBLISH_EVERY_S = 0.05


class EngineViews:
    """The engine's views for other threads, and the snapshot its thread publishes."""

    def snapshot(self, *, detail: bool = False, timeout: float = 10.0, visible: Callable[[str], bool] | None = None) -> EngineSnapshot | None:
        """The slots, queue and prompt cache. detail=False: the view published after the last
        step (any thread, no wait; None before the model is loaded). detail=True: a fresh one
        with every checkpoint and cache entry, taken on the engine thread between steps; only
        tenants for which `visible(tenant)` holds show their details (None: all)."""
        if not detail:
            return self._published
        return self.call(lambda engine: engine._take_snapshot(detail=True, visible=visible)).result(timeout)

    @property
    def cache_stats(self):
        """The prompt cache's counters (plain numbers, read at scrape time); None without a cache."""
        return self.cache.stats if self.cache is not None else None

    @property
    def disk_view(self):
        """The disk tier's sizes and counters (a copy; any thread); None without one."""
        return self.disk.view() if self.disk is not None else None

    @property
    def queue_depth(self) -> int:
        return self.admission.n_queued

    def _take_snapshot(self, *, detail: bool, visible: Callable[[str], bool] | None = None) -> EngineSnapshot:
        return take_snapshot(
            self.slots, self.cache, self.ctx or self._asleep, self.queue_depth, detail=detail, visible=visible, stats=self.stats,
        )

    def _publish(self, *, force: bool = True) -> None:
        """Replace the light snapshot that /metrics reads (one reference swap). Unforced (after
        a step): only when a slot took, finished or advanced a request's phase, or
        PUBLISH_EVERY_S after the last one."""
        now = time.monotonic()
        shape = tuple((s.active.req.id, s.active.prefill_done) if s.active is not None else None for s in self.slots)
        if not force and shape == self._published_shape and now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published = self._take_snapshot(detail=False)
        self._published_shape, self._published_at = shape, now
