"""The reuse decision on its own: how much of a sequence a new prompt keeps."""

import random

import numpy as np
import pytest

from warmslot.cache.checkpoints import Checkpoint, CheckpointList
from warmslot.slots.reuse.plan import common_prefix, plan_reuse


def state():
    return np.zeros(4, dtype=np.uint8)


def logits():
    return np.zeros(8, dtype=np.float32)


def test_common_prefix_agrees_with_a_plain_scan():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randrange(0, 3000)
        a = [rng.randrange(4) for _ in range(n)]
        b = a[: rng.randrange(0, n + 1)] + [rng.randrange(4) for _ in range(rng.randrange(0, 50))]
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b, step=rng.choice([1, 7, 512])) == expected
        assert common_prefix(tuple(a), b) == expected


ANYWHERE = lambda n: True  # noqa: E731  attention memory
NOWHERE = lambda n: False  # noqa: E731  recurrent memory


def test_attention_memory_cuts_at_the_divergence():
    plan = plan_reuse([1, 2, 3, 4, 5], CheckpointList(4, 1 << 20), [1, 2, 3, 9], ANYWHERE)
    assert (plan.matched, plan.keep, plan.restore) == (3, 3, None)


def test_at_least_one_prompt_token_is_evaluated_without_saved_logits():
    plan = plan_reuse([1, 2, 3, 4, 5], CheckpointList(4, 1 << 20), [1, 2, 3], ANYWHERE)
    assert plan.keep == 2 and plan.logits is None


def test_an_exact_repeat_uses_the_logits_saved_at_the_prompt_end():
    cks = CheckpointList(4, 1 << 20)
    cks.add(Checkpoint(3, None, logits()))
    plan = plan_reuse([1, 2, 3, 4, 5], cks, [1, 2, 3], ANYWHERE)
    assert plan.keep == 3 and plan.logits is not None


def test_recurrent_memory_restores_the_newest_checkpoint_at_or_before_the_divergence():
    cks = CheckpointList(8, 1 << 20)
    for n in (2, 4, 6):
        cks.add(Checkpoint(n, state()))
    plan = plan_reuse(list(range(10)), cks, list(range(5)) + [99], NOWHERE)
    assert plan.keep == 4 and plan.restore.n_tokens == 4
    # the memory ends exactly where the prompt continues: nothing to restore
    plan = plan_reuse(list(range(10)), cks, list(range(12)), NOWHERE)
    assert plan.keep == 10 and plan.restore is None


def test_recurrent_memory_without_a_checkpoint_starts_over_and_says_why():
    plan = plan_reuse(list(range(10)), CheckpointList(8, 1 << 20), list(range(5)) + [99], NOWHERE)
    assert plan.keep == 0 and "no checkpoint" in plan.reason


@pytest.mark.parametrize("window_start", [0, 3, 8])
def test_sliding_window_cuts_inside_the_window_and_restores_outside(window_start):
    cks = CheckpointList(8, 1 << 20)
    cks.add(Checkpoint(2, state()))
    can_cut = lambda n: n >= window_start  # noqa: E731
    plan = plan_reuse(list(range(10)), cks, list(range(5)) + [99], can_cut)
    if window_start <= 5:
        assert plan.keep == 5 and plan.restore is None
    else:
        assert plan.keep == 2 and plan.restore.n_tokens == 2
