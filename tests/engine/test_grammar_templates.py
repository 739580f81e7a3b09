"""A grammar is compiled once per model and copied for each request that carries it: the
copy constrains as a freshly compiled sampler does, from the grammar's start, whatever the
samplers made before it have accepted."""

import llama_cpp  # noqa: I001
import numpy as np
import pytest

from warmslot.slots import SamplingParams
from warmslot.slots.llama_api import Model
from warmslot.slots.llama_api.grammar import GrammarSpec
from warmslot.slots.llama_api.grammar_templates import GrammarTemplates
from warmslot.slots.llama_api.sampler import Sampler

pytestmark = pytest.mark.model


def _drawn(model: Model, spec: GrammarSpec, steps: int, seed: int = 3) -> list[int]:
    sampler = Sampler(model, SamplingParams(seed=seed, temperature=1.0, top_k=40, grammar=spec))
    try:
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(steps):
            token = sampler.sample_logits((rng.standard_normal(model.n_vocab) * 4).astype(np.float32))
            if model.is_eog(token):
                break
            out.append(token)
        return out
    finally:
        sampler.close()


def test_a_grammar_compiled_once_is_copied_fresh_for_each_request(default_model):
    model = Model(str(default_model), vocab_only=True)
    try:
        spec = GrammarSpec('root ::= "yes" [a-z]{0,3} | "no" [0-9]{0,3}')
        first = _drawn(model, spec, 8)
        assert (model.grammars.compiled, model.grammars.cloned) == (1, 0)
        second = _drawn(model, spec, 8)  # a copy of the compiled one, not of the first (spent) sampler
        assert (model.grammars.compiled, model.grammars.cloned) == (1, 1)
        assert first == second and model.detokenize(first)[:2] in ("ye", "no")
        other = _drawn(model, spec, 8, seed=11)
        assert model.detokenize(other)[:2] in ("ye", "no")
        assert model.grammars.compiled == 1 and len(model.grammars) == 1
    finally:
        model.close()
    assert len(model.grammars) == 0  # freed with the model


def test_templates_keep_the_newest_few_and_refuse_nothing_they_cannot_compile(default_model):
    model = Model(str(default_model), vocab_only=True)
    templates = GrammarTemplates(kept=2)
    made = []

    def make(spec):
        made.append(spec.grammar)
        return llama_cpp.llama_sampler_init_grammar(model.vocab, spec.grammar.encode(), b"root")

    try:
        specs = [GrammarSpec(f'root ::= "{w}"') for w in ("a", "b", "c")]
        for spec in (*specs, specs[2], specs[0]):
            sampler = templates.sampler(spec, make)
            assert sampler
            llama_cpp.llama_sampler_free(sampler)
        assert made == ['root ::= "a"', 'root ::= "b"', 'root ::= "c"', 'root ::= "a"']  # "a" was dropped for "c"
        assert len(templates) == 2 and templates.cloned == 1
        assert not templates.sampler(GrammarSpec("root ::= ("), make) and len(templates) == 2
    finally:
        templates.clear()
        model.close()
