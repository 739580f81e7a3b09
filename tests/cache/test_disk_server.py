"""The disk tier and slot files through real server processes: SIGTERM and restart on every
memory kind, entries of another model or KV type, damaged files, SIGKILL during a write, and
llama-server's slot save/restore endpoints."""

import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from warmslot.cache.disk import format as fmt
from tests.helpers import random_tokens, warmslot_server
from tests.tiny_models import KINDS, write_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.server]

# f32 KV and no flash attention keep numerics reproducible (see tests/helpers.tiny_engine); one
# thread, because llama.cpp threads that wait for each other crawl on a busy 2-core machine
EXACT = ["-t", "1", "-np", "1", "-c", "2048", "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-b", "64", "-ub", "64"]
FIRST = random_tokens(60, 120)


def disk_flags(directory, *extra):
    return [*EXACT, "--cache-disk", str(directory), "--cache-disk-size", "64MiB", "--cache-ram", "64MiB", *extra]


def complete(srv, prompt, **kw):
    body = {"prompt": prompt, "max_tokens": kw.pop("max_tokens", 12), "temperature": 0, "warmslot_explain": True, **kw}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["text"], out["usage"]["prompt_tokens_details"]["cached_tokens"], out["warmslot"]["cache"]


def metrics(srv) -> dict[str, float]:
    out = {}
    for line in httpx.get(srv.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("warmslot_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def rejected(m, reason):
    return m[f'warmslot_disk_cache_rejected_total{{reason="{reason}"}}']


def entry_files(directory):
    return sorted(p for p in directory.iterdir() if p.name.endswith(fmt.SUFFIX))


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_then_restart_serves_the_next_turn_from_disk(tiny_models, tmp_path, kind):
    directory = tmp_path / "disk"
    srv = warmslot_server(tiny_models[kind], *disk_flags(directory))
    try:
        complete(srv, FIRST)
    finally:
        assert srv.stop() is not None  # SIGTERM: the slot's contents are written on the way out
    assert len(entry_files(directory)) == 1
    assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
    nxt = FIRST + random_tokens(61, 15)
    srv = warmslot_server(tiny_models[kind], *disk_flags(directory))
    try:
        text, cached, cache = complete(srv, nxt)
        assert (cache["source"], cached) == ("disk", len(FIRST))
        m = metrics(srv)
        assert m['warmslot_prompt_tokens_total{source="disk"}'] == len(FIRST)
        assert m["warmslot_disk_cache_hits_total"] == 1 and m["warmslot_disk_cache_read_bytes_total"] > 0
        cold_text, cold_cached, _ = complete(srv, nxt, cache_prompt=False)
        assert cold_cached == 0 and text == cold_text
    finally:
        srv.stop()


def test_another_model_or_cache_type_rejects_the_files_and_computes_cold(tiny_models, tmp_path):
    directory = tmp_path / "disk"
    srv = warmslot_server(tiny_models["attention"], *disk_flags(directory))
    try:
        complete(srv, FIRST)
    finally:
        srv.stop()
    nxt = FIRST + random_tokens(62, 10)
    other_ctk = [a if a != "f32" else "f16" for a in disk_flags(directory)]
    other_model = write_tiny_model("attention", tmp_path / "other.gguf", seed=7)
    # the second server also finds the file the first one wrote for its own layout
    for n_foreign, (model, flags) in enumerate(((tiny_models["attention"], other_ctk), (other_model, disk_flags(directory))), 1):
        srv = warmslot_server(model, *flags)
        try:
            m = metrics(srv)
            assert rejected(m, "model") == n_foreign and m["warmslot_disk_cache_hits_total"] == 0
            text, cached, cache = complete(srv, nxt)
            assert cached == 0 and cache["source"] == "none" and text
            assert "rejected (model)" in cache["reason"]
        finally:
            srv.stop()


def test_damaged_files_are_counted_and_the_server_works(tiny_models, tmp_path):
    directory, model = tmp_path / "disk", tiny_models["hybrid"]
    prompts = {how: random_tokens(70 + i, 100) for i, how in enumerate(
        ("good", "truncated", "flipped", "empty", "version", "not_entry"))}
    srv = warmslot_server(model, *disk_flags(directory))
    try:
        for prompt in prompts.values():
            complete(srv, prompt, max_tokens=2)
    finally:
        srv.stop()
    by_prompt = {}
    for path in entry_files(directory):
        tokens = fmt.read_header(str(path)).tokens
        by_prompt[next(how for how, p in prompts.items() if tokens[:100] == tuple(p))] = path
    assert sorted(by_prompt) == sorted(prompts)
    for how, path in by_prompt.items():
        data = bytearray(path.read_bytes())
        if how == "truncated":
            data = data[: len(data) // 2]
        elif how == "flipped":
            data[len(data) // 2] ^= 0x5A  # state bytes: only a load can tell
        elif how == "empty":
            data = bytearray()
        elif how == "version":
            data[8:12] = (fmt.SEGMENT_VERSION + 1).to_bytes(4, "little")  # a version this server does not read
        elif how == "not_entry":
            data = bytearray(b"not a cache entry at all" * 10)
        path.write_bytes(bytes(data))
    (directory / "notes.txt").write_text("someone's file")
    srv = warmslot_server(model, *disk_flags(directory))
    try:
        m = metrics(srv)
        assert [rejected(m, r) for r in ("truncated", "empty", "version", "not_entry", "checksum")] == [1, 1, 1, 2, 0]
        for how, prompt in prompts.items():
            text, cached, cache = complete(srv, prompt + random_tokens(80, 5), max_tokens=2)
            assert text
            assert cached == (100 if how == "good" else 0), (how, cache)
            if how == "flipped":
                assert "rejected (checksum)" in cache["reason"]
        m = metrics(srv)
        assert rejected(m, "checksum") == 1 and m["warmslot_disk_cache_hits_total"] == 1
    finally:
        srv.stop()
    assert (directory / "notes.txt").exists()


def test_sigkill_during_a_write_restarts_cleanly(tiny_models, tmp_path):
    """The RAM cache holds about one conversation, so every new one spills the one before it
    to disk (about 1 MB, fsynced). The server is killed the moment a write's temporary file
    appears (once an entry is complete); the next server deletes it, counts it, and serves the
    complete entries."""
    directory, model = tmp_path / "disk", tiny_models["attention"]
    flags = [*EXACT, "--cache-disk", str(directory), "--cache-disk-size", "256MiB", "--cache-ram", "1536KiB"]
    prompts = []
    caught = False
    for attempt in range(4):
        srv = warmslot_server(model, *flags)
        seen = threading.Event()

        def watch():
            while not seen.is_set():
                try:
                    names = os.listdir(directory)
                    # once an entry is complete, kill in the middle of the next write
                    if any(n.endswith(fmt.SUFFIX) for n in names) and any(n.endswith(".tmp") for n in names):
                        os.killpg(srv.pid, signal.SIGKILL)
                        seen.set()
                except (FileNotFoundError, ProcessLookupError):
                    pass
                time.sleep(0.0002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for i in range(12):
                prompt = random_tokens(100 + len(prompts), 900)
                try:
                    complete(srv, prompt, max_tokens=1)
                except httpx.HTTPError:
                    break
                prompts.append(prompt)
                if seen.wait(0.2):
                    break
        finally:
            seen.set()
            watcher.join()
            srv.stop()
        caught = any(n.endswith(".tmp") for n in os.listdir(directory))
        if caught:
            break
    assert caught, "no write was interrupted"
    srv = warmslot_server(model, *flags)
    try:
        m = metrics(srv)
        assert rejected(m, "incomplete") >= 1
        assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
        assert m["warmslot_disk_cache_entries"] == len(entry_files(directory)) > 0
        for name in ("truncated", "checksum", "empty"):
            assert rejected(m, name) == 0
        spilled = [p for p in prompts if any(fmt.read_header(str(f)).tokens[:900] == tuple(p) for f in entry_files(directory))]
        text, cached, cache = complete(srv, spilled[0] + random_tokens(99, 5), max_tokens=4)
        assert (cache["source"], cached) == ("disk", 900)
        cold, _, _ = complete(srv, spilled[0] + random_tokens(99, 5), max_tokens=4, cache_prompt=False)
        assert text == cold
    finally:
        srv.stop()


def slot_action(srv, slot, action, filename=None):
    body = {"filename": filename} if filename is not None else {}
    return httpx.post(f"{srv.url}/slots/{slot}?action={action}", json=body, timeout=60)


def test_slot_save_restore_and_erase_round_trip(tiny_models, tmp_path):
    model, saved = tiny_models["recurrent"], tmp_path / "slots"
    saved.mkdir()
    flags = [*EXACT, "--cache-ram", "0", "--slot-save-path", str(saved)]
    nxt = FIRST + random_tokens(63, 10)
    srv = warmslot_server(model, *flags)
    try:
        complete(srv, FIRST)
        r = slot_action(srv, 0, "save", "conversation.bin")
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["id_slot"], body["filename"], body["n_saved"]) == (0, "conversation.bin", len(FIRST) + 11)
        assert body["n_written"] == (saved / "conversation.bin").stat().st_size and "save_ms" in body["timings"]
        assert slot_action(srv, 0, "erase").json() == {"id_slot": 0, "n_erased": len(FIRST) + 11}
        assert complete(srv, nxt, max_tokens=1)[1] == 0  # erased, and no prompt cache: nothing left
        assert slot_action(srv, 0, "save", "../escape.bin").status_code == 400
        assert slot_action(srv, 7, "save", "x.bin").status_code == 400
        assert slot_action(srv, 0, "frobnicate", "x.bin").status_code == 400
        assert slot_action(srv, 0, "restore", "missing.bin").status_code == 400
    finally:
        srv.stop()
    srv = warmslot_server(model, *flags)  # a new process
    try:
        r = slot_action(srv, 0, "restore", "conversation.bin")
        assert r.status_code == 200, r.text
        assert (r.json()["n_restored"], r.json()["n_read"]) == (len(FIRST) + 11, (saved / "conversation.bin").stat().st_size)
        text, cached, cache = complete(srv, nxt)
        assert (cache["source"], cached) == ("slot", len(FIRST))
        cold, _, _ = complete(srv, nxt, cache_prompt=False)
        assert text == cold
        data = bytearray((saved / "conversation.bin").read_bytes())
        data[-40] ^= 0xFF
        (saved / "damaged.bin").write_bytes(bytes(data))
        r = slot_action(srv, 0, "restore", "damaged.bin")
        assert r.status_code == 400 and "checksum" in r.json()["error"]["message"]
        assert rejected(metrics(srv), "checksum") == 1
        # a disk-tier segment holds only the cells after its base: never a slot's whole state
        header = fmt.read_header(str(saved / "conversation.bin"))
        fmt.write(str(saved), "segment.bin", header.meta, header.tokens, np.zeros(64, np.uint8), [],
                  base=fmt.BaseRef("base.wsc", 8, (0,)))
        r = slot_action(srv, 0, "restore", "segment.bin")
        assert r.status_code == 400 and "segment" in r.json()["error"]["message"]
        assert rejected(metrics(srv), "base") == 1
    finally:
        srv.stop()
    srv = warmslot_server(model, *[a if a != "f32" else "f16" for a in flags])
    try:
        r = slot_action(srv, 0, "restore", "conversation.bin")
        assert r.status_code == 400 and "another model" in r.json()["error"]["message"]
    finally:
        srv.stop()
    srv = warmslot_server(model, *EXACT)
    try:
        r = slot_action(srv, 0, "save", "x.bin")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    finally:
        srv.stop()


def test_slot_actions_need_the_admin_key_when_keys_are_set(tiny_models, tmp_path):
    saved = tmp_path / "slots"
    saved.mkdir()
    srv = warmslot_server(tiny_models["attention"], *EXACT, "--cache-ram", "0", "--slot-save-path", str(saved),
                          "--api-key", "admin,user")
    try:
        def act(key, action):
            return httpx.post(f"{srv.url}/slots/0?action={action}", json={"filename": "s.bin"},
                              headers={"Authorization": f"Bearer {key}"}, timeout=60)
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": FIRST, "max_tokens": 2, "temperature": 0},
                       headers={"Authorization": "Bearer user"}, timeout=60)
        assert r.status_code == 200, r.text
        for action in ("save", "restore", "erase"):
            r = act("user", action)
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
        assert not (saved / "s.bin").exists()
        assert act("nobody", "save").status_code == 401
        assert act("admin", "save").status_code == 200 and (saved / "s.bin").exists()
    finally:
        srv.stop()
