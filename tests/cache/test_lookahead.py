"""Which holders the waiting queue needs, and in what order a tier gives them up (pure logic;
the engine-level effect is in test_kv_streams.py)."""

from warmslot.cache.lookahead import HORIZON, SLACK, continues, next_uses, session_uses, victim_order

SYSTEM = list(range(500))


def test_a_next_turn_continues_its_conversation_and_a_shared_system_prompt_does_not():
    held = SYSTEM + [1] * 300 + [9] * 20  # a prompt of 800 tokens, then a 20-token reply
    assert continues(held, 800, SYSTEM + [1] * 300 + [5] * 40)  # the reply re-rendered
    assert continues(held, 800, SYSTEM + [1] * (300 - SLACK + 1) + [5] * 100)  # within the slack
    assert not continues(held, 800, SYSTEM + [1] * (300 - SLACK - 1) + [5] * 100)
    assert not continues(held, 800, SYSTEM + [2] * 300)  # another conversation, same system prompt
    assert not continues(held, 800, SYSTEM + [1] * 100)  # shorter than what is held
    assert not continues([1] * SLACK, None, [1] * 1000)  # too short to tell


def test_next_uses_is_the_first_waiting_request_of_the_same_tenant_and_order_follows_it():
    holders = [
        ("a", "", SYSTEM + [1] * 300, None),
        ("b", "", SYSTEM + [2] * 300, None),
        ("c", "", SYSTEM + [3] * 300, None),
        ("d", "eve", SYSTEM + [4] * 300, None),
    ]
    upcoming = [("", SYSTEM + [2] * 400), ("", SYSTEM + [9] * 400), ("", SYSTEM + [1] * 400),
                ("", SYSTEM + [2] * 500), ("", SYSTEM + [4] * 400)]
    uses = next_uses(holders, upcoming)
    assert uses == {"b": 0, "a": 2}  # d's prompt came from another tenant; c is wanted by no one
    # no one's first (LRU order among them: c before d as given), then the latest needed first
    assert victim_order(["a", "b", "c", "d"], uses) == ["c", "d", "a", "b"]
    assert victim_order(["d", "c", "b", "a"], {}) == ["d", "c", "b", "a"]  # no queue: LRU


def test_a_sessions_other_conversation_is_needed_after_the_waiting_prompts_and_before_what_no_one_needs():
    holders = [("main", "", "s1"), ("sub", "", "s1"), ("other", "", "s2"), ("gone", "", "s3"), ("anon", "", "")]
    direct = {"sub": 0}  # the waiting queue continues sub directly
    # s1's sub-agent waits first, s2 has a request running, s3 none; "eve"'s s1 is not this s1
    uses = session_uses(holders, running=[("", "s2"), ("eve", "s1")], waiting=[("", "s1"), ("", "s4")], uses=direct)
    assert uses == {"sub": 0, "main": HORIZON + 1, "other": HORIZON}
    # given up first: what no one needs (LRU order), then the latest needed
    assert victim_order(["main", "sub", "other", "gone", "anon"], uses) == ["gone", "anon", "main", "other", "sub"]
    assert session_uses(holders, running=[], waiting=[], uses={}) == {}
