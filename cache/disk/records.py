"""The records of the disk format: what an entry file says about itself (`Meta`), its
parsed head (`Header`) and the layout of its body (`Section`, `CheckpointInfo`, `DraftInfo`),
an entry about to be written (`Plan`), its bytes in memory (`Payload`), and why a file is
not used (`Rejected`, `REASONS`). How they are laid out in a file is format.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..checkpoints import Checkpoint
from ..prefix_trie import common_prefix
from ..entries import DraftState


class Rejected(Exception):
    """A file that must not be used, and why (`reason` is one of REASONS)."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# why a file is not used; every one is a label of the rejected-entries metric
REASONS = (
    "empty",  # a file of zero bytes
    "not_entry",  # not a file this format wrote (other magic, or not a file at all)
    "version",  # written by another format version
    "truncated",  # shorter than its header says (or the header itself is cut)
    "checksum",  # the head or a body block does not match its checksum, or trailing bytes
    "model",  # another model file or another state layout (KV types, --swa-full, sequences)
    "incomplete",  # a temporary file left by a write that never finished (a crash)
    "io",  # the file could not be read
    "base",  # a segment whose base entry is gone or was written again
)


@dataclass(frozen=True, slots=True)
class Section:
    """One body section: the state, or a checkpoint's state or logits."""

    nbytes: int
    dtype: str  # "u1" (state bytes) or "f4" (logits)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint as the header records it: its position and which parts it holds."""

    n_tokens: int
    data_bytes: int | None  # None: no state (attention memory keeps only logits)
    n_logits: int | None  # None: no logits


@dataclass(frozen=True, slots=True)
class DraftInfo:
    """A drafter's sequence (speculative decoding) as the header records it: its tokens are
    the entry's first `n_shared` and then `tail`; its extra arrays are (dtype, shape) each."""

    fingerprint: str
    n_shared: int
    tail: tuple[int, ...]
    state_bytes: int
    extra: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @staticmethod
    def of(draft: DraftState, tokens: Sequence[int]) -> "DraftInfo":
        n = common_prefix(draft.tokens, tokens)
        extra = tuple((a.dtype.str, tuple(int(x) for x in a.shape)) for a in draft.extra)
        return DraftInfo(draft.fingerprint, n, tuple(draft.tokens[n:]), int(draft.state.nbytes), extra)

    def section_bytes(self) -> list[int]:
        return [self.state_bytes] + [int(np.dtype(d).itemsize * np.prod(shape, dtype=np.int64)) for d, shape in self.extra]


@dataclass(frozen=True, slots=True)
class Meta:
    """What an entry says about itself, besides its tokens and bytes."""

    fingerprint: str  # the model file's identity and the context parameters of the state layout
    tenant: str
    prompt_end: int  # length of the last prompt in it; what follows is a generated reply
    last_used: float  # wall-clock seconds of its last use
    keep_s: float | None = None  # retention: dropped this long after its last use (None: LRU only)


@dataclass(frozen=True, slots=True)
class BaseRef:
    """The entry a segment continues (its state holds only the cells from `n_tokens` on):
    the base's file name, how many of its tokens the segment shares, and the checksums of
    the base's state as written, which the base must still have."""

    name: str
    n_tokens: int
    state_crcs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed head: everything but the body, and where each body section lies."""

    meta: Meta
    tokens: tuple[int, ...]
    state_bytes: int
    checkpoints: tuple[CheckpointInfo, ...]
    sections: tuple[Section, ...]
    crcs: tuple[tuple[int, ...], ...]  # per section, one CRC32 per BLOCK bytes
    head_bytes: int  # where the body starts
    file_bytes: int  # the exact file size
    draft: DraftInfo | None = None
    linear: bool = False  # its state holds each token's position once: a segment may continue it
    base: BaseRef | None = None  # a segment: the entry holding its first base.n_tokens tokens


@dataclass(frozen=True, slots=True)
class Payload:
    """An entry's bytes in memory: what a load puts into a slot (read-only arrays)."""

    state: np.ndarray
    checkpoints: tuple[Checkpoint, ...]
    draft: DraftState | None = None
    read_bytes: int = 0  # what reading it took from the disk (0: it was in memory)

    @property
    def nbytes(self) -> int:
        return int(self.state.nbytes) + sum(c.nbytes for c in self.checkpoints) + (self.draft.nbytes if self.draft is not None else 0)


def checkpoint_infos(checkpoints) -> tuple[CheckpointInfo, ...]:
    return tuple(
        CheckpointInfo(c.n_tokens, None if c.data is None else int(c.data.nbytes), None if c.logits is None else int(c.logits.size))
        for c in checkpoints
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """An entry about to be written: its exact size and layout (cheap: no bytes touched)."""

    meta: Meta
    n_tokens: int
    state_bytes: int
    checkpoints: tuple[CheckpointInfo, ...]
    sections: tuple[Section, ...]
    head_bytes: int
    draft: DraftInfo | None = None
    linear: bool = False
    base: BaseRef | None = None

    @property
    def file_bytes(self) -> int:
        return self.head_bytes + sum(s.nbytes for s in self.sections)
