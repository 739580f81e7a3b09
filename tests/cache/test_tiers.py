"""The three tiers behind one interface (`warmslot.slots.reuse.tiers.Tier`): the device's sequences,
the RAM prompt cache and the disk.

First the contract, on each tier alone (no model): it is a `Tier`, an empty tier offers
nothing, and a conversation placed in it is matched, given back and counted. Then the same
through the real engine on a tiny model: a conversation placed in each tier is matched by
that tier, served from it with the cold run's answer, and counted in its `counters()`.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from warmslot.cache.checkpoints import CheckpointList
from warmslot.cache.disk import DiskCache
from warmslot.cache.entries import CacheEntry
from warmslot.cache.prompt_cache import PromptCache
from warmslot.slots import GenerateRequest, QueueSink
from warmslot.slots.requests import Source
from warmslot.slots.slot import Slot
from warmslot.slots.stats import EngineStats
from warmslot.slots.reuse.tiers import DeviceTier, DiskTier, RamTier, Tier, TierCounters, TierMatch
from warmslot.slots.reuse.tiers.routes import Fork, FromDisk, KeepSlot, Load
from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine

FP = "model-a:f32:f32:0:u"
A = random_tokens(60, 40)
NEXT = A + random_tokens(61, 8)


def _request(tokens, tenant="") -> GenerateRequest:
    return GenerateRequest("probe", list(tokens), QueueSink(), tenant=tenant)


def _state(n: int) -> np.ndarray:
    a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    a.flags.writeable = False
    return a


def _entry(tokens) -> CacheEntry:
    return CacheEntry(tuple(tokens), _state(1000), CheckpointList(4, 1 << 20), "", FP, time.monotonic(), prompt_end=len(tokens))


class Placed:
    """A tier with a way to place conversation A in it, and what its offer for A is."""

    def __init__(self, tmp_path, name: str) -> None:
        self.name = name
        self.stats = EngineStats()
        self.ram = PromptCache(1 << 20, FP, True)
        self.slots = [Slot(0, CheckpointList(4, 1 << 20)), Slot(1, CheckpointList(4, 1 << 20))]
        self.store = None
        if name == "device":
            self.tier = DeviceTier(self.slots, lambda slot: (lambda n: True), True, self.ram, self.stats)
        elif name == "ram":
            self.tier = RamTier(self.ram, True, self.stats)
        else:
            self.store = DiskCache(str(tmp_path / "disk"), 1 << 20, FP, True, background=False)
            self.tier = DiskTier(self.store, self.ram, self.stats, (4, 1 << 20), wake=lambda fn: fn())

    def place(self, tokens) -> None:
        if self.name == "device":
            self.slots[0].tokens = list(tokens)
            self.slots[0].prompt_end = len(tokens)
        else:
            assert self.tier.put(_entry(tokens))

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


OFFERS = {"device": (KeepSlot, Fork), "ram": (Load,), "disk": (FromDisk,)}


@pytest.fixture(params=["device", "ram", "disk"])
def placed(request, tmp_path):
    p = Placed(tmp_path, request.param)
    yield p
    p.close()


def test_each_tier_is_a_tier_and_an_empty_one_offers_nothing(placed):
    tier = placed.tier
    assert isinstance(tier, Tier)
    found = tier.match(_request(NEXT))
    assert isinstance(found, TierMatch) and found.offers == [] and found.usable == 0
    assert tier.give_up() == []
    counters = tier.counters()
    assert isinstance(counters, TierCounters) and counters.source is tier.source and counters.entries == 0


def test_a_conversation_placed_in_a_tier_is_matched_given_back_and_counted(placed):
    tier = placed.tier
    placed.place(A)
    found = tier.match(_request(NEXT))
    assert found.matched == len(A) and found.usable == len(A)
    offer = max(found.offers, key=lambda o: o.usable)
    assert isinstance(offer, OFFERS[placed.name])
    assert tier.ready(offer)  # the disk's entry is still queued for writing: its bytes are in memory
    given = tier.take(offer)
    assert tuple(given.tokens) == tuple(A)
    assert tier.match(_request(NEXT, tenant="other")).offers == []  # another tenant sees nothing
    (release,) = tier.give_up()
    assert release.tokens == len(A)
    counters = tier.counters()
    assert counters.entries == 1
    if placed.name == "disk":
        assert counters.hits == 1 and counters.nbytes > 0
    if placed.name == "device":
        assert not tier.put(_entry(A))  # the device takes a conversation only through a route


def test_a_written_disk_entry_is_fetched_before_it_is_given(tmp_path):
    placed = Placed(tmp_path, "disk")
    try:
        placed.place(A)
        placed.store.flush()  # written: its bytes leave memory
        (offer,) = placed.tier.match(_request(NEXT)).offers
        assert offer.cost > 0 and not placed.tier.ready(offer)
        placed.tier.fetch(offer.entry, "probe", offer.need)
        deadline = time.monotonic() + 30
        while placed.tier.waiting("probe") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert placed.tier.ready(offer)
        assert tuple(placed.tier.take(offer).tokens) == tuple(A)
        assert placed.tier.counters().hits == 1
    finally:
        placed.close()


# -- through the engine ------------------------------------------------------------------------


def _tiers(engine):
    """The engine's router's tiers, asked on the engine thread."""
    router = getattr(engine, "router", None) or engine.loaded.router
    return {t.source: t for t in router.tiers}


def _match(engine, source: Source, tokens) -> TierMatch:
    return engine.call(lambda e: _tiers(e)[source].match(_request(tokens))).result(30)


def _counters(engine, source: Source) -> TierCounters:
    return engine.call(lambda e: _tiers(e)[source].counters()).result(30)


PROMPT = random_tokens(62, 120)
TURN = PROMPT + random_tokens(63, 20)
OTHER = random_tokens(64, 120)


@pytest.mark.model
def test_a_conversation_on_the_device_is_matched_served_and_counted(tiny_models):
    path = tiny_models["attention"]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        generate(engine, PROMPT)
        assert [t for t in _tiers(engine)] == [Source.SLOT, Source.RAM]  # asked in this order
        found = _match(engine, Source.SLOT, TURN)
        assert found.usable == len(PROMPT) and isinstance(found.offers[0], KeepSlot)
        before = _counters(engine, Source.SLOT)
        warm = generate(engine, TURN, return_prompt_logits=True)
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("slot", len(PROMPT))
        assert _counters(engine, Source.SLOT).served_tokens == before.served_tokens + len(PROMPT)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, TURN))


@pytest.mark.model
def test_a_conversation_in_ram_is_matched_served_and_counted(tiny_models):
    path = tiny_models["attention"]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        generate(engine, PROMPT)
        generate(engine, OTHER)  # the one slot goes to another conversation: PROMPT moves to RAM
        found = _match(engine, Source.RAM, TURN)
        assert found.usable == len(PROMPT) and isinstance(found.offers[0], Load)
        assert _match(engine, Source.SLOT, TURN).usable == 0
        before = _counters(engine, Source.RAM)
        assert before.entries >= 1 and before.nbytes > 0
        warm = generate(engine, TURN, return_prompt_logits=True)
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("ram", len(PROMPT))
        after = _counters(engine, Source.RAM)
        assert after.hits == before.hits + 1 and after.served_tokens == before.served_tokens + len(PROMPT)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, TURN))


@pytest.mark.model
def test_a_conversation_on_disk_is_matched_served_and_counted(tiny_models, tmp_path):
    path = tiny_models["attention"]
    disk = dict(REUSE_ENGINE, cache_disk=str(tmp_path / "disk"), cache_disk_size=64 << 20)
    engine = tiny_engine(path, **disk)
    try:
        generate(engine, PROMPT)
    finally:
        engine.stop()  # the slot's contents are written on the way out
    engine = tiny_engine(path, **disk)
    try:
        assert [t for t in _tiers(engine)] == [Source.SLOT, Source.RAM, Source.DISK]
        found = _match(engine, Source.DISK, TURN)
        assert found.usable == len(PROMPT) and isinstance(found.offers[0], FromDisk)
        assert _match(engine, Source.RAM, TURN).usable == 0
        before = _counters(engine, Source.DISK)
        assert before.entries == 1 and before.hits == 0
        warm = generate(engine, TURN, return_prompt_logits=True)
        assert (warm.reuse.source, warm.usage.cached_tokens) == ("disk", len(PROMPT))
        after = _counters(engine, Source.DISK)
        assert after.hits == 1 and after.served_tokens == len(PROMPT)
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, TURN))
