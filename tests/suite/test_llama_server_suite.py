"""llama.cpp's own server test suite, the warmslot half: every test that
docs/llama-server-suite.json lists as passing on warmslot must still pass.

The suite comes out of the pinned llama-cpp-python sdist and runs unchanged against a real
warmslot process per test (tests/server_suite.py starts each as a fork of one process that
has imported warmslot, on the embedded default model and the tiny vision model); building and
running llama-server for the other half of the table is left to
`tests/server_suite.py run --server llama-server`.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "llama-server-suite.json"

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_table_counts_match_its_rows():
    table = json.loads(TABLE.read_text())
    groups: dict[str, int] = {}
    for row in table["tests"]:
        groups[row["group"]] = groups.get(row["group"], 0) + 1
    for group, count in groups.items():
        assert table["counts"][group] == count


def test_every_test_passing_on_warmslot_in_the_table_still_passes(chat_model, tmp_path):
    # two tests at once, each server on one thread: a server spends much of its start on one
    # core (the model's vocabulary), so two share two cores better than one runs on both
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "server_suite.py"), "check", "--work", str(tmp_path / "suite"), "--workers", "2"],
        capture_output=True, text=True, timeout=1800,
    )
    summary = [line for line in done.stderr.splitlines() if line.startswith("server_suite:")]
    assert done.returncode == 0, "\n".join(summary) + "\n" + done.stdout[-4000:]
    assert any("passed" in line for line in summary), done.stderr[-2000:]
