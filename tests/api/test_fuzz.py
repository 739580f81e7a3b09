"""Property-based fuzzing of every route, from the server's own /openapi.json.

schemathesis turns the document into Hypothesis strategies: requests that follow the
schemas (positive) and requests that break them (negative: wrong types, missing fields,
values out of range). 2,000 distinct requests go to the real server on the default model,
spread over the routes by tests/fuzz_plan.py: routes that take the same request share its
generated cases (a chat completion and its /input_tokens count get the same bodies; aliases
such as the four rerank paths take turns), a group gets cases in proportion to the size of
what its requests can vary, a route with nothing to vary gets one request per path, and no
request is sent twice. Every response is checked:

- no 5xx;
- the status, content type and body are the ones the document declares for the route
  (every 4xx is an OpenAI error body: message, type, param, code; Anthropic's on the
  Messages routes);
- afterwards /health answers 200 and no slot is left busy, nothing left queued.

Generation is kept cheap so that 2,000 requests fit in CI: a max_tokens (max_completion_tokens,
max_output_tokens, n_predict) above 2 becomes 2, the server's default is 2 (-n 2), the context
is small and --request-timeout bounds the rest.
The run is derandomized (the same requests every time, so CI is reproducible); set
WARMSLOT_FUZZ_RANDOM=1 to explore new ones.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import multiprocessing
import os
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from tests.fuzz_plan import Group, plan, request_key
from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

N_REQUESTS = 2000
FLOOR = 20  # requests for a route whose requests can vary, before its share by size
MAX_TOKENS = 2
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    # every route enabled (a route a flag leaves off answers 501, which counts as a 5xx here)
    slot_files = tmp_path_factory.mktemp("slot-files")
    proc = warmslot_server(
        default_model, "-np", "2", "-c", "2048", "-n", str(MAX_TOKENS), "-cram", "256MiB", "--request-timeout", "30",
        "--slot-save-path", str(slot_files), "--embeddings", "--reranking",
    )
    yield proc
    proc.stop()


def cheap(case) -> None:
    """Bound what a generated request may cost: at most MAX_TOKENS generated tokens."""
    if isinstance(case.body, dict):
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict"):
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                case.body[name] = MAX_TOKENS


def openai_error_shape(response) -> str | None:
    """What is wrong with a 4xx body, or None when it is an OpenAI error."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return "not an OpenAI error body"
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "error.message and error.type must be strings"
    if "param" not in error or "code" not in error:
        return "error.param and error.code must be present"
    return None


def anthropic_error_shape(response) -> str | None:
    """What is wrong with a 4xx body of a Messages route, or None when it is Anthropic's."""
    try:
        body = response.json()
        error = body["error"]
    except (ValueError, KeyError, TypeError):
        return "not an Anthropic error body"
    if body.get("type") != "error" or not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "type must be 'error', error.message and error.type strings"
    return None


WORKERS = 2  # processes generating and sending cases: generation is Python-bound, the server waits


def fuzz(url: str, total: int, record) -> list[Group]:
    """About `total` distinct requests by the plan (tests/fuzz_plan.py): per lane of a group,
    half of its cases break the schema (where something can), the rest follow it; each case
    goes to every route of the group. The groups are shared out between WORKERS processes
    (forked), each generating its groups' cases as one process would (derandomized per lane,
    so the requests are the same however the groups are shared out). `record(label, status,
    problem)` gets every answer. Returns the plan."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    groups = plan(schema.raw_schema, total, FLOOR)
    with concurrent.futures.ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("fork")) as pool:
        for answers in pool.map(_fuzz_group, [url] * len(groups), groups):
            for answer in answers:
                record(*answer)
    return groups


def _fuzz_group(url: str, group: Group) -> list[tuple[str, int, str | None]]:
    """One group's cases (in a worker process): (label, status, problem) of every answer."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    answers: list[tuple[str, int, str | None]] = []

    def record(case, response, problem):
        if problem is not None:
            body = case.body if not isinstance(case.body, bytes) else case.body[:300]
            problem = f"{problem}\nbody: {json.dumps(body, default=repr)[:500]}"
        answers.append((case.operation.label, response.status_code, problem))

    sent: set[str] = set()
    for paths, cases in group.lanes():
        operations = [schema[path][group.method] for path in paths]
        broken = send(url, operations, GenerationMode.NEGATIVE, cases // 2, sent, record)
        send(url, operations, GenerationMode.POSITIVE, cases - broken, sent, record)
    return answers


def send(url: str, operations: list, mode: GenerationMode, n: int, sent: set[str], record) -> int:
    """Up to `n` cases generated for the first of `operations` (which all take the same
    request), each sent to every one of them unless sent before; how many cases went."""
    if n <= 0:
        return 0
    count = [0]

    @settings(
        max_examples=n, deadline=None, database=None, phases=[Phase.generate],
        derandomize=not os.environ.get("WARMSLOT_FUZZ_RANDOM"), suppress_health_check=list(HealthCheck),
    )
    @given(case=operations[0].as_strategy(generation_mode=mode))
    def one(case):
        cheap(case)
        cases = [case] + [
            operation.Case(path_parameters=case.path_parameters, headers=case.headers, cookies=case.cookies, query=case.query,
                           body=case.body, media_type=case.media_type)
            for operation in operations[1:]
        ]
        keys = [request_key(c) for c in cases]
        assume(any(key not in sent for key in keys))  # a repeat teaches nothing: Hypothesis draws another instead
        count[0] += 1
        for c, key in zip(cases, keys):
            if key not in sent:
                sent.add(key)
                check(url, c, record)

    try:
        one()
    except Unsatisfiable:  # nothing to break (a route without parameters), or nothing new left
        pass
    return count[0]


def check(url: str, case, record) -> None:
    """Send one request and record what is wrong with its answer (None: nothing)."""
    response = case.call(base_url=url, timeout=120)
    problem = None
    try:
        case.validate_response(response, checks=CHECKS)
    except Exception as exc:  # noqa: BLE001 - every failure is collected, the run goes on
        problem = str(exc)[:1500]
    if problem is None and 400 <= response.status_code < 500:
        anthropic = case.path.startswith(("/v1/messages", "/messages"))
        problem = anthropic_error_shape(response) if anthropic else openai_error_shape(response)
    record(case, response, problem)


def test_generated_requests_get_no_5xx_and_only_declared_openai_shaped_answers(server):
    statuses: collections.Counter = collections.Counter()
    failures: list[str] = []

    def record(label, status, problem):
        statuses[(label, status)] += 1
        if problem is not None and len(failures) < 10:
            failures.append(f"{label} -> {status}: {problem}")

    t0 = time.monotonic()
    groups = fuzz(server.url, N_REQUESTS, record)
    elapsed = time.monotonic() - t0
    print(f"\n{sum(statuses.values())} requests in {elapsed:.0f} s:")
    for (label, status), n in sorted(statuses.items()):
        print(f"  {label} {status}: {n}")
    assert not failures, "\n\n".join(failures)
    assert not any(status >= 500 for _, status in statuses)
    # every path was reached, and repeats left out did not thin the plan out
    reached = {label for label, _ in statuses}
    assert not [label for group in groups for label in group.labels if label not in reached]
    assert sum(statuses.values()) >= 0.9 * sum(group.requests for group in groups), sum(statuses.values())
    # the routes that generate: chat and text completions (OpenAI's and llama-server's), Messages
    generating = ("completion", "/messages")
    ok = sum(n for (label, status), n in statuses.items()
             if status == 200 and any(g in label for g in generating) and "input_tokens" not in label and "count_tokens" not in label)
    # the mix of cases differs between runs (schemathesis' generation is not fully seeded by
    # derandomize): two runs of the same code reached generation 42 and 69 times
    assert ok >= 20, "the fuzzer should reach generation, not only the validators"


# -- request sizes: many messages, many inputs ------------------------------------------------

N_SIZED = 10  # requests per strategy: each may carry thousands of messages or inputs
SIZED_ANSWER_S = 45  # --request-timeout (30 s) plus a margin for a loaded machine

# short texts, some of them pieces of the chat template's special tokens
_PIECES = st.sampled_from(["a", "t", "rt", "<", ">", "_of_", "turn", "<start_of_turn>", "user", "model", "\n", " ", "hi there"])
_ROLES = st.sampled_from(["user", "assistant", "system", "tool"])


@st.composite
def many_messages(draw):
    n = draw(st.integers(1, 12_000))  # the server takes 10,000 (--max-messages)
    piece = draw(_PIECES)
    roles = draw(st.lists(_ROLES, min_size=1, max_size=4))
    messages = [{"role": roles[i % len(roles)], "content": piece} for i in range(n)]
    if messages[0]["role"] == "tool":
        messages[0]["role"] = "user"
    return {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}


@st.composite
def many_inputs(draw):
    n = draw(st.integers(1, 2_100))  # at most 2048 are taken
    if draw(st.booleans()):
        inputs = [draw(_PIECES) * draw(st.integers(1, 20)) for _ in range(min(n, 20))] * (n // min(n, 20) + 1)
    else:
        inputs = [[draw(st.integers(0, 5000))] * draw(st.integers(1, 30)) for _ in range(min(n, 20))] * (n // min(n, 20) + 1)
    return {"input": inputs[:n]}


def sized(url: str, path: str, strategy, record) -> None:
    @settings(
        max_examples=N_SIZED, deadline=None, database=None, phases=[Phase.generate],
        derandomize=not os.environ.get("WARMSLOT_FUZZ_RANDOM"), suppress_health_check=list(HealthCheck),
    )
    @given(body=strategy)
    def one(body):
        t0 = time.monotonic()
        response = httpx.post(url + path, json=body, timeout=120)
        record(body, response, time.monotonic() - t0)

    one()


@pytest.mark.parametrize(("path", "strategy"), [("/v1/chat/completions", many_messages()), ("/v1/embeddings", many_inputs())],
                         ids=["many messages", "many inputs"])
def test_requests_of_many_messages_or_inputs_are_answered_in_time_without_5xx(server, path, strategy):
    failures: list[str] = []
    statuses: collections.Counter = collections.Counter()

    def record(body, response, seconds):
        statuses[response.status_code] += 1
        size = len(body.get("messages") or body.get("input"))
        problem = None
        if response.status_code >= 500 and response.status_code != 503:
            problem = f"{response.status_code}: {response.text[:300]}"
        elif seconds > SIZED_ANSWER_S:
            problem = f"answered after {seconds:.0f} s"
        elif 400 <= response.status_code < 500:
            problem = openai_error_shape(response)
        if problem is not None and len(failures) < 10:
            failures.append(f"{size} items: {problem}")

    sized(server.url, path, strategy, record)
    assert not failures, "\n".join(failures)
    assert statuses[200] > 0 and statuses[400] > 0, statuses  # both sides of the limits were reached


def test_the_server_is_healthy_and_idle_after_the_fuzzing(server):
    assert httpx.get(server.url + "/health").status_code == 200
    deadline = time.monotonic() + 60
    view = httpx.get(server.url + "/engine").json()
    while any(s["state"] != "idle" for s in view["slots"]) and time.monotonic() < deadline:
        time.sleep(0.1)
        view = httpx.get(server.url + "/engine").json()
    assert len(view["slots"]) >= 2 and all(s["state"] == "idle" for s in view["slots"])  # slots and spare streams
    assert view["queue_depth"] == 0
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=60)
    assert r.status_code == 200


def test_the_plan_reaches_every_path_and_shares_cases_among_routes_that_take_the_same_request(tmp_path):
    from warmslot.server.app import create_app
    from warmslot.server.openapi import openapi_document
    from warmslot.server.process.config import parse_config

    create_app(parse_config(["-m", str(tmp_path / "never-loaded.gguf")])[0])  # the APIs register their parts
    document = openapi_document()
    groups = plan(document, N_REQUESTS, FLOOR)
    paths = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
    assert {f"{group.method} {path}" for group in groups for lane, _ in group.lanes() for path in lane} == paths
    assert abs(sum(group.requests for group in groups) - N_REQUESTS) <= 2 * len(groups)  # rounding
    group_of = {label: group for group in groups for label in group.labels}
    assert group_of["POST /v1/chat/completions"] is group_of["POST /chat/completions/input_tokens"]
    assert group_of["POST /tokenize"] is group_of["POST /apply-template"]
    assert group_of["POST /rerank"] is group_of["POST /v1/reranking"]
    assert group_of["GET /health"] is group_of["GET /v1/health"] and group_of["GET /health"].requests == 2
    assert group_of["GET /health"] is not group_of["GET /version"]  # nothing to vary: not one request for all
    # by size: the chat request (~90 schema nodes) gets more cases than the slot action (7)
    assert group_of["POST /v1/chat/completions"].cases > 3 * group_of["POST /slots/{id_slot}"].cases


def test_the_document_describes_every_route_of_the_app(tmp_path):
    """Every route in the app's table, with each of its methods, is in /openapi.json, so the
    fuzzing above reaches it."""
    from starlette.routing import Route

    from warmslot.server.app import create_app
    from warmslot.server.process.config import parse_config
    from warmslot.server.openapi import openapi_document

    config, _ = parse_config(["-m", str(tmp_path / "never-loaded.gguf")])
    app = create_app(config)
    paths = openapi_document()["paths"]
    missing = []
    for route in app.routes:
        if not isinstance(route, Route):
            continue
        path = route.path.replace(":path}", "}")
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            if method.lower() not in paths.get(path, {}):
                missing.append(f"{method} {path}")
    assert not missing, missing
