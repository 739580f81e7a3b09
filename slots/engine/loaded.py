"""What a loaded model brings: the model and its context, the slots and every part that works
on them. `load` builds it on the engine thread; `Loaded.close` frees it (sleep is
`loaded.close(); loaded = None`). The prompt cache and the disk tier outlive it: a later
load of the same parts takes them back (`kept`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from warmslot.cache.prompt_cache import PromptCache

from ..adapters.on_model import ModelAdapters
from .embedding_worker import Embedder, Reranker
from ..fitting.layout import KvLayout
from ..llama_api import Batch, Context, MemoryKind, Model
from ..llama_api.mtmd import Projector
from .loader import open_model, reuse_parts
from ..reuse.memory import SlotMemory
from ..step.media_prefill import MediaPrefill
from ..step.outbox import Outbox
from ..sampling.parallel import BatchSampler
from ..step.postprocess import Postprocess
from ..reuse.prefix import Prefixes
from ..reuse.router import Router
from ..settings import EngineConfig
from ..slot import Slot
from .snapshot import EngineInfo
from ..speculation.draft_model import load_draft
from ..speculation.speculator import Speculator
from ..stats import EngineStats
from ..reuse.tiers.disk import DiskTier
from ..vocab import Vocab
from .demand import EngineDemand

__all__ = ["Loaded", "UnloadedContext", "load"]


@dataclass(slots=True)
class Loaded:
    model: Model
    layout: KvLayout
    ctx: Context
    batch: Batch
    sampling: BatchSampler
    slots: list[Slot]
    memory: SlotMemory  # saves, loads, forks and clears slots' sequences
    router: Router  # decides where a request's prompt comes from
    prefixes: Prefixes  # applies that decision
    post: Postprocess  # the token path after each decode
    spec: Speculator  # drafts tokens and verifies them (speculative decoding)
    filler_budget: int  # cells a micro-batch is worth (streams of attention memory); 0: no fillers
    on_gpu: bool  # a decode is launched on a GPU (else llama_decode computes it before it returns)
    vocab: Vocab  # any thread
    info: EngineInfo  # any thread
    reload: EngineConfig  # loads the same parts again (the context and placement chosen)
    cache: PromptCache | None = None
    disk: DiskTier | None = None  # the disk tier, when on
    embedder: Embedder | None = None  # with config.embeddings: embeddings on a context of their own
    reranker: Reranker | None = None  # with config.reranking: relevance scores, likewise
    projector: Projector | None = None  # --mmproj: its `tokenize_media` may be called from any thread
    media: MediaPrefill | None = None  # --mmproj: images in prompts
    adapters: ModelAdapters | None = None  # --lora: the LoRA adapters on the model

    def close_parts(self) -> None:
        """Free what was built on the model (the model itself stays: see close); the adapters
        after the contexts that may hold them."""
        for part in (self.sampling, self.spec, self.ctx, self.embedder, self.reranker, self.projector, self.adapters):
            if part is not None:
                part.close()

    def close(self) -> None:
        """Free the parts and the model (no other thread may be tokenizing: Vocab.retire)."""
        self.close_parts()
        self.model.close()


@dataclass(frozen=True, slots=True)
class UnloadedContext:
    """The context's facts a snapshot shows while the model is unloaded."""

    memory_kind: MemoryKind
    n_ctx: int
    host: Any  # the host buffers the prompt cache's entries live in
    unified: bool = False  # one pool of KV cells (its sequences are all empty while unloaded)


def load(
    cfg: EngineConfig, stats: EngineStats, progress: Callable[[float], None], *, outbox: Outbox, demand: EngineDemand,
    kept: tuple[PromptCache | None, DiskTier | None] | None = None,
) -> Loaded:
    """Load the model (loader.py), then its speculative drafter, then the parts that move and
    reuse the slots' contents (which follow the drafter's sequences) and the token path.
    `kept`: the prompt cache and disk tier of an earlier load (waking from sleep)."""
    _check_adapters(cfg)
    parts = open_model(cfg, stats, progress, wake=demand.later, kept=kept, demand=demand)
    model, ctx = parts.model, parts.ctx
    adapters = None
    if cfg.lora:
        try:
            adapters = ModelAdapters.load(model, [path for path, _ in cfg.lora])
        except BaseException:
            for part in (parts.sampling, ctx, parts.embedder, parts.reranker, parts.projector, model):
                if part is not None:
                    part.close()
            raise
        parts.info = dataclasses.replace(parts.info, adapters=adapters.infos)
    spec = Speculator(cfg.spec, ctx, stats, model.info.n_swa, load_draft(cfg, model, ctx, stats))
    memory, router, prefixes = reuse_parts(parts, stats, drafter=spec.draft_model, demand=demand)
    media = None
    if parts.projector is not None:
        media = MediaPrefill(parts.projector, ctx, memory, outbox, stats, truncatable=ctx.memory_kind.truncatable)
    return Loaded(
        model=model, layout=parts.layout, ctx=ctx, batch=parts.batch, sampling=parts.sampling, slots=parts.slots,
        memory=memory, router=router, prefixes=prefixes, post=Postprocess(model, ctx, memory, outbox, stats), spec=spec,
        filler_budget=parts.filler_budget, on_gpu=parts.on_gpu, vocab=parts.vocab, info=parts.info, reload=parts.reload, cache=parts.cache,
        disk=parts.disk, embedder=parts.embedder, reranker=parts.reranker, projector=parts.projector, media=media,
        adapters=adapters,
    )


def _check_adapters(cfg: EngineConfig) -> None:
    """What decodes apart from the step's one decode (drafts verified outside it, a draft
    model's or the MTP block's own decodes, images) would run under whatever adapter set the
    step left applied: with --lora those are refused rather than served wrong."""
    if cfg.lora and cfg.spec.type != "none":
        raise ValueError(f"LoRA adapters (--lora) do not go with speculative decoding (--spec-type {cfg.spec.type})")
    if cfg.lora and cfg.mmproj:
        raise ValueError("LoRA adapters (--lora) do not go with a multimodal projector (--mmproj; with -hf, add --no-mmproj)")
