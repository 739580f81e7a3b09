"""What one client can learn about another's: the miss explanation quotes no other
conversation's text, /slots and /engine show a key only its own tenants (the admin key sees all),
/engine/requests is the admin key's and quotes no prompt, and /metrics needs a key when the
server has keys. The real server on the default model."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

SYSTEM = {"role": "system", "content": "You are the assistant of a bank. Answer in one short sentence."}
SECRET = "the vault code is 7Q-LIMA-4491-ZEBRA-OCTAVE and the backup phrase is purple-hammock-nine"


def chat(url, messages, key=None, **extra):
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "warmslot_explain": True, **extra}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


@pytest.fixture(scope="module")
def anonymous(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "2048")
    yield proc
    proc.stop()


def test_the_explanation_never_quotes_another_conversations_text(anonymous):
    """The attack that recovered a 93-character secret in 4 requests: share the victim's
    prefix, read the text after the divergence, append it, repeat."""
    chat(anonymous.url, [SYSTEM, {"role": "user", "content": f"Remember this: {SECRET}."}])
    known = "Remember this: the vault code is"
    seen = []
    for _ in range(4):
        r = chat(anonymous.url, [SYSTEM, {"role": "user", "content": known + " X"}])
        # every text the server returned; not the random ids, timestamps and timings, whose
        # digits can spell a fragment by chance
        body = r.json()
        seen.append(json.dumps([body["choices"], body["warmslot"]]) + r.headers.get("x-warmslot-cache", ""))
        where = r.json()["warmslot"]["cache"]["divergence"]
        assert where is not None and where["message"] == 1  # where it diverged is still told
        assert where["old"] is None
        known += " X"
    leaked = "".join(seen)
    for fragment in ("7Q", "LIMA", "4491", "ZEBRA", "OCTAVE", "purple", "hammock"):
        assert fragment not in leaked


def test_the_explanation_quotes_the_reply_of_a_prompt_the_requester_sent_whole(anonymous):
    """A client that re-renders the previous reply (whose whole prompt it sends again) is
    told what the server had: that text was the answer to its own prompt."""
    base = [SYSTEM, {"role": "user", "content": "Name a color and nothing else."}]
    first = chat(anonymous.url, base, max_tokens=8).json()
    reply = first["choices"][0]["message"]["content"]
    assert reply
    rerendered = base + [{"role": "assistant", "content": "Certainly: " + reply}, {"role": "user", "content": "Another one."}]
    where = chat(anonymous.url, rerendered).json()["warmslot"]["cache"]["divergence"]
    assert where["message"] == 2 and where["role"] == "assistant"
    assert where["old"] is not None and where["old"].strip()
    assert where["old"].strip()[:3] in reply or reply.strip()[:3] in where["old"]
    assert "Certainly" in where["new"]


@pytest.fixture(scope="module")
def keyed(default_model):
    proc = warmslot_server(default_model, "-np", "2", "-c", "2048", "--api-key", "alice-key,bob-key")
    yield proc
    proc.stop()


def slots(url, key):
    r = httpx.get(url + "/engine", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_slots_show_a_key_only_its_own_tenants_and_the_first_key_everything(keyed):
    chat(keyed.url, [SYSTEM, {"role": "user", "content": "Alice asks about savings."}], key="alice-key")
    chat(keyed.url, [SYSTEM, {"role": "user", "content": "Bob asks about loans."}], key="bob-key", user="bob-session-1")
    chat(keyed.url, [SYSTEM, {"role": "user", "content": "Alice again, about cards."}], key="alice-key")

    admin = slots(keyed.url, "alice-key")  # the first key is the admin key
    bob = slots(keyed.url, "bob-key")
    admin_tenants = {s["tenant"] for s in admin["slots"] if s["n_tokens"]} | {e["tenant"] for e in admin["cache"]["entries"]}
    assert len(admin_tenants) == 2  # alice's and bob's
    assert not any(s["redacted"] for s in admin["slots"])

    bob_tenants = {s["tenant"] for s in bob["slots"] if not s["redacted"]} | {e["tenant"] for e in bob["cache"]["entries"]}
    assert len(bob_tenants) == 1 and bob_tenants < admin_tenants
    redacted = [s for s in bob["slots"] if s["redacted"]]
    assert redacted, "alice's slot is shown to bob only as redacted"
    for s in redacted:
        assert s["n_tokens"] == 0 and s["content_hash"] == "" and s["checkpoints"] == [] and s["request"] is None
    alice_hashes = {s["content_hash"] for s in admin["slots"] if s["tenant"] not in bob_tenants} | {
        e["content_hash"] for e in admin["cache"]["entries"] if e["tenant"] not in bob_tenants
    }
    assert alice_hashes and not alice_hashes & {e["content_hash"] for e in bob["cache"]["entries"]}
    assert "alice" not in json.dumps(bob)


def test_metrics_need_the_admin_key_when_the_server_has_keys(keyed):
    r = httpx.get(keyed.url + "/metrics")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(keyed.url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # bob's key would read alice's prompt lengths and sources as they happen
    r = httpx.get(keyed.url + "/metrics", headers={"Authorization": "Bearer bob-key"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    r = httpx.get(keyed.url + "/metrics", headers={"Authorization": "Bearer alice-key"})  # the first key: the admin
    assert r.status_code == 200 and "warmslot_prompt_tokens_total" in r.text
    assert httpx.get(keyed.url + "/health").status_code == 200  # probes need no key
    assert httpx.get(keyed.url + "/slots").status_code == 401


def test_admin_key_and_metrics_open(default_model):
    proc = warmslot_server(default_model, "-np", "1", "-c", "1024", "--api-key", "alice-key,bob-key", "--admin-key", "root-key", "--metrics-open")
    try:
        chat(proc.url, [SYSTEM, {"role": "user", "content": "Alice asks."}], key="alice-key")
        assert slots(proc.url, "root-key")["slots"][0]["redacted"] is False
        assert slots(proc.url, "root-key")["slots"][0]["n_tokens"] > 0
        # with an admin key, the first API key is an ordinary one: it sees its own tenant
        assert slots(proc.url, "alice-key")["slots"][0]["n_tokens"] > 0
        assert slots(proc.url, "bob-key")["slots"][0]["redacted"] is True
        # the admin key is a key for every route
        chat(proc.url, [{"role": "user", "content": "Hi"}], key="root-key")
        r = httpx.get(proc.url + "/metrics")  # --metrics-open: no key needed
        assert r.status_code == 200 and "warmslot_model_info" in r.text
    finally:
        proc.stop()


def test_recent_requests_are_the_admin_keys_and_quote_no_prompt(keyed):
    alice = {"Authorization": "Bearer alice-key"}  # the first key: the admin
    chat(keyed.url, [SYSTEM, {"role": "user", "content": f"Remember this: {SECRET}."}], key="alice-key")
    own = chat(keyed.url, [SYSTEM, {"role": "user", "content": "Remember this: the vault code is 7Q-LIMA, no more."}], key="alice-key")
    assert "LIMA" in json.dumps(own.json()["warmslot"])  # the requester's own explanation quotes her text
    chat(keyed.url, [SYSTEM, {"role": "user", "content": "Bob asks about loans."}], key="bob-key")

    assert httpx.get(keyed.url + "/engine/requests").status_code == 401
    r = httpx.get(keyed.url + "/engine/requests", headers={"Authorization": "Bearer bob-key"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    r = httpx.get(keyed.url + "/engine/requests?limit=3", headers=alice)
    assert r.status_code == 200, r.text
    bob, alice_second, _ = r.json()["data"]  # newest first
    assert bob["route"] == "/v1/chat/completions" and bob["tenant"] != alice_second["tenant"]
    where = alice_second["explanation"]["divergence"]
    assert where == {"token": where["token"], "message": 1, "role": "user"}  # where, not what
    for fragment in ("7Q", "LIMA", "vault", "loans", "Remember"):
        assert fragment not in r.text
    assert httpx.get(keyed.url + "/engine/requests?limit=0", headers=alice).status_code == 400


def test_get_load_shows_kv_cells_and_cache_bytes_to_the_admin_key_only(keyed):
    coarse = httpx.get(keyed.url + "/get_load").json()
    assert set(coarse) == {"load", "running", "waiting", "slots"}
    assert set(httpx.get(keyed.url + "/get_load", headers={"Authorization": "Bearer bob-key"}).json()) == set(coarse)
    full = httpx.get(keyed.url + "/get_load", headers={"Authorization": "Bearer alice-key"}).json()
    assert {"kv_cells_used", "kv_cells_total", "prompt_cache_bytes"} <= set(full)
