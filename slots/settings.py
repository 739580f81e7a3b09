"""The engine's settings: one value the server builds from its flags (server/process/config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from warmslot.cache.shared_budget import SharedBudget

from .llama_api import Placement
from .speculation.spec_config import SpecConfig


@dataclass(slots=True)
class EngineConfig:
    model_path: str
    n_parallel: int = 4
    n_ctx: int = 0  # cells of all slots; 0: the training context if it fits the memory (context_size.py)
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0
    n_threads_batch: int = 0
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False
    max_queue: int = 64
    prefill_chunk: int = 0  # prefill tokens per step while other slots decode; 0: n_ubatch
    ctx_checkpoints: int = 32  # per slot
    checkpoint_bytes: int = 4 << 30  # per slot
    checkpoint_every: int = 8192  # tokens between checkpoints inside one long prefill
    quick_tokens: int = 512  # new tokens of a quick request, which runs beside n_parallel others (router.py)
    cache_reuse: int = 0  # --cache-reuse: least tokens of a slot's chunk shifted to where the prompt has it; 0: off (reuse/plan.py)
    cache_ram: int = 8 << 30  # prompt cache budget in bytes; 0: no prompt cache
    cache_segments: bool = True  # attention, sliding-window and hybrid memory: prompt-cache and disk entries store only what their base lacks
    park_idle: bool = True  # move idle slots to the prompt cache when a request starts (unified pool)
    kv_unified: str = "auto"  # on: one KV pool for all slots; off: a stream per slot; auto: see layout.kv_unified
    cache_vram: int | None = None  # device memory for spare sequences (see layout.py); None: auto
    spare_share: int = 1  # auto spares take 1/spare_share of the free device memory (a server of several models)
    shared_ram: SharedBudget | None = None  # a RAM budget shared with other models' prompt caches (cache_ram: its total)
    shared_disk: SharedBudget | None = None  # a disk budget shared with other models' disk tiers (cache_disk_size: its total)
    pinned_at_load: int = 16 << 30  # pinned host memory for states, in the background once the model serves (CUDA)
    embeddings: bool = False  # a second context for embeddings (`embedder`)
    pooling: str = "auto"  # its pooling: auto (the model's), mean, cls, last
    reranking: bool = False  # a context with rank pooling for relevance scores (`reranker`)
    cache_ram_auto: bool = False  # cache_ram was sized from the RAM (shown in the capacity table)
    use_mmap: bool = True
    use_mlock: bool = False
    repack: bool | None = None  # CPU weight repacking (llama.cpp's extra buffer types, --repack); None: off
    cache_disk: str | None = None  # directory of the disk tier below the prompt cache; None: off
    cache_disk_size: int = 0  # its budget in bytes
    placement: Placement = Placement()  # split mode, tensor split, devices, RPC servers
    mmproj: str | None = None  # a vision projector GGUF (libmtmd); None: text only
    mmproj_offload: bool = True  # the projector on the GPU
    image_min_tokens: int = -1  # -1: the projector's own
    image_max_tokens: int = -1
    placement: Placement = Placement()  # split mode, tensor split, devices, RPC servers, tensor overrides
    # --fit (fit.py): on a GPU, what was left unset (the context, expert placement, GPU layers)
    # is chosen to fit the free device memory less fit_target bytes per device
    fit: bool = True
    fit_target: int = 1 << 30  # bytes left free on each device; also the margin of the capacity answer
    fit_ctx: int = 4096  # the smallest context --fit may choose
    n_gpu_layers_auto: bool = False  # -ngl was not given: --fit may offload fewer layers
    spec: SpecConfig = SpecConfig()  # speculative decoding (--spec-type, --draft-max, ...)
    # LoRA adapters (--lora, --lora-scaled): each file and its scale for requests that name
    # none (the server's; POST /lora-adapters changes it); an adapter's id is its index
    lora: tuple[tuple[str, float], ...] = ()
