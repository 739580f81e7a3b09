"""The fuzzer's plan (tests/fuzz_plan.py): routes grouped by the request they take, cases by
what the request can vary. Pure logic, on a small document."""

from tests.fuzz_plan import plan, schema_size

BODY = {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Chat"}}}}}
SMALL = {"requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}}
DOC = {
    "components": {"schemas": {"Chat": {"type": "object", "properties": {
        "messages": {"type": "array", "items": {"type": "object"}}, "n": {"type": "integer"}, "x": {"$ref": "#/components/schemas/Chat"}}}}},
    "paths": {
        "/v1/chat": {"post": {**BODY, "summary": "chat"}},
        "/chat": {"post": {**BODY, "summary": "chat"}},  # an alias: the same operation
        "/v1/chat/count": {"post": {**BODY, "summary": "count"}},  # another route taking the same request
        "/v1/small": {"post": SMALL},
        "/health": {"get": {"summary": "health"}},  # nothing to vary
        "/v1/health": {"get": {"summary": "health"}},
    },
}


def test_a_ref_is_followed_once_per_chain():
    chat = DOC["components"]["schemas"]["Chat"]
    flat = schema_size({**chat, "properties": {**chat["properties"], "x": {}}}, {})  # x as one node
    # x -> Chat once more, whose own x counts one node: the recursion stops there
    assert schema_size(chat, DOC["components"]["schemas"]) == 2 * flat - 1


def test_routes_taking_one_request_share_its_cases_and_size_sets_the_share():
    groups = {g.routes[0][0]: g for g in plan(DOC, total=100, floor=5)}
    chat, small, health = groups["/v1/chat"], groups["/v1/small"], groups["/health"]
    assert set(chat.routes) == {("/v1/chat", "/chat"), ("/v1/chat/count",)}  # aliases first, then the count route
    assert health.cases == 1 and health.routes == (("/health", "/v1/health"),)  # one request per path
    assert chat.cases > small.cases >= 5  # more to vary, more cases; never under the floor
    assert [cases for _, cases in chat.lanes()] == [chat.cases // 2 + chat.cases % 2, chat.cases // 2]  # aliases take turns
    assert sum(g.requests for g in groups.values()) <= 100 + len(groups)  # about the total asked for
