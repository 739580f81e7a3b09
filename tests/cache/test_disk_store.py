"""The disk tier's file format and `DiskCache` on their own, with real files: round trips,
every rejection reason, the exact budget, LRU across reopenings, retention, tenants, and
loads of entries whose write is still queued."""

import json
import os
import stat

import numpy as np
import pytest

from warmslot.cache.checkpoints import Checkpoint
from warmslot.cache.disk import DiskCache, DiskInUse, Meta, Rejected
from warmslot.cache.disk import format as fmt
from warmslot.cache.entries import DraftState

FP = "model-a:f16:f16:0:u"


def state(n: int, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    a.flags.writeable = False
    return a


def ckpts(*positions, nbytes=64, logits_at=None):
    out = []
    for p in positions:
        logits = np.arange(8, dtype=np.float32) + p if p == logits_at else None
        out.append(Checkpoint(p, state(nbytes, p), logits))
    if logits_at is not None and logits_at not in positions:
        out.append(Checkpoint(logits_at, None, np.arange(8, dtype=np.float32)))
    return sorted(out, key=lambda c: c.n_tokens)


def usable(entry, matched):
    return matched


def write_one(tmp_path, name="e.wsc", tokens=(1, 2, 3, 4, 5), nbytes=1000, **meta):
    m = Meta(meta.get("fingerprint", FP), meta.get("tenant", ""), len(tokens), 1000.0, meta.get("keep_s"))
    header = fmt.write(str(tmp_path), name, m, tokens, state(nbytes), ckpts(2, 4, logits_at=5))
    return tmp_path / name, header


# -- the format ---------------------------------------------------------------------------------


def test_round_trip_keeps_tokens_state_checkpoints_and_logits(tmp_path):
    path, written = write_one(tmp_path, tokens=tuple(range(300)), nbytes=3 * fmt.BLOCK + 17)
    assert path.stat().st_size == written.file_bytes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    header = fmt.read_header(str(path))
    assert header.tokens == tuple(range(300)) and header.meta.fingerprint == FP
    assert [len(c) for c in header.crcs] == [4, 1, 1, 1]  # the state spans 4 blocks
    header2, payload = fmt.read(str(path), expect=header)
    assert np.array_equal(payload.state, state(3 * fmt.BLOCK + 17))
    assert [c.n_tokens for c in payload.checkpoints] == [2, 4, 5]
    assert np.array_equal(payload.checkpoints[1].data, state(64, 4))
    assert payload.checkpoints[2].data is None and np.array_equal(payload.checkpoints[2].logits, np.arange(8, dtype=np.float32))
    assert not payload.state.flags.writeable


def test_a_drafters_sequence_round_trips_with_its_extra_arrays(tmp_path):
    """A draft model's or MTP block's sequence (speculative decoding) is written after the
    checkpoints: its tokens as the entry's shared prefix and a tail, its state and its extra
    arrays with their dtypes and shapes; the planned size is the written size, and a flipped
    byte in it is caught when the entry is loaded."""
    tokens = tuple(range(40))
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows.flags.writeable = False
    draft = DraftState(tokens[:30] + (7, 8), state(3000, 9), (np.array([27], dtype=np.int64), rows), "drafter-x")
    m = Meta(FP, "", 40, 1000.0)
    c = ckpts(10, logits_at=40)
    plan = fmt.plan(m, 40, 1000, fmt.checkpoint_infos(c), fmt.DraftInfo.of(draft, tokens))
    written = fmt.write(str(tmp_path), "d.wsc", m, tokens, state(1000), c, draft)
    path = tmp_path / "d.wsc"
    assert plan.file_bytes == written.file_bytes == path.stat().st_size
    header, payload = fmt.read(str(path), checkpoints=set())
    assert (header.draft.n_shared, header.draft.tail) == (30, (7, 8))
    got = payload.draft
    assert (got.tokens, got.fingerprint) == (draft.tokens, "drafter-x") and np.array_equal(got.state, draft.state)
    assert got.extra[0].tolist() == [27] and got.extra[1].dtype == np.float32 and np.array_equal(got.extra[1], rows)
    assert payload.nbytes == 1000 + got.nbytes  # no checkpoint asked for
    data = bytearray(path.read_bytes())
    data[-60] ^= 0xFF  # inside the extra rows, the last section
    path.write_bytes(bytes(data))
    with pytest.raises(Rejected) as exc:
        fmt.read(str(path), expect=header)
    assert exc.value.reason == "checksum"


def small_blocks_entry(tmp_path, monkeypatch):
    """An entry of many more blocks than readers (small blocks), so that a load has several
    blocks in flight and finishes them out of order."""
    monkeypatch.setattr(fmt, "BLOCK", 4096)
    n = 40 * fmt.READERS * 4096 + 123
    path, header = write_one(tmp_path, tokens=tuple(range(50)), nbytes=n)
    return path, header, n


def test_blocks_read_at_once_come_back_in_place(tmp_path, monkeypatch):
    path, header, n = small_blocks_entry(tmp_path, monkeypatch)
    assert len(header.crcs[0]) > 4 * fmt.READERS
    _, payload = fmt.read(str(path), expect=header)
    assert np.array_equal(payload.state, state(n))
    assert np.array_equal(payload.checkpoints[0].data, state(64, 2))


@pytest.mark.parametrize("block", [0, 17, 100, -1])
def test_a_flipped_byte_in_any_block_read_at_once_is_rejected(tmp_path, monkeypatch, block):
    path, header, n = small_blocks_entry(tmp_path, monkeypatch)
    blocks = len(header.crcs[0])
    data = bytearray(path.read_bytes())
    data[header.head_bytes + (block % blocks) * 4096 + 5] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(Rejected) as exc:
        fmt.read(str(path), expect=header)
    assert exc.value.reason == "checksum" and "section 0" in str(exc.value)


def test_a_file_cut_while_it_is_read_is_truncated(tmp_path, monkeypatch):
    path, header, n = small_blocks_entry(tmp_path, monkeypatch)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.truncate(path, header.head_bytes + n // 2)  # after the head was checked
        with pytest.raises(Rejected) as exc:
            fmt._read_body(fd, header, lambda k: np.empty(k, dtype=np.uint8))
    finally:
        os.close(fd)
    assert exc.value.reason == "truncated"


def test_a_read_returns_the_state_and_only_the_checkpoints_asked_for(tmp_path):
    path, header = write_one(tmp_path)  # checkpoints at 2 and 4 (state), 5 (logits only)
    _, alone = fmt.read(str(path), expect=header, checkpoints=())
    assert np.array_equal(alone.state, state(1000)) and alone.checkpoints == ()
    _, one = fmt.read(str(path), expect=header, checkpoints={4, 5})
    assert [c.n_tokens for c in one.checkpoints] == [4, 5]
    assert np.array_equal(one.checkpoints[0].data, state(64, 4)) and one.checkpoints[1].logits is not None
    # a damaged checkpoint fails the reads that return it, not those that skip it
    data = bytearray(path.read_bytes())
    data[header.head_bytes + 1000 + 3] ^= 0x01  # the checkpoint at 2 follows the state
    path.write_bytes(bytes(data))
    assert fmt.read(str(path), expect=header, checkpoints={4})[1].checkpoints[0].n_tokens == 4
    with pytest.raises(Rejected) as exc:
        fmt.read(str(path), expect=header, checkpoints={2})
    assert exc.value.reason == "checksum"


def test_the_planned_size_is_the_written_size(tmp_path):
    m = Meta(FP, "tenant", 7, 12345.678, 3600.0)
    c = ckpts(3, logits_at=7)
    plan = fmt.plan(m, 7, 5000, fmt.checkpoint_infos(c))
    header = fmt.write(str(tmp_path), "x.wsc", m, range(7), state(5000), c)
    assert plan.file_bytes == header.file_bytes == (tmp_path / "x.wsc").stat().st_size


def corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) - 100]
    elif how == "flipped_state":
        data[-900] ^= 0xFF  # inside the state (the body ends with small checkpoints)
    elif how == "flipped_tokens":
        data[fmt.read_header(str(path)).head_bytes - 8] ^= 0x01
    elif how == "empty":
        data = bytearray()
    elif how == "version":
        data[8:12] = (fmt.SEGMENT_VERSION + 1).to_bytes(4, "little")  # a version this server does not read
    elif how == "not_entry":
        data = bytearray(b"# notes\nnothing to see here\n")
    elif how == "trailing":
        data += b"\0" * 10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,reason,at_startup", [
    ("truncated", "truncated", True),
    ("flipped_tokens", "checksum", True),
    ("flipped_state", "checksum", False),  # found when the entry is loaded
    ("empty", "empty", True),
    ("version", "version", True),
    ("not_entry", "not_entry", True),
    ("trailing", "checksum", True),
])
def test_every_damage_is_rejected_with_its_reason(tmp_path, how, reason, at_startup):
    path, _ = write_one(tmp_path)
    corrupt(path, how)
    if at_startup:
        with pytest.raises(Rejected) as exc:
            fmt.read_header(str(path))
    else:
        header = fmt.read_header(str(path))
        with pytest.raises(Rejected) as exc:
            fmt.read(str(path), expect=header)
    assert exc.value.reason == reason


def test_a_file_replaced_after_indexing_is_rejected(tmp_path):
    path, first = write_one(tmp_path, tokens=(1, 2, 3, 4, 5))
    write_one(tmp_path, tokens=(1, 2, 3, 4, 6))  # another valid entry under the same name
    with pytest.raises(Rejected) as exc:
        fmt.read(str(path), expect=first)
    assert exc.value.reason == "checksum"


# -- the cache ----------------------------------------------------------------------------------


def open_cache(tmp_path, budget=1 << 20, **kw):
    return DiskCache(str(tmp_path / "disk"), budget, kw.pop("fingerprint", FP), kw.pop("truncatable", True), **kw)


def test_the_directory_is_owner_only_and_locked(tmp_path):
    cache = open_cache(tmp_path)
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "disk").st_mode) == 0o700
        with pytest.raises(DiskInUse):
            open_cache(tmp_path)
    finally:
        cache.close()
    open_cache(tmp_path).close()  # released on close


def test_entries_survive_reopening_and_loading_never_consumes_them(tmp_path):
    cache = open_cache(tmp_path)
    cache.put((1, 2, 3, 4), state(500, 1), ckpts(2), "", 4, 100.0)
    cache.put((7, 8, 9), state(300, 2), [], "", 3, 200.0)
    cache.close()
    cache = open_cache(tmp_path)
    try:
        assert cache.n_entries == 2 and cache.stats.index_files == 2
        for _ in range(2):
            found = cache.lookup((1, 2, 3, 4, 5), "", usable).best
            assert found.matched == 4
            payload = cache.read(found.entry)
            assert np.array_equal(payload.state, state(500, 1))
        assert cache.n_entries == 2 and cache.stats.reads == 2
        cache.sanity_check()
    finally:
        cache.close()


def test_a_load_while_the_write_is_queued_takes_the_bytes_from_memory(tmp_path):
    cache = open_cache(tmp_path, background=False)  # writes run at flush()
    try:
        entry = cache.put((5, 6, 7), state(400, 3), [], "", 3, 10.0)
        assert entry.pending is not None and not (tmp_path / "disk" / entry.name).exists()
        found = cache.lookup((5, 6, 7, 8), "", usable).best
        payload = cache.read(found.entry)
        assert np.array_equal(payload.state, state(400, 3))
        assert cache.stats.memory_reads == 1 and cache.stats.reads == 0
        cache.flush()
        assert entry.pending is None and (tmp_path / "disk" / entry.name).exists()
        assert np.array_equal(cache.read(entry).state, state(400, 3)) and cache.stats.reads == 1
        cache.sanity_check()
    finally:
        cache.close()


def test_tenants_are_isolated_on_disk(tmp_path):
    cache = open_cache(tmp_path)
    cache.put((1, 2, 3), state(100), [], "alice", 3, 1.0)
    cache.close()
    cache = open_cache(tmp_path)
    try:
        assert cache.lookup((1, 2, 3, 4), "bob", usable).best is None
        assert cache.lookup((1, 2, 3, 4), "bob", usable).closest is None
        assert cache.lookup((1, 2, 3, 4), "", usable).best is None
        assert cache.lookup((1, 2, 3, 4), "alice", usable).best.matched == 3
    finally:
        cache.close()


def test_budget_is_exact_and_eviction_is_lru_across_reopenings(tmp_path):
    size = fmt.plan(Meta(FP, "", 4, 0.0), 4, 1000, ()).file_bytes
    budget = 5 * size + size // 2  # room for five entries
    cache = open_cache(tmp_path, budget=budget)
    for i in range(5):
        cache.put((i, i, i, i), state(1000, i), [], "", 4, 100.0 + i)
    assert cache.n_entries == 5
    first = cache.lookup((0, 0, 0, 0), "", usable).best.entry
    cache.touch(first)  # now the most recently used
    cache.close()
    cache = open_cache(tmp_path, budget=budget)
    try:
        cache.put((9, 9, 9, 9), state(1000, 9), [], "", 4, 1e12)
        cache.flush()
        kept = sorted(e.tokens[0] for e in cache.entries())
        assert kept == [0, 2, 3, 4, 9]  # entry 1 was the least recently used
        assert cache.stats.evictions == 1
        assert sum(cache.disk_usage().values()) == cache.nbytes <= budget
        cache.sanity_check()
    finally:
        cache.close()


def test_an_entry_older_than_everything_kept_is_not_written(tmp_path):
    size = fmt.plan(Meta(FP, "", 4, 0.0), 4, 1000, ()).file_bytes
    cache = open_cache(tmp_path, budget=2 * size + 50)  # last-use times take a few bytes more
    try:
        cache.put((1, 1, 1, 1), state(1000), [], "", 4, 500.0)
        cache.put((2, 2, 2, 2), state(1000), [], "", 4, 600.0)
        assert cache.put((3, 3, 3, 3), state(1000), [], "", 4, 100.0) is None
        assert cache.put((4, 4, 4, 4), state(10 * size), [], "", 4, 900.0) is None  # larger than the budget
        assert cache.stats.refused == 2 and cache.n_entries == 2
    finally:
        cache.close()


def test_a_newer_turn_replaces_the_entry_it_covers(tmp_path):
    cache = open_cache(tmp_path)
    try:
        cache.put((1, 2, 3), state(100), [], "", 3, 1.0)
        cache.put((1, 2, 3, 4, 5), state(100), [], "", 5, 2.0)
        assert [e.tokens for e in cache.entries()] == [(1, 2, 3, 4, 5)]
        assert cache.stats.dropped_redundant == 1
        same = cache.put((1, 2, 3, 4, 5), state(100), [], "", 5, 3.0)  # already there: only touched
        assert same.last_used == 3.0 and cache.n_entries == 1
    finally:
        cache.close()


def test_non_truncatable_entries_cover_only_at_a_checkpoint(tmp_path):
    cache = open_cache(tmp_path, truncatable=False)
    try:
        cache.put((1, 2, 3), state(100), [], "", 3, 1.0)
        cache.put((1, 2, 3, 4, 5), state(100), [], "", 5, 2.0)  # no state at 3: keeps the first
        assert cache.n_entries == 2
        cache.put((1, 2, 3, 4, 5, 6), state(100), ckpts(3, 5), "", 6, 3.0)
        assert [e.tokens for e in cache.entries()] == [(1, 2, 3, 4, 5, 6)]
    finally:
        cache.close()


def test_retention_in_memory_is_never_written_and_a_duration_expires(tmp_path):
    now = [1000.0]
    cache = open_cache(tmp_path, clock=lambda: now[0])
    try:
        assert cache.put((1, 2), state(10), [], "", 2, 1000.0, keep_s=0.0) is None
        cache.put((3, 4), state(10), [], "", 2, 1000.0, keep_s=60.0)
        assert cache.lookup((3, 4, 5), "", usable).best is not None
        now[0] += 61
        assert cache.lookup((3, 4, 5), "", usable).best is None
        assert cache.stats.expired == 1 and cache.n_entries == 0
    finally:
        cache.close()
    assert not [p for p in (tmp_path / "disk").iterdir() if p.name.endswith(fmt.SUFFIX)]


def test_startup_rejects_each_damaged_file_and_keeps_the_good_ones(tmp_path):
    cache = open_cache(tmp_path)
    entries = {how: cache.put((i, 1, 2), state(1000, i), [], "", 3, float(i)) for i, how in enumerate(
        ("good", "truncated", "flipped_tokens", "flipped_state", "empty", "version"))}
    cache.close()
    d = tmp_path / "disk"
    for how, entry in entries.items():
        if how != "good":
            corrupt(d / entry.name, how)
    (d / "README.txt").write_text("a file someone left here")
    (d / ".abc.wsc.1234.tmp").write_bytes(b"half a write")
    other = DiskCache(str(tmp_path / "other"), 1 << 20, "model-b:f16:f16:0:u", True)
    other.put((50, 51, 52), state(100), [], "", 3, 1.0)
    other.close()
    for p in (tmp_path / "other").glob("*.wsc"):
        os.replace(p, d / p.name)
    cache = open_cache(tmp_path)
    try:
        assert dict(cache.stats.rejected) == {"truncated": 1, "checksum": 1, "empty": 1, "version": 1,
                                              "not_entry": 1, "incomplete": 1, "model": 1}
        usable_now = {e.tokens[0] for e in cache.entries() if e.stale is None}
        assert usable_now == {0, 3}  # flipped state bytes are only found when loaded
        with pytest.raises(Rejected):
            cache.read(cache.lookup((3, 1, 2), "", usable).best.entry)
        assert cache.stats.rejected["checksum"] == 2
        assert cache.lookup((3, 1, 2), "", usable).rejected == (3, (3, 1, 2), "checksum")
        assert cache.lookup((50, 51, 52, 53), "", usable).rejected[2] == "model"
        assert np.array_equal(cache.read(cache.lookup((0, 1, 2), "", usable).best.entry).state, state(1000, 0))
        cache.flush()
        names = {p.name for p in d.iterdir()}
        assert "README.txt" in names and entries["version"].name in names  # left alone
        for how in ("truncated", "flipped_tokens", "flipped_state", "empty"):
            assert entries[how].name not in names  # damaged: deleted
        assert not [n for n in names if n.endswith(".tmp")]
        cache.sanity_check()
    finally:
        cache.close()


def test_stale_files_count_against_the_budget_and_go_first(tmp_path):
    other = DiskCache(str(tmp_path / "disk"), 1 << 20, "model-b", True)
    other.put((1, 2, 3), state(1000), [], "", 3, 9e9)  # used "later" than anything below
    other.close()
    size = fmt.plan(Meta(FP, "", 3, 0.0), 3, 1000, ()).file_bytes
    cache = open_cache(tmp_path, budget=2 * size + 100)
    try:
        assert cache.nbytes > 0 and cache.stats.rejected["model"] == 1
        cache.put((4, 5, 6), state(1000), [], "", 3, 1.0)
        cache.put((7, 8, 9), state(1000), [], "", 3, 2.0)
        cache.flush()
        assert sorted(e.tokens for e in cache.entries()) == [(4, 5, 6), (7, 8, 9)]
        cache.sanity_check()
    finally:
        cache.close()


def test_budget_holds_under_200_alternating_conversations(tmp_path):
    budget = 40_000
    cache = open_cache(tmp_path, budget=budget)
    try:
        for i in range(200):
            conv, turn = i % 10, i // 10  # ten conversations, each growing turn by turn
            tokens = tuple([conv] * 4 + list(range(turn + 1)))
            cache.put(tokens, state(800 + 200 * turn, i), ckpts(3) if i % 2 else [], "", len(tokens), float(i))
            if i % 3 == 0:
                cache.touch(cache.entries()[0])
            assert cache.nbytes <= budget
            assert sum(cache.disk_usage().values()) <= budget  # the directory, temporary files included
        cache.flush()
        cache.sanity_check()
        assert cache.stats.evictions > 0 and cache.stats.dropped_redundant > 0
    finally:
        cache.close()
    with open(tmp_path / "disk" / "last-used.json") as f:
        assert len(json.load(f)["last_used"]) == len([p for p in (tmp_path / "disk").glob("*.wsc")])


# -- flags and request hints ---------------------------------------------------------------------


def test_disk_flags(tmp_path):
    from warmslot.server.process.config import parse_config

    config, _ = parse_config(["--cache-disk", str(tmp_path / "d"), "--cache-disk-size", "3GiB", "--cache-ram", "1GiB",
                              "--slot-save-path", str(tmp_path)])
    assert (config.engine.cache_disk, config.engine.cache_disk_size) == (str(tmp_path / "d"), 3 << 30)
    assert config.slot_save_path == str(tmp_path)
    auto, _ = parse_config(["--cache-disk", str(tmp_path / "d")])
    assert 0 < auto.engine.cache_disk_size <= 64 << 30
    for bad in (["--cache-disk", str(tmp_path), "--cache-ram", "0"], ["--slot-save-path", str(tmp_path / "missing")],
                ["--cache-disk", str(tmp_path), "--cache-disk-size", "0"], ["--cache-disk", str(tmp_path), "--cache-disk-size", "lots"]):
        with pytest.raises(SystemExit):
            parse_config(bad)


def test_prompt_cache_hints_are_parsed_and_checked():
    from warmslot.server.request.cache_hints import parse_cache_hints
    from warmslot.server.errors import InvalidRequest

    assert parse_cache_hints({}) == ("", None)
    assert parse_cache_hints({"prompt_cache_key": "agent-7", "prompt_cache_retention": "24h"}) == ("agent-7", 86400.0)
    assert parse_cache_hints({"prompt_cache_retention": "in-memory"})[1] == 0.0
    assert parse_cache_hints({"prompt_cache_retention": "in_memory"})[1] == 0.0
    assert parse_cache_hints({"prompt_cache_retention": "30m"})[1] == 1800.0
    for body in ({"prompt_cache_retention": "forever"}, {"prompt_cache_retention": 5}, {"prompt_cache_retention": "0h"},
                 {"prompt_cache_key": 12}, {"prompt_cache_key": "k" * 2000}):
        with pytest.raises(InvalidRequest) as exc:
            parse_cache_hints(body)
        assert exc.value.param == next(iter(body))


@pytest.mark.parametrize("name,ok", [
    ("conversation.bin", True), ("état été.bin", True), ("a..b", False), ("../x", False), ("a/b", False),
    ("a\\b", False), (" lead", False), ("trail ", False), ("dot.", False), (".", False), ("", False),
    ("x" * 256, False), ("tab\there", False), ("a:b", False), ("q?", False), ("\ufeffbom", False),
])
def test_slot_file_names_follow_llama_servers_rules(name, ok):
    from warmslot.server.routes.slot_files import valid_filename

    assert valid_filename(name) is ok
