"""Prometheus metrics at /metrics.

The engine keeps plain counters (`slots.stats.EngineStats`); this module reads them at
scrape time through a custom collector, so the engine thread never waits on a metrics lock
per token. HTTP requests are counted by a small ASGI middleware. llama-server's own `llamacpp:` families
follow the `warmslot_` ones, from the same counters.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from warmslot.cache.disk import REASONS
from warmslot.slots import PROMPT_SOURCES, CopyCause

from .errors import Forbidden
from .models.metrics import ModelsCollector

# endpoint labels of warmslot_requests_total by path; the app adds those its other APIs declare
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "completions",
    "/completions": "completions",
    "/v1/models": "models",
    "/models": "models",
    "/health": "health",
    "/v1/health": "health",
    "/metrics": "metrics",
    "/slots": "slots",
    "/engine": "slots",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/openapi.json": "openapi",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/embeddings": "embeddings",
}


class RequestCounter:
    """ASGI middleware: counts responses by endpoint and status into `counts`. `endpoints`:
    the labels of the APIs' paths beyond `ENDPOINTS`."""

    def __init__(self, app, counts: Counter, endpoints: dict[str, str] | None = None) -> None:
        self.app = app
        self.counts = counts
        self.endpoints = {**ENDPOINTS, **(endpoints or {})}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = self.endpoints.get(path) or ("slots" if path.startswith("/slots/") else "other")
        status = [0]

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.counts[(endpoint, str(status[0] or 499))] += 1


class EngineCollector:
    def __init__(self, server, request_counts: Counter) -> None:
        self.server = server
        self.request_counts = request_counts

    def collect(self):
        yield from self._requests()
        models = self.server.models
        if models is None:
            yield from self._engine(self.server.default.engine)
            return
        # several models: each engine's families once, every sample labelled with its model
        merged: dict[str, Metric] = {}
        for entry in list(models.entries.values()):
            for family in self._engine(entry.host.engine):
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples += [s._replace(labels={"model": entry.name, **s.labels}) for s in family.samples]
        yield from merged.values()

    def _engine(self, engine):
        """The families of one engine (one model)."""
        stats = engine.stats
        prompt = CounterMetricFamily("warmslot_prompt_tokens", "Prompt tokens by where they came from", labels=["source"])
        for source in PROMPT_SOURCES:
            prompt.add_metric([source], stats.prompt_tokens.get(source, 0))
        yield prompt
        yield CounterMetricFamily("warmslot_generated_tokens", "Tokens generated", value=stats.generated_tokens)
        finished = CounterMetricFamily("warmslot_engine_requests", "Requests finished by the engine, by outcome", labels=["outcome"])
        for outcome, n in sorted(stats.requests.items()):
            finished.add_metric([outcome], n)
        yield finished
        yield _histogram("warmslot_time_to_first_token_seconds", "Time from submission to the first generated token", stats.ttft)
        yield _histogram("warmslot_inter_token_latency_seconds", "Time between consecutive generated tokens of a request", stats.itl)
        yield _histogram("warmslot_queue_wait_seconds", "Time a request waited for a slot", stats.queue_wait)
        yield CounterMetricFamily("warmslot_prefill_tokens", "Prompt tokens evaluated", value=stats.prefill_tokens)
        yield CounterMetricFamily("warmslot_prefill_seconds", "Decode time attributed to prompt tokens", value=stats.prefill_seconds)
        yield CounterMetricFamily("warmslot_decode_tokens", "Generated tokens evaluated", value=stats.decode_tokens)
        yield CounterMetricFamily("warmslot_decode_seconds", "Decode time attributed to generated tokens", value=stats.decode_seconds)
        yield CounterMetricFamily("warmslot_filler_tokens", "Throwaway tokens in idle KV streams that kept a micro-batch's sequence ids consecutive", value=stats.filler_tokens)
        yield CounterMetricFamily("warmslot_quick_starts", "Requests started beside --parallel running ones: quick continuations of a conversation the device holds (--quick-tokens)", value=stats.quick_starts)
        prefill_rate, decode_rate = stats.recent_rates()
        yield GaugeMetricFamily("warmslot_prefill_tokens_per_second", "Prompt evaluation speed over the last 10 s of work", value=prefill_rate)
        yield GaugeMetricFamily("warmslot_decode_tokens_per_second", "Generation speed over the last 10 s of work", value=decode_rate)
        yield GaugeMetricFamily("warmslot_queue_depth", "Requests waiting for a slot", value=engine.queue_depth)
        yield GaugeMetricFamily("warmslot_asleep", "1 while the model is unloaded (--sleep-idle-seconds)", value=int(engine.asleep))
        yield CounterMetricFamily("warmslot_queue_rejected", "Requests rejected because the queue was full", value=stats.queue_rejected)
        yield from self._engine_time(stats)
        yield from self._speculative(stats)
        snap = engine.snapshot()  # the view published after the last step
        if snap is not None:
            yield from self._slots(snap)
        yield from self._checkpoints(snap, stats)
        yield from self._cache(snap, engine)
        yield from self._disk(engine.disk_view)
        yield from self._model(engine.info)

    def _requests(self):
        family = CounterMetricFamily("warmslot_requests", "HTTP requests by endpoint and status", labels=["endpoint", "status"])
        for (endpoint, status), n in sorted(self.request_counts.items()):
            family.add_metric([endpoint, status], n)
        yield family

    def _slots(self, snap):
        states = snap.states()
        family = GaugeMetricFamily("warmslot_slots", "Slots by state", labels=["state"])
        for state in ("idle", "prefill", "decode"):
            family.add_metric([state], states.get(state, 0))
        yield family
        idle = [s for s in snap.slots if s.state == "idle" and s.n_tokens]
        yield GaugeMetricFamily("warmslot_idle_conversations",
                                "Sequences that hold a conversation and run nothing: it comes back with no copy", value=len(idle))
        yield GaugeMetricFamily("warmslot_idle_conversation_tokens", "Tokens those sequences hold", value=sum(s.n_tokens for s in idle))
        yield GaugeMetricFamily("warmslot_kv_cells_used", "KV cells held by the slots' contents (in one pool a prefix that sequences share counts once)", value=snap.device_tokens)
        yield GaugeMetricFamily("warmslot_kv_cells_total", "KV cells in the pool", value=snap.n_ctx)
        yield GaugeMetricFamily("warmslot_host_pinned_bytes", "Page-locked host memory held for states (CUDA only)", value=snap.pinned_bytes)
        yield GaugeMetricFamily("warmslot_host_pinned_free_bytes", "Pinned host memory not in use", value=snap.pinned_free_bytes)
        yield CounterMetricFamily("warmslot_host_unpinned_state_bytes", "Bytes of states that found no room in pinned memory and went through ordinary memory (CUDA only; slower copies)", value=snap.unpinned_state_bytes)

    def _engine_time(self, stats):
        yield CounterMetricFamily("warmslot_engine_step_seconds", "Engine thread time spent in steps with work", value=stats.step_seconds)
        yield CounterMetricFamily("warmslot_engine_decode_call_seconds", "Engine thread time inside llama_decode (graph building and launch; all of the compute on a CPU backend)", value=stats.decode_call_seconds)
        yield CounterMetricFamily("warmslot_engine_device_wait_seconds", "Engine thread time waiting for the device to finish a decode", value=stats.device_wait_seconds)
        copied = CounterMetricFamily("warmslot_state_copy_bytes", "Sequence state bytes copied between the device and RAM, by cause", labels=["cause"])
        spent = CounterMetricFamily("warmslot_state_copy_seconds", "Engine thread time spent copying sequence states, by cause", labels=["cause"])
        for cause in CopyCause:
            copied.add_metric([cause.value], stats.copy_bytes.get(cause, 0))
            spent.add_metric([cause.value], stats.copy_seconds.get(cause, 0.0))
        yield copied
        yield spent

    def _speculative(self, stats):
        """Speculative decoding by type and slot: drafted and accepted tokens, and their ratio."""
        drafted = CounterMetricFamily("warmslot_spec_draft_tokens", "Tokens drafted by speculative decoding, by type and slot", labels=["type", "slot"])
        accepted = CounterMetricFamily("warmslot_spec_accepted_tokens", "Drafted tokens accepted (each saved a decode step), by type and slot", labels=["type", "slot"])
        rate = GaugeMetricFamily("warmslot_spec_acceptance_rate", "Accepted over drafted tokens since the start, by type and slot", labels=["type", "slot"])
        counts, hits = dict(stats.spec_drafted), dict(stats.spec_accepted)
        for (kind, slot), n in sorted(counts.items()):
            labels = [kind, str(slot)]
            drafted.add_metric(labels, n)
            accepted.add_metric(labels, hits.get((kind, slot), 0))
            rate.add_metric(labels, hits.get((kind, slot), 0) / n if n else 0.0)
        yield drafted
        yield accepted
        yield rate
        yield CounterMetricFamily(
            "warmslot_spec_rollbacks", "Recurrent and hybrid memory: drafts partly rejected, the state before them put back",
            value=stats.spec_rollbacks,
        )
        yield CounterMetricFamily("warmslot_spec_rollback_seconds", "Time spent rolling back drafts", value=stats.spec_rollback_seconds)
        yield CounterMetricFamily("warmslot_spec_drafter_calls", "Steps in which a draft model or the MTP block drafted",
                                  value=stats.spec_drafter_calls)
        yield CounterMetricFamily("warmslot_spec_drafter_seconds", "Time those drafts took: catching up with the slots, "
                                  "then one decode per drafted position", value=stats.spec_drafter_seconds)
        yield CounterMetricFamily(
            "warmslot_spec_drafts_checked", "N-gram drafts compared with the token then emitted instead of verified "
            "(a request whose drafts miss verifies none)", value=stats.spec_drafts_checked,
        )
        drafter = CounterMetricFamily(
            "warmslot_spec_drafter_tokens", "Tokens a draft model or the MTP block took into its own memory to follow the "
            "slots: evaluated, or restored with the slot's contents from the prompt cache or another slot", labels=["source"],
        )
        for source in ("evaluated", "restored"):
            drafter.add_metric([source], stats.spec_drafter_tokens.get(source, 0))
        yield drafter

    def _checkpoints(self, snap, stats):
        yield CounterMetricFamily("warmslot_checkpoints_created", "Checkpoints taken", value=stats.checkpoints_created)
        yield CounterMetricFamily("warmslot_checkpoints_restored", "Checkpoints restored to reuse a prefix", value=stats.checkpoints_restored)
        yield CounterMetricFamily("warmslot_checkpoints_evicted", "Checkpoints dropped to stay within the per-slot bounds", value=stats.checkpoints_evicted)
        yield CounterMetricFamily("warmslot_checkpoint_saved_bytes", "Bytes of partial state copied out for checkpoints", value=stats.checkpoint_saved_bytes)
        yield CounterMetricFamily("warmslot_checkpoint_save_seconds", "Time spent taking checkpoints", value=stats.checkpoint_save_seconds)
        yield CounterMetricFamily("warmslot_checkpoint_restored_bytes", "Bytes of partial state restored from checkpoints", value=stats.checkpoint_restored_bytes)
        yield CounterMetricFamily("warmslot_checkpoint_restore_seconds", "Time spent restoring checkpoints", value=stats.checkpoint_restore_seconds)
        held = sum(s.checkpoint_bytes for s in snap.slots) if snap is not None else 0
        yield GaugeMetricFamily("warmslot_checkpoint_bytes", "Bytes of checkpoints held by the slots", value=held)
        yield CounterMetricFamily("warmslot_logits_reused", "Prompts whose last-token logits came from a checkpoint (nothing evaluated)", value=stats.logits_reused)
        yield CounterMetricFamily("warmslot_full_prefills", "Prompts that matched a candidate but could reuse none of it", value=stats.full_prefills)
        yield CounterMetricFamily("warmslot_media_encodes", "Images and audio clips run through the projector's encoder", value=stats.media_encodes)
        yield CounterMetricFamily("warmslot_media_preprocessed", "Images and clips decoded and preprocessed for a prompt (one sent again soon after is not)", value=stats.media_preprocessed)
        yield CounterMetricFamily("warmslot_media_embeddings_reused", "Images and clips decoded from embeddings encoded earlier (no encode)", value=stats.media_embeddings_reused)
        yield CounterMetricFamily("warmslot_media_tokens", "Image and audio embeddings decoded into slots", value=stats.media_tokens)
        yield CounterMetricFamily("warmslot_kv_evictions", "Idle slots cleared to make room in the KV pool", value=stats.kv_evictions)
        yield CounterMetricFamily("warmslot_state_tail_reads", "Slot saves that read only the cells the prompt cache lacked", value=stats.tail_reads)
        yield CounterMetricFamily("warmslot_state_tail_loads", "Prompt-cache loads that wrote only the cells after a prefix the slot held or forked", value=stats.tail_loads)
        yield CounterMetricFamily("warmslot_slots_parked", "Idle slots moved to the prompt cache when another request started", value=stats.parked)
        yield CounterMetricFamily("warmslot_wakes", "Times the model was loaded again after sleeping (--sleep-idle-seconds)", value=stats.wakes)

    def _cache(self, snap, engine):
        if snap is None or snap.cache is None:
            return
        view, s = snap.cache, engine.cache_stats
        yield GaugeMetricFamily("warmslot_prompt_cache_entries", "Entries in the RAM prompt cache", value=view.n_entries)
        yield GaugeMetricFamily("warmslot_prompt_cache_bytes", "Bytes held by the RAM prompt cache", value=view.bytes)
        yield GaugeMetricFamily("warmslot_prompt_cache_budget_bytes", "The RAM prompt cache's budget (--cache-ram)", value=view.budget_bytes)
        yield GaugeMetricFamily("warmslot_prompt_cache_tokens", "Tokens whose state the RAM prompt cache stores, a prefix that entries share once", value=view.tokens)
        yield CounterMetricFamily("warmslot_prompt_cache_hits", "Requests that loaded a prompt-cache entry", value=s.hits)
        yield CounterMetricFamily("warmslot_prompt_cache_misses", "Requests for which the prompt cache had nothing usable", value=s.misses)
        yield CounterMetricFamily("warmslot_prompt_cache_evictions", "Entries evicted (what no waiting request continues, least recently used first)", value=s.evictions)
        yield CounterMetricFamily("warmslot_prompt_cache_refused", "Slot contents not stored: every waiting request needs what the cache holds sooner", value=s.refused)
        yield CounterMetricFamily("warmslot_prompt_cache_saved_bytes", "Bytes saved into the prompt cache", value=s.saved_bytes)
        yield CounterMetricFamily("warmslot_prompt_cache_loaded_bytes", "Bytes loaded from the prompt cache into slots", value=s.loaded_bytes)
        yield CounterMetricFamily("warmslot_prompt_cache_save_seconds", "Time spent saving slots into the prompt cache", value=s.save_seconds)
        yield CounterMetricFamily("warmslot_prompt_cache_load_seconds", "Time spent loading prompt-cache entries into slots", value=s.load_seconds)
        yield CounterMetricFamily("warmslot_prompt_cache_chained", "Entries stored as a segment chained to another entry that holds their prefix", value=s.chained)
        yield CounterMetricFamily("warmslot_prompt_cache_chain_bytes_spared", "State bytes that chained entries did not store (their bases hold them)", value=s.chain_bytes_spared)
        yield CounterMetricFamily("warmslot_prompt_cache_join_seconds", "Time spent joining chained entries into whole states (loads, disk writes)", value=s.join_seconds)

    def _disk(self, view):
        rejected = CounterMetricFamily("warmslot_disk_cache_rejected", "Files of the disk tier and slot files not used, by reason", labels=["reason"])
        slot_files = self.server.slot_file_rejected
        for reason in REASONS:
            rejected.add_metric([reason], (view.stats.rejected.get(reason, 0) if view else 0) + slot_files.get(reason, 0))
        yield rejected
        if view is None:
            return
        s = view.stats
        yield GaugeMetricFamily("warmslot_disk_cache_entries", "Entry files in the disk tier (those of another model or layout included)", value=view.n_entries)
        yield GaugeMetricFamily("warmslot_disk_cache_bytes", "Bytes of the disk tier's entry files (queued writes included)", value=view.bytes)
        yield GaugeMetricFamily("warmslot_disk_cache_budget_bytes", "The disk tier's budget (--cache-disk-size)", value=view.budget_bytes)
        yield GaugeMetricFamily("warmslot_disk_cache_queued_bytes", "Bytes waiting for the disk writer", value=s.queued_bytes)
        yield GaugeMetricFamily("warmslot_disk_cache_index_seconds", "Time the startup index rebuild took", value=s.index_seconds)
        yield CounterMetricFamily("warmslot_disk_cache_hits", "Requests that loaded a disk entry", value=s.hits)
        yield CounterMetricFamily("warmslot_disk_cache_reads", "Entry files read (and verified) for loads", value=s.reads)
        yield CounterMetricFamily("warmslot_disk_cache_read_bytes", "Bytes read from entry files", value=s.read_bytes)
        yield CounterMetricFamily("warmslot_disk_cache_read_seconds", "Time spent reading and verifying entry files (reader threads)", value=s.read_seconds)
        yield CounterMetricFamily("warmslot_disk_cache_memory_reads", "Loads of entries still queued for writing, served from memory", value=s.memory_reads)
        yield CounterMetricFamily("warmslot_disk_cache_writes", "Entry files written", value=s.writes)
        yield CounterMetricFamily("warmslot_disk_cache_write_bytes", "Bytes of entry files written", value=s.write_bytes)
        yield CounterMetricFamily("warmslot_disk_cache_write_seconds", "Time spent writing entry files, fsync included (writer thread)", value=s.write_seconds)
        yield CounterMetricFamily("warmslot_disk_cache_write_errors", "Entry writes that failed", value=s.write_errors)
        deleted = CounterMetricFamily("warmslot_disk_cache_deleted", "Entry files deleted, by reason", labels=["reason"])
        deleted.add_metric(["evicted"], s.evictions)
        deleted.add_metric(["expired"], s.expired)
        deleted.add_metric(["redundant"], s.dropped_redundant)
        yield deleted
        yield CounterMetricFamily("warmslot_disk_cache_refused", "Entries not written: larger than the budget, or older than every entry kept", value=s.refused)
        yield CounterMetricFamily("warmslot_disk_cache_chained", "Entries written as segments of an entry the disk holds", value=s.chained)
        yield CounterMetricFamily("warmslot_disk_cache_chain_bytes_spared", "State bytes that segments did not write (their bases hold them)", value=s.chain_bytes_spared)

    def _model(self, info):
        if info is None:
            return
        yield from self._devices(info)
        family = InfoMetricFamily("warmslot_model", "The loaded model")
        family.add_metric([], {
            "name": info.model_name,
            "arch": info.arch,
            "path": info.model_path,
            "memory": info.memory.value,
            "n_params": str(info.n_params),
            "n_ctx": str(info.n_ctx_slots),  # as /get_model_info: the slots' context, spares not counted
            "slots": str(info.n_slots),
            "fingerprint": info.fingerprint,
        })
        yield family

    def _devices(self, info):
        model = GaugeMetricFamily("warmslot_device_model_bytes", "Model weights by device (llama.cpp's buffer names)", labels=["device"])
        state = GaugeMetricFamily("warmslot_device_state_bytes", "KV cache and recurrent state of all sequences, by device", labels=["device"])
        for d in info.device_memory:
            model.add_metric([d.device], d.model_bytes)
            state.add_metric([d.device], d.state_bytes)
        yield model
        yield state


def _since_last(last: dict, key: str, tokens: int, seconds: float) -> float:
    """Tokens per second since the previous scrape (`last` keeps the counters it saw)."""
    tokens0, seconds0 = last.get(key, (0, 0.0))
    last[key] = (tokens, seconds)
    return (tokens - tokens0) / (seconds - seconds0) if seconds > seconds0 else 0.0


def llama_server_families(engine, last: dict) -> str:
    """llama-server's `llamacpp:` families, by its names, types and meanings, so dashboards and
    alerts written for it read warmslot unchanged. Written as text: `n_tokens_max` is a counter
    whose name has no `_total`, which prometheus_client would append. The throughput gauges
    are, as llama-server's, over the window since the previous scrape (`last`). `engine`: the
    default model's."""
    stats = engine.stats
    computed = stats.prompt_tokens.get("computed", 0)
    snap = engine.snapshot()
    states = snap.states() if snap is not None else {}
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", computed),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         sum(n for source, n in stats.prompt_tokens.items() if source != "computed")),
        ("prompt_seconds_total", "Total time spent processing prompts", stats.prefill_seconds),
        ("tokens_predicted_total", "Number of generation tokens processed", stats.generated_tokens),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", stats.decode_seconds),
        ("n_decode_total", "Total number of llama_decode() calls", stats.steps),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", stats.max_sequence),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", sum(stats.spec_drafted.values())),
        ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
         sum(stats.spec_accepted.values())),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", stats.spec_verify_steps),
    ]
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
         _since_last(last, "prompt", stats.prefill_tokens, stats.prefill_seconds)),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
         _since_last(last, "predicted", stats.decode_tokens, stats.decode_seconds)),
        ("requests_processing", "Number of requests processing", states.get("prefill", 0) + states.get("decode", 0)),
        ("requests_deferred", "Number of requests deferred", engine.queue_depth),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         stats.busy_slot_steps / max(stats.steps, 1)),
    ]
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, doc, value in items:
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {float(value)!r}"]
    return "\n".join(lines) + "\n"


def _histogram(name: str, doc: str, hist) -> HistogramMetricFamily:
    buckets, total, _count = hist.snapshot()
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def make_registry(server, request_counts: Counter) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(server, request_counts))
    if server.models is not None:
        registry.register(ModelsCollector(server.models))
    return registry


async def metrics_endpoint(request: Request) -> Response:
    """Prometheus text. With API keys it needs the admin key (the scraper's), unless
    --metrics-open (the model path and the load are then readable by anyone).

    NOTE: the counters are the whole server's: prompt lengths and their sources, as they
    happen, would show one tenant another's traffic, so an ordinary key gets 403."""
    server = request.app.state.warmslot
    if not server.config.metrics_open:
        key = server.authorize(request)
        if not server.is_admin(key):
            raise Forbidden("/metrics shows every tenant's traffic: it needs the admin key (--admin-key, else the first --api-key)")
    registry = request.app.state.metrics_registry
    body = generate_latest(registry) + llama_server_families(server.default.engine, request.app.state.metrics_window).encode()
    response = Response(body, media_type=CONTENT_TYPE_LATEST)
    # llama-server's header, in its case (clients look it up in a case-sensitive dict)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(server.default.created).encode()))
    return response

