"""Prefix reuse on every memory kind, differential against cold runs, through the real engine.

Each test runs a cold engine and a warm one on the same tiny model. The warm engine first
serves P (so its slot holds P, generated tokens and checkpoints), then P+Q or a variant.
It checks that the answer equals the cold run (logits of the last prompt token within
LOGITS_ATOL of tests/helpers.py, the 16 greedy tokens identical up to any near-tie) and that the cached path really ran (cached token counts,
restore counters).
"""

import pytest

from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine
from tests.tiny_models import KINDS

pytestmark = pytest.mark.model

P = random_tokens(1, 300)
Q = random_tokens(2, 40)


@pytest.mark.parametrize("kind", KINDS)
def test_history_that_diverges_right_after_the_prompt_reuses_all_of_it(tiny_models, kind):
    path = tiny_models[kind]
    ref = cold_run(path, P + Q, boundaries=(len(P),))
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        # a long reply moves the sliding window well past the end of P
        generate(engine, P, max_tokens=300)
        restored = engine.stats.checkpoints_restored
        warm = generate(engine, P + Q, return_prompt_logits=True)
        assert warm.usage.cached_tokens == len(P)
        assert (warm.usage.source, warm.usage.cached_tokens, warm.usage.computed_tokens) == ("slot", len(P), len(Q))
        if kind == "attention":
            assert engine.stats.checkpoints_restored == restored  # a plain cut
        else:
            # the reply cannot be cut away: the end-of-prompt checkpoint is restored
            assert engine.stats.checkpoints_restored == restored + 1
            assert warm.reuse.restored_checkpoint == len(P)
    finally:
        engine.stop()
    assert_same_answer(warm, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_divergence_inside_the_prompt_restores_the_message_checkpoint(tiny_models, kind):
    """P = A + B with a message boundary at len(A); the next history keeps A, replaces B."""
    path = tiny_models[kind]
    a, b, c = P[:200], P[200:], random_tokens(3, 50)
    ref = cold_run(path, a + c, boundaries=(len(a),))
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        generate(engine, a + b, boundaries=(len(a),), max_tokens=300)
        restored = engine.stats.checkpoints_restored
        warm = generate(engine, a + c, return_prompt_logits=True)
        assert warm.usage.cached_tokens == len(a)
        if kind != "attention":
            assert engine.stats.checkpoints_restored == restored + 1
            assert warm.reuse.restored_checkpoint == len(a)
    finally:
        engine.stop()
    assert_same_answer(warm, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_exact_repeat_reuses_the_whole_prompt_with_saved_logits(tiny_models, kind):
    path = tiny_models[kind]
    ref = cold_run(path, P)
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        first = generate(engine, P, return_prompt_logits=True)
        reused = engine.stats.logits_reused
        warm = generate(engine, P, return_prompt_logits=True)
        assert warm.usage.cached_tokens == len(P)
        assert (warm.usage.source, warm.usage.cached_tokens, warm.usage.computed_tokens) == ("slot", len(P), 0)
        assert warm.reuse.used_logits
        assert engine.stats.logits_reused == reused + 1
    finally:
        engine.stop()
    assert_same_answer(first, ref)
    assert_same_answer(warm, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_echoed_reply_continues_without_any_restore(tiny_models, kind):
    """The client sends back exactly what was generated, plus more: nothing is cut, even on
    recurrent state, because the slot ends exactly where the shared prefix ends."""
    path = tiny_models[kind]
    engine = tiny_engine(path, **REUSE_ENGINE)
    try:
        first = generate(engine, P)
        history = P + first.tokens + Q
        ref = cold_run(path, history, boundaries=(len(P),))
        restored = engine.stats.checkpoints_restored
        warm = generate(engine, history, return_prompt_logits=True)
        # the last generated token was sampled but never decoded, so it is evaluated again
        assert warm.usage.cached_tokens == len(P) + len(first.tokens) - 1
        assert engine.stats.checkpoints_restored == restored
    finally:
        engine.stop()
    assert_same_answer(warm, ref)


def test_sliding_window_without_checkpoint_falls_back_to_full_prefill(tiny_models):
    """Checkpoints are what makes SWA reuse work once the window has moved on: with a single
    checkpoint slot that only holds the end of the prompt, an earlier divergence recomputes."""
    path = tiny_models["swa"]
    engine = tiny_engine(path, ctx_checkpoints=1, checkpoint_every=0, **REUSE_ENGINE)
    try:
        generate(engine, P, max_tokens=300)
        warm = generate(engine, P[:150] + Q, return_prompt_logits=True)
        assert warm.usage.cached_tokens == 0
        assert "no checkpoint" in warm.reuse.reason
        assert engine.stats.full_prefills == 1
    finally:
        engine.stop()
    assert_same_answer(warm, cold_run(path, P[:150] + Q))
