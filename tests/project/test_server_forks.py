"""tests/server_forks.py: children forked by a fork server behave as subprocess.Popen's do.

The fork server here runs a few lines of Python in each child instead of a server: the child
reports its arguments, environment and folder on the stdout it was given and exits with the
code its first argument names, or sleeps until it is signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.server_forks import ForkClient, start_fork_server, stop_fork_server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = f"""
import json, os, sys, time
import numpy.random  # imported before the fork, as the suite's fork server does
sys.path.insert(0, {ROOT!r})
from tests.server_forks import serve
request = serve(sys.argv[1])
if request is None:
    sys.exit(0)
print(json.dumps({{"args": request.args, "cwd": os.getcwd(), "value": os.environ.get("FORK_TEST_VALUE"),
                  "pid": os.getpid(), "random": numpy.random.random()}}), flush=True)
if request.args[0] == "sleep":
    time.sleep(60)
sys.exit(int(request.args[0]))
"""


@pytest.fixture
def forks(tmp_path):
    path = str(tmp_path / "forks.sock")
    proc = start_fork_server([sys.executable, "-c", CHILD, path], timeout=60)
    yield ForkClient(path), proc
    stop_fork_server(proc)


def test_a_child_gets_its_arguments_environment_folder_and_stdout_and_its_exit_code_comes_back(forks, tmp_path):
    client, _ = forks
    reports = []
    for n in range(2):
        out = tmp_path / f"out{n}.txt"
        with open(out, "w") as stdout:
            child = client.spawn(["3", "x y"], env={**os.environ, "FORK_TEST_VALUE": "seen"}, cwd=str(tmp_path), stdout=stdout)
        assert child.wait(30) == 3
        assert child.poll() == 3
        report = json.loads(out.read_text())
        assert report.pop("pid") == child.pid
        reports.append(report)
        assert {k: v for k, v in report.items() if k != "random"} == {"args": ["3", "x y"], "cwd": str(tmp_path), "value": "seen"}
    assert reports[0]["random"] != reports[1]["random"]  # numpy's global generator: each child's own, as in a new process


def test_terminate_ends_a_running_child_with_minus_sigterm_and_wait_times_out_before(forks):
    client, _ = forks
    child = client.spawn(["sleep"], stdout=subprocess.DEVNULL)
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.terminate()
    assert child.wait(30) == -signal.SIGTERM
    child.kill()  # after the end: nothing to signal, no error


def test_children_end_with_the_fork_server(forks):
    client, proc = forks
    child = client.spawn(["sleep"], stdout=subprocess.DEVNULL)
    time.sleep(0.2)
    stop_fork_server(proc)
    assert child.wait(30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
