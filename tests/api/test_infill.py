"""POST /infill: llama-server's fill-in-the-middle completion, as code editors call it.

The layout and its budgets are checked without a model (a vocabulary of characters), the
indentation limit on the text stream alone; the rest runs on the tiny model with
deepseek-coder's vocabulary (FIM prefix, suffix and middle tokens, BOS added).
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.helpers import warmslot_server
from warmslot.server.errors import InvalidRequest
from warmslot.server.prompt.infill import SNIPPET, Budget, Chunk, Infill, infill_tokens, parse_infill
from warmslot.slots import FimTokens
from warmslot.slots.step.text import TextStream

# -- the layout, on a vocabulary of characters ----------------------------------------------------


class CharVocab:
    """One token per character (its code point); FIM and BOS tokens below 32."""

    def __init__(self, fim: FimTokens, add_bos: bool = True) -> None:
        self.fim, self.bos, self.add_bos = fim, 7, add_bos

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


REPO = FimTokens(pre=1, suf=2, mid=3, pad=4, rep=5, sep=6)
PLAIN = FimTokens(pre=1, suf=2, mid=3)
WIDE = Budget(n_batch=512, n_ctx=4096)
FIELDS = Infill("def f(", ")\n", (Chunk("a.py", "x=1"),), "a")


def test_repository_layout_puts_the_extra_context_first_then_bos_prefix_suffix_middle():
    got = infill_tokens(CharVocab(REPO), FIELDS, WIDE)
    extra = [5, *chars("myproject\n"), 6, *chars("a.py\n"), *chars("x=1"), 6, *chars("filename\n")]
    assert got == [*extra, 7, 1, *chars("def f(a"), 2, *chars(")\n"), 3]


def test_suffix_prefix_middle_order_and_snippets_without_a_file_separator():
    got = infill_tokens(CharVocab(PLAIN, add_bos=False), FIELDS, WIDE, spm=True)
    assert got == [*chars(SNIPPET + "x=1"), 2, *chars(")\n"), 1, *chars("def f(a"), 3]


def test_budgets_keep_the_prefix_tail_the_suffix_head_and_the_extra_tail():
    fields = Infill("p" * 20 + "P" * 12, "S" * 3 + "s" * 20, (Chunk("f", "e" * 50),), "ab")
    # n_batch 16: prefix 12, suffix 16/4 - 2 - 2 = 0; extra: 64 - 16 - 2 * 4 = 40 of its tail
    got = infill_tokens(CharVocab(PLAIN, add_bos=False), fields, Budget(n_batch=16, n_ctx=64, n_predict=4))
    assert got == [*chars("e" * 40), 1, *chars("P" * 12 + "ab"), 2, 3]
    fields = Infill("x", "S" * 3 + "s" * 20, ())
    got = infill_tokens(CharVocab(PLAIN, add_bos=False), fields, Budget(n_batch=20, n_ctx=64))
    assert got == [1, *chars("x"), 2, *chars("SSS"), 3]  # 20/4 - 2 = 3


def test_mixed_prefix_of_texts_and_token_ids():
    fields = parse_infill({"input_prefix": ["a", 9, "b"], "input_suffix": "", "prompt": "c"}, 100)
    assert infill_tokens(CharVocab(PLAIN, add_bos=False), fields, WIDE) == [1, *chars("a"), 9, *chars("bc"), 2, 3]


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ""}, "input_suffix"),
    ({"input_prefix": 3, "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "", "input_suffix": [1.5]}, "input_suffix"),
    ({"input_prefix": [100], "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "", "input_suffix": "", "prompt": ["x"]}, "prompt"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": ["x"]}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "ok"}]}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": 1, "text": "x"}]}, "input_extra"),
])
def test_bad_fields_name_themselves(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_infill(body, 100)
    assert caught.value.param == param


# -- n_indent, on the text stream ---------------------------------------------------------------


def stream(pieces: list[str], n_indent: int, stop=()) -> tuple[str, TextStream]:
    ts = TextStream(stop, n_indent)
    text = "".join(ts.feed(p.encode()) for p in pieces) + ts.finish()
    return text, ts


def test_a_line_indented_less_ends_the_text_before_its_first_character():
    text, ts = stream(["foo(", "\n    a", "\n  ", "  b\n", "\tc\n", "d"], 4)
    assert (text, ts.cut_by_indent) == ("foo(\n    a\n    b\n\t", True)


def test_the_first_line_is_never_checked_and_a_blank_line_counts():
    text, ts = stream(["x = (", "\n    y"], 4)
    assert (text, ts.cut_by_indent) == ("x = (\n    y", False)
    text, ts = stream(["x", "\n", "\n", "    y"], 2)
    assert (text, ts.cut_by_indent) == ("x\n", True)


def test_a_stop_string_after_the_cut_does_not_count():
    text, ts = stream(["a\nbEND"], 2, stop=["END"])
    assert (text, ts.cut_by_indent, ts.stopped_by) == ("a\n", True, None)


# -- the route, on a model -------------------------------------------------------------------------

PREFIX = "#include <cstdio>\n\nint main() {\n"
SUFFIX = "}\n"
EXTRA = [{"filename": "llama.h", "text": "int llama_n_threads();\n"}]


@pytest.fixture(scope="module")
def server(tiny_fim_model):
    # a batch of 512 in a 4096 context leaves the extra context 3586 tokens (llama-server's budget)
    proc = warmslot_server(tiny_fim_model, "-np", "1", "-c", "4096", "-b", "512", "--temp", "0")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def vocab(tiny_fim_model):
    from warmslot.slots.llama_api import Model

    model = Model(str(tiny_fim_model), n_gpu_layers=0, vocab_only=True)
    yield model
    model.close()


def post(server, body: dict, path: str = "/infill") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_the_prompt_is_the_fim_layout_of_the_model_tokens(server, vocab):
    reply = post(server, {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": "    int n = ", "n_predict": 4})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    raw = lambda text: vocab.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    fim = vocab.fim
    assert (fim.pre, fim.suf, fim.mid) == (32016, 32015, 32017) and vocab.add_bos
    expected = [*raw(SNIPPET), *raw(EXTRA[0]["text"]), vocab.bos, fim.pre, *raw(PREFIX), *raw("    int n = "), fim.suf, *raw(SUFFIX), fim.mid]
    assert body["tokens_evaluated"] == len(expected)
    assert body["prompt"] == vocab.detokenize(expected)
    assert body["stop"] is True and body["tokens_predicted"] <= 4 and body["stop_type"] in ("limit", "eos")


def test_n_predict_0_only_evaluates_the_prompt(server):
    # llama.vscode's warm-up of the extra context it will send next
    reply = post(server, {"input_prefix": "", "input_suffix": "", "input_extra": EXTRA, "n_predict": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == "" and reply.json()["tokens_predicted"] == 0


def test_a_stream_sends_what_the_reply_holds(server):
    ask = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6, "cache_prompt": False}
    whole = post(server, ask).json()
    with httpx.stream("POST", server.url + "/infill", json={**ask, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop"] is True and not any(e["stop"] for e in events[:-1])
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]


def token(server, text: str) -> int:
    ids = httpx.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert len(ids) == 1, ids
    return ids[0]


def first_short_line(text: str, n: int) -> int | None:
    """Where a line after the first newline, indented less than n, has its first other character."""
    for m in re.finditer(r"\n([ \t]*)", text):
        if len(m.group(1)) < n and m.end() < len(text):
            return m.end()
    return None


def test_n_indent_ends_the_reply_at_the_first_line_indented_less(server):
    # three tokens much likelier than the rest, sampled at random: lines of spaces and x
    bias = [[token(server, t), 50] for t in ("\n", "  ", "x")]
    ask = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 48, "seed": 3, "temperature": 2.0, "top_k": 0,
           "top_p": 1.0, "min_p": 0.0, "logit_bias": bias, "cache_prompt": False}
    free = post(server, ask).json()
    cut = first_short_line(free["content"], 4)
    assert cut is not None, free["content"]
    limited = post(server, {**ask, "n_indent": 4}).json()
    assert limited["content"] == free["content"][:cut]
    assert limited["stop_type"] == "limit" and limited["tokens_predicted"] < free["tokens_predicted"]


def test_t_max_predict_ms_ends_the_reply_at_a_newline_once_past(server):
    ask = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 32, "logit_bias": [[token(server, "\n"), 100]]}
    reply = post(server, {**ask, "t_max_predict_ms": 1}).json()
    assert set(reply["content"]) == {"\n"} and 2 <= reply["tokens_predicted"] < 32 and reply["stop_type"] == "limit"


def test_bad_input_is_answered_400_and_the_server_serves_on(server):
    for body in ({"input_prefix": PREFIX}, {"input_prefix": PREFIX, "input_suffix": 1},
                 {"input_prefix": PREFIX, "input_suffix": "", "input_extra": [{}]},
                 {"input_prefix": PREFIX, "input_suffix": "", "input_extra": [{"filename": 123, "text": "abc"}]},
                 {"input_prefix": PREFIX, "input_suffix": "", "input_extra": "x"},
                 {"input_prefix": PREFIX, "input_suffix": "", "n_indent": "4"},
                 {"input_prefix": PREFIX, "input_suffix": "", "response_fields": "content"},
                 {"input_prefix": PREFIX, "input_suffix": "", "response_fields": ["content", 1]}):
        reply = post(server, body)
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["error"]["type"] == "invalid_request_error"
    bad = httpx.post(server.url + "/infill", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert post(server, {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 2}).status_code == 200


def test_response_fields_cut_the_reply_to_the_paths_asked_for(server):
    # llama.vim asks for a few fields on every keystroke; a path that leads nowhere is left out
    ask = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 3}
    whole = post(server, ask).json()
    cut = post(server, {**ask, "response_fields": ["content", "timings/prompt_n", "timings/nothing", "tokens_cached"]}).json()
    assert cut == {"content": whole["content"], "timings/prompt_n": cut["timings/prompt_n"], "tokens_cached": cut["tokens_cached"]}
    assert isinstance(cut["timings/prompt_n"], int) and cut["tokens_cached"] + cut["timings/prompt_n"] == whole["tokens_evaluated"]


def test_a_cursor_moving_on_reuses_the_prompt_before_it(server):
    prefix = "".join(f"int value_{i} = compute({i}, {i * 7});\n" for i in range(12))
    ask = {"input_suffix": SUFFIX, "input_extra": EXTRA, "n_predict": 2}
    post(server, {**ask, "input_prefix": prefix})
    moved = post(server, {**ask, "input_prefix": prefix + "int va"}).json()
    assert moved["tokens_cached"] >= 0.8 * moved["tokens_evaluated"], moved
    assert moved["tokens_cached"] < moved["tokens_evaluated"]


def test_a_model_without_fim_tokens_answers_400(tiny_models):
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "512")
    try:
        reply = post(proc, {"input_prefix": PREFIX, "input_suffix": SUFFIX})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "infill_not_supported" and "FIM prefix, suffix, middle" in error["message"]
        assert post(proc, {"prompt": "x", "n_predict": 1}, "/completion").status_code == 200
    finally:
        proc.stop()


def test_spm_infill_puts_the_suffix_first(tiny_fim_model, vocab):
    proc = warmslot_server(tiny_fim_model, "-np", "1", "-c", "1024", "-b", "256", "--spm-infill")
    try:
        body = post(proc, {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 1}).json()
    finally:
        proc.stop()
    raw = lambda text: vocab.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    fim = vocab.fim
    assert body["prompt"] == vocab.detokenize([vocab.bos, fim.suf, *raw(SUFFIX), fim.pre, *raw(PREFIX), fim.mid])
