"""Assistant turns put back into a prompt exactly as the model generated them.

A chat template renders an earlier assistant turn its own way: it may drop the turn's
reasoning, write tool calls in another JSON spacing, or end the turn with a marker the model
never sampled. The prompt then differs from what the slot holds (the previous prompt followed
by the generated tokens) from the turn on, and everything after it is computed again. A
client that sends the turn back with a proof of what was generated (`ExactTurn`: the
generated tokens and the length and digest of the prompt they followed; /v1/responses carries
one in a reasoning item's `encrypted_content`) gets the turn as those tokens instead:

    rendered:  [conversation before | the template's rendering of the turn     | end marker ... rest]
    spliced:   [conversation before | generation prompt H | generated tokens G | end marker ... rest]

The previous prompt P was the conversation before the turn followed by the template's
generation prompt H (e.g. `<|im_start|>assistant\n<think>\n`), which the turn carries: a
template may render the start of an earlier turn otherwise (Qwen3.5 drops the think block of
turns before the last user message), and the turn is then still P followed by G. P is checked,
not trusted: a turn is spliced only where the tokens before it, then H, hash to the digest it
carries (so the spliced prompt starts with exactly the prompt the turn was generated after,
earlier spliced turns included). The rendering of the turn is replaced up to its end-of-turn
marker (the first end-of-generation token after the turn's own text): the marker and what
follows are the template's. A turn that does not check is left as rendered.

The slot that generated G holds P + G (P + G less its last token when the token limit or a
stop string ended it), so the next prompt reuses all of it.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import hashlib
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from .builder import Prompt

DIGEST_BYTES = 16


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 (what digests and signed blobs are made of): a
    prompt's image placeholders are negative ids (media_spans.py)."""
    data = array.array("i", tokens)
    assert data.itemsize == 4
    if sys.byteorder == "big":
        data.byteswap()
    return data.tobytes()


def prompt_digest(tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(token_bytes(tokens)).digest()[:DIGEST_BYTES]


@dataclass(frozen=True, slots=True)
class ExactTurn:
    """An assistant turn as generated: its tokens (without the end-of-generation token that
    ended it), and the prompt it followed: its length, its digest, and its last tokens from
    where the template's generation prompt starts (`head`, empty where that is not known)."""

    prompt_len: int
    prompt_digest: bytes
    tokens: tuple[int, ...]
    head: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        assert 0 < self.prompt_len and len(self.head) <= self.prompt_len and len(self.prompt_digest) == DIGEST_BYTES


@dataclass(slots=True)
class Splice:
    """What `splice_turns` did: the messages whose turns were spliced, and why others were not."""

    spliced: list[int] = dataclasses.field(default_factory=list)
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)  # message index -> reason
    moved: Callable[[int], int] = lambda index: index  # a rendered token index -> the spliced one


class _Map:
    """Token index in the rendered prompt -> index in the spliced one, from the ranges copied
    over (an index inside a replaced range maps to where its replacement starts)."""

    def __init__(self) -> None:
        self.starts: list[int] = []  # rendered start of each range, copied or replaced, in order
        self.targets: list[tuple[int, bool]] = []  # (spliced start, copied) of each

    def add(self, rendered_start: int, spliced_start: int, copied: bool) -> None:
        self.starts.append(rendered_start)
        self.targets.append((spliced_start, copied))

    def __call__(self, index: int) -> int:
        i = bisect.bisect_right(self.starts, index) - 1
        if i < 0:
            return index
        at, copied = self.targets[i]
        return at + index - self.starts[i] if copied else at


def splice_turns(prompt: Prompt, turns: dict[int, ExactTurn], is_eog: Callable[[int], bool]) -> tuple[Prompt, Splice]:
    """The prompt with each turn (message index -> ExactTurn, an assistant message of the
    prompt) spliced in where it checks; positions in the prompt (message spans, the generation
    start, the system end) moved with it. Linear in the prompt's tokens and the turns'."""
    rendered = prompt.tokens
    report = Splice()
    out: list[int] = []
    digest = hashlib.sha256()
    cursor = 0  # tokens of `rendered` before it are written (or replaced)
    moved = _Map()
    for index in sorted(turns):
        turn = turns[index]
        start = cursor + turn.prompt_len - len(turn.head) - len(out)  # where the turn (its H) starts in `rendered`
        if start < cursor or start > len(rendered):
            report.skipped[index] = f"its prompt ({turn.prompt_len} tokens) does not end inside this one"
            continue
        probe = digest.copy()
        probe.update(token_bytes(rendered[cursor:start]))
        probe.update(token_bytes(turn.head))
        if probe.digest()[:DIGEST_BYTES] != turn.prompt_digest:
            report.skipped[index] = "the conversation before it is not the prompt it was generated after"
            continue
        end = _end_of_turn(rendered, prompt, index, start, is_eog)
        if end is None:
            report.skipped[index] = "the rendered prompt has no end-of-turn marker after it"
            continue
        moved.add(cursor, len(out), copied=True)
        out += rendered[cursor:start]
        moved.add(start, len(out), copied=False)
        out += turn.head
        out += turn.tokens
        digest = probe
        digest.update(token_bytes(turn.tokens))
        cursor = end
        report.spliced.append(index)
    if not report.spliced:
        return prompt, report
    moved.add(cursor, len(out), copied=True)
    out += rendered[cursor:]
    # per turn: [.., start) as rendered | [start, +len(H)+len(G)) as generated | [.., next start) rendered from the marker on
    spans = [(role, moved(glue), moved(content)) for role, glue, content in prompt.messages]
    spliced = dataclasses.replace(
        prompt, tokens=out, messages=spans,
        generation_start=moved(prompt.generation_start) if prompt.generation_start is not None else None,
        system_end=moved(prompt.system_end) if prompt.system_end is not None else None,
    )
    report.moved = moved
    return spliced, report


def _end_of_turn(rendered: list[int], prompt: Prompt, index: int, start: int, is_eog) -> int | None:
    """Where the turn's end-of-turn marker is in `rendered`: the first end-of-generation token
    from the turn's start, looked for after the turn's own text (where the next message's
    glue starts), so that a marker's text inside the turn's content is never taken for it."""
    after = prompt.messages[index + 1][1] if index + 1 < len(prompt.messages) else start
    for i in range(max(start, after), len(rendered)):
        if is_eog(rendered[i]):
            return i
    return None

