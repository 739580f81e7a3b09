"""Native sampler chains through the engine: seed, logit_bias, penalties, EOG, stops and grammars."""

import pytest

from warmslot.slots import ErrorKind, GrammarSpec, SamplingParams
from warmslot.slots.llama_api import trigger_tokens
from tests.helpers import generate, tiny_engine
from tests.tiny_models import EOS_ID, IM_START_ID

pytestmark = pytest.mark.model

PROMPT = list(range(40, 90))


@pytest.fixture(scope="module")
def engine(tiny_models):
    eng = tiny_engine(tiny_models["attention"], n_parallel=2)
    yield eng
    eng.stop()


def sample(engine, **params):
    return generate(engine, PROMPT, max_tokens=24, sampling=SamplingParams(**params)).tokens


def test_same_seed_same_tokens_other_seed_other_tokens(engine):
    a = sample(engine, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    b = sample(engine, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    c = sample(engine, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=8)
    assert a == b
    assert a != c


def test_logit_bias_forces_and_bans_tokens(engine):
    forced = sample(engine, temperature=0.0, logit_bias={65: 100.0})
    assert set(forced) == {65}
    greedy = sample(engine, temperature=0.0)
    banned = sample(engine, temperature=0.0, logit_bias={greedy[0]: float("-inf")})
    assert banned[0] != greedy[0]


def test_repeat_penalty_changes_a_repetitive_greedy_output(engine):
    greedy = sample(engine, temperature=0.0)
    penalized = sample(engine, temperature=0.0, repeat_penalty=1.8, presence_penalty=1.0, frequency_penalty=1.0)
    assert penalized != greedy
    assert len(set(penalized)) >= len(set(greedy))


def test_end_of_generation_stops_unless_ignored(engine):
    r = generate(engine, PROMPT, max_tokens=24, sampling=SamplingParams(temperature=0.0, logit_bias={EOS_ID: 100.0}))
    assert r.finish.value == "stop" and r.tokens == [] and r.usage.completion_tokens == 1
    r = generate(engine, PROMPT, max_tokens=5, ignore_eos=True, sampling=SamplingParams(temperature=0.0, logit_bias={EOS_ID: 100.0}))
    assert r.finish.value == "length" and r.tokens == [EOS_ID] * 5


def test_stop_string_finishes_with_stop_and_cuts_the_text(engine):
    full = generate(engine, PROMPT, max_tokens=24)
    stop = full.text[5:8]
    r = generate(engine, PROMPT, max_tokens=24, stop=(stop,))
    assert r.finish.value == "stop"
    assert r.text == full.text[: full.text.index(stop)]


def test_max_tokens_zero_only_evaluates_the_prompt(engine):
    r = generate(engine, PROMPT + [7], max_tokens=0)
    assert r.tokens == [] and r.finish.value == "length" and r.usage.prompt_tokens == len(PROMPT) + 1
    # and the prompt is now warm
    assert generate(engine, PROMPT + [7, 8], max_tokens=1).usage.cached_tokens == len(PROMPT) + 1


def test_a_trigger_text_that_is_one_token_starts_a_lazy_grammar(engine):
    assert trigger_tokens(engine.model, ["<|im_start|>", "<|im_start|>x", "the"]) == [IM_START_ID]
    grammar = GrammarSpec('root ::= "<|im_start|>" "ok"\n', lazy=True, trigger_texts=["<|im_start|>"])
    sampling = SamplingParams(temperature=0.0, logit_bias={IM_START_ID: 100.0}, grammar=grammar)
    r = generate(engine, PROMPT, max_tokens=16, sampling=sampling)
    assert r.tokens[:3] == [IM_START_ID, ord("o"), ord("k")]
    assert r.finish.value == "stop" and r.usage.completion_tokens == 4  # then only end-of-generation


def test_a_grammar_past_the_compile_limits_is_refused_not_compiled(engine):
    """llama.cpp's parser overflows its stack on this nesting; the engine refuses the request."""
    deep = GrammarSpec("root ::= " + '("a" ' * 20_000 + ")?" * 20_000 + "\n")
    r = generate(engine, PROMPT, sampling=SamplingParams(temperature=0.0, grammar=deep))
    assert r.error is not None and r.error.kind is ErrorKind.INVALID and "nests" in r.error.message
    assert generate(engine, PROMPT, max_tokens=2).usage.completion_tokens == 2
