"""The prompt of a fill-in-the-middle request (/infill), laid out as llama-server lays it out.

    extra context (its tail) | BOS (where the model adds one) | FIM_PRE prefix prompt | FIM_SUF suffix | FIM_MID

`--spm-infill` swaps the two middle parts (suffix, then prefix): FIM_SUF suffix FIM_PRE
prefix prompt FIM_MID. `prompt` is the text typed after the prefix on the cursor's line.

The extra context is the repository-level pattern (arXiv 2409.12186): FIM_REP "myproject\\n"
where the vocabulary has a repository token; each chunk of `input_extra` as FIM_SEP
"filename\\n" text where it has a file-separator token, else as llama-server's
"\\n\\n--- snippet ---\\n\\n" then the text; then FIM_SEP "filename\\n" for the file being edited.

Budgets, from llama-server (the FIM part fits one batch, 3:1 between prefix and suffix):
the prefix keeps its last 3/4 n_batch tokens, the suffix its first n_batch/4 - 2 - len(prompt),
the extra context its last n_ctx - n_batch - 2 n_predict.

NOTE: the extra context comes first and the prefix before the suffix, so when the cursor moves
on (the prefix grows by what was typed) everything up to the cursor is a token prefix of the
last request's prompt, which the slot still holds: only the rest is evaluated again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from warmslot.slots import FimTokens

from ..errors import InvalidRequest

REPO_NAME = "myproject\n"  # llama-server's: the repository's name is not an input yet
FILE_NAME = "filename\n"  # llama-server's: nor is the name of the file being edited
SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's header where the vocabulary has no file separator


class FimVocab(Protocol):
    """What the layout reads of the vocabulary (slots.Vocab)."""

    fim: FimTokens
    bos: int
    add_bos: bool

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Chunk:
    """One `input_extra` entry: a file (or a part of one) the completion may refer to."""

    filename: str
    text: str


Mixed = str | list  # llama-server's text fields: a text, or texts and token ids mixed


@dataclass(frozen=True, slots=True)
class Infill:
    """An /infill body's FIM fields."""

    prefix: Mixed
    suffix: Mixed
    extra: tuple[Chunk, ...] = ()
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class Budget:
    """What bounds the layout: the server's batch, a slot's context, the server's n_predict."""

    n_batch: int
    n_ctx: int
    n_predict: int = -1


def _mixed(body: dict, name: str, n_vocab: int) -> Mixed:
    if name not in body:
        raise InvalidRequest(f"'{name}' is required", param=name)
    value = body[name]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool)) for p in value):
        bad = [p for p in value if isinstance(p, int) and not 0 <= p < n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param=name)
        return value
    raise InvalidRequest(f"'{name}' must be a string, or an array of strings and token ids", param=name)


def _chunks(value: Any) -> tuple[Chunk, ...]:
    shape = "'input_extra' must be an array of {\"filename\": string, \"text\": string}"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest(shape, param="input_extra")
    chunks = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidRequest(f"{shape}: input_extra[{i}] has no \"text\" string", param="input_extra")
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise InvalidRequest(f"{shape}: input_extra[{i}].filename is not a string", param="input_extra")
        chunks.append(Chunk(filename, chunk["text"]))
    return tuple(chunks)


def parse_infill(body: dict, n_vocab: int) -> Infill:
    """The FIM fields of an /infill body: `input_prefix` and `input_suffix` (required),
    `input_extra` and `prompt` (optional); each wrong one is a 400 that names it."""
    prompt = body.get("prompt", "")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidRequest("'prompt' must be a string", param="prompt")
    prefix, suffix = _mixed(body, "input_prefix", n_vocab), _mixed(body, "input_suffix", n_vocab)
    return Infill(prefix, suffix, _chunks(body.get("input_extra")), prompt or "")


def _tokens(vocab: FimVocab, text: Mixed) -> list[int]:
    if isinstance(text, str):
        return vocab.tokenize(text, add_special=False, parse_special=False)
    out: list[int] = []
    for part in text:
        out += vocab.tokenize(part, add_special=False, parse_special=False) if isinstance(part, str) else [part]
    return out


def _extra(vocab: FimVocab, chunks: Sequence[Chunk]) -> list[int]:
    """The extra context, whole (the layout keeps its tail)."""
    fim = vocab.fim
    raw = lambda text: vocab.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    out: list[int] = [fim.rep, *raw(REPO_NAME)] if fim.rep >= 0 else []
    for chunk in chunks:
        out += [fim.sep, *raw(chunk.filename + "\n")] if fim.sep >= 0 else raw(SNIPPET)
        out += raw(chunk.text)
    if fim.sep >= 0:
        out += [fim.sep, *raw(FILE_NAME)]
    return out


def infill_tokens(vocab: FimVocab, infill: Infill, budget: Budget, spm: bool = False) -> list[int]:
    """The prompt's tokens (on the tokenize pool: tokenizing a large extra context takes time)."""
    fim = vocab.fim
    assert not fim.missing(), "the vocabulary has the three FIM tokens (the route checks it)"
    prefix, suffix = _tokens(vocab, infill.prefix), _tokens(vocab, infill.suffix)
    prompt = vocab.tokenize(infill.prompt, add_special=False, parse_special=True) if infill.prompt else []
    extra = _extra(vocab, infill.extra)
    n_prefix = min(len(prefix), 3 * (budget.n_batch // 4))
    n_suffix = min(len(suffix), max(0, budget.n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, budget.n_ctx - budget.n_batch - 2 * budget.n_predict), len(extra))
    before = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    after = [fim.suf, *suffix[:n_suffix]]
    if spm:
        before, after = after, before
    bos = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
    # [0, n_extra) extra context | BOS | the FIM parts | FIM_MID
    return [*extra[len(extra) - n_extra :], *bos, *before, *after, fim.mid]
