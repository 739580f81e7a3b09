"""Splicing turns as generated into a rendered prompt (server/prompt/exact_turns.py), the signed blob
that carries them (/v1/responses reasoning items' encrypted_content), and Responses tools in
chat's terms: pure functions, no model."""

from __future__ import annotations

import pytest

from warmslot.server.api.responses.signed_turns import TurnSigner
from warmslot.server.api.responses.tools import parse_tools, tool_choice
from warmslot.server.prompt.builder import Prompt
from warmslot.server.errors import InvalidRequest
from warmslot.server.prompt.exact_turns import ExactTurn, prompt_digest, splice_turns

EOT, HEADER = 99, 98  # an end-of-generation token, an assistant header token


def is_eog(token: int) -> bool:
    return token == EOT


def rendered(*parts: list[int]) -> list[int]:
    return [t for part in parts for t in part]


# system [1, 2] | user [3, 4] EOT | header (the generation prompt) | assistant as rendered [50, 51] EOT | tool [6, 7] EOT | header
SYSTEM, USER, TURN, TOOL = [1, 2], [3, 4, EOT], [50, 51, EOT], [6, 7, EOT]


def prompt_of(tokens: list[int], spans: list[tuple[str, int, int]]) -> Prompt:
    return Prompt(text="", tokens=tokens, messages=spans, generation_start=len(tokens) - 1)


def test_a_turn_is_spliced_as_generated_and_positions_move_with_it():
    previous = rendered(SYSTEM, USER, [HEADER])  # the prompt the turn was generated after
    generated = (60, 61, 62)  # the reply as generated, without its end-of-generation token
    tokens = rendered(SYSTEM, USER, [HEADER], TURN, TOOL, [HEADER])
    spans = [("system", 0, 0), ("user", 2, 2), ("assistant", 4, 6), ("tool", 8, 9)]  # (role, glue start, content start)
    turn = ExactTurn(len(previous), prompt_digest(previous), generated, (HEADER,))
    spliced, report = splice_turns(prompt_of(tokens, spans), {2: turn}, is_eog)
    # the previous prompt and the reply exactly, then the template's marker and what follows
    assert spliced.tokens == previous + list(generated) + [EOT] + TOOL + [HEADER]
    assert report.spliced == [2] and report.skipped == {}
    assert spliced.messages[3] == ("tool", 9, 10) and spliced.generation_start == len(spliced.tokens) - 1
    assert report.moved(5) == len(previous) - 1 and report.moved(8) == len(previous) + len(generated)


def test_the_turn_starts_where_the_generation_prompt_did_whatever_the_template_renders_there():
    """A template may render an earlier turn's start otherwise than its generation prompt
    (Qwen3.5 drops the think block): the turn carries the generation prompt it followed."""
    think = [HEADER, 97]  # "<|im_start|>assistant\n<think>\n"
    previous = rendered(SYSTEM, USER, think)
    tokens = rendered(SYSTEM, USER, [HEADER], TURN, TOOL, [HEADER])  # rendered without the think block
    turn = ExactTurn(len(previous), prompt_digest(previous), (60,), tuple(think))
    spliced, report = splice_turns(prompt_of(tokens, [("system", 0, 0), ("user", 2, 2), ("assistant", 4, 6), ("tool", 8, 9)]), {2: turn}, is_eog)
    assert report.spliced == [2] and spliced.tokens == previous + [60, EOT] + TOOL + [HEADER]


def test_a_turn_after_another_conversation_is_left_as_rendered():
    tokens = rendered(SYSTEM, USER, [HEADER], TURN, TOOL, [HEADER])
    other = rendered([1, 9], USER, [HEADER])  # another system prompt
    prompt = prompt_of(tokens, [("system", 0, 0), ("user", 2, 2), ("assistant", 4, 6), ("tool", 8, 9)])
    spliced, report = splice_turns(prompt, {2: ExactTurn(len(other), prompt_digest(other), (60,), (HEADER,))}, is_eog)
    assert spliced is prompt and report.spliced == [] and "not the prompt it was generated after" in report.skipped[2]
    longer = ExactTurn(len(tokens) + 5, prompt_digest(tokens), (60,))
    assert "does not end inside" in splice_turns(prompt, {2: longer}, is_eog)[1].skipped[2]


def test_a_marker_inside_the_turns_own_text_is_not_its_end():
    """The end-of-turn marker is looked for after the turn's text (where the next message's
    glue starts): an assistant's content that spells the marker does not end it."""
    previous = rendered(SYSTEM, USER, [HEADER])
    tokens = rendered(SYSTEM, USER, [HEADER], [50, EOT, 51, EOT], TOOL, [HEADER])
    spans = [("system", 0, 0), ("user", 2, 2), ("assistant", 4, 6), ("tool", 9, 10)]
    spliced, _ = splice_turns(prompt_of(tokens, spans), {2: ExactTurn(len(previous), prompt_digest(previous), (60,), (HEADER,))}, is_eog)
    assert spliced.tokens == previous + [60, EOT] + TOOL + [HEADER]


def test_turns_chain_each_checked_against_the_prompt_with_the_earlier_ones_spliced():
    first_prompt = rendered(SYSTEM, USER, [HEADER])
    first = ExactTurn(len(first_prompt), prompt_digest(first_prompt), (60, 61), (HEADER,))
    second_prompt = first_prompt + [60, 61, EOT] + TOOL + [HEADER]  # what the second request sent
    second = ExactTurn(len(second_prompt), prompt_digest(second_prompt), (70,), (HEADER,))
    tokens = rendered(SYSTEM, USER, [HEADER], TURN, TOOL, [HEADER], [55, EOT], TOOL, [HEADER])
    spans = [("system", 0, 0), ("user", 2, 2), ("assistant", 4, 6), ("tool", 8, 9), ("assistant", 11, 13), ("tool", 14, 15)]
    spliced, report = splice_turns(prompt_of(tokens, spans), {2: first, 4: second}, is_eog)
    assert report.spliced == [2, 4] and spliced.tokens == second_prompt + [70, EOT] + TOOL + [HEADER]


def test_a_signed_turn_verifies_only_unchanged_with_the_same_secret_and_model():
    turn = ExactTurn(1234, prompt_digest([1, 2, 3]), tuple(range(500)), (7, 8))
    signer = TurnSigner(b"secret", "llama:264:100")
    blob = signer.sign(turn)
    assert blob.startswith("ws1.") and signer.verify(blob) == turn
    assert TurnSigner(b"secret", "llama:264:100").verify(blob) == turn  # another process with the same secret
    assert TurnSigner(b"other", "llama:264:100").verify(blob) is None  # a restart without --responses-secret
    assert TurnSigner(b"secret", "llama:32000:100").verify(blob) is None  # another model
    for bad in (blob[:-2] + ("AA" if blob[-2:] != "AA" else "BB"), blob[:20], "ws1.!!!", "gAAAAAB-openai", 42, None):
        assert signer.verify(bad) is None, bad


def test_namespace_functions_are_offered_by_their_names_and_hosted_tools_left_out():
    spawn = {"type": "function", "name": "spawn_agent", "description": "Spawn.", "parameters": {"type": "object"}}
    tools = parse_tools([
        {"type": "function", "name": "exec_command"}, {"type": "web_search", "external_web_access": True},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Subagents.", "tools": [spawn]},
        {"type": "namespace", "name": "other", "tools": [{"type": "function", "name": "exec_command"}]},
        {"type": "custom", "name": "apply_patch"},
    ])
    assert [t["function"]["name"] for t in tools.chat] == ["exec_command", "spawn_agent", "other__exec_command"]
    assert tools.chat[1]["function"]["description"] == "Subagents.\n\nSpawn."
    assert tools.left_out == [{"index": 1, "type": "web_search"}, {"index": 4, "type": "custom"}]
    assert tools.call_fields("spawn_agent") == {"namespace": "multi_agent_v1", "name": "spawn_agent"}
    assert tools.call_fields("other__exec_command") == {"namespace": "other", "name": "exec_command"}
    assert tools.call_fields("exec_command") == {"name": "exec_command"}
    assert tools.offered_name("exec_command", "other") == "other__exec_command"
    assert tool_choice({"type": "function", "name": "exec_command", "namespace": "other"}, tools) == {
        "type": "function", "function": {"name": "other__exec_command"}}
    for bad, param in (([1], "tools[0]"), ([{"type": "namespace", "tools": []}], "tools[0].name"),
                       ([{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}], "tools[0].tools[0].type")):
        with pytest.raises(InvalidRequest) as info:
            parse_tools(bad)
        assert info.value.param == param


def test_a_prompt_with_image_placeholders_digests_and_splices():
    """Images are runs of negative placeholder ids in a prompt's tokens (media_spans.py)."""
    image = [-7, -7, -7]
    previous = rendered(SYSTEM, [3, *image, EOT], [HEADER])
    tokens = rendered(SYSTEM, [3, *image, EOT], [HEADER], TURN, TOOL, [HEADER])
    spans = [("system", 0, 0), ("user", 2, 2), ("assistant", 6, 8), ("tool", 10, 11)]
    spliced, report = splice_turns(prompt_of(tokens, spans), {2: ExactTurn(len(previous), prompt_digest(previous), (60,), (HEADER,))}, is_eog)
    assert report.spliced == [2] and spliced.tokens == previous + [60, EOT] + TOOL + [HEADER]
