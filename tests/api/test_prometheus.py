"""Debian's real Prometheus scrapes two warmslot replicas; its HTTP API then answers the
queries the README and the Grafana dashboard rely on.

`tests/install_deps.sh` (part of the README's test command) installs the `prometheus`
package on Debian as root. Where it could not, the test skips saying so, except under CI,
where it fails.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import time

import httpx
import pytest

from scripts.server_process import ServerProcess, start_together, warmslot_command

pytestmark = pytest.mark.server

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
JOB = "warmslot"
REPLICA_FLAGS = ["-t", "1", "-c", "1024", "-np", "1", "-cram", "256MiB"]
SCRAPE_INTERVAL = "1s"
NOT_INSTALLED = ("Debian's prometheus is not installed: tests/install_deps.sh installs it as root "
                 "(or: sudo apt-get install prometheus)")


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(NOT_INSTALLED, pytrace=False)
        pytest.skip(NOT_INSTALLED)
    return path


class Prometheus:
    """A prometheus process scraping `targets` every second, and its query API."""

    def __init__(self, binary: str, targets: list[str], workdir: pathlib.Path) -> None:
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }))
        cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}", "--log.level=warn"]
        self.proc = ServerProcess("prometheus", cmd, listen=lambda host, port: [f"--web.listen-address={host}:{port}"],
                                  ready_path="/-/ready", ready_timeout=60)
        self.url = self.proc.url

    def query(self, expr: str) -> list[dict]:
        """The result of an instant query; fails the test when Prometheus reports an error."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def scrapes(self) -> int:
        """Scrapes of the target scraped least often so far."""
        result = self.query(f'count_over_time(up{{job="{JOB}"}}[1h])')
        return min((int(float(s["value"][1])) for s in result), default=0)

    def wait_scrapes(self, n: int, timeout: float = 30.0) -> None:
        """Until every target has been scraped `n` more times from now."""
        goal = self.scrapes() + n
        deadline = time.monotonic() + timeout
        while self.scrapes() < goal:
            assert time.monotonic() < deadline, f"Prometheus did not scrape every target {n} times in {timeout:.0f} s"
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="module")
def scraped(default_model, prometheus_binary, tmp_path_factory):
    """Two replicas, Prometheus scraping them, and traffic between its scrapes."""
    replicas = [ServerProcess(f"replica{i}", warmslot_command(default_model, REPLICA_FLAGS), ready_timeout=180, start=False)
                for i in range(2)]
    prometheus = None
    try:
        start_together(replicas)
        prometheus = Prometheus(prometheus_binary, [r.url.removeprefix("http://") for r in replicas],
                                tmp_path_factory.mktemp("prometheus"))
        prometheus.wait_scrapes(1)  # a sample before any traffic, so rates over a window see it
        for replica in replicas:
            traffic(replica.url)
        prometheus.wait_scrapes(2)
        yield prometheus, replicas
    finally:
        for proc in [prometheus, *replicas]:
            if proc is not None:
                proc.stop()


def traffic(url: str) -> None:
    """Two conversations on one slot: the first is saved to the prompt cache when the second
    takes the slot, and comes back from RAM (prompt tokens by source: computed and ram)."""
    convs = [[{"role": "system", "content": f"You answer questions about {topic}. Keep every answer to one short "
                                            f"sentence, use plain words, and never repeat an earlier answer."}]
             for topic in ("harbours", "orchards")]
    for conv in [convs[0], convs[1], convs[0]]:
        conv.append({"role": "user", "content": f"Question {len(conv)}: tell me one fact."})
        r = httpx.post(url + "/v1/chat/completions", json={"messages": conv, "max_tokens": 8, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        conv.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})


def replica_metrics(replicas: list[ServerProcess]) -> dict[str, float]:
    """The replicas' /metrics samples, summed over the replicas."""
    total: dict[str, float] = {}
    for replica in replicas:
        for line in httpx.get(replica.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                total[name] = total.get(name, 0.0) + float(value)
    return total


def value(sample: dict) -> float:
    return float(sample["value"][1])


def test_prompt_tokens_by_source(scraped):
    prometheus, replicas = scraped
    by_source = {s["metric"]["source"]: value(s) for s in prometheus.query(
        f'sum by (source) (warmslot_prompt_tokens_total{{job="{JOB}"}})')}
    direct = replica_metrics(replicas)
    for source, n in by_source.items():
        assert n == direct[f'warmslot_prompt_tokens_total{{source="{source}"}}'], source
    assert by_source["computed"] > 0
    assert by_source["ram"] > 0  # each replica's first conversation came back from its prompt cache


def test_idle_conversations_are_the_idle_sequences_that_hold_tokens(scraped):
    _, replicas = scraped
    for replica in replicas:
        held = [s["n_tokens"] for s in httpx.get(replica.url + "/slots", timeout=10).json() if not s["is_processing"] and s["n_tokens"]]
        direct = replica_metrics([replica])
        assert held and direct["warmslot_idle_conversations"] == len(held)
        assert direct["warmslot_idle_conversation_tokens"] == sum(held)


def test_time_to_first_token_quantile(scraped):
    prometheus, _ = scraped
    result = prometheus.query(
        f'histogram_quantile(0.5, sum by (le) (rate(warmslot_time_to_first_token_seconds_bucket{{job="{JOB}"}}[5m])))')
    assert len(result) == 1
    p50 = value(result[0])
    assert math.isfinite(p50) and 0 < p50 < 60


def test_prompt_cache_bytes(scraped):
    prometheus, replicas = scraped
    per_instance = prometheus.query(f'warmslot_prompt_cache_bytes{{job="{JOB}"}}')
    assert sorted(s["metric"]["instance"] for s in per_instance) == sorted(r.url.removeprefix("http://") for r in replicas)
    assert all(value(s) > 0 for s in per_instance)  # the saved conversation
    total = value(prometheus.query(f'sum(warmslot_prompt_cache_bytes{{job="{JOB}"}})')[0])
    assert total == replica_metrics(replicas)["warmslot_prompt_cache_bytes"]


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expression) of every query in the Grafana dashboard."""
    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    board = json.loads(DASHBOARD.read_text())
    return [(p.get("title", "?"), t["expr"]) for p in panels(board["panels"]) for t in p.get("targets", []) if t.get("expr")]


def test_every_dashboard_query_evaluates(scraped):
    prometheus, _ = scraped
    expressions = dashboard_expressions()
    assert len(expressions) > 20
    for title, expr in expressions:
        # Grafana's $job variable, set to "All" (the dashboard's default)
        concrete = re.sub(r"\$\{?job\}?", ".+", expr)
        assert "$" not in concrete, (title, expr)
        assert prometheus.query(concrete), f"{title}: {concrete} returned no series"


def test_dashboard_job_variable(scraped):
    """The dashboard's job list, label_values(warmslot_model_info, job), finds the scraped job."""
    prometheus, _ = scraped
    board = json.loads(DASHBOARD.read_text())
    variable = next(v for v in board["templating"]["list"] if v["name"] == "job")
    metric = re.fullmatch(r"label_values\((\w+),\s*job\)", variable["query"]).group(1)
    r = httpx.get(prometheus.url + "/api/v1/label/job/values", params={"match[]": metric}, timeout=10)
    assert r.json()["data"] == [JOB]
