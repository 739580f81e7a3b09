"""Per-model families of /metrics on a server with several models, labelled `model`: where each
model stands, its requests, loads and unloads, and its prompt and generated tokens. Every
engine family of `server/metrics.py` has a `model` label there too, one series per model
(`warmslot_requests_total`, counted by route, and the `llamacpp:` families, llama-server's
own, speak of the whole server and of the default model)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from warmslot.slots import PROMPT_SOURCES

from .registry import ModelState


class ModelsCollector:
    """Reads the registry at scrape time (`models`: a `registry.Models`)."""

    def __init__(self, models) -> None:
        self.models = models

    def collect(self):
        entries = list(self.models.entries.values())
        state = GaugeMetricFamily("warmslot_model_state", "1 for the state each model is in", labels=["model", "state"])
        loaded = GaugeMetricFamily("warmslot_model_loaded", "1 while the model is loaded", labels=["model"])
        in_flight = GaugeMetricFamily("warmslot_model_requests_in_flight", "Requests using the model now", labels=["model"])
        counters = {
            key: CounterMetricFamily(f"warmslot_model_{key}", doc, labels=["model"])
            for key, doc in (("requests", "Requests that picked the model"), ("loads", "Times the model was loaded"),
                             ("unloads", "Times the model was unloaded"), ("load_failures", "Loads of the model that failed"))
        }
        prompt = CounterMetricFamily("warmslot_model_prompt_tokens", "Prompt tokens of the model by where they came from",
                                     labels=["model", "source"])
        generated = CounterMetricFamily("warmslot_model_generated_tokens", "Tokens the model generated", labels=["model"])
        for entry in entries:
            name = entry.name
            for each in ModelState:
                state.add_metric([name, each.value], int(entry.state is each))
            loaded.add_metric([name], int(entry.state is ModelState.LOADED))
            in_flight.add_metric([name], entry.in_flight)
            for key, family in counters.items():
                family.add_metric([name], entry.counts[key])
            stats = entry.host.engine.stats
            for source in PROMPT_SOURCES:
                prompt.add_metric([name, source], stats.prompt_tokens.get(source, 0))
            generated.add_metric([name], stats.generated_tokens)
        yield from (state, loaded, in_flight, *counters.values(), prompt, generated)
