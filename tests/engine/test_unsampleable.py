"""Logits that give no token end one request, never the process.

A model whose logits hold a NaN or a +inf (a broken quantization, an fp16 overflow, a bad
adapter), a row of only -inf, a grammar's dead end, or a logit_bias that removes every
token: llama.cpp aborts the process on the empty candidate set (`GGML_ASSERT(cur_p->size >
0)`) or when its grammar is asked to accept a token it forbids. The sampler sees each case
before anything is accepted, and the engine ends that request with an error naming the cause
and the reply token, then goes on. Each sampling path is covered: numpy's argmax (greedy),
numpy's top-k, llama.cpp's own chain, a chain with a grammar, saved logits.

The poisoned models are the tiny random-weight ones of `tests/tiny_models.py` with an output
norm of NaN (hybrid, the Qwen3.5 shape the abort was first seen on) or output weights that
overflow to +inf and -inf (attention).
"""

import llama_cpp  # noqa: F401,I001

import math

import numpy as np
import pytest

from tests.helpers import generate, tiny_engine
from tests.tiny_models import N_VOCAB, write_tiny_model
from warmslot.slots import ErrorKind, GrammarSpec, SamplingParams
from warmslot.slots.llama_api import Model, NoToken, Sampler, SamplingFailed
from warmslot.slots.llama_api.sampler import _top_k

pytestmark = pytest.mark.model

PROMPT = [ord(c) for c in "Say something."]

# one chain per sampling path: numpy top-k, numpy argmax, llama.cpp's chain, a grammar's
PATHS = {
    "temperature 1 (numpy top-k)": SamplingParams(temperature=1.0),
    "temperature 0 (numpy argmax)": SamplingParams(temperature=0.0),
    "penalties (llama.cpp's chain)": SamplingParams(temperature=0.7, repeat_penalty=1.1, top_k=0),
    "grammar (candidates of ours)": SamplingParams(temperature=2.0, grammar=GrammarSpec("root ::= [a-z]+")),
}


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    out = tmp_path_factory.mktemp("poisoned")
    return {
        "nan": write_tiny_model("hybrid", out / "nan.gguf", poison="nan"),
        "inf": write_tiny_model("attention", out / "inf.gguf", poison="inf"),
    }


@pytest.fixture(scope="module")
def nan_engine(poisoned):
    engine = tiny_engine(poisoned["nan"], n_parallel=2)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = tiny_engine(tiny_models["attention"], n_parallel=2)
    yield engine
    engine.stop()


@pytest.mark.parametrize("path", list(PATHS))
def test_nan_logits_end_the_request_and_the_engine_goes_on(nan_engine, path):
    failed = generate(nan_engine, PROMPT, sampling=PATHS[path])
    assert failed.error is not None and failed.error.kind is ErrorKind.MODEL_OUTPUT, failed
    assert "NaN" in failed.error.message and "reply token 0" in failed.error.message
    assert failed.tokens == []
    again = generate(nan_engine, PROMPT + [ord("!")], sampling=PATHS[path])  # the engine still answers
    assert again.error is not None and again.error.kind is ErrorKind.MODEL_OUTPUT
    assert all(s.state == "idle" for s in nan_engine.snapshot(detail=True).slots)


def test_nan_logits_saved_with_a_prompt_fail_the_request_that_reuses_them(nan_engine):
    """A prompt evaluated before keeps its last logits: the next request samples those."""
    prompt = PROMPT + [ord("?")]
    generate(nan_engine, prompt, sampling=SamplingParams(temperature=1.0))
    reused = nan_engine.stats.logits_reused
    failed = generate(nan_engine, prompt, sampling=SamplingParams(temperature=1.0))
    assert nan_engine.stats.logits_reused == reused + 1
    assert failed.error is not None and failed.error.kind is ErrorKind.MODEL_OUTPUT and "NaN" in failed.error.message


@pytest.mark.parametrize("path", list(PATHS))
def test_infinite_logits_end_the_request(poisoned, path):
    engine = tiny_engine(poisoned["inf"])
    try:
        failed = generate(engine, PROMPT, sampling=PATHS[path])
        assert failed.error is not None and failed.error.kind is ErrorKind.MODEL_OUTPUT, failed
        assert "+inf" in failed.error.message
    finally:
        engine.stop()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_logit_bias_that_removes_every_token_fails_the_request(engine, temperature):
    every = {token: -math.inf for token in range(N_VOCAB)}  # what -100 in a request becomes
    failed = generate(engine, PROMPT, sampling=SamplingParams(temperature=temperature, logit_bias=every))
    assert failed.error is not None and failed.error.kind is ErrorKind.INVALID, failed
    assert "logit_bias removes every token" in failed.error.message
    assert generate(engine, PROMPT, max_tokens=3).usage.completion_tokens == 3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_dead_end_fails_the_request(engine, temperature):
    """The grammar allows only "{" first and logit_bias forbids it: llama.cpp's chain would
    select a forbidden token and its grammar abort the process on accepting it."""
    grammar = GrammarSpec('root ::= "{" [a-z]* "}"')
    sampling = SamplingParams(temperature=temperature, grammar=grammar, logit_bias={ord("{"): -math.inf})
    failed = generate(engine, PROMPT, sampling=sampling)
    assert failed.error is not None and failed.error.kind is ErrorKind.INVALID, failed
    assert "the grammar and logit_bias allow no token" in failed.error.message and "reply token 0" in failed.error.message
    # later in the reply: "{" is the one token left, then the grammar wants letters or "}"
    but_open = {token: -math.inf for token in range(N_VOCAB) if token != ord("{")}
    failed = generate(engine, PROMPT, sampling=SamplingParams(temperature=temperature, grammar=grammar, logit_bias=but_open))
    assert failed.error is not None and "reply token 1" in failed.error.message
    assert generate(engine, PROMPT, max_tokens=3).usage.completion_tokens == 3


# -- the checks themselves, on rows of a real vocabulary's size ----------------------------------


def rows(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(n) * 3).astype(np.float32)

    def with_(index, value):
        row = base.copy()
        row[index] = value
        return row

    return {
        "nan in a block": with_(n // 2, np.nan),
        "nan in the tail": with_(n - 1, np.nan),
        "+inf": with_(77, np.inf),
        "all -inf": np.full(n, -np.inf, dtype=np.float32),
    }


EXPECTED = {"nan in a block": NoToken.NAN, "nan in the tail": NoToken.NAN, "+inf": NoToken.POS_INF, "all -inf": NoToken.ALL_NEG_INF}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_top_k_refuses_a_row_it_cannot_rank(case):
    for n in (151_937, 1000):  # blocks of maxima and a short tail; a vocabulary with fewer blocks than k
        with pytest.raises(SamplingFailed) as raised:
            _top_k(rows(n)[case], 40)
        assert raised.value.cause is EXPECTED[case]


def test_top_k_takes_a_row_with_some_minus_infinity():
    row = rows(151_937)["+inf"]
    row[77] = -np.inf  # tokens a model rules out are not a failure
    assert len(_top_k(row, 40)) == 40


@pytest.mark.parametrize("path", list(PATHS))
def test_every_chain_refuses_a_row_with_one_nan(default_model, path):
    """One NaN among 262,144 logits: each path sees it (numpy's max keeps a NaN)."""
    model = Model(str(default_model), vocab_only=True)
    try:
        logits = rows(model.n_vocab)["nan in a block"]
        sampler = Sampler(model, PATHS[path])
        try:
            with pytest.raises(SamplingFailed) as raised:
                sampler.sample_logits(logits)
            assert raised.value.cause is NoToken.NAN
            finite = logits.copy()
            finite[model.n_vocab // 2] = 0.0
            assert 0 <= sampler.sample_logits(finite) < model.n_vocab  # and nothing was accepted before
        finally:
            sampler.close()
    finally:
        model.close()
