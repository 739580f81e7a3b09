"""The sampler's top-k in numpy draws what llama.cpp's whole chain draws: the same token for
the same seed, step after step, on logits of a real vocabulary's size."""

import llama_cpp  # noqa: I001
import numpy as np
import pytest

from warmslot.slots import SamplingParams
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api import sampler as sampler_mod
from warmslot.slots.llama_api.sampler import Sampler, _top_k

pytestmark = pytest.mark.model


def test_top_k_finds_the_k_largest_in_order():
    rng = np.random.default_rng(0)
    for n, k in ((151_936, 40), (1000, 40), (300, 256), (50, 64), (262_144, 1)):
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        want = np.argsort(-logits, kind="stable")[: min(k, n)]
        assert list(_top_k(logits, k)) == list(want)
    peaked = np.full(151_936, -30.0, dtype=np.float32)
    peaked[[7, 99, 150_000]] = [5.0, 9.0, 1.0]  # fewer than k logits stand out
    assert list(_top_k(peaked, 40)[:3]) == [99, 7, 150_000] and len(_top_k(peaked, 40)) == 40


@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.0, top_k=200, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=5, top_p=0.5, min_p=0.1),
])
def test_the_fast_chain_draws_what_the_native_chain_draws(default_model, params):
    model = Model(str(default_model), vocab_only=True)
    try:
        fast = Sampler(model, SamplingParams(seed=7, **params))
        native = Sampler(model, SamplingParams(seed=7, **params))
        assert fast._tail is not None
        llama_cpp.llama_sampler_free(native._tail)
        native._tail = None  # the whole chain, as llama.cpp runs it
        rng = np.random.default_rng(1)
        drawn = []
        for _ in range(200):
            logits = (rng.standard_normal(model.n_vocab) * 4).astype(np.float32)
            a, b = fast.sample_logits(logits.copy()), native.sample_logits(logits.copy())
            assert a == b
            drawn.append(a)
        assert len(set(drawn)) > 20  # it draws, not always the same token
    finally:
        fast.close()
        native.close()
        model.close()


def test_chains_the_fast_path_does_not_take(default_model):
    model = Model(str(default_model), vocab_only=True)
    try:
        for params in (SamplingParams(top_k=0), SamplingParams(top_k=sampler_mod.TOP_K_FAST + 1),
                       SamplingParams(repeat_penalty=1.1), SamplingParams(logit_bias={1: 2.0}),
                       SamplingParams(temperature=0.0)):
            s = Sampler(model, params)
            try:
                assert s._tail is None, params
            finally:
                s.close()
    finally:
        model.close()
