"""SIGTERM ends the process within --shutdown-timeout plus a few seconds whatever runs:
here a batch of embeddings that would take minutes, the request waiting behind it, and a
tokenization of megabytes that llama.cpp cannot be interrupted in."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from tests.helpers import warmslot_server


def test_sigterm_during_a_long_embedding_batch_exits_in_time(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--embeddings", "--shutdown-timeout", "2")
    try:
        answers: dict = {}  # the status (or the client's error) of each request

        def embed(n: int) -> None:
            try:
                r = httpx.post(proc.url + "/v1/embeddings", json={"input": [f"text number {i} " + "lorem ipsum dolor " * 60 for i in range(n)]}, timeout=300)
                answers[n] = r.status_code
            except httpx.HTTPError as exc:
                answers[n] = type(exc).__name__

        def tokenize() -> None:
            try:
                r = httpx.post(proc.url + "/tokenize", json={"content": "ab" * 3_000_000}, timeout=300)
                answers["tokenize"] = r.status_code
            except httpx.HTTPError as exc:
                answers["tokenize"] = type(exc).__name__

        clients = [threading.Thread(target=embed, args=(n,)) for n in (2048, 1)] + [threading.Thread(target=tokenize)]
        for client in clients:
            client.start()
            time.sleep(1.5)  # the batch runs; the second request waits behind it
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.proc.wait(60)
        elapsed = time.monotonic() - t0
        assert elapsed < 2 + 8, elapsed  # --shutdown-timeout plus a few seconds
        assert code == 0
        for client in clients:
            client.join(30)
        ended = (503, "RemoteProtocolError", "ConnectError", "ReadError")
        assert answers[2048] in ended, answers  # the batch of minutes was cut short
        # the one-input request and the tokenization may finish before the signal on a fast
        # machine; otherwise they end the same way
        assert answers[1] in (200, *ended) and answers["tokenize"] in (200, *ended), answers
    finally:
        proc.stop()
