"""Conversations agents send, on every chat template: what each template is probed to take,
and the rewrite of the rest (server/prompt/template_rules.py). A system message in the middle of a
conversation renders on every template, to the same tokens on every turn, and the prompt
before it stays the same as the conversation grows. The templates are the real ones of the
template families (tests/template_families.py) with their real tokenizers (vocab-only loads),
and warmslot's built-ins."""

from __future__ import annotations

import pytest

from tests.template_families import FAMILIES, template_source, vocab_path
from warmslot.server.prompt.builder import PromptBuilder
from warmslot.server.prompt.template import BUILTIN_TEMPLATES, ChatTemplate, builtin_source
from warmslot.server.request.protocol import parse_messages
from warmslot.server.prompt.template_rules import REMINDER_CLOSE, TemplateRules, fit, rules_for, short_call_id
from warmslot.slots.llama_api import Model
from warmslot.slots.vocab import Vocab

pytestmark = pytest.mark.model  # vocab-only loads of real tokenizers

# what each family's template rejects (the rest it renders as sent)
EXPECTED = {
    "qwen35": {"leading_systems", "later_systems"},
    "qwen3": set(),
    "gemma3": set(),  # warmslot's built-in gemma template takes any role
    "llama3": {"parallel_calls"},
    "mistral": {"leading_systems", "later_systems", "user_after_user", "user_after_tool", "any_call_ids"},
    "smollm2": set(),
}
TEMPLATES = [*FAMILIES, *(f"builtin:{name}" for name in BUILTIN_TEMPLATES)]
AGENT_TYPES = "Available agent types for the Agent tool:\n- Explore: read-only search agent"


@pytest.fixture(scope="module")
def vocabs():
    loaded: dict = {}
    yield loaded
    for model, _ in loaded.values():
        model.close()


def builder_for(name: str, vocabs: dict) -> PromptBuilder:
    """A prompt builder on a family's template and tokenizer, or on a built-in template
    (with the Qwen3.5 tokenizer)."""
    family = name if name in FAMILIES else "qwen35"
    if family not in vocabs:
        model = Model(str(vocab_path(family)), n_gpu_layers=0, vocab_only=True)
        vocabs[family] = (model, Vocab(model))
    vocab = vocabs[family][1]
    if name in FAMILIES:
        source = template_source(name) or _gguf_template(vocab_path(name))  # None: the vocab file's own
    else:
        source = builtin_source(name.removeprefix("builtin:"))
    bos = vocab.special_text(vocab.bos) if vocab.bos >= 0 else ""
    return PromptBuilder(ChatTemplate(name, source, bos, vocab.special_text(vocab.eos)), vocab)


def _gguf_template(path) -> str:
    from scripts.bench_models import read_vocab

    template = read_vocab(path).chat_template
    assert template, f"{path} has no chat template"
    return template


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def grow(builder: PromptBuilder, turns: list[list[dict]]):
    """Build each conversation of a growing session; each must keep the one before it, up to
    its generation prompt, token for token."""
    prompts = []
    conversation: list[dict] = []
    for turn in turns:
        conversation = conversation + turn
        prompt = builder.build(conversation, None)
        assert builder.build(conversation, None).tokens == prompt.tokens  # the same tokens on repeat
        if prompts:
            before = prompts[-1]
            kept = before.generation_start if before.generation_start is not None else len(before.tokens) - 1
            assert common_prefix(before.tokens, prompt.tokens) >= kept, (len(prompts), before.text[-300:], prompt.text[-400:])
        prompts.append(prompt)
    return prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_template_is_probed_for_what_it_rejects(family, vocabs):
    rules = builder_for(family, vocabs).rules
    assert {name for name, value in vars_of(rules).items() if not value} == EXPECTED[family]


def vars_of(rules: TemplateRules) -> dict[str, bool]:
    return {name: getattr(rules, name) for name in TemplateRules.__dataclass_fields__}


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_mid_conversation_system_message_renders_the_same_as_the_conversation_grows(name, vocabs):
    """Claude Code's shape: the agent types as a system message right after the first user
    message, then a system notification after a later user turn and one at the very end."""
    builder = builder_for(name, vocabs)
    prompts = grow(builder, [
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Read the notes."},
         {"role": "system", "content": AGENT_TYPES}],
        [{"role": "assistant", "content": "I read them."}, {"role": "user", "content": "Now count them."}],
        [{"role": "assistant", "content": "Two."}, {"role": "user", "content": "Thanks."},
         {"role": "system", "content": "A background task finished."}],
        [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Bye."}],
    ])
    first, last = prompts[0], prompts[-1]
    assert AGENT_TYPES in first.text and "A background task finished." in last.text  # rendered, not dropped
    # each system message is still placed in the prompt (checkpoints, miss diagnosis)
    spans = last.messages
    assert spans[2][0] == "system" and spans[1][2] < spans[2][2] < spans[3][2]


@pytest.mark.parametrize("name", ["qwen35", "mistral"])
def test_a_system_message_after_an_assistant_turn_keeps_its_text_when_a_user_turn_follows(name, vocabs):
    """A system message with no user turn before it becomes a user turn of its own; once a
    user message follows, it leads that message: the text up to its end stays."""
    builder = builder_for(name, vocabs)
    start = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Hi."},
             {"role": "assistant", "content": "Hello."}, {"role": "system", "content": "Context changed."}]
    alone = builder.render_text(start, None)
    followed = builder.render_text(start + [{"role": "user", "content": "Go on."}], None)
    end = alone.index(REMINDER_CLOSE) + len(REMINDER_CLOSE)
    assert followed[:end] == alone[:end]


def test_codexs_two_developer_messages_and_a_mid_chat_one_render_on_qwen35(vocabs):
    """Codex sends two developer messages before the user's; an OpenAI chat may send one in
    the middle. They arrive as system messages (parse_messages) and are joined, or folded."""
    builder = builder_for("qwen35", vocabs)
    messages = parse_messages([
        {"role": "developer", "content": "Sandbox: read-only."}, {"role": "developer", "content": "AGENTS.md says: be brief."},
        {"role": "user", "content": "List the files."}, {"role": "assistant", "content": "a.py"},
        {"role": "developer", "content": "The user switched to write mode."}, {"role": "user", "content": "Edit a.py."},
    ])
    text = builder.build(messages, None).text
    assert text.startswith("<|im_start|>system\nSandbox: read-only.\n\nAGENTS.md says: be brief.<|im_end|>")
    assert "<system-reminder>\nThe user switched to write mode.\n</system-reminder>\n\nEdit a.py." in text


def test_parallel_calls_become_single_calls_each_followed_by_its_result_where_the_template_takes_one(vocabs):
    """Llama 3.x's templates raise on several tool calls in one message (Claude Code starts
    its subagents so); each call then becomes a message of its own, its result after it."""
    builder = builder_for("llama3", vocabs)
    calls = [{"id": f"toolu_{i}", "type": "function", "function": {"name": "Agent", "arguments": f'{{"prompt": "task {i}"}}'}}
             for i in (1, 2)]
    messages = parse_messages([
        {"role": "user", "content": "Start two agents."}, {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "result one"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "result two"},
    ])
    tools = [{"type": "function", "function": {"name": "Agent", "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}}}}}]
    text = builder.build(messages, tools).text
    assert text.index("task 1") < text.index("result one") < text.index("task 2") < text.index("result two")


def test_fit_is_the_identity_for_a_template_that_takes_every_shape():
    messages = [{"role": "user", "content": "a", "_index": 0}, {"role": "system", "content": "b", "_index": 1}]
    assert fit(messages, TemplateRules()) is messages


def test_tool_call_ids_become_nine_letters_and_digits_the_same_every_time():
    short = short_call_id("toolu_01ABCdef")
    assert len(short) == 9 and short.isalnum() and short == short_call_id("toolu_01ABCdef") != short_call_id("toolu_02")


def test_a_template_that_renders_nothing_plain_is_left_alone():
    assert rules_for(ChatTemplate("broken", "{{ raise_exception('no') }}")) == TemplateRules()
