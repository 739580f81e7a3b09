"""--cache-reuse: chunks of a slot's previous prompt shifted to where a new prompt has them.

The chunk matching on its own (`plan_shifts`, pure), then the engine on the tiny models: on
attention memory a prompt that lost a chunk before a long matching one takes the matching one
from the slot, shifted, and computes fewer tokens; with the flag off, and on every memory that
cannot shift, the answer is a cold run's. Shifted KV never reaches the prompt cache.
"""

import pytest

from tests.helpers import REUSE_ENGINE, assert_same_answer, cold_run, generate, random_tokens, tiny_engine
from tests.tiny_models import KINDS
from warmslot.cache.disk import format as fmt
from warmslot.server.process.config import parse_config
from warmslot.slots.reuse.plan import ChunkMove, ReusePlan, plan_shifts, with_shifts

A, B, C, D = random_tokens(11, 40), random_tokens(12, 30), random_tokens(13, 120), random_tokens(14, 12)


def chunk(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_removed_chunk_moves_what_follows_it_back():
    a, b, c = chunk(100, 10), chunk(200, 5), chunk(300, 20)
    assert plan_shifts(a + b + c, a + c + [1], 10, 4) == (ChunkMove(15, 10, 20),)
    # each chunk moves to where the prompt has it; the gaps between go
    assert plan_shifts(a + b + c + b + c, a + c + c + [1], 10, 4) == (ChunkMove(15, 10, 20), ChunkMove(40, 30, 20))


def test_runs_shorter_than_the_chunk_size_and_inserted_text_are_computed():
    a, b, c = chunk(100, 10), chunk(200, 5), chunk(300, 20)
    assert plan_shifts(a + b + c, a + c[:3] + [1], 10, 4) == ()  # 3 tokens < 4
    # text inserted before a chunk: keeping the chunk would leave a hole to fill, so it is computed
    assert plan_shifts(a + c, a + [7, 8] + c + [1], 10, 4) == ()
    # a chunk matched only up to where the prompt changes again
    assert plan_shifts(a + b + c, a + c[:8] + [9] * 3, 10, 4) == (ChunkMove(15, 10, 8),)


def test_the_prompts_last_token_is_never_taken():
    c = chunk(300, 20)
    assert plan_shifts([5] + c, c, 0, 4) == (ChunkMove(1, 0, 19),)
    assert plan_shifts([5] + c[:4], c[:4], 0, 4) == ()  # 3 takeable tokens < 4


def test_shifts_follow_only_a_plain_exact_prefix():
    a, b, c = chunk(100, 10), chunk(200, 5), chunk(300, 20)
    plan = ReusePlan(matched=10, keep=10)
    assert with_shifts(plan, a + b + c, a + c + [1], 0) is plan  # off
    shifted = with_shifts(plan, a + b + c, a + c + [1], 4)
    assert (shifted.keep, shifted.shifted, shifted.kept) == (10, 20, 30)
    restored = ReusePlan(matched=10, keep=4, reason="restored")  # a checkpoint's prefix: nothing shifts
    assert with_shifts(restored, a + b + c, a + c + [1], 4) is restored


def test_the_flag_takes_a_chunk_size_and_refuses_a_negative_one():
    assert parse_config(["-m", "x.gguf"])[0].engine.cache_reuse == 0
    assert parse_config(["-m", "x.gguf", "--cache-reuse", "256"])[0].engine.cache_reuse == 256
    with pytest.raises(SystemExit):
        parse_config(["-m", "x.gguf", "--cache-reuse", "-1"])
    with pytest.raises(SystemExit):
        parse_config(["-m", "x.gguf", "--cache-reuse", "many"])


@pytest.mark.model
def test_a_chunk_after_a_removed_one_is_shifted_and_not_computed(tiny_models):
    engine = tiny_engine(tiny_models["attention"], cache_reuse=4, **REUSE_ENGINE)
    try:
        generate(engine, A + B + C, max_tokens=4)
        warm = generate(engine, A + C + D, max_tokens=4)
        assert warm.error is None
        assert (warm.usage.cached_tokens, warm.usage.shifted_tokens) == (len(A + C), len(C))
        assert warm.usage.computed_tokens == len(D)
        assert engine.stats.prompt_tokens["shifted"] == len(C)
        # another conversation takes the slot: what it held is saved up to its first shifted
        # token only (A, which the entry of A + B + C saved before the shift holds already)
        other = generate(engine, random_tokens(15, 60), max_tokens=2)
        assert other.error is None and other.usage.shifted_tokens == 0
        entries = [list(e.tokens) for e in engine.cache.entries()]
        assert entries and all(e[: len(A + B + C)] == A + B + C for e in entries)
        engine.cache.sanity_check()
    finally:
        engine.stop()


@pytest.mark.model
@pytest.mark.parametrize("kind", KINDS)
def test_without_shifting_the_answer_is_a_cold_runs(tiny_models, kind):
    """The flag off (attention), or on where the memory cannot shift (the other kinds)."""
    path = tiny_models[kind]
    ref = cold_run(path, A + C + D)
    engine = tiny_engine(path, cache_reuse=0 if kind == "attention" else 4, **REUSE_ENGINE)
    try:
        generate(engine, A + B + C, max_tokens=4)
        warm = generate(engine, A + C + D, return_prompt_logits=True, logprobs=2)
        assert warm.usage.shifted_tokens == (None if kind == "attention" else 0)
        assert warm.usage.cached_tokens <= len(A)
    finally:
        engine.stop()
    assert_same_answer(warm, ref)


@pytest.mark.model
def test_a_slot_with_shifted_chunks_reaches_the_disk_without_them(tiny_models, tmp_path):
    """At shutdown the slots' contents are written to the disk tier as they are: a slot that
    holds shifted chunks is first cut back to its exact prefix."""
    directory = tmp_path / "disk"
    engine = tiny_engine(tiny_models["attention"], cache_reuse=4, cache_disk=str(directory), cache_disk_size=64 << 20,
                         cache_ram=64 << 20, **REUSE_ENGINE)
    try:
        generate(engine, A + B + C, max_tokens=4)
        assert generate(engine, A + C + D, max_tokens=4).usage.shifted_tokens == len(C)
    finally:
        engine.stop()
    written = [fmt.read_header(str(p)).tokens for p in directory.iterdir() if p.name.endswith(fmt.SUFFIX)]
    assert written and all(list(t[: len(A + B + C)]) == A + B + C or list(t) == A for t in written), written
