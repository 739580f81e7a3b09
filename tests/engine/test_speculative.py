"""Speculative decoding (ngram-simple): drafts from the slot's own tokens are verified in the
step's one decode; output, grammars and reuse are as without it. Real llama.cpp: the default
model (a sliding-window model) and the tiny models per memory kind."""

import math
import re
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import generate, random_tokens, tiny_engine, warmslot_server
from tests.tiny_models import write_tiny_model
from warmslot.server.process.config import parse_config
from warmslot.slots import DraftLimits, GenerateRequest, GrammarSpec, NotReady, QueueSink, SamplingParams, SpecConfig
from warmslot.slots.speculation import ngram_drafter
from warmslot.slots.speculation import speculator as speculative
from warmslot.slots.speculation.ngram_memory import NgramMemory
from warmslot.slots.speculation.ngram_drafter import NgramDrafter

NGRAM = SpecConfig(type="ngram-simple", n_max=16, ngram_n=4)
# the model copies the earlier answer: every generated token wins by a clear margin (its top
# two logprobs are at least 0.25 apart), so batch-shape rounding cannot flip a greedy choice
REPEAT = (
    "Q: Repeat 'one two three four five six seven eight nine ten' twice.\n"
    "A: one two three four five six seven eight nine ten one two three four five six seven eight nine ten\n"
    "Q: Repeat 'one two three four five six seven eight nine ten' twice.\nA:"
)


# -- drafting (no model) --------------------------------------------------------------------


def test_ngram_simple_drafts_what_followed_the_latest_earlier_occurrence():
    d = NgramDrafter(3, 48)
    history = [9, 1, 2, 3, 4, 5, 7, 1, 2, 3, 6, 8, 1, 2]
    # the last 3 tokens with the pending one are [1, 2, 3]: latest earlier start is 7, and what
    # followed it reaches the present: the last 5 tokens repeat, as they did
    assert d.draft(history, 3, limit=12) == [6, 8, 1, 2, 3, 6, 8, 1, 2, 3, 6, 8]
    assert d.draft(history, 3, limit=2) == [6, 8]
    # a loop of period 2 drafts its whole length, not 2 tokens
    assert NgramDrafter(4, 48).draft([5, 7] * 6, 5, limit=9) == [7, 5, 7, 5, 7, 5, 7, 5, 7]
    assert d.draft(history + [3], 5, limit=16) == []  # [2, 3, 5] never occurred
    assert NgramDrafter(3, 2).draft(history, 3, limit=16) == [6, 8]  # --spec-ngram-size-m


def test_shorter_n_grams_draft_where_the_longest_did_not_occur_cut_where_they_disagree():
    assert ngram_drafter.ngram_sizes(12, 3) == (12, 8, 6, 4, 3) and ngram_drafter.ngram_sizes(4, 4) == (4,)
    history = [9, 8, 7, 1, 2, 3, 4, 5, 6]
    # the last 6 tokens with the pending 3 never occurred, the last 3 ([1, 2, 3]) did once
    assert NgramDrafter(6, 48, n_min=3).draft(history + [7, 1, 2], 3, limit=4) == [4, 5, 6, 7]
    assert NgramDrafter(6, 48, n_min=6).draft(history + [7, 1, 2], 3, limit=4) == []  # --spec-ngram-size-min
    # [1, 2, 3] occurred twice, followed by 4, 5, 6 and by 4, 5, 0: the draft stops where they differ
    twice = history + [1, 2, 3, 4, 5, 0, 8, 1, 2]
    assert NgramDrafter(6, 48, n_min=3).draft(twice, 3, limit=8) == [4, 5]
    # the longest n-gram drafts from its latest occurrence alone, as ngram-simple does
    assert NgramDrafter(3, 48).draft(twice, 3, limit=3) == [4, 5, 0]


def test_a_copy_goes_on_from_its_source_while_the_output_follows_it():
    source = [1, 2, 3, 4, 5, 6, 7, 8]
    tokens = source + [0, 5, 6, 9, 0, 1, 2]  # [5, 6] recurs later, followed by 9
    d = NgramDrafter(2, 48, n_min=2)
    assert d.draft(tokens, 3, limit=2) == [4, 5]  # [2, 3] occurred at the start: the copy begins
    # both drafted tokens accepted, and the next token is the source's next (6): the copy goes
    # on there, though the latest occurrence of [5, 6] is followed by 9
    assert d.draft(tokens + [3, 4, 5], 6, limit=2) == [7, 8]
    assert NgramDrafter(2, 48, n_min=2).draft(tokens + [3, 4, 5], 6, limit=2) == [9, 0]
    # a token the source does not hold ends the copy: the n-grams decide again
    assert d.draft(tokens + [3, 4, 5, 6], 9, limit=2) == [0, 1]


def test_the_memory_drafts_what_an_earlier_output_emitted_after_the_n_gram():
    memory = NgramMemory(3, budget=40)
    memory.remember("", [7, 7, 1, 2], [3, 4, 5, 6])  # kept after its prompt's last 2 tokens
    d = NgramDrafter(3, 48, memory)
    # [1, 2, 3] never occurred in this history: the output that followed it is drafted
    assert d.draft([9, 9, 1, 2], 3, limit=8) == [4, 5, 6]
    assert NgramDrafter(3, 48, memory, tenant="other").draft([9, 9, 1, 2], 3, limit=8) == []  # tenants apart
    assert NgramDrafter(3, 48, memory).draft([1, 2, 3, 8, 1, 2], 3, limit=5) == [8, 1, 2, 3, 8]  # the history's own first
    memory.remember("", [0, 1, 2], [3, 9, 9, 9])  # the newest output wins
    assert memory.draft("", [1, 2, 3], 2) == [9, 9]
    for i in range(12):  # past the budget the oldest go, with what the index held of them
        memory.remember("", [50, 51], [60 + i, 61 + i, 62 + i])
    assert memory.draft("", [1, 2, 3], 2) == [] and len(memory) <= 40
    assert memory.draft("", [51, 71, 72], 1) == [73]
    assert len(memory._index) <= len(memory)


def test_draft_length_follows_what_a_drafted_token_costs():
    # on a GPU a drafted token costs little: long drafts pay even at modest acceptance
    assert speculative.best_length(0.8, 0.0, 0.04, 16) >= 8
    # on a CPU each costs a fifth of a step: short drafts, none at low acceptance
    assert speculative.best_length(0.5, 0.0, 0.2, 16) == 1
    assert speculative.best_length(0.9, 0.0, 0.2, 16) in (5, 6, 7)
    assert speculative.best_length(0.1, 0.0, 0.2, 16) == 0
    # a fixed cost per verify step (a new graph) calls for fewer, longer drafts
    assert speculative.best_length(0.9, 1.0, 0.04, 16) > speculative.best_length(0.9, 0.0, 0.2, 16)


def test_step_cost_is_learned_from_steps():
    cost = speculative.StepCost()
    for _ in range(5):
        cost.observe(1, 0, False, 0.010)  # plain one-slot steps of 10 ms
        cost.observe(1, 0, True, 0.050)  # a prefill step: ignored
    assert cost.model() is None
    for drafted in (2, 4, 8, 4, 2, 8):
        cost.observe(1, drafted, False, 0.010 * (1 + 0.5 + 0.25 * drafted))
    fixed, per_token = cost.model()
    assert fixed == pytest.approx(0.5, abs=1e-6) and per_token == pytest.approx(0.25, abs=1e-6)


def test_spec_flags_follow_llama_server():
    config, _ = parse_config(["-m", "x.gguf", "--spec-type", "ngram-simple", "--draft-max", "8", "--draft-min", "2",
                              "--spec-ngram-size-n", "5", "--spec-ngram-size-m", "20", "--draft-p-min", "0.5"])
    assert config.engine.spec == SpecConfig("ngram-simple", 8, 2, 0.5, 5, 20)
    assert parse_config(["-m", "x.gguf"])[0].engine.spec.on is False  # off by default
    for argv in (["--spec-type", "eagle"], ["--draft-max", "-1"], ["--draft-p-min", "2"], ["--spec-ngram-size-n", "0"]):
        with pytest.raises(SystemExit):
            parse_config(["-m", "x.gguf", *argv])


def test_recurrent_snapshots_go_to_the_drafters_that_verify_at_most_steps():
    """--spec-rs-snapshots: -1 keeps 4 recurrent states per sequence with MTP or a draft model
    (bounded by --draft-max), none with n-grams; only recurrent and hybrid memory keeps any."""
    from warmslot.slots.llama_api import MemoryKind

    hybrid = MemoryKind.HYBRID
    assert SpecConfig(type="draft-mtp").snapshots_for(hybrid) == 4
    assert SpecConfig(type="draft-mtp", n_max=2).snapshots_for(hybrid) == 2
    assert SpecConfig(type="draft", draft_model="d.gguf").snapshots_for(MemoryKind.RECURRENT) == 4
    assert SpecConfig(type="ngram-simple").snapshots_for(hybrid) == 0
    assert SpecConfig(type="ngram-simple", rs_snapshots=6).snapshots_for(hybrid) == 6
    assert SpecConfig(type="draft-mtp").snapshots_for(MemoryKind.ATTENTION) == 0
    assert SpecConfig().snapshots_for(hybrid) == 0  # no drafts
    config, _ = parse_config(["-m", "x.gguf", "--spec-type", "ngram-simple", "--spec-rs-snapshots", "3"])
    assert config.engine.spec.rs_snapshots == 3
    with pytest.raises(SystemExit):
        parse_config(["-m", "x.gguf", "--spec-type", "ngram-simple", "--spec-rs-snapshots", "-2"])


def test_draft_model_flags(tmp_path):
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    config, _ = parse_config(["-m", "x.gguf", "-md", str(draft), "-ngld", "0", "-ctkd", "q8_0", "--draft-p-min", "0.5"])
    spec = config.engine.spec
    assert (spec.type, spec.draft_model, spec.draft_gpu_layers, spec.draft_type_k, spec.p_min) == ("draft", str(draft), 0, "q8_0", 0.5)
    for argv in (["-md", str(draft), "--spec-type", "ngram-simple"], ["--spec-type", "draft"], ["-md", str(tmp_path / "none.gguf")]):
        with pytest.raises(SystemExit):
            parse_config(["-m", "x.gguf", *argv])
    # -devd: the draft model's devices; by default the model's (-dev)
    devices = {
        tuple(argv): parse_config(["-m", "x.gguf", "-md", str(draft), *argv])[0].engine.spec.draft_devices
        for argv in ([], ["-dev", "CUDA1"], ["-dev", "CUDA1", "-devd", "none"], ["--spec-draft-device", "CUDA0,CUDA1"])
    }
    assert list(devices.values()) == [None, ("CUDA1",), (), ("CUDA0", "CUDA1")]


def test_a_draft_model_on_no_device_or_an_unknown_one(tiny_models):
    """-devd none keeps the draft model on the CPU, and it drafts; a device that does not exist
    is refused at start, naming it."""
    target = tiny_models["attention"]
    engine = tiny_engine(target, spec=SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0, draft_devices=()))
    try:
        assert generate(engine, random_tokens(7, 30), max_tokens=16).usage.draft_accepted > 0
    finally:
        engine.stop()
    with pytest.raises(NotReady, match="NOPE"):
        tiny_engine(target, spec=SpecConfig(type="draft", draft_model=str(target), draft_devices=("NOPE",)))


# -- the engine on the default model --------------------------------------------------------


@pytest.fixture(scope="module")
def engines(default_model):
    off = tiny_engine(default_model, n_ctx=2048, n_parallel=2)
    on = tiny_engine(default_model, n_ctx=2048, n_parallel=2, spec=NGRAM)
    yield off, on
    off.stop()
    on.stop()


def test_greedy_output_is_unchanged_and_drafts_are_accepted(engines):
    off, on = engines
    prompt = off.model.tokenize(REPEAT, add_special=True, parse_special=False)
    steps = off.stats.steps
    plain = generate(off, prompt, max_tokens=40)
    plain_steps = off.stats.steps - steps
    steps, drafted, accepted = on.stats.steps, sum(on.stats.spec_drafted.values()), sum(on.stats.spec_accepted.values())
    fast = generate(on, prompt, max_tokens=40)
    fast_steps = on.stats.steps - steps
    # the request's usage counts every step's draft, the last one's too
    assert fast.usage.draft_tokens == sum(on.stats.spec_drafted.values()) - drafted
    assert fast.usage.draft_accepted == sum(on.stats.spec_accepted.values()) - accepted
    assert fast.tokens == plain.tokens and len(plain.tokens) == 40
    assert fast.usage.draft_accepted > 10 and fast.usage.draft_tokens >= fast.usage.draft_accepted
    assert plain.usage.draft_tokens == 0
    assert fast_steps < plain_steps / 2, (fast_steps, plain_steps)


def test_two_slots_at_once_give_each_its_own_output(engines):
    off, on = engines
    prompts = [off.model.tokenize(REPEAT, add_special=True, parse_special=False),
               off.model.tokenize("The capital of France is", add_special=True, parse_special=False)]
    want = [generate(off, p, max_tokens=24).tokens for p in prompts]
    sinks = [QueueSink(), QueueSink()]
    for i, (p, sink) in enumerate(zip(prompts, sinks)):
        on.submit(GenerateRequest(f"two{i}", p, sink, SamplingParams(temperature=0.0), max_tokens=24))
    got = [sink.collect() for sink in sinks]
    assert [r.tokens for r in got] == want
    assert got[0].usage.draft_accepted > 0


def test_the_next_turn_reuses_the_accepted_tokens(engines):
    _, on = engines
    prompt = on.model.tokenize(REPEAT, add_special=True, parse_special=False)
    first = generate(on, prompt, max_tokens=30, cache_key="conversation")
    assert first.usage.draft_accepted > 0
    follow = prompt + first.tokens + on.model.tokenize("\nQ: Thanks.\nA:", add_special=False, parse_special=False)
    second = generate(on, follow, max_tokens=4, cache_key="conversation")
    # everything the slot decoded: the prompt and every output token but the last sampled one
    assert second.usage.cached_tokens >= len(prompt) + len(first.tokens) - 1


def test_a_request_drafts_from_what_an_earlier_request_emitted(engines):
    """A retried turn: the second request drafts from the first one's output (a count: its own
    history never holds the n-gram it is at), accepts it and runs in far fewer steps; another
    tenant's request does not draft from it."""
    off, on = engines
    prompt = on.model.tokenize("Count from 1 to 40: 1, 2, 3,", add_special=True, parse_special=False)
    want = generate(off, prompt, max_tokens=48).tokens
    first = generate(on, prompt, max_tokens=48)
    steps = on.stats.steps
    again = generate(on, prompt, max_tokens=48)
    steps = on.stats.steps - steps
    other = generate(on, prompt, max_tokens=48, tenant="other")
    assert first.tokens == again.tokens == other.tokens == want
    # how long a draft may be follows the step costs the engine measures, which a busy
    # machine raises (two tests at a time): 30 and more accepted alone, 23 seen under load
    assert again.usage.draft_accepted >= first.usage.draft_accepted + 16, (first.usage, again.usage)
    assert other.usage.draft_accepted == first.usage.draft_accepted
    assert steps <= 48 - 16, steps


def test_a_request_turns_drafting_off(engines):
    off, on = engines
    prompt = on.model.tokenize(REPEAT, add_special=True, parse_special=False)
    quiet = SamplingParams(temperature=0.0, speculative=DraftLimits(n_max=0))
    r = generate(on, prompt, max_tokens=20, sampling=quiet)
    assert r.usage.draft_tokens == 0
    assert r.tokens == generate(off, prompt, max_tokens=20).tokens


def test_a_grammar_never_accepts_a_drafted_token_it_rejects(engines):
    """The history says ' seven' after ' six'; the grammar allows only one to six, so drafts
    of the copy must be cut there, and the output is what it is without drafts."""
    off, on = engines
    prompt = on.model.tokenize(REPEAT, add_special=True, parse_special=False)
    grammar = GrammarSpec('root ::= (" " word)+\nword ::= "one" | "two" | "three" | "four" | "five" | "six"')
    sampling = SamplingParams(temperature=0.0, grammar=grammar)
    r = generate(on, prompt, max_tokens=24, sampling=sampling)
    words = r.text.split()
    assert all(w in ("one", "two", "three", "four", "five", "six") for w in words[:-1]), r.text
    assert re.fullmatch(r"( (one|two|three|four|five|six))*( \w*)?", r.text), r.text
    # drafting ran (whether the model later turns down a draft of allowed words is a near-tie,
    # below, and so is not asserted)
    assert r.usage.draft_tokens >= r.usage.draft_accepted > 0
    # the copy up to ' six', then the grammar's ' six' where the history (and the draft) says
    # ' seven', as without drafts; past that the model's picks among the allowed words are
    # near-ties (logits 16.31 for ' five' against 16.42 for ' three') that a step of another
    # shape may round the other way
    plain = generate(off, prompt, max_tokens=24, sampling=SamplingParams(temperature=0.0, grammar=grammar))
    assert r.tokens[:7] == plain.tokens[:7]
    assert r.text.split()[:7] == ["one", "two", "three", "four", "five", "six", "six"]


def _chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-squared with `dof` degrees of freedom (closed forms, no SciPy)."""
    h = x / 2
    if dof % 2 == 0:
        term = total = 1.0
        for i in range(1, dof // 2):
            term *= h / i
            total += term
        return math.exp(-h) * total
    total, term = math.erfc(math.sqrt(h)), math.sqrt(h) / math.gamma(1.5)
    for i in range(1, (dof + 1) // 2):
        total += math.exp(-h) * term
        term *= h / (i + 0.5)
    return total


def _homogeneity_p(a: list, b: list, least: int = 10) -> float:
    """Chi-squared test that two samples come from one distribution; outcomes seen fewer than
    `least` times in both together are pooled."""
    ca, cb = Counter(a), Counter(b)
    common = [k for k in ca.keys() | cb.keys() if ca[k] + cb[k] >= least]
    rows = [(ca[k], cb[k]) for k in common]
    rest = (len(a) - sum(r[0] for r in rows), len(b) - sum(r[1] for r in rows))
    if sum(rest):
        rows.append(rest)
    if len(rows) < 2:
        return 1.0
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in rows:
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return _chi2_sf(stat, len(rows) - 1)


def test_chi2_tail_matches_known_values():
    assert _chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert _chi2_sf(5.991, 2) == pytest.approx(0.05, abs=1e-3)
    assert _chi2_sf(16.919, 9) == pytest.approx(0.05, abs=1e-3)
    assert _homogeneity_p([1] * 50 + [2] * 50, [1] * 50 + [2] * 50) == pytest.approx(1.0)
    assert _homogeneity_p([1] * 80 + [2] * 20, [1] * 50 + [2] * 50) < 1e-4


def test_sampling_at_temperature_1_keeps_the_token_distribution(tiny_models):
    """At temperature 1 the tokens at each of the first four positions are distributed as
    without drafts: a chi-squared test per position on 2,000 seeded requests a side (distinct
    seeds), each p-value above 0.001 (a false alarm in under 1 run of 250). The prompt is the
    model's own sampled text and drafts look up one token, so drafts are proposed at most
    steps and both accepted and rejected; a rule that kept a rejected draft, or sampled the
    wrong row, would move these distributions. The same test tells temperature 0.75 from 1."""
    args = dict(n_ctx=4096, n_parallel=8)
    # top-k 3 keeps the random model's next token to a few likely ones, so drafts of what
    # followed a token before are often right
    def sampling(seed, temperature=1.0):
        return SamplingParams(temperature=temperature, top_k=3, top_p=1.0, min_p=0.0, seed=seed)

    def samples(engine, prompt, first_seed, n=2000, k=4, temperature=1.0):
        out = []
        for wave in range(0, n, 30):  # within the engine's queue
            sinks = []
            for i in range(wave, min(n, wave + 30)):
                sinks.append(QueueSink())
                engine.submit(GenerateRequest(f"t-{first_seed + i}", prompt, sinks[-1], sampling(first_seed + i, temperature),
                                              max_tokens=k, ignore_eos=True))
            out += [tuple(sink.collect().tokens) for sink in sinks]
        assert all(len(t) == k for t in out)
        return out

    def p_values(a, b):
        return [_homogeneity_p([t[pos] for t in a], [t[pos] for t in b]) for pos in range(len(a[0]))]

    off = tiny_engine(tiny_models["attention"], **args)
    try:
        prompt = random_tokens(1, 16)
        prompt += generate(off, prompt, max_tokens=200, ignore_eos=True, sampling=sampling(0)).tokens
        plain = samples(off, prompt, 1)
        cooler = samples(off, prompt, 100_001, temperature=0.75)
    finally:
        off.stop()
    on = tiny_engine(tiny_models["attention"], spec=SpecConfig(type="ngram-simple", n_max=8, ngram_n=1), **args)
    try:
        fast = samples(on, prompt, 200_001)
        drafted, accepted = sum(on.stats.spec_drafted.values()), sum(on.stats.spec_accepted.values())
    finally:
        on.stop()
    assert drafted - accepted > 200 and accepted > 500, (drafted, accepted)
    assert len(set(plain)) > 20  # a distribution worth comparing
    assert min(p_values(plain, fast)) > 1e-3, p_values(plain, fast)
    assert min(p_values(plain, cooler)) < 1e-3, p_values(plain, cooler)


# -- the tiny models: four slots, greedy and sampled ----------------------------------------


def _four(engine, kind):
    base = random_tokens(1, 30)
    prompts = [base * 3, random_tokens(2, 20) * 4, base * 2 + random_tokens(3, 10), random_tokens(4, 40)]
    sinks = []
    for i, prompt in enumerate(prompts):
        sinks.append(QueueSink())
        # two greedy requests, two at temperature 1 with a seed: a sampled token is drawn by
        # the same chain from the same logits with or without drafts, so even these agree
        sampling = SamplingParams(temperature=0.0) if i < 2 else SamplingParams(temperature=1.0, seed=7 + i)
        engine.submit(GenerateRequest(f"{kind}{i}", prompt, sinks[-1], sampling, max_tokens=40))
    return [sink.collect() for sink in sinks]


@pytest.mark.parametrize("kind", ["attention", "swa", "hybrid", "recurrent"])
def test_four_slots_agree_with_and_without_drafts(tiny_models, kind):
    args = dict(n_ctx=1024, n_parallel=4, n_batch=64, n_ubatch=64)
    results = {}
    for spec in (SpecConfig(), SpecConfig(type="ngram-simple", n_max=8, ngram_n=3)):
        engine = tiny_engine(tiny_models[kind], spec=spec, **args)
        try:
            results[spec.on] = _four(engine, kind)
            reason, rollbacks = engine.spec.reason, engine.stats.spec_rollbacks
        finally:
            engine.stop()
    assert [r.tokens for r in results[True]] == [r.tokens for r in results[False]]
    assert reason is None
    if kind in ("attention", "swa"):  # the random models draft little: the cut drafts are tested below
        assert sum(r.usage.draft_tokens for r in results[True]) > 0 and rollbacks == 0


def _drafting_wrong_in(
    tiny_models, monkeypatch, seed: int, wrong: range, kind: str = "attention", stats: dict | None = None, snapshots: int = 8,
):
    """48 greedy tokens of a random prompt with an n-gram drafter that proposes a token the
    model never emits while the tokens generated so far are in `wrong`, and the output
    without drafts otherwise. Returns (the result with drafts, the output without, the steps
    the engine ran for it); `stats` gets the engine's rollback counters."""
    prompt = random_tokens(seed, 24)
    off = tiny_engine(tiny_models[kind])
    try:
        want = generate(off, prompt, max_tokens=48).tokens
    finally:
        off.stop()
    never = next(t for t in range(256) if t not in want)

    class Drafter:
        def __init__(self, n, m, *memory):
            pass

        def draft(self, tokens, pending, limit):
            done = len(tokens) + 1 - len(prompt)  # tokens generated so far, the pending one included
            return [never] * limit if done in wrong else list(want[done : done + limit])

    monkeypatch.setattr(speculative, "NgramDrafter", Drafter)
    on = tiny_engine(tiny_models[kind], spec=SpecConfig(type="ngram-simple", n_max=8, ngram_n=3, rs_snapshots=snapshots))
    try:
        steps = on.stats.steps
        r = generate(on, prompt, max_tokens=48)
        steps = on.stats.steps - steps
        if stats is not None:
            stats.update(rollbacks=on.stats.spec_rollbacks, verify_steps=on.stats.spec_verify_steps,
                         copies=on.stats.spec_state_copies, n_rs_seq=on.ctx.n_rs_seq)
    finally:
        on.stop()
    return r, want, steps


def test_ngram_drafts_are_checked_before_they_are_verified(tiny_models, monkeypatch):
    """A drafter that is wrong for the first 20 tokens, then right: the request verifies no
    draft until one would have had its first token accepted (checked against the token it then
    emits, at no cost), and from then on its drafts are verified and accepted. The output is
    the one without drafts."""
    r, want, steps = _drafting_wrong_in(tiny_models, monkeypatch, 5, range(0, 20))
    assert r.tokens == want
    rejected = r.usage.draft_tokens - r.usage.draft_accepted
    assert rejected == 0 and r.usage.draft_accepted >= 12, r.usage  # none verified while wrong
    assert steps < 48 - 10


def test_after_a_fruitless_draft_drafts_are_checked_again(tiny_models, monkeypatch):
    """A drafter that is right, then wrong from token 12 to 30, then right: one verified draft
    is rejected when it turns wrong, none after it until the drafter is right again."""
    r, want, _ = _drafting_wrong_in(tiny_models, monkeypatch, 6, range(12, 30))
    assert r.tokens == want
    # drafts made before token 12 are right; of those made in the wrong stretch only the first
    # is verified (at most --draft-max tokens), where backing off would verify one every few steps
    rejected = r.usage.draft_tokens - r.usage.draft_accepted
    assert 1 <= rejected <= 8, r.usage
    assert r.usage.draft_accepted >= 15, r.usage


@pytest.mark.parametrize("kind,snapshots", [("recurrent", 8), ("hybrid", 0), ("hybrid", 8)])
def test_recurrent_and_hybrid_memory_roll_a_cut_draft_back(tiny_models, monkeypatch, kind, snapshots):
    """Memory that cannot be cut back: a draft that is partly rejected is taken back, either
    to the recurrent state llama.cpp kept after the last accepted token (Qwen3.5's hybrid
    memory with snapshots: seq_rm alone), or by putting back the state copied before the
    step and decoding the kept tokens again (Mamba 2, which has no snapshots, or
    --spec-rs-snapshots 0). With a drafter that is right, then wrong from token 12 to 30,
    then right, the output is the one without drafts, drafts are accepted, and each cut
    draft was rolled back."""
    stats: dict = {}
    r, want, steps = _drafting_wrong_in(tiny_models, monkeypatch, 6, range(12, 30), kind=kind, stats=stats, snapshots=snapshots)
    assert r.tokens == want
    rejected = r.usage.draft_tokens - r.usage.draft_accepted
    assert rejected >= 1 and r.usage.draft_accepted >= 15, r.usage
    assert stats["rollbacks"] >= 1, stats
    assert steps < 48 - 10
    with_snapshots = kind == "hybrid" and snapshots > 0
    assert stats["n_rs_seq"] == (8 if with_snapshots else 0), stats
    assert (stats["copies"] == 0) == with_snapshots, stats  # drafts of at most 8 tokens


def test_a_draft_model_that_proposes_nothing_backs_off(tiny_models, monkeypatch):
    """A draft model's draft costs a decode to make: when its drafts gain nothing the request
    decodes 4, 8, 16, ... steps without drafting, so over 48 tokens it drafts 4 times, not 47."""
    prompt = random_tokens(5, 24)
    on = tiny_engine(tiny_models["attention"], spec=SpecConfig(type="ngram-simple", n_max=8, ngram_n=3))
    calls = []

    class Empty:
        def draft_batch(self, requests):
            calls.extend(len(tokens) for _, tokens, _, _ in requests)
            return [[] for _ in requests]

        def after_decode(self, entries, batch):
            pass

        def close(self):
            pass

    try:
        on.spec.draft_model = Empty()
        r = generate(on, prompt, max_tokens=48)
    finally:
        on.stop()
    assert r.usage.draft_tokens == 0
    # drafts asked at generated tokens 1, 6, 15 and 32 (the prompt is 24 tokens)
    assert calls == [25, 30, 39, 56], calls


# -- the server: per-request fields, /metrics, /slots and the log line -----------------------


@pytest.fixture(scope="module")
def server(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048", "--spec-type", "ngram-simple", "--spec-ngram-size-n", "4")
    yield proc
    proc.stop()


@pytest.mark.server
@pytest.mark.parametrize("field,value", [
    ("speculative.n_max", -1), ("speculative.n_min", "two"), ("speculative.p_min", 1.5),
])
def test_bad_speculative_fields_get_400_naming_them(server, field, value):
    body = {"prompt": "Hi", "max_tokens": 2, field: value}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.server
def test_drafts_show_on_metrics_slots_and_the_log_line(server):
    body = {"prompt": REPEAT, "max_tokens": 40, "temperature": 0, "speculative.n_max": 12}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    metrics = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for sample in family.samples:
            metrics[(sample.name, sample.labels.get("slot"), sample.labels.get("type"))] = sample.value
    drafted = metrics[("warmslot_spec_draft_tokens_total", "0", "ngram-simple")]
    accepted = metrics[("warmslot_spec_accepted_tokens_total", "0", "ngram-simple")]
    assert drafted >= accepted > 0
    # the request's own counts, under llama-server's names in its timings
    timings = r.json()["timings"]
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (drafted, accepted)
    assert metrics[("warmslot_spec_acceptance_rate", "0", "ngram-simple")] == pytest.approx(accepted / drafted)
    slot = httpx.get(server.url + "/slots").json()[0]  # llama-server's array, with warmslot's fields
    assert (slot["spec_drafted"], slot["spec_accepted"]) == (drafted, accepted)
    assert re.search(r"drafted \d+ accepted \d+ \(\d+%\)", server.output())


# -- a draft model ---------------------------------------------------------------------------


def test_a_draft_model_drafts_and_follows_the_slot(tiny_models):
    """The tiny attention model drafting for itself: what it drafts is what the model says,
    so the drafts are accepted and the output is unchanged; its KV follows the slot, so a
    second turn on the same slot evaluates in the draft model only what is new."""
    target = tiny_models["attention"]
    spec = SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0)
    prompt = random_tokens(5, 50)
    results = {}
    for config in (SpecConfig(), spec):
        engine = tiny_engine(target, n_ctx=1024, n_parallel=2, spec=config)
        try:
            first = generate(engine, prompt, max_tokens=30, cache_key="c")
            before = engine.stats.spec_drafter_tokens["evaluated"]
            follow = prompt + first.tokens + random_tokens(6, 10)
            second = generate(engine, follow, max_tokens=10, cache_key="c")
            after = engine.stats.spec_drafter_tokens["evaluated"]
            results[config.on] = (first, second, after - before)
        finally:
            engine.stop()
    (plain1, plain2, _), (fast1, fast2, evaluated) = results[False], results[True]
    assert (fast1.tokens, fast2.tokens) == (plain1.tokens, plain2.tokens)
    assert fast1.usage.draft_accepted >= 0.9 * fast1.usage.draft_tokens > 0
    # the second prompt has 90 tokens: the draft model evaluated its 10 new ones, and the few
    # of the first turn's output that it had not drafted
    assert 10 <= evaluated <= 25, evaluated


def test_a_draft_model_drafts_for_four_slots_in_shared_decodes(tiny_models):
    """Four slots draft with the draft model (the tiny attention model drafting for itself) in
    the same steps: their draft sequences catch up together, and each drafted position of all
    of them is one decode of the draft model, so it runs far fewer decodes than one per
    sequence and position. The outputs equal those without drafts."""
    target = tiny_models["attention"]
    args = dict(n_ctx=1024, n_parallel=4, n_batch=64, n_ubatch=64)
    results, rows = {}, []
    for spec in (SpecConfig(), SpecConfig(type="draft", draft_model=str(target), n_max=8, p_min=0.0)):
        engine = tiny_engine(target, spec=spec, **args)
        try:
            if spec.on:
                ctx = engine.spec.draft_model.ctx
                decode = ctx.decode

                def counted(batch, decode=decode):
                    rows.append(len(set(batch.seq_ids(batch.n).tolist())))  # sequences in each decode
                    return decode(batch)

                ctx.decode = counted
            results[spec.on] = _four(engine, "attention")
        finally:
            engine.stop()
    assert [r.tokens for r in results[True]] == [r.tokens for r in results[False]]
    drafted = sum(r.usage.draft_tokens for r in results[True])
    assert drafted > 40 and sum(1 for n in rows if n >= 2) > 10, rows
    assert len(rows) < 0.8 * sum(rows), (len(rows), sum(rows))  # one decode per sequence: sum(rows)


def test_a_draft_model_of_another_vocabulary_is_refused(tiny_models, default_model):
    with pytest.raises(NotReady, match="vocabulary"):
        tiny_engine(tiny_models["attention"], spec=SpecConfig(type="draft", draft_model=str(default_model)))


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    """The tiny hybrid model with a Qwen3.5 MTP block after its last layer."""
    return write_tiny_model("hybrid-mtp", tmp_path_factory.mktemp("tiny-mtp") / "hybrid-mtp.gguf")


def test_mtp_drafts_are_verified_and_the_block_follows_the_slot(tiny_mtp):
    """--spec-type draft-mtp on the tiny hybrid model: the MTP block drafts (every proposal
    taken, p_min 0), the target verifies and rolls back its recurrent state, and the output is
    the output without drafts. The block is fed every position the target decodes, so a second
    turn on the same slot feeds it only what is new."""
    prompt = random_tokens(11, 40)
    results = {}
    for config in (SpecConfig(), SpecConfig(type="draft-mtp", n_max=4, p_min=0.0)):
        engine = tiny_engine(tiny_mtp, n_ctx=1024, n_parallel=2, spec=config)
        try:
            first = generate(engine, prompt, max_tokens=24, cache_key="m")
            before = engine.stats.spec_drafter_tokens["evaluated"]
            follow = prompt + first.tokens + random_tokens(12, 8)
            second = generate(engine, follow, max_tokens=12, cache_key="m")
            after = engine.stats.spec_drafter_tokens["evaluated"]
            results[config.on] = (first, second, after - before, engine.stats.spec_rollbacks)
        finally:
            engine.stop()
    (plain1, plain2, _, _), (mtp1, mtp2, fed, rollbacks) = results[False], results[True]
    assert (mtp1.tokens, mtp2.tokens) == (plain1.tokens, plain2.tokens)
    assert mtp1.usage.draft_tokens > 0 and mtp2.usage.draft_tokens > 0
    assert rollbacks > 0  # rejected drafts on recurrent memory
    # the second prompt adds the first turn's output and 8 tokens: the block is fed those, the
    # tokens it then verifies (drafts included) and nothing of the 40-token prompt again
    assert 8 <= fed < 40 + 8, fed


def test_mtp_on_a_model_without_mtp_layers_is_refused(tiny_models):
    with pytest.raises(NotReady, match="MTP"):
        tiny_engine(tiny_models["hybrid"], spec=SpecConfig(type="draft-mtp"))
