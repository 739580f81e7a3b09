"""Engine counters, written by the engine thread and read by the metrics collector.

Plain ints and floats: single writes are atomic under the GIL, and a scrape that reads a
counter one step late is fine. `server.metrics` turns these into Prometheus families.
"""

from __future__ import annotations

import bisect
import collections
import enum
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

# Time buckets that cover a GPU's milliseconds and a CPU's seconds.
LATENCY_BUCKETS = (
    0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
)

RECENT_WINDOW = 10.0  # seconds of steps the recent rates are over
# labels of prompt tokens by origin; "shifted": an idle slot's chunks moved to where the
# prompt has them (--cache-reuse), counted apart from its exact prefix ("slot")
PROMPT_SOURCES = ("slot", "fork", "ram", "disk", "shifted", "computed")


class CopyCause(str, enum.Enum):
    """Why a sequence state was copied between the device and RAM."""

    OVERWRITE = "overwrite"  # a slot's contents saved before another conversation takes the slot
    PARK = "park"  # idle slots moved to RAM when a request starts (unified KV pool)
    SPILL = "spill"  # idle slots moved to RAM because the KV pool was full
    LOAD = "load"  # a prompt-cache entry copied into a slot
    SLEEP = "sleep"  # slots moved to RAM before the model is unloaded (--sleep-idle-seconds)


class Histogram:
    """A cumulative-bucket histogram; observe() on one thread, snapshot() from any."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[tuple[str, int]], float, int]:
        """Cumulative (le, count) pairs including +Inf, the sum, and the count."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        out, running = [], 0
        for le, c in zip(self.buckets, counts):
            running += c
            out.append((repr(float(le)), running))
        running += counts[-1]
        out.append(("+Inf", running))
        return out, total, running


@dataclass
class EngineStats:
    prompt_tokens: Counter = field(default_factory=Counter)  # by source
    generated_tokens: int = 0
    requests: Counter = field(default_factory=Counter)  # by finish reason or error kind
    queue_rejected: int = 0
    prefill_tokens: int = 0  # tokens evaluated for prompts
    prefill_seconds: float = 0.0
    decode_tokens: int = 0  # generated tokens evaluated
    filler_tokens: int = 0  # throwaway tokens that kept a micro-batch's sequence ids consecutive
    quick_starts: int = 0  # requests started beside --parallel others (router.py: quick requests)
    decode_seconds: float = 0.0
    steps: int = 0  # llama_decode calls
    busy_slot_steps: int = 0  # summed over steps: the slots with tokens in the step's batch
    max_sequence: int = 0  # the longest request seen, prompt and generation
    checkpoints_created: int = 0
    checkpoints_restored: int = 0
    checkpoints_evicted: int = 0
    checkpoint_saved_bytes: int = 0
    checkpoint_save_seconds: float = 0.0
    checkpoint_restored_bytes: int = 0
    checkpoint_restore_seconds: float = 0.0
    logits_reused: int = 0
    media_encodes: int = 0  # images run through the projector's encoder
    media_embeddings_reused: int = 0  # images decoded from embeddings encoded earlier
    media_tokens: int = 0  # image embeddings decoded into slots
    full_prefills: int = 0  # prompts that reused nothing although a candidate matched
    kv_evictions: int = 0  # idle slots cleared to make room in the KV pool
    tail_reads: int = 0  # saves that read only the cells the prompt cache lacked (SlotMemory._read)
    scratch_reads: int = 0  # of those, saves that read them through the scratch sequence, the slot left whole
    tail_loads: int = 0  # loads that wrote only the cells after a prefix the slot held (SlotMemory._load_tail)
    tail_load_forks: int = 0  # of the prefixes those loads kept, those forked from another slot first
    parked: int = 0  # idle slots moved to the prompt cache when another request started
    wakes: int = 0  # times the model was loaded again after sleeping (--sleep-idle-seconds)
    media_preprocessed: int = 0  # images decoded and preprocessed for a prompt (not those recent ones sent again)
    copy_bytes: Counter = field(default_factory=Counter)  # by CopyCause
    copy_seconds: Counter = field(default_factory=Counter)  # by CopyCause
    # where the engine thread's time goes while it has work: inside llama_decode (graph
    # building and launch; the whole computation on a CPU backend), waiting for the device
    # to finish, and the rest of each step (Python: admission, sampling, streaming)
    step_seconds: float = 0.0
    decode_call_seconds: float = 0.0
    device_wait_seconds: float = 0.0
    # speculative decoding, by (type, slot id): tokens drafted, and of those accepted
    spec_drafted: Counter = field(default_factory=Counter)
    spec_accepted: Counter = field(default_factory=Counter)
    spec_verify_steps: int = 0  # drafts verified
    spec_drafts_checked: int = 0  # n-gram drafts compared with the output instead of verified (speculator._shadow)
    spec_drafter_calls: int = 0  # steps in which a draft model or the MTP block drafted
    spec_drafter_seconds: float = 0.0  # the time they took (catching up with the slots, then drafting)
    spec_rollbacks: int = 0  # recurrent and hybrid memory: drafts cut, their state put back
    spec_rollback_seconds: float = 0.0
    spec_state_copies: int = 0  # drafts whose recurrent state was copied before the step (longer than the snapshots)
    # tokens a draft model or the MTP block took into its own memory to follow the slots:
    # "evaluated", or "restored" from the prompt cache or another slot's sequence
    spec_drafter_tokens: Counter = field(default_factory=Counter)
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    queue_wait: Histogram = field(default_factory=Histogram)

    # the steps of the last RECENT_WINDOW seconds (as of the newest), with their sums
    # (prefill tokens, prefill seconds, decode tokens, decode seconds), kept as they change:
    # the engine reads the prefill rate every step, and a sum over thousands of steps
    # each time cost a tenth of a one-token step on a GPU
    recent: collections.deque = field(default_factory=collections.deque)
    _recent_sums: list = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    def record_step(self, n_prefill: int, n_decode: int, seconds: float) -> None:
        """Account one decode step, splitting its time by token counts."""
        total = n_prefill + n_decode
        prefill_s = seconds * n_prefill / total
        decode_s = seconds - prefill_s
        self.steps += 1
        self.prefill_tokens += n_prefill
        self.decode_tokens += n_decode
        self.prefill_seconds += prefill_s
        self.decode_seconds += decode_s
        now = time.monotonic()
        sums, recent = self._recent_sums, self.recent
        recent.append((now, n_prefill, prefill_s, n_decode, decode_s))
        for i, v in enumerate((n_prefill, prefill_s, n_decode, decode_s)):
            sums[i] += v
        while recent[0][0] < now - RECENT_WINDOW:
            old = recent.popleft()
            for i in range(4):
                sums[i] -= old[i + 1]

    def prefill_rate(self) -> float:
        """Prefill tokens per second over the last RECENT_WINDOW seconds of steps, else since
        the start (0: none measured yet). Engine thread."""
        pn, ps = self._recent_sums[0], self._recent_sums[1]
        if pn > 0 and ps > 1e-9:
            return pn / ps
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    def recent_rates(self, window: float = RECENT_WINDOW) -> tuple[float, float]:
        """Prefill and decode tokens per second of decode time, over the last `window`
        seconds (at most RECENT_WINDOW). Any thread."""
        since = time.monotonic() - window
        pn = ps = dn = ds = 0.0
        for t, a, b, c, d in list(self.recent):  # one C-level copy, under the GIL
            if t >= since:
                pn, ps, dn, ds = pn + a, ps + b, dn + c, ds + d
        return (pn / ps if ps else 0.0, dn / ds if ds else 0.0)

    def count_preprocessed(self) -> None:
        """An image was decoded and preprocessed (the tokenize pool's threads)."""
        self.media_preprocessed += 1

    def add_prompt(self, source: str, cached: int, computed: int, shifted: int = 0) -> None:
        """Count a finished request's prompt: `cached` tokens not evaluated, of which `shifted`
        from shifted chunks and the rest from `source`, and `computed` evaluated."""
        assert 0 <= shifted <= cached
        if cached > shifted:
            assert source in PROMPT_SOURCES and source not in ("computed", "shifted"), source
            self.prompt_tokens[source] += cached - shifted
        if shifted:
            self.prompt_tokens["shifted"] += shifted
        self.prompt_tokens["computed"] += computed

    def add_copy(self, cause: CopyCause, nbytes: int, seconds: float) -> None:
        self.copy_bytes[cause] += nbytes
        self.copy_seconds[cause] += seconds
