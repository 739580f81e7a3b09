"""Slot files on disk are bounded: --slot-save-size holds (507 past it, no file left), and a
name the file system cannot take is a 400 that does not show the server's path."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.helpers import warmslot_server


@pytest.fixture(scope="module")
def saving(default_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("slot-files")
    # a few saves of a short conversation fit in 16 MiB on the default model, not many more
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--slot-save-path", str(directory), "--slot-save-size", "16MiB")
    yield proc, directory
    proc.stop()


def save(url: str, name: str) -> httpx.Response:
    return httpx.post(f"{url}/slots/0?action=save", json={"filename": name}, timeout=120)


def test_saves_past_the_quota_get_507_and_leave_no_file(saving):
    proc, directory = saving
    r = httpx.post(proc.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 4}, timeout=120)
    assert r.status_code == 200
    statuses = [save(proc.url, f"s{i}.bin").status_code for i in range(40)]
    assert statuses[0] == 200 and 507 in statuses, statuses
    first_refused = statuses.index(507)
    assert set(statuses[first_refused:]) == {507}
    r = save(proc.url, "again.bin")
    assert r.json()["error"]["code"] == "slot_save_quota" and "--slot-save-size" in r.json()["error"]["message"]
    total = sum(os.path.getsize(directory / n) for n in os.listdir(directory))
    assert total <= 16 << 20
    assert len(os.listdir(directory)) == first_refused
    assert save(proc.url, "s0.bin").status_code == 200  # a name replaced in place fits again


@pytest.mark.parametrize("length", [242, 250, 255])
def test_a_name_past_the_file_systems_limit_is_a_400_that_shows_no_path(saving, length):
    proc, directory = saving
    r = save(proc.url, "n" * length)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "filename" and str(directory) not in error["message"] and "/" not in error["message"]
