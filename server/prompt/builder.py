"""Prompt building: a chat request's messages to tokens.

A chat request becomes tokens in three steps:

1. **Render** the messages (and tools) with the chat template (`chat_template`: the GGUF's
   own, a file or a built-in named with --chat-template, or a built-in chosen by
   architecture). Shapes of conversation the template rejects (system messages after the
   first, parallel tool calls, ...) are first rewritten into ones it takes (`template_rules`).
   A template that knows no tools gets them injected as a Hermes-style system prompt, with
   tool calls and tool results turned into text (see `inject_tools`).
2. **Split** the text into segments: template glue, and each message's content.
3. **Tokenize** each segment on its own (and cache the result). Glue and assistant content
   parse special tokens; user, system and tool content do not, so text such as
   "<start_of_turn>" typed by a user stays text.

Tokenizing segments separately keeps a conversation's token prefix stable from turn to turn:
a new message never changes how the previous ones tokenize. It also gives the token offset
where each message's content starts, which the engine uses as checkpoint positions.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Sequence

from warmslot.slots import Vocab

from .template import ChatTemplate
from .template_rules import fit, rules_for
from ..errors import ContextOverflow, InvalidRequest
from .jinja_env import tojson as _tojson
from .tokenizer import Tokenizer, split_marker


# -- tools for templates that know none ---------------------------------------------------

TOOL_PROMPT = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def hermes_call_text(function: dict) -> str:
    """A tool call as the injected tool prompt asks for it. The arguments keep the client's
    own JSON text when it sent one, so a call echoed back renders exactly as generated."""
    raw = function.get("raw_arguments")
    args = raw if isinstance(raw, str) else _tojson(function["arguments"])
    return "<tool_call>\n" + '{"name": ' + json.dumps(function["name"], ensure_ascii=False) + ', "arguments": ' + args + "}\n</tool_call>"


def inject_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Rewrite a conversation for a template without tool support (Hermes-style):
    tools go into the system prompt, assistant tool calls become <tool_call> blocks and tool
    results become user turns wrapped in <tool_response>. Consecutive tool results merge into
    one user turn. Keeps each message's original index under "_index"."""
    out: list[dict] = []
    if tools:
        listing = "\n".join(_tojson(t) for t in tools)
        prompt = TOOL_PROMPT.format(tools=listing)
        if messages and messages[0]["role"] == "system":
            first = dict(messages[0])
            first["content"] = f"{first.get('content') or ''}\n\n{prompt}".lstrip("\n")
            out.append(first)
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": prompt, "_index": -1})
    for msg in messages:
        role = msg["role"]
        if role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(hermes_call_text(c["function"]) for c in msg["tool_calls"])
            text = msg.get("content") or ""
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls, "_index": msg["_index"]})
        elif role == "tool":
            block = f"<tool_response>\n{msg.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_merge"):
                out[-1]["_tool_merge"].append(block)
            else:
                out.append({"role": "user", "content": block, "_index": msg["_index"], "_tool_merge": [block]})
        else:
            out.append(msg)
    for msg in out:  # NOTE: joined once; `+=` per result would be quadratic in their number
        merged = msg.get("_tool_merge")
        if merged is not None and len(merged) > 1:
            msg["content"] = "\n".join(merged)
    return out


# -- segments and tokens ------------------------------------------------------------------


@dataclass(slots=True)
class Segment:
    text: str
    special: bool  # parse special tokens in this text
    message: int = -1  # original message index of a content segment, -1 for glue


@dataclass(slots=True)
class Prompt:
    """A rendered, tokenized chat prompt."""

    text: str
    tokens: list[int]
    # per original message: (role, token offset where its glue starts, where its content starts)
    messages: list[tuple[str, int, int]] = field(default_factory=list)
    generation_start: int | None = None  # where the template's generation prompt starts
    system_end: int | None = None  # where the first message's own system text ends

    def message_at(self, token_index: int) -> int:
        """Index of the message that the token at `token_index` belongs to (-1: none)."""
        found = -1
        for i, (_, glue_start, _) in enumerate(self.messages):
            if glue_start <= token_index:
                found = i
        return found


def split_segments(text: str, messages: Sequence[dict], glue: re.Pattern | None = None) -> list[Segment]:
    """Cut rendered text at each message's content. Contents are found in order; a content
    the template changed beyond trimming stays inside the glue around it. A message that has
    only tool calls is anchored at the names of its calls (which only places the message for
    diagnostics: tokens do not depend on how glue is cut). `glue` finds the template's own
    special tokens: a content is never found inside one (a message "a" is not the "a" of
    "<start_of_turn>")."""
    segments: list[Segment] = []
    cursor = 0
    guarded = _Guard(text, glue)
    for msg in messages:
        for anchor, index in _anchors(msg):
            start = guarded.find(anchor, cursor)
            if start < 0:
                anchor = anchor.strip()
                start = guarded.find(anchor, cursor) if anchor else -1
            if start < 0:
                continue
            if start > cursor:
                segments.append(Segment(text[cursor:start], True))
            segments.append(Segment(anchor, msg["role"] == "assistant", index))
            cursor = start + len(anchor)
    if cursor < len(text):
        segments.append(Segment(text[cursor:], True))
    assert "".join(s.text for s in segments) == text
    return segments


class _Guard:
    """`str.find` that skips matches cutting through a special token of the template."""

    def __init__(self, text: str, glue: re.Pattern | None) -> None:
        self.text = text
        spans = [m.span() for m in glue.finditer(text)] if glue is not None else []
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]

    def find(self, anchor: str, cursor: int) -> int:
        text = self.text
        start = text.find(anchor, cursor)
        while start >= 0 and (self._inside(start) or self._inside(start + len(anchor))):
            start = text.find(anchor, start + 1)
        return start

    def _inside(self, char: int) -> bool:
        """Whether `char` falls strictly inside a special token (cutting it)."""
        i = bisect.bisect_right(self.starts, char) - 1
        return i >= 0 and self.starts[i] < char < self.ends[i]


def _anchors(msg: dict) -> list[tuple[str, int]]:
    """The texts that place a message in the rendered prompt, each with the index of the
    original message it comes from: the texts of the messages a merged one holds (`_parts`,
    see template_rules), its content, else the names of the functions it calls."""
    index = msg.get("_index", -1)
    parts = msg.get("_parts")
    if parts:
        return [(text, i) for text, i in parts if text.strip()]
    content = msg.get("content")
    if isinstance(content, str) and content.strip():
        return [(content, index)]
    anchors = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        if isinstance(fn.get("name"), str):
            anchors.append(fn["name"])
        args = fn.get("raw_arguments") or fn.get("arguments")
        if isinstance(args, dict) and args:
            args = _tojson(args)
        if isinstance(args, str) and args.strip() not in ("", "{}"):
            anchors.append(args)
    return [(anchor, index) for anchor in anchors]


@dataclass(slots=True)
class _Piece:
    start: int  # character offset in the rendered text
    text: str
    token: int | None  # a special token, or None for raw text


class PromptTooLong(ContextOverflow):
    """The prompt has more than `limit` tokens: the builder stopped once it had counted
    `at_least` of them (the whole prompt has at least that many)."""

    def __init__(self, at_least: int, limit: int) -> None:
        super().__init__(at_least, limit)
        self.at_least = at_least
        self.limit = limit


class PromptBuilder:
    """Renders and tokenizes chat prompts. Every step is linear in the size of the prompt
    (a chat of 100,000 messages builds in about a second), and with `max_tokens` set the
    builder stops as soon as the prompt is known to be longer, before rendering when the
    text alone proves it (`PromptTooLong`)."""

    def __init__(self, template: ChatTemplate, vocab: Vocab, *, max_tokens: int | None = None, longest_piece: int | None = None) -> None:
        self.template = template
        self.vocab = vocab
        self.tokenizer = Tokenizer(vocab)
        self.max_tokens = max_tokens  # None: no limit
        self._generation_suffixes: dict[str, str | None] = {}
        self._longest_piece = longest_piece  # None: not measured yet (longest_piece)
        self._token_chars: dict[int, int] = {}  # tokens' lengths in characters, filled as they occur
        self._glue: re.Pattern | bool | None = None  # False: the template writes no special token
        self.rules = rules_for(template)  # the shapes of conversation the template renders

    def build(
        self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool = True, extra: dict | None = None,
        media_marker: str | None = None, continue_final: bool = False,
    ) -> Prompt:
        """Render and tokenize. Thread-safe; call it off the event loop (it runs ctypes).
        Raises PromptTooLong past `max_tokens`. With `media_marker`, each occurrence of it in
        the text becomes one MEDIA_TOKEN (the text on either side is tokenized apart).
        `continue_final`: the last message (an assistant's) is a prefill: the prompt is the
        others with the generation prompt, then its text, open for the reply to continue."""
        self._check_text_bound(messages)
        indexed, text, prefill, add_generation_prompt = self._render(messages, tools, add_generation_prompt, extra, continue_final)
        generation_at = None
        suffix = self._generation_suffix(extra) if add_generation_prompt else None
        if suffix and text.endswith(suffix) and len(suffix) < len(text):
            generation_at = len(text) - len(suffix)
        text += prefill
        segments = split_segments(text, indexed, self._glue_pattern())
        if generation_at is not None:
            segments = _split_glue_at(segments, generation_at)
        pieces = self._pieces(segments, media_marker)
        tokens: list[int] = []
        starts: list[int] = []
        limit = self.max_tokens
        for piece in pieces:
            starts.append(len(tokens))
            tokens.extend((piece.token,) if piece.token is not None else self.tokenizer.raw(piece.text))
            if limit is not None and len(tokens) > limit:
                raise PromptTooLong(len(tokens), limit)
        shift = self._bos_prefix(tokens)
        if shift:
            tokens = [self.vocab.bos] + tokens
        # NOTE: looked up once per prompt; per message, building was quadratic in messages
        char_starts = [p.start for p in pieces]
        ends: dict[int, list[int]] = {}

        def at(char: int) -> int:
            return shift + self._token_index(pieces, char_starts, starts, char, ends)

        spans = _message_spans(messages, segments, at)
        system_end = _system_end(messages, segments)
        return Prompt(
            text, tokens, spans, at(generation_at) if generation_at is not None else None,
            at(system_end) if system_end is not None else None,
        )

    def _glue_pattern(self) -> re.Pattern | None:
        """The special tokens the template writes (found in its source, plus BOS and EOS),
        as one pattern."""
        if self._glue is None:
            source = self.template.source
            texts = {self.template.bos_token, self.template.eos_token}
            for token in self.vocab.tokenize(source, add_special=False, parse_special=True):
                if self.vocab.is_special(token):
                    texts.add(self.vocab.token_text(token))
            texts.discard("")
            ordered = sorted(texts, key=len, reverse=True)
            self._glue = re.compile("|".join(map(re.escape, ordered))) if ordered else False
        return self._glue or None

    def render_text(
        self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool = True, extra: dict | None = None,
        continue_final: bool = False,
    ) -> str:
        """The prompt text `build` would tokenize, with no bound on its length."""
        _, text, prefill, _ = self._render(messages, tools, add_generation_prompt, extra, continue_final)
        return text + prefill

    def _render(self, messages, tools, add_generation_prompt, extra, continue_final) -> tuple[list[dict], str, str, bool]:
        """(the messages as rendered, the template's text, the prefill after it, whether the
        text ends with the generation prompt). Tools a template does not know are injected."""
        indexed = fit([dict(m, _index=i) for i, m in enumerate(messages)], self.rules)
        template_tools = tools
        if not self.template.supports_tools and (tools or any(m["role"] == "tool" or m.get("tool_calls") for m in indexed)):
            indexed = inject_tools(indexed, tools)
            template_tools = None
        if continue_final:
            return indexed, self.template.render(indexed[:-1], template_tools, True, extra), indexed[-1].get("content") or "", True
        return indexed, self.template.render(indexed, template_tools, add_generation_prompt, extra), "", add_generation_prompt

    def _check_text_bound(self, messages: list[dict]) -> None:
        """Before rendering: no token is longer than the vocabulary's longest piece, so the
        messages' text alone gives a lower bound on the prompt's tokens."""
        if self.max_tokens is None:
            return
        n_bytes = 0
        for m in messages:
            # NOTE: only user and tool text: templates may drop or rewrite the others (old
            # reasoning, a system prompt they fold elsewhere), which would break the bound
            content = m.get("content")
            if m.get("role") in ("user", "tool") and isinstance(content, str):
                n_bytes += len(content)  # characters: at most the bytes
        longest = self._longest_piece
        if longest is None:  # not known yet (see longest_piece): the token count decides
            return
        at_least = n_bytes // longest
        if at_least > self.max_tokens:
            raise PromptTooLong(at_least, self.max_tokens)

    def longest_piece(self) -> int:
        """Bytes of the vocabulary's longest token (computed once, n_vocab calls: about 0.6 s
        for a 262K vocabulary, which the server spends while it loads)."""
        if self._longest_piece is None:
            self._longest_piece = self.vocab.longest_piece()
        return self._longest_piece

    def _pieces(self, segments: list[Segment], media_marker: str | None = None) -> list[_Piece]:
        """Special tokens of glue and assistant text, and the raw text between them merged."""
        pieces: list[_Piece] = []
        raw: list[str] = []  # the texts of the raw piece being merged (joined once)
        offset = 0
        for seg in segments:
            parts = self.tokenizer.split_specials(seg.text) if seg.special else [(0, seg.text, None)]
            if media_marker is not None:
                parts = split_marker(parts, media_marker)
            for rel, text, token in parts:
                if token is None and pieces and pieces[-1].token is None:
                    raw.append(text)
                    continue
                if raw:
                    pieces[-1].text = "".join(raw)
                pieces.append(_Piece(offset + rel, text, token))
                raw = [text] if token is None else []
            offset += len(seg.text)
        if raw:
            pieces[-1].text = "".join(raw)
        return pieces

    def _token_index(self, pieces: list[_Piece], char_starts: list[int], starts: list[int], char: int, ends: dict) -> int:
        """The token index where the character at `char` starts: exact at piece boundaries;
        inside raw text, the number of the piece's tokens that end at or before it. `ends`
        caches each raw piece's token ends (so any number of lookups stays linear)."""
        i = bisect.bisect_right(char_starts, char) - 1
        if i < 0:
            return 0
        piece = pieces[i]
        inside = char - piece.start
        if inside == 0 or piece.token is not None:
            return starts[i] + (1 if inside and piece.token is not None else 0)
        if i not in ends:
            ends[i] = self._char_ends(self.tokenizer.raw(piece.text))
        limit = starts[i + 1] if i + 1 < len(starts) else starts[i] + len(ends[i])
        return min(starts[i] + bisect.bisect_right(ends[i], inside), limit)

    def _char_ends(self, tokens: list[int]) -> list[int]:
        """Where each token's text ends, in characters of the text they came from (a
        character counts with the token that holds its first byte). Each token's length is
        asked of llama.cpp once: a call per token of a 38,000-token prompt took 0.6 s of its
        0.8 s of building on two cores, and an agent's next turn repeats the same tokens."""
        table = self._token_chars

        def length(token: int) -> int:
            n = table.get(token)
            if n is None:
                n = table[token] = _n_chars(self.vocab.token_piece(token, special=False))
            return n

        return list(itertools.accumulate(map(length, tokens)))

    def _generation_suffix(self, extra: dict | None) -> str | None:
        """The text the template adds for the generation prompt (e.g. "<|im_start|>assistant\\n"),
        found once per set of template arguments by rendering a probe with and without it."""
        key = json.dumps(extra or {}, sort_keys=True, default=str)
        if key not in self._generation_suffixes:
            probe = [{"role": "user", "content": "probe", "_index": 0}]
            try:
                without = self.template.render(probe, None, False, extra)
                with_prompt = self.template.render(probe, None, True, extra)
            except InvalidRequest:
                without, with_prompt = "", ""
            ok = with_prompt.startswith(without) and len(with_prompt) > len(without)
            self._generation_suffixes[key] = with_prompt[len(without):] if ok else None
        return self._generation_suffixes[key]

    def _bos_prefix(self, tokens: list[int]) -> int:
        """1 when the vocabulary wants a BOS token and the template did not render one."""
        vocab = self.vocab
        return int(vocab.add_bos and vocab.bos >= 0 and (not tokens or tokens[0] != vocab.bos))


def _n_chars(piece: bytes) -> int:  # characters whose first byte is in `piece`
    return sum(1 for b in piece if b & 0xC0 != 0x80)


def _split_glue_at(segments: list[Segment], char: int) -> list[Segment]:
    """Cut the glue segment that contains `char` in two (contents are never cut)."""
    out: list[Segment] = []
    offset = 0
    for seg in segments:
        end = offset + len(seg.text)
        if seg.message < 0 and offset < char < end:
            out.append(Segment(seg.text[: char - offset], seg.special))
            out.append(Segment(seg.text[char - offset :], seg.special))
        else:
            out.append(seg)
        offset = end
    return out


def _system_end(messages, segments: list[Segment]) -> int | None:
    """The character where the first message's system text ends, when it leads the
    conversation: tools injected after it, or rendered after it by the template, follow."""
    if not messages or messages[0]["role"] != "system" or not isinstance(messages[0].get("content"), str):
        return None
    own = messages[0]["content"]
    offset = 0
    for seg in segments:
        if seg.message == 0:
            return offset + len(own) if own and seg.text.startswith(own) else None
        offset += len(seg.text)
    return None


def _message_spans(messages, segments: list[Segment], at) -> list[tuple[str, int, int]]:
    """(role, token where its glue starts, token where its content starts) per message. A
    message whose content was not found (tool calls only, or content the template changed)
    starts where the previous content ended."""
    found: dict[int, tuple[int, int, int]] = {}  # message -> glue start, content start, end (chars)
    offset = 0
    previous_end = 0
    for seg in segments:
        end = offset + len(seg.text)
        if seg.message >= 0 and seg.message not in found:
            found[seg.message] = (previous_end, offset, end)
        if seg.message >= 0:
            previous_end = end
        offset = end
    out = []
    cursor = 0
    for i, m in enumerate(messages):
        if i in found:
            glue, content, end = found[i]
            out.append((m["role"], at(glue), at(content)))
            cursor = end
        else:
            out.append((m["role"], at(cursor), at(cursor)))
    return out
