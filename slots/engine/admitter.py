"""Admission applied: the requests waiting in `Admission`'s queue are given slots in arrival
order. Each is routed (router.py), its prefix applied to the slot (prefix.py), and the slot
activated with the request's sampler; a request that waits for another slot's prefill to
pass their shared prefix lets later requests go first. Engine thread only, once per step."""

from __future__ import annotations

import bisect
import logging
import time

from .admission import Admission
from ..llama_api import Context, GrammarError, Model, Sampler
from ..reuse.memory import SlotMemory
from ..step.postprocess import Postprocess
from ..reuse.other_scopes import held_under_other_adapters, other_adapters_reason
from ..reuse.prefix import Prefixes
from ..requests import EngineError, ErrorKind, GenerateRequest, Reuse, Source
from ..reuse.router import Fetch, Fork, FromDisk, Route, Router, Wait
from ..slot import Active, Slot
from ..stats import CopyCause, EngineStats
from ..step.text import TextStream
from ..reuse.tiers.disk import DiskTier

log = logging.getLogger("warmslot.engine")

__all__ = ["Admitter", "moved_bytes"]


def moved_bytes(before: dict, after: dict) -> dict[str, int]:
    """State bytes copied between two readings of the engine's copy counters, by direction."""
    out: dict[str, int] = {}
    for cause, n in after.items():
        delta = n - before.get(cause, 0)
        if delta:
            way = "ram_to_device" if cause is CopyCause.LOAD else "device_to_ram"
            out[way] = out.get(way, 0) + int(delta)
    return out


class Admitter:
    """Waiting requests started on slots."""

    def __init__(
        self, admission: Admission, router: Router, prefixes: Prefixes, memory: SlotMemory, post: Postprocess,
        model: Model, ctx: Context, stats: EngineStats, disk: DiskTier | None = None, adapters: bool = False,
    ) -> None:
        self.admission = admission
        self.router = router
        self.prefixes = prefixes
        self.memory = memory
        self.post = post
        self.model = model  # the requests' samplers are built on it
        self.ctx = ctx
        self.stats = stats
        self.disk = disk
        self.adapters = adapters  # LoRA adapters are loaded: a miss may be another set's prefix

    def admit(self) -> None:
        """Give waiting requests slots, in arrival order. A request that waits for another
        slot's prefill to pass their shared prefix lets later requests go first."""
        i = 0
        held: set[str] = set()  # passed over in this loop: their siblings wait behind them
        waiting = self.admission.waiting
        while i < len(waiting):
            req = waiting[i]
            route = Wait(None) if req.sibling_of in held else self.router.route(req)
            if isinstance(route, Fetch):  # read from disk first; its siblings wait behind it
                self.disk.fetch(route.entry, req.id, route.need)
                held.add(req.id)
                i += 1
                continue
            # NOTE: a fork between streams is pending until the next decode; more forks of the
            # same donor may join it (llama.cpp performs every pending copy then), nothing else
            if self.memory.fork_pending and not (isinstance(route, Fork) and route.donor is self.memory.fork_donor):
                return
            if isinstance(route, Wait):
                if route.for_slot is None and req.sibling_of not in held and not self.router.quick_room():
                    return  # no idle slot, and none for a quick request further on (router.py)
                if route.for_slot is not None:
                    self._want_checkpoint(route.for_slot, route.shared)
                held.add(req.id)
                i += 1
                continue
            self.admission.admitted(i)
            self.stats.queue_wait.observe(time.monotonic() - req.submitted)
            quick = self.router.saturated()
            try:
                self._start(route, req, quick)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
                log.exception("slot %d: request %s failed to start", route.target.id, req.id)
                route.target.active = None
                self.memory.clear(route.target)
                self.admission.reject(req, EngineError(ErrorKind.INTERNAL, f"internal error starting the request: {type(exc).__name__}: {exc}"))

    def _want_checkpoint(self, slot: Slot, n: int) -> None:
        """Ask a prefilling slot to stop at n (and checkpoint there) for a request waiting to
        share its first n tokens. Attention memory can be forked at any position."""
        active = slot.active
        if not self.ctx.memory_kind.truncatable and n > slot.n_past and n not in active.cuts:
            bisect.insort(active.cuts, n)

    def _start(self, route: Route, req: GenerateRequest, quick: bool = False) -> None:
        try:
            sampler = Sampler(self.model, req.sampling)
        except GrammarError as exc:
            self.admission.reject(req, EngineError(ErrorKind.INVALID, str(exc)))
            return
        before = dict(self.stats.copy_bytes)
        # read before the prefix is taken, which may move what the slot held
        other = held_under_other_adapters(req, self.router.slots, self.router.cache) if self.adapters else 0
        try:
            reuse, plan = self.prefixes.take(route, req)
            if other > reuse.matched and reuse.cached < other:
                reuse.reason = other_adapters_reason(other)
            self._activate(route.target, req, sampler, reuse, quick)
        except BaseException:
            sampler.close()  # the request never became active
            raise
        reuse.state_bytes = moved_bytes(before, self.stats.copy_bytes)
        if isinstance(route, FromDisk) and reuse.source is Source.DISK and self.disk.taken_bytes:
            reuse.state_bytes["disk_to_ram"] = self.disk.taken_bytes  # read (by a reader thread) for this request
        if reuse.cached == len(req.tokens):
            self.post.prompt_done_from_logits(route.target, plan.logits)

    def _activate(self, slot: Slot, req: GenerateRequest, sampler: Sampler, reuse: Reuse, quick: bool = False) -> None:
        keep = reuse.cached
        active = Active(
            req=req,
            sampler=sampler,
            text=TextStream(req.stop, req.n_indent),
            reuse=reuse,
            cuts=self.prefixes.cuts(req, keep),
            quick=quick,
        )
        self.stats.quick_starts += quick
        slot.active = active
        slot.tenant = req.scope
        slot.prompt_end = len(req.tokens)
        slot.last_used = time.monotonic()
        self.prefixes.park_idle(keep=slot)
        active.event().started = True
        active.event().admitted_at = active.admitted
        active.event().reuse = reuse
        active.report_progress(keep, at_start=True)
        log.debug("slot %d: request %s, %d prompt tokens, kept %d from %s (%s)", slot.id, req.id, len(req.tokens), keep, reuse.source, reuse.reason)
