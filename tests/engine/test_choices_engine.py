"""Log-probabilities and several choices of one prompt in the engine, on the tiny models."""

import numpy as np
import pytest

from warmslot.slots import GenerateRequest, QueueSink, SamplingParams
from warmslot.slots.sampling.logprobs import log_softmax, token_logprob
from tests.helpers import cold_run, generate, random_tokens, tiny_engine

pytestmark = pytest.mark.model

ENGINE = dict(n_batch=64, n_ubatch=64, n_ctx=1024)


def test_log_softmax_adds_the_bias_and_normalizes():
    logits = np.array([1.0, 2.0, 3.0, -1.0], dtype=np.float32)
    lp = log_softmax(logits, {0: 2.0, 3: float("-inf")})
    assert np.isclose(np.exp(lp).sum(), 1.0)
    assert lp[3] == float("-inf")
    assert np.isclose(lp[0], lp[2])  # 1 + 2 == 3
    entry = token_logprob(logits, None, 1, 2)
    assert [t for t, _ in entry.top] == [2, 1] and entry.top[1][1] == entry.logprob


def test_logprobs_match_llama_cpp_logits(tiny_models):
    """Each generated token's logprob and top list equal a log-softmax of the logits llama.cpp
    gives for the same prefix on a fresh engine (with the request's logit bias added)."""
    path = tiny_models["attention"]
    prompt = random_tokens(11, 40)
    bias = {65: 3.0, 66: -2.0}
    engine = tiny_engine(path, **ENGINE)
    try:
        sampling = SamplingParams(temperature=0.0, logit_bias=bias)
        r = generate(engine, prompt, max_tokens=4, sampling=sampling, logprobs=5)
    finally:
        engine.stop()
    assert len(r.logprobs) == len(r.tokens) == 4
    for i, entry in enumerate(r.logprobs):
        assert entry.token == r.tokens[i]
        assert entry.top[0] == (entry.token, entry.logprob)  # greedy: the most likely one
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        ref = cold_run(path, prompt + r.tokens[:i], ENGINE, max_tokens=1, sampling=sampling)
        expected = log_softmax(ref.prompt_logits, bias)
        assert abs(entry.logprob - expected[entry.token]) < 1e-4
        for token, lp in entry.top:
            assert abs(lp - expected[token]) < 1e-4


def test_logprobs_without_top_list_and_without_asking(tiny_models):
    engine = tiny_engine(tiny_models["attention"], **ENGINE)
    try:
        prompt = random_tokens(12, 30)
        plain = generate(engine, prompt, max_tokens=3)
        only = generate(engine, prompt, max_tokens=3, logprobs=0)
    finally:
        engine.stop()
    assert plain.logprobs == []
    assert [e.top for e in only.logprobs] == [(), (), ()] and all(e.logprob <= 0 for e in only.logprobs)


def _submit_choices(engine, prompt, n, seed=5, max_tokens=8):
    sinks = []
    parent = None
    for i in range(n):
        sink = QueueSink()
        req_id = f"choice-{seed}-{i}-{len(prompt)}"
        sampling = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed + i)
        engine.submit(GenerateRequest(req_id, list(prompt), sink, sampling, max_tokens=max_tokens, sibling_of=parent))
        parent = parent or req_id
        sinks.append(sink)
    return [s.collect() for s in sinks]


@pytest.mark.parametrize("kind", ["attention", "swa", "recurrent", "hybrid"])
def test_n_choices_evaluate_the_prompt_once(tiny_models, kind):
    """Four choices of one prompt: the prompt is evaluated by the first; the other three fork
    it (whole, with its last logits) and evaluate no prompt token."""
    engine = tiny_engine(tiny_models[kind], n_parallel=4, **ENGINE)
    try:
        prompt = random_tokens(21, 150)
        before = engine.stats.prefill_tokens
        results = _submit_choices(engine, prompt, 4)
        assert engine.stats.prefill_tokens - before == len(prompt)
    finally:
        engine.stop()
    assert all(r.error is None and len(r.tokens) == 8 for r in results)
    assert [r.usage.cached_tokens for r in results[1:]] == [len(prompt)] * 3
    assert len({tuple(r.tokens) for r in results}) > 1  # different seeds, different samples


def test_more_choices_than_slots_wait_and_still_share_the_prompt(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_parallel=2, **ENGINE)
    try:
        prompt = random_tokens(22, 120)
        before = engine.stats.prefill_tokens
        results = _submit_choices(engine, prompt, 4, seed=9)
        assert engine.stats.prefill_tokens - before == len(prompt)
    finally:
        engine.stop()
    assert all(r.error is None and len(r.tokens) == 8 for r in results)
