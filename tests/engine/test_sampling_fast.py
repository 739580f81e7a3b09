"""The sampler takes its top-k in numpy and asks a grammar about the best candidates only,
and draws what llama.cpp's whole chain draws over the whole vocabulary: the same token for
the same seed, step after step, on logits of a real vocabulary's size."""

import llama_cpp  # noqa: I001
import numpy as np
import pytest

from warmslot.slots import SamplingParams
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api import sampler as sampler_mod
from warmslot.slots.llama_api.grammar import GrammarSpec
from warmslot.slots.llama_api.sampler import Sampler, _top_k
from warmslot.slots.sampling.reasoning_budget import ReasoningBudget

pytestmark = pytest.mark.model


def test_top_k_finds_the_k_largest_in_order():
    rng = np.random.default_rng(0)
    for n, k in ((151_936, 40), (1000, 40), (300, 256), (50, 64), (262_144, 1), (262_144, 1024), (2000, 1024)):
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        want = np.argsort(-logits, kind="stable")[: min(k, n)]
        assert list(_top_k(logits, k)) == list(want)
    peaked = np.full(151_936, -30.0, dtype=np.float32)
    peaked[[7, 99, 150_000]] = [5.0, 9.0, 1.0]  # fewer than k logits stand out
    assert list(_top_k(peaked, 40)[:3]) == [99, 7, 150_000] and len(_top_k(peaked, 40)) == 40


class _Counted:
    """Counts a sampler's draws over the whole vocabulary (`_sample_array`)."""

    def __init__(self, sampler: Sampler) -> None:
        self.whole = 0
        inner = sampler._sample_array

        def counted(logits):
            self.whole += 1
            return inner(logits)

        sampler._sample_array = counted


def _draw_both(model: Model, params: dict, steps: int, scale: float = 4.0, seed: int = 1):
    """Draw `steps` tokens with the fast sampler and with the whole chain (its fast path
    off), from the same logits; returns the tokens and how often each drew over the whole
    vocabulary."""
    fast = Sampler(model, SamplingParams(seed=7, **params))
    native = Sampler(model, SamplingParams(seed=7, **params))
    native._top_first = False  # the whole chain over the whole vocabulary, as llama.cpp runs it
    counts = _Counted(fast), _Counted(native)
    try:
        assert fast._top_first
        rng = np.random.default_rng(seed)
        drawn = []
        for _ in range(steps):
            logits = (rng.standard_normal(model.n_vocab) * scale).astype(np.float32)
            a, b = fast.sample_logits(logits.copy()), native.sample_logits(logits.copy())
            assert a == b
            drawn.append(a)
        assert counts[1].whole == steps
        return drawn, counts[0].whole
    finally:
        fast.close()
        native.close()


@pytest.fixture(scope="module")
def vocab_model(default_model):
    model = Model(str(default_model), vocab_only=True)
    yield model
    model.close()


@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.0, top_k=200, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=5, top_p=0.5, min_p=0.1),
])
def test_the_fast_chain_draws_what_the_native_chain_draws(vocab_model, params):
    drawn, whole = _draw_both(vocab_model, params, 200)
    assert whole == 0
    assert len(set(drawn)) > 20  # it draws, not always the same token


def test_a_lazy_grammar_awaiting_its_trigger_costs_no_draw_over_the_vocabulary(vocab_model):
    lazy = GrammarSpec('root ::= "{" [a-z]* "}"', lazy=True, trigger_patterns=[r"[\s\S]*?(TOOLCALL)"])
    drawn, whole = _draw_both(vocab_model, dict(temperature=0.8, top_k=40, grammar=lazy), 100)
    assert whole == 0 and len(set(drawn)) > 20


@pytest.mark.parametrize("greedy", [False, True])
def test_a_grammar_asked_about_the_best_candidates_draws_what_the_whole_chain_draws(vocab_model, greedy):
    # no "e" anywhere: a few of the best 40 are often forbidden (the wider set then answers),
    # now and then more (the whole vocabulary answers)
    grammar = GrammarSpec("root ::= [^e]*")
    params = dict(temperature=0.0) if greedy else dict(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0)
    drawn, whole = _draw_both(vocab_model, dict(grammar=grammar, **params), 150)
    pieces = [vocab_model.detokenize([t]) for t in drawn]
    assert not any("e" in p for p in pieces)
    assert whole < 150 // 2  # most draws took the best candidates
    assert len(set(drawn)) > (10 if greedy else 50)


def test_a_grammar_that_forbids_all_the_best_falls_back_to_the_whole_vocabulary(vocab_model):
    # only digits: among 262k random logits the best 1,024 rarely hold 40 of them
    grammar = GrammarSpec("root ::= [0-9]+")
    drawn, whole = _draw_both(vocab_model, dict(grammar=grammar, temperature=1.0, top_k=40), 20)
    assert whole > 0
    # digits, and the end of generation once one was drawn
    assert vocab_model.detokenize([drawn[0]]).isdigit()
    assert all(vocab_model.detokenize([t]).isdigit() or vocab_model.is_eog(t) for t in drawn)


def test_a_reasoning_budget_forces_its_tokens_and_the_best_candidates_answer_the_rest(vocab_model):
    # thinking from the first token, 5 tokens allowed, then the two "forced" tokens
    budget = ReasoningBudget(start=(1000,), end=(1001,), forced=(1002, 1001), budget=5, inside=True)
    lazy = GrammarSpec('root ::= "{" [a-z]* "}"', lazy=True, trigger_patterns=[r"[\s\S]*?(TOOLCALL)"])
    for params in (dict(temperature=0.0), dict(temperature=0.8, top_k=40, grammar=lazy)):
        drawn, whole = _draw_both(vocab_model, dict(reasoning_budget=budget, **params), 40)
        assert drawn[5:7] == [1002, 1001] and 1002 not in drawn[:5]
        assert whole == 2  # only the forced tokens


def test_chains_the_fast_path_does_not_take(vocab_model):
    for params in (SamplingParams(top_k=0), SamplingParams(top_k=sampler_mod.TOP_K_FAST + 1),
                   SamplingParams(repeat_penalty=1.1), SamplingParams(logit_bias={1: 2.0})):
        s = Sampler(vocab_model, params)
        try:
            assert not s._top_first, params
        finally:
            s.close()
