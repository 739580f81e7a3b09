"""The web page at `/`, in a real headless browser: Debian's chromium driven by Playwright
(launched on the system executable, so nothing is downloaded). A streamed chat, the second
turn served from the slot and the cache view following it, stop freeing the slot, the key
prompt with --api-key, the admin's view of every tenant's requests, and `--no-webui`. The
real server on the default chat model, with short replies; images attached by the file
picker, a paste and a drop, and an audio clip, go to the tiny model with its tiny projectors. A
server of two tiny models: the picker lists them with their states, and sending with the
unloaded one loads it. Screenshots of the page go to build/webui/ (the README shows two of them)."""

from __future__ import annotations

import base64
import hashlib
import io
import math
import os
import pathlib
import shutil
import struct
import time
import wave

import httpx
import pytest
from PIL import Image

from tests.helpers import warmslot_server

SHOTS = pathlib.Path(__file__).resolve().parents[2] / "build" / "webui"
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
    policy = dict(d.strip().split(" ", 1) for d in page.headers["content-security-policy"].split(";"))
    assert "script-src" not in policy and policy["default-src"] == "'self'"  # the page's own script, nothing inline
    assert policy["img-src"] == "'self' data:"  # attached images' thumbnails are data: URLs
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
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
    proc = warmslot_server(chat_model, "-np", "1", "-c", "1024", "--api-key", "right-key,other-key")  # the first is the admin's
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def vision_server(tiny_models, tiny_mmproj):
    """The tiny model with its tiny projector: 16 tokens an image."""
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "1024", "--mmproj", str(tiny_mmproj))
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
    assert "distinct tokens held in all" in device.inner_text()  # the tokens it holds, a shared prefix once
    assert "distinct tokens" in page.locator("#tiers [data-tier='RAM prompt cache']").inner_text()

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


def test_the_admin_key_sees_every_tenants_requests_and_why_they_missed(browser, keyed_server):
    url, other = keyed_server.url, {"Authorization": "Bearer other-key"}
    refused = httpx.get(url + "/engine/requests", headers=other, timeout=10)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required", refused.text
    for text in ("Name a color.", "Name a fruit."):  # the second leaves the first's prefix inside the question
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
        assert httpx.post(url + "/v1/chat/completions", headers=other, json=body, timeout=60).status_code == 200
    newest = httpx.get(url + "/engine/requests?limit=1", headers={"Authorization": "Bearer right-key"}, timeout=10).json()["data"]
    assert len(newest) == 1 and set(newest[0]["explanation"]["divergence"]) == {"token", "message", "role"}  # no text

    page, errors = open_page(browser, url, settings=False)
    page.locator("#key-dialog").wait_for()
    page.fill("#key-input", "right-key")
    page.click("#key-submit")
    row = page.locator("#recent-requests tbody tr").first
    row.wait_for()
    text = row.inner_text()
    assert "diverged at token" in text and "(user)" in text, text
    assert "fruit" not in text and "color" not in text  # redacted: positions, never the prompt
    tenant = slots_json(url, "right-key")["slots"][0]["tenant"]  # the other key's tenant, as /slots names it
    assert tenant and tenant in text

    page.evaluate("sessionStorage.setItem('warmslot.key', 'other-key')")
    page.reload()
    page.locator("#slots tbody tr").first.wait_for()
    page.wait_for_timeout(1200)  # a poll past the refused /engine/requests
    assert page.locator("#recent").is_hidden()
    assert not errors, errors
    page.close()


def png(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 12), color).save(buf, "PNG")
    return buf.getvalue()


# a file handed to the page as a paste into the message box or a drop on the chat, through
# a DataTransfer built in the page (as the browser builds one for a real paste or drop)
HAND_OVER = """([how, name, type, b64]) => {
  const data = new DataTransfer();
  data.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], name, { type }));
  const event = how === "paste"
    ? new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true })
    : new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true });
  document.getElementById(how === "paste" ? "input" : "messages").dispatchEvent(event);
}"""


def hand_over(page, how, name, data, kind="image/png"):
    page.evaluate(HAND_OVER, [how, name, kind, base64.b64encode(data).decode()])


def rendered_widths(page, selector):
    """The natural width of each image the selector finds (0: not rendered)."""
    return page.eval_on_selector_all(selector, "imgs => imgs.map((i) => i.complete ? i.naturalWidth : 0)")


def test_images_attached_by_picker_paste_and_drop_reach_the_model(browser, vision_server):
    page, errors = open_page(browser, vision_server.url, max_tokens=4)
    page.locator("#attach:not([disabled])").wait_for()  # /props: the model takes images
    red, green, blue = png((200, 10, 30)), png((10, 200, 30)), png((10, 30, 200))
    page.set_input_files("#file-input", files=[{"name": "red.png", "mimeType": "image/png", "buffer": red}])
    hand_over(page, "paste", "green.png", green)
    hand_over(page, "drop", "blue.png", blue)
    thumbs = page.locator("#attachments img.thumb")
    thumbs.nth(2).wait_for()
    assert rendered_widths(page, "#attachments img.thumb") == [20, 20, 20]  # shown under the page's CSP
    page.click("#attachments figure[title='blue.png'] .remove")
    assert [thumbs.nth(i).get_attribute("alt") for i in range(thumbs.count())] == ["red.png", "green.png"]

    send(page, "What is this?")
    line = stats(page, 0).inner_text()
    assert page.locator("#attachments figure").count() == 0  # sent with the message
    assert rendered_widths(page, ".msg.user img.thumb") == [20, 20]
    # the server took both images: two runs of 16 embeddings, named by the hash of the bytes sent
    hashes = [hashlib.sha256(b).hexdigest()[:16] for b in (red, green)]
    slot = slots_json(vision_server.url)["slots"][0]
    assert [(r["hash"], r["kind"], r["n_tokens"]) for r in slot["images"]] == [(h, "image", 16) for h in hashes]
    assert int(line.split("prompt ")[1].split()[0]) > 32, line
    # the cache panel names the runs as /slots does, and so does the admin's list (no keys: all see it)
    for where in ("#slots", "#recent-requests"):
        for h in hashes:
            page.locator(f"{where} .run[data-hash='{h}']").wait_for(timeout=5000)
    assert "none (slot 0)" in page.locator("#recent-requests tbody tr").first.inner_text()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "images.png"))
    assert not errors, errors
    page.close()


@pytest.fixture(scope="module")
def audio_server(tiny_models, tmp_path_factory):
    """The tiny model with a tiny audio projector: 750 tokens a clip."""
    from tests.tiny_audio import write_tiny_audio_mmproj

    mmproj = write_tiny_audio_mmproj(tmp_path_factory.mktemp("audio") / "audio-mmproj.gguf")
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "2048", "--mmproj", str(mmproj))
    yield proc
    proc.stop()


def tone_wav(freq=440.0, seconds=0.25, rate=16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * freq * i / rate))) for i in range(int(rate * seconds))))
    return buf.getvalue()


def test_an_audio_clip_reaches_a_model_that_takes_audio_and_an_image_does_not(browser, audio_server):
    page, errors = open_page(browser, audio_server.url, max_tokens=2)
    page.locator("#attach:not([disabled])").wait_for()
    assert "audio" in page.locator("#attach").get_attribute("title")
    hand_over(page, "drop", "red.png", png((200, 10, 30)))
    page.locator("#attach-note").wait_for()
    assert "takes audio only" in page.locator("#attach-note").inner_text()
    clip = tone_wav()
    page.set_input_files("#file-input", files=[{"name": "tone.wav", "mimeType": "audio/wav", "buffer": clip}])
    chip = page.locator("#attachments .attachment.audio .chip")
    chip.wait_for()
    assert "tone.wav" in chip.inner_text() and page.locator("#attachments figure").count() == 1

    send(page, "Listen.")
    stats(page, 0)
    assert "tone.wav" in page.locator(".msg.user .attachment.audio").inner_text()
    slot = slots_json(audio_server.url)["slots"][0]
    assert [(r["hash"], r["kind"], r["n_tokens"]) for r in slot["images"]] == [(hashlib.sha256(clip).hexdigest()[:16], "audio", 750)]
    assert not errors, errors
    page.close()


def test_a_text_model_takes_no_attachments(browser, server):
    page, errors = open_page(browser, server.url, settings=False)
    page.locator("#capacity tr").first.wait_for()  # /props has answered
    assert page.locator("#attach").is_disabled()
    assert "text only" in page.locator("#attach").get_attribute("title")
    hand_over(page, "drop", "red.png", png((200, 10, 30)))
    page.locator("#attach-note").wait_for()
    assert "takes text only" in page.locator("#attach-note").inner_text()
    assert page.locator("#attachments figure").count() == 0
    assert page.locator("#model-picker").is_hidden() and page.locator("#models-panel").is_hidden()  # one model: no picker
    assert not errors, errors
    page.close()


@pytest.fixture(scope="module")
def models_server(tmp_path_factory, tiny_models):
    """Two tiny models by name, `small` and `big` (tests/api/test_models_by_name.py), both may load at once."""
    from tests.api.test_models_by_name import serve

    with serve(tmp_path_factory.mktemp("models"), tiny_models, "--models-max", "2") as proc:
        yield proc


# records each "loading" line a reply shows while its request waits for the model
WATCH_WAITING = """() => {
  window.waitingLines = [];
  new MutationObserver(() => {
    const line = document.querySelector(".msg.assistant .waiting");
    if (line) window.waitingLines.push(line.textContent);
  }).observe(document.getElementById("messages"), { childList: true, subtree: true });
}"""


def picker_states(page) -> dict[str, str]:
    return {o.get_attribute("value"): o.get_attribute("data-state") for o in page.locator("#model-picker option").all()}


def test_the_model_picker_lists_the_models_and_sending_loads_the_chosen_one(browser, models_server):
    url = models_server.url
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 200  # small loaded, big not
    page, errors = open_page(browser, url, max_tokens=4)
    page.locator("#model-picker option[value=big]").wait_for(state="attached")
    assert picker_states(page) == {"small": "loaded", "big": "unloaded"}
    assert page.locator("#model-picker").input_value() == "small" and page.locator("#model").is_hidden()
    # the models panel: what each takes, measured once loaded, else estimated, and whether they fit together
    page.locator("#models tr[data-model=big]").wait_for()
    assert "estimated" in page.locator("#models tr[data-model=big]").inner_text()
    assert "measured" in page.locator("#models tr[data-model=small]").inner_text()
    assert "fit in RAM together" in page.locator("#models-fit").inner_text()

    page.select_option("#model-picker", "big")
    page.locator("#attach[title*='once it is loaded']").wait_for()  # what big takes is not known before its load
    page.locator("#slots tr", has_text="a request naming it loads it").wait_for()
    page.evaluate(WATCH_WAITING)
    send(page, "Hello!")
    line = stats(page, 0).inner_text()
    assert line.endswith("· big"), line  # the request named the chosen model
    assert page.evaluate("window.waitingLines")[0] == "loading big…"
    # the list follows the server: big is loaded now, and the cache panel shows its slot
    deadline = time.monotonic() + 10
    while picker_states(page)["big"] != "loaded" and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert picker_states(page) == {"small": "loaded", "big": "loaded"}
    page.locator("#slots tr[data-tokens]:not([data-tokens='0'])").wait_for()
    page.locator("#models tr[data-model=big][data-state=loaded]").wait_for()
    assert "measured" in page.locator("#models tr[data-model=big]").inner_text()
    page.locator("#attach[title*='text only']").wait_for()  # /props?model=big, now that it is loaded
    assert page.locator("#attach").is_disabled()
    assert not errors, errors
    page.close()
