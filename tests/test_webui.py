"""The web page at `/`, in a real headless browser: Debian's chromium driven by Playwright
(launched on the system executable, so nothing is downloaded). A streamed chat, the second
turn served from the slot and the cache view following it, stop freeing the slot, the key
prompt with --api-key, and `--no-webui`. The real server on the default chat model, with
short replies. Screenshots of the page go to build/webui/ (the README shows two of them)."""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import httpx
import pytest

from tests.helpers import warmslot_server

SHOTS = pathlib.Path(__file__).resolve().parent.parent / "build" / "webui"
NOT_INSTALLED = "Debian's chromium is not installed: tests/install_deps.sh installs it (as root)"


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(NOT_INSTALLED, pytrace=False)
        pytest.skip(NOT_INSTALLED)
    return path


# -- the route, no model or browser needed ---------------------------------------------------


def test_the_page_ships_in_the_package_and_no_webui_turns_it_off(tmp_path):
    from starlette.testclient import TestClient

    from warmslot.server.app import create_app
    from warmslot.server.process.config import parse_config

    config, _ = parse_config(["-m", str(tmp_path / "never-loaded.gguf")])
    client = TestClient(create_app(config))  # no lifespan: the model is never loaded
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self' holds
    assert '<script src="/webui/app.js">' in page.text and "http" not in page.text.split("<body>")[1]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = client.get(f"/webui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and len(r.content) > 1000
    assert client.get("/webui/..%2Fapp.py").status_code == 404
    assert client.get("/webui/index.htm").status_code == 404

    config, _ = parse_config(["-m", str(tmp_path / "never-loaded.gguf"), "--no-webui"])
    client = TestClient(create_app(config))
    for path in ("/", "/webui/app.js"):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text


# -- in the browser --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(chat_model):
    proc = warmslot_server(chat_model, "-np", "2", "-c", "2048")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def keyed_server(chat_model):
    proc = warmslot_server(chat_model, "-np", "1", "-c", "1024", "--api-key", "right-key")
    yield proc
    proc.stop()


def open_page(browser, url, max_tokens=8, settings=True):
    page = browser.new_page(viewport={"width": 1400, "height": 820})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url + "/")
    if settings:
        set_settings(page, max_tokens)
    return page, errors


def set_settings(page, max_tokens):
    page.click("#settings summary")
    page.fill("#max-tokens", str(max_tokens))
    page.dispatch_event("#max-tokens", "change")
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "change")


def send(page, text):
    page.fill("#input", text)
    page.click("#send")


def stats(page, n):
    """The nth reply's line (TTFT, tokens/s, cached_tokens), once the reply has ended."""
    line = page.locator(".msg.assistant .stats").nth(n)
    line.wait_for(timeout=90_000)
    return line


def slots_json(url, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url + "/engine", headers=headers, timeout=10).json()


def test_chat_streams_and_the_second_turn_comes_from_the_slot(browser, server):
    page, errors = open_page(browser, server.url, max_tokens=16)
    page.locator("#capacity tr").first.wait_for()  # the capacity table from /props
    send(page, "What color is the sky on a clear day?")
    page.locator(".msg.assistant .content p").first.wait_for(timeout=90_000)  # text before the end
    first = stats(page, 0)
    assert "TTFT" in first.inner_text() and "tokens/s" in first.inner_text()
    assert "sky" in page.locator(".msg.assistant .content").first.inner_text().lower()
    page.locator("#slots tr[data-tokens]:not([data-tokens='0'])").first.wait_for()
    slot_before = page.locator("[data-source=slot]").inner_text()

    send(page, "Why is that?")
    second = stats(page, 1)
    assert int(second.get_attribute("data-cached")) > 0, second.inner_text()
    # the cache view follows: the slot's tokens counted by source, the request listed
    # (polled from here: wait_for_function's string predicates are eval, which the page's CSP refuses)
    deadline = time.monotonic() + 10
    while page.locator("[data-source=slot]").inner_text() == slot_before and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert int(page.locator("[data-source=slot]").inner_text()) > int(slot_before)
    assert page.locator("#requests tbody tr").count() == 2
    assert "slot" in page.locator("#requests tbody tr").first.inner_text()
    assert page.locator("#tiers [data-tier='RAM prompt cache']").count() == 1
    # the device tier: the conversation its slot holds, idle between turns
    device = page.locator("#tiers [data-tier='device (idle conversations)']")
    deadline = time.monotonic() + 10
    while "1 of" not in device.inner_text() and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert "1 of" in device.inner_text(), device.inner_text()

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "chat.png"))
    page.locator("#cache").screenshot(path=str(SHOTS / "cache-view.png"))
    # the conversation is kept in the browser: a reload shows it again
    page.reload()
    assert page.locator(".msg.assistant .stats").count() == 2
    assert not errors, errors
    page.close()


def test_stop_ends_the_reply_and_frees_the_slot(browser, server):
    page, errors = open_page(browser, server.url, max_tokens=1000)
    page.click("#new-chat")
    send(page, "Write a long story about a lighthouse keeper.")
    page.locator(".msg.assistant .content p").first.wait_for(timeout=90_000)
    assert any(s["state"] != "idle" for s in slots_json(server.url)["slots"])
    page.click("#stop")
    assert "stopped" in stats(page, 0).inner_text()
    deadline = time.monotonic() + 10
    while any(s["state"] != "idle" for s in slots_json(server.url)["slots"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(s["state"] == "idle" for s in slots_json(server.url)["slots"])
    page.locator("#send").wait_for()  # ready for the next message
    assert not errors, errors
    page.close()


def test_the_page_asks_for_the_key(browser, keyed_server):
    page, errors = open_page(browser, keyed_server.url, settings=False)
    dialog = page.locator("#key-dialog")
    dialog.wait_for()  # /props answered 401: the prompt is up
    page.fill("#key-input", "wrong-key")
    page.click("#key-submit")
    page.locator("#key-error").wait_for()
    assert "refused" in page.locator("#key-error").inner_text()

    page.fill("#key-input", "right-key")
    page.click("#key-submit")
    dialog.wait_for(state="hidden")
    set_settings(page, 8)
    send(page, "Hello!")
    assert "TTFT" in stats(page, 0).inner_text()
    # the view shows what /slots shows to this key
    page.locator("#slots tbody tr").first.wait_for()
    assert page.locator("#slots tbody tr").count() == len(slots_json(keyed_server.url, "right-key")["slots"])
    assert page.evaluate("sessionStorage.getItem('warmslot.key')") == "right-key"
    assert not errors, errors
    page.close()
