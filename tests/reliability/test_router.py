"""Two warmslot replicas behind vllm-router (from PyPI, the `test` extra), on loopback.

The router hashes each conversation's `X-Session-ID` header onto a replica (policy
`consistent_hash`), so every turn finds the previous one's prompt in that replica's slots or
prompt cache. When a replica dies in the middle of a turn, the router retries the turn on the
other one, which has nothing of the conversation yet (a cold turn) and keeps it from then on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from openai import OpenAI

from scripts.server_process import ServerProcess, free_port, start_together, vllm_router_command, warmslot_command

pytestmark = pytest.mark.server

REPLICA_FLAGS = ["-t", "1", "-c", "1024", "-np", "2", "-cram", "256MiB"]
ROUTER_FLAGS = [
    "--policy", "consistent_hash",
    # notice a dead replica at once: one failed request opens its circuit, one failed health
    # check (every second) marks it unhealthy
    "--cb-failure-threshold", "1", "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
    "--worker-startup-check-interval", "1", "--request-timeout-secs", "120", "--log-level", "warning",
]
TOPICS = ["lighthouses", "glaciers", "bees", "volcanoes", "tides", "comets", "deserts", "owls",
          "rivers", "caves", "storms", "forests", "coral", "wolves", "islands", "auroras"]
TIMEOUT = 60.0  # seconds for any one turn: a turn that takes longer has hung


@dataclass
class Turn:
    replica: int  # index of the replica that served it
    prompt_tokens: int
    cached_tokens: int
    seconds: float


@dataclass
class Conversation:
    session: str
    topic: str
    messages: list[dict] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def __post_init__(self) -> None:
        # NOTE: a system prompt of its own makes the first prompt long enough (50+ tokens) that
        # a replica saves it to its prompt cache when another conversation takes the slot
        # (shorter contents are not worth a copy), as an agent's would be
        self.messages.append({"role": "system", "content": (
            f"You answer questions about {self.topic}. Keep every answer to one short sentence, "
            f"use plain words, and never repeat an earlier answer about {self.topic}.")})


class Cluster:
    """The replicas, the router and an OpenAI client that talks to the router."""

    def __init__(self, replicas: list[ServerProcess], router: ServerProcess) -> None:
        self.replicas = replicas
        self.router = router
        self.alive = [True] * len(replicas)
        self.client = OpenAI(base_url=router.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)

    def chats_served(self) -> list[float]:
        """Chat completions each live replica has answered (its own /metrics)."""
        return [_chat_count(r.url) if alive else 0.0 for r, alive in zip(self.replicas, self.alive)]

    def turn(self, conv: Conversation, max_tokens: int = 8, **extra) -> Turn:
        """One turn through the router; the replica that served it is the one whose count grew."""
        n = len(conv.turns) + 1
        conv.messages.append({"role": "user", "content": f"{conv.topic.capitalize()}, question {n}: tell me one fact about {conv.topic}."})
        before = self.chats_served()
        t0 = time.monotonic()
        r = self.client.chat.completions.create(
            model="default", messages=conv.messages, max_tokens=max_tokens, temperature=0,
            extra_headers={"X-Session-ID": conv.session}, extra_body=extra or None,
        )
        seconds = time.monotonic() - t0
        after = self.chats_served()
        served = [i for i, (a, b) in enumerate(zip(after, before)) if a > b]
        conv.messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        turn = Turn(served[0] if len(served) == 1 else -1, r.usage.prompt_tokens,
                    r.usage.prompt_tokens_details.cached_tokens, seconds)
        conv.turns.append(turn)
        return turn

    def kill(self, index: int) -> None:
        """SIGKILL: a replica that dies, not one that shuts down."""
        proc = self.replicas[index].proc
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.alive[index] = False


def _chat_count(url: str) -> float:
    return _answers(url).get("200", 0.0)


@pytest.fixture(scope="module")
def cluster(default_model):
    """One cluster for the module: the endpoint test reads it, then the failover test kills a
    replica (tests run in file order)."""
    replicas = [ServerProcess(f"replica{i}", warmslot_command(default_model, REPLICA_FLAGS), ready_timeout=180, start=False)
                for i in range(2)]
    router = None
    try:
        start_together(replicas)
        cmd = vllm_router_command([r.url for r in replicas], [*ROUTER_FLAGS, "--prometheus-port", str(free_port())])
        router = ServerProcess("vllm-router", cmd, ready_timeout=60)
        yield Cluster(replicas, router)
    finally:
        for proc in [router, *replicas]:
            if proc is not None:
                proc.stop()


def pick_conversations(cluster: Cluster, per_replica: int = 2, rounds: int = 3) -> list[Conversation]:
    """First turns of new sessions until each replica holds `per_replica` of them: the hash
    decides where a session goes, and ports (so the ring) change from run to run. The router
    hashes onto the replicas it deems healthy: a round starts once its /health says all are,
    and a round that did not spread (a replica was out of the ring for a while) is dropped
    for a round of new sessions."""
    for r in range(rounds):
        _wait_healthy(cluster.router.url)
        chosen: list[Conversation] = []
        count = [0] * len(cluster.replicas)
        for i, topic in enumerate(TOPICS):
            conv = Conversation(f"session-{r}-{i}-{topic}", topic)
            turn = cluster.turn(conv)
            assert turn.replica >= 0, "one replica served the turn"
            if count[turn.replica] < per_replica:
                count[turn.replica] += 1
                chosen.append(conv)
            if len(chosen) == per_replica * len(cluster.replicas):
                return chosen
        print(f"router test: round {r}: {len(TOPICS)} sessions spread {count}; router /health: "
              f"{httpx.get(cluster.router.url + '/health', timeout=5).text!r}; replicas' answers: "
              f"{[_answers(rep.url) for rep in cluster.replicas]}")
    pytest.fail(f"{rounds} rounds of {len(TOPICS)} sessions did not spread {per_replica} per replica: {count}")


def _wait_healthy(router_url: str, timeout: float = 30.0) -> None:
    """The router's /health says every replica is healthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(router_url + "/health", timeout=5).status_code == 200:
            return
        time.sleep(0.5)
    pytest.fail("the router does not report every replica healthy")


def _answers(url: str) -> dict[str, float]:
    """A replica's chat answers by status (its own /metrics)."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith('warmslot_requests_total{endpoint="chat"'):
            out[line.split('status="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def assert_warm(conv: Conversation, index: int) -> None:
    """Turn `index` reused at least the whole previous prompt."""
    turn, previous = conv.turns[index], conv.turns[index - 1]
    assert turn.cached_tokens >= previous.prompt_tokens, (conv.session, index, conv.turns)


def test_worker_endpoints_a_router_reads(cluster):
    """The router passes /get_model_info, /get_server_info and /health_generate through to a
    replica, and reads each replica's /get_load."""
    url = cluster.router.url
    info = httpx.get(url + "/get_model_info", timeout=10).json()
    assert info["model_id"] == "gemma-3-270m-q4_k_m.gguf" and info["n_ctx"] == 1024
    server = httpx.get(url + "/get_server_info", timeout=10).json()
    assert server["slots"] == 2 and server["placement"]["split_mode"] == "layer"
    assert any(d["state_bytes"] > 0 for d in server["device_memory"])
    assert httpx.get(url + "/health_generate", timeout=10).status_code == 200
    loads = httpx.get(url + "/get_loads", timeout=10).json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(r.url for r in cluster.replicas)
    assert all(w["load"] == 0 for w in loads)  # -1 would mean the router could not read it


def test_conversations_stay_on_their_replica_and_move_when_it_dies(cluster):
    t0 = time.monotonic()
    convs = pick_conversations(cluster)
    home = {c.session: c.turns[0].replica for c in convs}

    # turn 2: every conversation goes back to its replica and reuses its whole first prompt
    for conv in convs:
        turn = cluster.turn(conv)
        assert turn.replica == home[conv.session]
        assert_warm(conv, 1)

    # turn 3: replica 1 dies while it generates a turn; the router retries that turn on replica 0
    survivor, victim = 0, 1
    moved = [c for c in convs if home[c.session] == victim]
    stayed = [c for c in convs if home[c.session] == survivor]
    in_flight: dict = {}

    def long_turn() -> None:
        try:
            in_flight["turn"] = cluster.turn(moved[0], max_tokens=48, ignore_eos=True)
        except Exception as exc:  # noqa: BLE001 - asserted below
            in_flight["error"] = exc

    worker = threading.Thread(target=long_turn)
    worker.start()
    _wait_running(cluster.replicas[victim].url)
    cluster.kill(victim)
    worker.join(TIMEOUT + 10)
    assert not worker.is_alive(), "the turn in flight on the dead replica hung"
    assert "error" not in in_flight, in_flight.get("error")
    for conv in [moved[1], *stayed]:
        cluster.turn(conv)
    _wait_unhealthy(cluster.router.url, cluster.replicas[victim].url)

    # turn 4: everything on the survivor
    for conv in convs:
        cluster.turn(conv)

    for conv in stayed:  # never moved: every turn warm, on their replica
        assert [t.replica for t in conv.turns] == [survivor] * 4
        for i in range(1, 4):
            assert_warm(conv, i)
    for conv in moved:  # cold on the survivor once, warm after that
        first = next(i for i, t in enumerate(conv.turns) if t.replica == survivor)
        assert first in (2, 3), conv.turns
        assert all(t.replica == survivor for t in conv.turns[first:]), conv.turns
        assert conv.turns[first].cached_tokens < conv.turns[first - 1].prompt_tokens, conv.turns
        for i in range(first + 1, 4):
            assert_warm(conv, i)
    assert all(t.seconds < TIMEOUT for c in convs for t in c.turns)
    print(f"router test: {sum(len(c.turns) for c in convs)} turns in {time.monotonic() - t0:.1f} s")


def _wait_running(url: str, timeout: float = TIMEOUT) -> None:
    """Until the replica at `url` is working on a request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/get_load", timeout=5).json()["running"] >= 1:
            return
        time.sleep(0.01)
    pytest.fail("the long turn never started on its replica")


def _wait_unhealthy(router_url: str, worker_url: str, timeout: float = 15.0) -> None:
    """The router's /health names the dead replica (its health checks run every second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(router_url + "/health", timeout=5)
        if r.status_code == 503 and worker_url in r.text:
            return
        time.sleep(0.2)
    pytest.fail(f"the router still reports {worker_url} healthy")
