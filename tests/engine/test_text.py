"""Streaming detokenization: whole UTF-8 characters only, stop strings held back."""

import random

from warmslot.slots.step.text import TextStream


def stream(pieces, stop=()):
    ts = TextStream(stop)
    out = [ts.feed(p) for p in pieces]
    out.append(ts.finish())
    return out, ts


def test_never_emits_half_a_utf8_character():
    text = "naïve café — 漢字 😀 ok"
    data = text.encode()
    for _ in range(50):
        cuts = sorted(random.sample(range(1, len(data)), 6))
        pieces = [data[i:j] for i, j in zip([0] + cuts, cuts + [len(data)])]
        out, _ = stream(pieces)
        for chunk in out:
            chunk.encode("utf-8")  # a lone surrogate or replacement would show here
            assert "\ufffd" not in chunk
        assert "".join(out) == text


def test_stop_string_split_across_pieces_is_held_back_and_never_emitted():
    out, ts = stream([b"Hello ", b"wor", b"ld!", b" more"], stop=["world"])
    assert "".join(out) == "Hello "
    assert ts.stopped_by == "world"
    assert out[1] == ""  # "wor" could start the stop string: held


def test_a_partial_match_that_fails_is_released():
    out, ts = stream([b"a wo", b"nderful day"], stop=["world"])
    assert "".join(out) == "a wonderful day"
    assert ts.stopped_by is None


def test_unfinished_stop_prefix_at_the_end_is_real_text():
    out, _ = stream([b"see you wor"], stop=["world"])
    assert "".join(out) == "see you wor"


def test_earliest_of_several_stop_strings_wins():
    out, ts = stream([b"one two three"], stop=["three", "two"])
    assert "".join(out) == "one "
    assert ts.stopped_by == "two"
