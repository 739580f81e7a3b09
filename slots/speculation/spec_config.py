"""The speculation settings (llama-server's flags): `SpecConfig`, checked when it is built,
and the kinds of drafter (`SPEC_TYPES`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..llama_api import MemoryKind
from .ngram_memory import MEMORY_TOKENS

SPEC_TYPES = ("none", "ngram-simple", "draft", "draft-mtp")
DRAFT = "draft"  # a draft model (-md): draft_model.py
MTP = "draft-mtp"  # the model's own MTP layers: mtp_draft.py
NGRAM_MIN = 3  # --spec-ngram-size-min: the shortest n-gram looked up

# Recurrent and hybrid memory: llama.cpp can keep the recurrent state after each of a
# sequence's last N tokens (n_rs_seq), so a draft of up to N tokens is taken back by seq_rm
# alone, without the state copy before the step and the copy and decode after it. But every
# step then writes the snapshots, and each costs one more recurrent state per sequence (52.7
# MB on the Qwen3.5-9B shape). On an H100 with that shape, steps ran 3% slower with 2
# snapshots and 10% slower with 8, drafts or not; MTP drafting at every step with all drafts
# rejected gave 200.6 tokens/s with 4 snapshots against 175.4 with state copies (rewrite
# turns; 188.2 and 187.4 on free text). So by default the drafters that verify at most
# steps (a draft model, MTP) keep 4, and n-gram drafts, verified only now and then, none.
RS_SNAPSHOTS = 4


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """The server's speculation settings (llama-server's flags)."""

    type: str = "none"  # --spec-type: none or ngram-simple
    n_max: int = 64  # --draft-max: most tokens drafted per step
    n_min: int = 0  # --draft-min: a shorter draft is not used
    p_min: float = 0.75  # --draft-p-min: a draft model's threshold; n-gram drafts have no probabilities
    ngram_n: int = 12  # --spec-ngram-size-n: tokens of the n-gram looked up
    ngram_m: int = 48  # --spec-ngram-size-m: tokens drafted after a match (before --draft-max)
    ngram_min: int = NGRAM_MIN  # --spec-ngram-size-min: the shortest looked up where that one did not occur
    ngram_memory: int = MEMORY_TOKENS  # --spec-ngram-memory: tokens of earlier outputs drafted from
    draft_model: str | None = None  # -md: the draft model's GGUF (type "draft")
    draft_gpu_layers: int = -1  # -ngld
    draft_type_k: str = "f16"  # -ctkd
    draft_type_v: str = "f16"  # -ctvd
    draft_devices: tuple[str, ...] | None = None  # -devd: names from --list-devices; None: all GPUs; (): the CPU
    rs_snapshots: int = -1  # --spec-rs-snapshots: recurrent state snapshots per sequence (-1: see RS_SNAPSHOTS)

    def __post_init__(self) -> None:
        if self.type not in SPEC_TYPES:
            raise ValueError(f"--spec-type must be one of {', '.join(SPEC_TYPES)}")
        if (self.type == DRAFT) != (self.draft_model is not None):
            raise ValueError("a draft model (-md) and --spec-type draft go together")
        if (self.n_max < 0 or self.n_min < 0 or self.ngram_n < 1 or self.ngram_m < 1 or self.ngram_memory < 0
                or self.ngram_min < 1 or self.rs_snapshots < -1):
            raise ValueError(
                "--draft-max, --draft-min and --spec-ngram-memory must be 0 or more, --spec-rs-snapshots -1 or more, "
                "--spec-ngram-size-n, -m and -min at least 1"
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError("--draft-p-min must be between 0 and 1")

    @property
    def on(self) -> bool:
        return self.type != "none" and self.n_max > 0

    def snapshots_for(self, kind: MemoryKind) -> int:
        """The recurrent state snapshots each sequence keeps (llama.cpp's n_rs_seq): drafts up
        to that long roll back with seq_rm, longer ones with a state copy. 0 without drafts or
        without recurrent memory (llama.cpp keeps none where the model cannot use them)."""
        if not self.on or kind not in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            return 0
        n = self.rs_snapshots
        if n < 0:
            n = RS_SNAPSHOTS if self.type in (DRAFT, MTP) else 0
        return min(self.n_max, n)
