"""A crash names its requests: when llama.cpp aborts the process, the log says which requests
were running (id, route, slot, tokens, sampling) and where every Python thread was.

The abort is a real one: a grammar sampler asked to accept a token it forbids throws a C++
exception out of llama.cpp's C API, and the process ends in abort(), on the engine thread,
while a request streams. The server installs the same handler at start; SIGABRT sent to a
running server shows it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import abort_while_streaming, warmslot_server

pytestmark = pytest.mark.model

CHILD = r"""
import llama_cpp, sys
from warmslot.slots import Engine, EngineConfig, GenerateRequest, GrammarSpec, QueueSink, SamplingParams, report_crashes
from warmslot.slots.llama_api.sampler import _init_grammar

engine = Engine(EngineConfig(model_path=sys.argv[1], n_parallel=2, n_ctx=1024, n_threads=2))
engine.start()
engine.wait_ready(60)
report_crashes(engine)
sink = QueueSink()
sampling = SamplingParams(temperature=0.7, top_k=12, seed=5, logit_bias={10: -1.0})
engine.submit(GenerateRequest("req-under-test", [1, 2, 3, 4], sink, sampling, max_tokens=100000, ignore_eos=True, origin="/v1/chat/completions"))
assert sink.queue.get(timeout=30)[0].started

def abort_inside_llama_cpp(engine):
    grammar = _init_grammar(engine.model, GrammarSpec('root ::= "a"'))
    llama_cpp.llama_sampler_accept(grammar, ord("b"))  # "b" does not fit: llama.cpp throws, the process aborts

engine.call(abort_inside_llama_cpp).result(60)
print("the process went on")
"""


def test_an_abort_inside_llama_cpp_names_the_running_request(tiny_models):
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # no gdb backtrace: the test stays fast
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_models["attention"])], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    log = proc.stderr
    assert "Unexpected empty grammar stack" in log  # llama.cpp's own message comes first
    lines = [line for line in log.splitlines() if line.startswith("warmslot crash:")]
    running = next(line for line in lines if "req-under-test" in line)
    assert "via /v1/chat/completions in slot 0" in running and "4 prompt tokens" in running
    assert "temperature=0.7 top_k=12" in running and "seed=5" in running and "logit_bias=1 tokens" in running
    assert "abort_inside_llama_cpp" in log  # the engine thread's Python stack
    assert "the process went on" not in proc.stdout


def test_the_server_names_its_running_requests_when_it_aborts(tiny_models):
    server = warmslot_server(tiny_models["attention"], "-np", "2", "-c", "1024", env={"GGML_NO_BACKTRACE": "1"})
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000, "ignore_eos": True, "stream": True, "temperature": 1.5}
        request_id = abort_while_streaming(server, body)
        assert server.proc.returncode == -signal.SIGABRT
        log = server.output()
        running = next(line for line in log.splitlines() if line.startswith("warmslot crash:") and request_id in line)
        assert "via /v1/chat/completions" in running and "temperature=1.5" in running
    finally:
        server.stop()
