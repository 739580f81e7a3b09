"""Images in chat: a tiny model with a tiny random-weight projector (--mmproj) through the real
libmtmd. A conversation whose first turn holds an image reuses its prefix past the image on
the next turn, without running the encoder again, and answers as a cold run does."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from PIL import Image

from tests.helpers import metric, warmslot_server


def data_url(color, size=(20, 12), fmt="PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(text, url):
    return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "pics").mkdir()
    (folder / "pics" / "red.png").write_bytes(base64.b64decode(data_url((200, 10, 30)).split(",", 1)[1]))
    (tmp_path_factory.getbasetemp() / "outside.png").write_bytes((folder / "pics" / "red.png").read_bytes())
    (folder / "pics" / "link.png").symlink_to(tmp_path_factory.getbasetemp() / "outside.png")
    return folder


@pytest.fixture(scope="module")
def server(tiny_models, tiny_mmproj, media):
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "1024", "--mmproj", str(tiny_mmproj),
                           "--image-max-pixels", "10000", "--image-max-bytes", "1", "--media-path", str(media))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, messages, **kw):
    return client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0, **kw)


def test_second_turn_reuses_the_prefix_past_the_image_without_encoding_again(server, client):
    first = [image_message("What is this?", data_url((200, 10, 30)))]
    r1 = chat(client, first)
    assert r1.choices[0].message.content
    assert r1.usage.prompt_tokens > 16  # the image's 16 embeddings count as prompt tokens
    encodes = metric(server, "warmslot_media_encodes_total")
    assert encodes == 1
    preprocessed = metric(server, "warmslot_media_preprocessed_total")
    assert preprocessed == 1
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And more?"}]
    r2 = chat(client, second)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # everything up to the new turn came from the slot: the image's run and the reply after it
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)
    assert metric(server, "warmslot_media_encodes_total") == encodes
    assert metric(server, "warmslot_media_embeddings_reused_total") == 0  # its KV was kept: nothing decoded again
    assert metric(server, "warmslot_media_preprocessed_total") == preprocessed  # nor the image's file
    # the same conversation evaluated cold (cache_prompt off) answers the same, greedy
    cold = chat(client, second, extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == r2.choices[0].message.content


def test_different_images_give_different_prefixes(client):
    a = chat(client, [image_message("Which?", data_url((0, 0, 255)))])
    b = chat(client, [image_message("Which?", data_url((0, 255, 0)))])
    # the second shares only the text before its image with the first
    assert b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens - 16
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_slots_and_the_miss_explanation_name_images_by_hash(server, client):
    """/engine lists the images a slot's memory holds (a hash, where, how many tokens), and
    a prompt that leaves the slot at an image says so: `<image HASH>`, never its bytes."""
    chat(client, [image_message("Name it.", data_url((10, 200, 200)))])
    engine = httpx.get(server.url + "/engine").json()
    images = engine["slots"][0]["images"]
    assert len(images) == 1 and images[0]["n_tokens"] == 16 and images[0]["n_pos"] == 16, images
    assert images[0]["start"] > 0 and len(images[0]["hash"]) == 16
    assert httpx.get(server.url + "/slots").json()[0]["images"] == images
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [image_message("Name it.", data_url((200, 200, 10)))], "max_tokens": 2, "warmslot_explain": True})
    divergence = r.json()["warmslot"]["cache"]["divergence"]
    assert divergence["token"] == images[0]["start"], divergence
    new = httpx.get(server.url + "/engine").json()["slots"][0]["images"][0]["hash"]
    assert new != images[0]["hash"] and divergence["new"].startswith(f"<image {new}>"), divergence
    assert "base64" not in r.text


def post(server, messages):
    return httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)


@pytest.mark.parametrize("url, words", [
    ("https://example.com/cat.png", "not fetched"),
    ("data:image/png;base64,!!!notbase64", "base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "not an image"),
    ("data:audio/wav;base64,AAAA", "not supported"),
])
def test_bad_images_get_400_naming_the_field(server, url, words):
    r = post(server, [image_message("x", url)])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1].image_url.url"
    assert words in err["message"]


def test_limits_and_modalities_get_400(server):
    big = data_url((1, 2, 3), size=(200, 100))  # 20,000 pixels: over --image-max-pixels 10000
    r = post(server, [image_message("x", big)])
    assert r.status_code == 400 and "pixels" in r.json()["error"]["message"]
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}
    r = post(server, [audio])  # a vision projector has no audio encoder
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].input_audio.data"
    assert "no audio" in r.json()["error"]["message"]
    video = {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}
    r = post(server, [video])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]"
    assert httpx.get(server.url + "/health").status_code == 200


def test_images_without_a_projector_get_400(tiny_models):
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "256")
    try:
        r = post(proc, [image_message("x", data_url((5, 5, 5)))])
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "messages[0].content[1].image_url.url"
        assert "--mmproj" in r.json()["error"]["message"]
    finally:
        proc.stop()


def test_an_anthropic_image_block_is_the_same_image_as_a_chat_part(server, client):
    """/v1/messages image blocks (base64 source) go through the same path: a Messages request
    with the image that a chat request sent reuses that chat's prefix past the image."""
    url = data_url((90, 90, 250))
    first = chat(client, [image_message("Describe.", url)])
    media_type, data = url[len("data:"):].split(";base64,")
    content = [{"type": "text", "text": "Describe."}, {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}]
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": content}]}
    encodes = metric(server, "warmslot_media_encodes_total")
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["cache_read_input_tokens"] + usage["input_tokens"] == first.usage.prompt_tokens
    assert usage["cache_read_input_tokens"] >= first.usage.prompt_tokens - 1  # past the image
    assert metric(server, "warmslot_media_encodes_total") == encodes
    bad = dict(body, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}])
    r = httpx.post(server.url + "/v1/messages", json=bad, timeout=60)
    assert r.status_code == 400 and "messages[0].content[0].source.type" in r.json()["error"]["message"], r.text


def test_a_responses_input_image_is_the_same_image_as_a_chat_part(server, client):
    """/v1/responses `input_image` parts go through the same path: a Responses request with
    the image that a chat request sent reuses that chat's prefix past the image, without
    encoding it again; a bad one gets a 400 naming its own field."""
    url = data_url((250, 120, 20))
    first = chat(client, [image_message("Describe.", url)])
    content = [{"type": "input_text", "text": "Describe."}, {"type": "input_image", "image_url": url}]
    body = {"model": "m", "max_output_tokens": 8, "temperature": 0, "store": False,
            "input": [{"role": "user", "content": content}]}
    encodes = metric(server, "warmslot_media_encodes_total")
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["input_tokens"] == first.usage.prompt_tokens
    assert usage["input_tokens_details"]["cached_tokens"] >= first.usage.prompt_tokens - 1  # past the image
    assert metric(server, "warmslot_media_encodes_total") == encodes
    for part, param in (({"type": "input_image", "image_url": "https://example.com/a.png"}, "input[0].content[1].image_url"),
                        ({"type": "input_image", "file_id": "file-1"}, "input[0].content[1].image_url"),
                        ({"type": "input_image", "image_url": "data:image/png;base64,!!"}, "input[0].content[1].image_url")):
        bad = dict(body, input=[{"role": "user", "content": [content[0], part]}])
        r = httpx.post(server.url + "/v1/responses", json=bad, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_file_url_in_media_path_is_the_same_image_as_its_bytes(server, client):
    inline = chat(client, [image_message("Whose file?", data_url((200, 10, 30)))])
    encodes = metric(server, "warmslot_media_encodes_total")
    for url in ("file://pics/red.png", "file:////pics//red.png"):
        r = chat(client, [image_message("Whose file?", url)])
        assert r.choices[0].message.content == inline.choices[0].message.content
        assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1  # the same image: the same prefix
    assert metric(server, "warmslot_media_encodes_total") == encodes


@pytest.fixture(scope="module")
def web():
    """A local web server with an image, a missing one, a large one and a slow one."""
    import http.server
    import threading
    import time

    png = base64.b64decode(data_url((200, 10, 30)).split(",", 1)[1])

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path in ("/moved.png", "/away.png"):
                self.send_response(302)
                self.send_header("Location", "/red.png" if self.path == "/moved.png" else "ftp://127.0.0.1/red.png")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path == "/slow.png":
                time.sleep(3)
            body = {"/red.png": png, "/slow.png": png, "/big.png": png + b"\0" * 300_000}.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_image_fetch_reads_http_urls_within_its_limits(tiny_models, tiny_mmproj, web):
    """--image-fetch: an http(s) URL is the same image as its bytes sent inline (a redirect to
    another http(s) URL is followed); one that is missing, too large, too slow or redirected
    out of http(s) gets 400 naming the field, and the server serves on."""
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "1024", "--mmproj", str(tiny_mmproj),
                           "--image-fetch", "--image-fetch-timeout", "1", "--image-max-bytes", "200KiB")
    try:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        inline = chat(client, [image_message("Whose?", data_url((200, 10, 30)))])
        fetched = chat(client, [image_message("Whose?", web + "/red.png")])
        assert fetched.choices[0].message.content == inline.choices[0].message.content
        assert fetched.usage.prompt_tokens_details.cached_tokens >= fetched.usage.prompt_tokens - 1  # the same image
        moved = chat(client, [image_message("Whose?", web + "/moved.png")])  # a redirect within http(s)
        assert moved.choices[0].message.content == inline.choices[0].message.content
        for path, words in (("/none.png", "HTTP 404"), ("/big.png", "--image-max-bytes"), ("/slow.png", ""),
                            ("/away.png", "out of http(s)")):
            r = post(proc, [image_message("Whose?", web + path)])
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "messages[0].content[1].image_url.url" and words in err["message"], err
        assert httpx.get(proc.url + "/health").status_code == 200
    finally:
        proc.stop()


@pytest.mark.parametrize("url,words", [
    ("file://../outside.png", "no '..'"), ("file://pics/link.png", "no link out"), ("file://pics/none.png", "no file"),
    ("file://pics", "no file"),
])
def test_a_file_url_outside_media_path_gets_400(server, url, words):
    r = post(server, [image_message("Which?", url)])
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["param"] == "messages[0].content[1].image_url.url"
