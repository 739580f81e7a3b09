"""--cache-reuse through the HTTP server, as an editor plugin uses it: the oldest chunk of
/infill's extra context is dropped, and what followed it is shifted instead of computed; every
response says how many prompt tokens came from shifted chunks, and /metrics counts them."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import metric, warmslot_server

pytestmark = pytest.mark.model

FILES = [{"filename": f"src/mod_{i}.py", "text": "".join(f"def f_{i}_{j}(x):\n    return x * {j}\n" for j in range(6))}
         for i in range(3)]
PREFIX = "def main():\n    total = 0\n    for i in range(10):\n        total += "
SUFFIX = "\n    return total\n"


@pytest.fixture(scope="module")
def server(tiny_fim_model):
    proc = warmslot_server(tiny_fim_model, "-np", "1", "-c", "2048", "-b", "512", "--temp", "0", "--cache-reuse", "4")
    yield proc
    proc.stop()


def infill(server, extra: list[dict]) -> dict:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "n_predict": 2}
    reply = httpx.post(server.url + "/infill", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_dropping_the_oldest_extra_chunk_shifts_the_rest(server):
    before = metric(server, 'warmslot_prompt_tokens_total{source="shifted"}')
    first = infill(server, FILES)
    assert first["tokens_shifted"] == 0 and first["timings"]["cache_shifted_n"] == 0
    moved = infill(server, FILES[1:])
    # everything after the dropped file is the slot's, shifted; only the last token is computed
    assert moved["tokens_shifted"] > 0.9 * moved["tokens_evaluated"], moved
    assert moved["timings"]["cache_shifted_n"] == moved["tokens_shifted"]
    assert moved["tokens_cached"] == moved["timings"]["cache_n"] >= moved["tokens_shifted"]
    assert moved["timings"]["prompt_n"] == moved["tokens_evaluated"] - moved["tokens_cached"] < 8
    assert metric(server, 'warmslot_prompt_tokens_total{source="shifted"}') - before == moved["tokens_shifted"]


def test_openai_usage_says_how_many_cached_tokens_were_shifted(server):
    text = "".join(f"line {i} of a long document\n" for i in range(20))
    ask = {"max_tokens": 2, "temperature": 0}
    httpx.post(server.url + "/v1/completions", json={**ask, "prompt": "Intro paragraph.\n" + text}, timeout=120)
    reply = httpx.post(server.url + "/v1/completions", json={**ask, "prompt": text + "The end."}, timeout=120)
    details = reply.json()["usage"]["prompt_tokens_details"]
    assert 0 < details["shifted_tokens"] <= details["cached_tokens"], details
