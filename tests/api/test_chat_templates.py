"""Choosing and rendering chat templates: llama.cpp's own formats by name (rendered by
llama.cpp), what llama.cpp's template runner gives Jinja templates (the date, undefined
variables joined as empty text), --reasoning auto, and prompts built from them on the
default model's real vocabulary."""

from __future__ import annotations

import datetime

import pytest

from warmslot.server.prompt.builder import PromptBuilder
from warmslot.server.prompt.template import ChatTemplate, choose_template
from warmslot.server.errors import InvalidRequest
from warmslot.server.request.reasoning import thinking_default
from warmslot.slots import builtin_chat_templates

HI = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def vocab(default_vocab):
    return default_vocab


def test_llama_cpp_formats_are_chosen_by_name_and_rendered_by_llama_cpp():
    assert {"command-r", "llama2", "phi3", "zephyr", "chatml"} <= set(builtin_chat_templates())
    name, source, native = choose_template("command-r", None, "llama", lambda _: False)
    assert (name, source, native) == ("command-r", "", True)
    text = ChatTemplate(name, source, native=native).render(HI, None, True)
    assert text == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )
    # warmslot's own Jinja built-ins keep their names
    assert choose_template("chatml", None, "llama", lambda _: False)[2] is False
    with pytest.raises(ValueError, match="command-r"):
        choose_template("no-such-format", None, "llama", lambda _: False)


def test_a_native_format_builds_a_prompt_with_tools_injected(vocab):
    builder = PromptBuilder(ChatTemplate("zephyr", "", native=True), vocab)
    tools = [{"type": "function", "function": {"name": "now", "description": "the time", "parameters": {"type": "object"}}}]
    prompt = builder.build([{"role": "user", "content": "What time is it?"}], tools)
    assert "<|user|>" in prompt.text and '"name": "now"' in prompt.text and prompt.text.endswith("<|assistant|>\n")
    assert prompt.messages[-1][0] == "user"  # the user's content was found in llama.cpp's text
    assert vocab.detokenize(prompt.tokens).endswith("<|assistant|>\n")


def test_jinja_templates_get_llama_cpps_variables_and_lenient_joins():
    source = "{{ 'Today is ' + datetime + '.' }}{{ ' ' + functions }}|{{ date_string }}|{% if missing is defined %}no{% endif %}"
    text = ChatTemplate("t", source).render(HI, None, True)
    today = datetime.date.today()
    assert text == f"Today is {today.strftime('%b %d %Y')}. |{today.strftime('%d %b %Y')}|"
    with pytest.raises(InvalidRequest, match="UndefinedError"):
        ChatTemplate("t", "{{ missing.field }}").render(HI, None, True)  # an undefined's attribute still fails


def test_reasoning_auto_turns_thinking_on_where_the_template_has_the_switch():
    switch = "{% if not enable_thinking %}</think>{% endif %}"
    assert thinking_default("auto", switch) == (("enable_thinking", True),)
    assert thinking_default("auto", "{{ messages }}") == ()
    assert thinking_default("off", switch) == (("enable_thinking", False),)
    template = ChatTemplate("t", "<think>\n" + switch, defaults=thinking_default("auto", switch))
    assert template.render(HI, None, True) == "<think>\n"


def test_chat_template_kwargs_flag_sets_variables_a_request_overrides():
    from warmslot.server.process.config import parse_config

    config, _ = parse_config(["--chat-template-kwargs", '{"greeting": "hi", "enable_thinking": false}'])
    assert config.chat_template_kwargs == {"greeting": "hi", "enable_thinking": False}
    template = ChatTemplate("t", "{{ greeting }}/{{ enable_thinking }}", defaults=tuple(config.chat_template_kwargs.items()))
    assert template.render(HI, None, True) == "hi/False"
    assert template.render(HI, None, True, {"greeting": "yo"}) == "yo/False"
    for bad in ("[1]", "{nope"):
        with pytest.raises(SystemExit):
            parse_config(["--chat-template-kwargs", bad])
