"""Audio in chat: a tiny model with a tiny random-weight audio projector (tests/tiny_audio.py,
Qwen2-Audio's Whisper encoder) through the real libmtmd. A clip is one audio chunk of 750
embeddings; a conversation whose first turn holds a clip reuses its prefix past the clip on
the next turn, without running the encoder again, and answers as a cold run does."""

from __future__ import annotations

import llama_cpp  # noqa: F401, I001  (before numpy)

import base64
import io
import wave

import httpx
import numpy as np
import openai
import pytest

from tests.helpers import metric, warmslot_server
from tests.engine.test_images import chat, data_url, image_message
from tests.tiny_audio import write_tiny_audio_mmproj
from tests.tiny_models import N_EMBD
from warmslot.slots.llama_api.model import Model
from warmslot.slots.llama_api.mtmd import MediaChunk, Projector, ProjectorParams

pytestmark = pytest.mark.model


def sine_wav(freq: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    x = 0.5 * np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def audio_message(text: str, clip: bytes, fmt: str = "wav") -> dict:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": fmt}}
    return {"role": "user", "content": [{"type": "text", "text": text}, part]}


@pytest.fixture(scope="module")
def audio_mmproj(tmp_path_factory):
    return write_tiny_audio_mmproj(tmp_path_factory.mktemp("audio") / "audio-mmproj.gguf")


def test_the_audio_projector_encodes_a_clip(tiny_models, audio_mmproj):
    model = Model(str(tiny_models["attention"]), n_gpu_layers=0)
    proj = Projector(str(audio_mmproj), model, ProjectorParams(use_gpu=False))
    try:
        assert proj.modalities == ("audio",)

        def encode(freq: float, media_id: str) -> np.ndarray:
            before, chunk, after = proj.tokenize_media(sine_wav(freq), media_id, audio=True)
            assert bytes(before) == b"<|audio_bos|>" and bytes(after) == b"<|audio_eos|>"  # libmtmd wraps the clip
            assert isinstance(chunk, MediaChunk) and chunk.audio
            assert (chunk.n_tokens, chunk.n_pos) == (750, 750)  # one 30 s window, however short the clip
            return proj.encode(chunk)

        a = encode(440, "a")
        assert a.shape == (750, N_EMBD) and np.isfinite(a).all() and 0.1 < a.std() < 10
        assert np.array_equal(a, encode(440, "b"))  # the same clip again (another id: not the kept parts)
        assert not np.allclose(a, encode(880, "c"))
    finally:
        proj.close()
        model.close()


@pytest.fixture(scope="module")
def server(tiny_models, audio_mmproj, tmp_path_factory):
    media = tmp_path_factory.mktemp("clips")
    (media / "tone.wav").write_bytes(sine_wav(520))
    proc = warmslot_server(tiny_models["attention"], "-np", "1", "-c", "2048", "--mmproj", str(audio_mmproj), "--media-path", str(media))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_second_turn_reuses_the_prefix_past_the_clip_without_encoding_again(server, client):
    props = httpx.get(server.url + "/props").json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": True}
    first = [audio_message("What is said?", sine_wav(440))]
    r1 = chat(client, first)
    assert r1.choices[0].message.content and r1.usage.prompt_tokens > 750  # the clip's embeddings count
    assert metric(server, "warmslot_media_encodes_total") == 1
    clips = httpx.get(server.url + "/engine").json()["slots"][0]["images"]
    assert [(c["kind"], c["n_tokens"]) for c in clips] == [("audio", 750)], clips
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Again?"}]
    r2 = chat(client, second)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    assert metric(server, "warmslot_media_encodes_total") == 1
    assert metric(server, "warmslot_media_embeddings_reused_total") == 0  # its KV was kept: nothing decoded again
    cold = chat(client, second, extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == r2.choices[0].message.content
    other = chat(client, [audio_message("What is said?", sine_wav(880))])
    assert other.usage.prompt_tokens == r1.usage.prompt_tokens
    assert other.usage.prompt_tokens_details.cached_tokens < r1.usage.prompt_tokens - 750  # another clip: another prefix


def test_a_responses_input_audio_is_the_same_clip_as_a_chat_part(server, client):
    clip = sine_wav(660)
    first = chat(client, [audio_message("Transcribe.", clip)])
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": "wav"}}
    body = {"model": "m", "max_output_tokens": 8, "temperature": 0, "store": False,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Transcribe."}, part]}]}
    encodes = metric(server, "warmslot_media_encodes_total")
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["input_tokens"] == first.usage.prompt_tokens
    assert usage["input_tokens_details"]["cached_tokens"] >= first.usage.prompt_tokens - 1  # past the clip
    assert metric(server, "warmslot_media_encodes_total") == encodes
    bad = dict(body, input=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]}])
    r = httpx.post(server.url + "/v1/responses", json=bad, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0].input_audio.data", r.text


def test_a_file_url_in_media_path_is_the_same_clip_as_its_bytes(server, client):
    inline = chat(client, [audio_message("Which tone?", sine_wav(520))])
    part = {"type": "input_audio", "input_audio": {"data": "file://tone.wav", "format": "wav"}}
    r = chat(client, [{"role": "user", "content": [{"type": "text", "text": "Which tone?"}, part]}])
    assert r.choices[0].message.content == inline.choices[0].message.content
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1  # the same clip: the same prefix


def _post(server, messages):
    return httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)


@pytest.mark.parametrize("audio, param, words", [
    ({"data": "!!!", "format": "wav"}, "input_audio.data", "base64"),
    ({"data": base64.b64encode(b"not audio at all").decode(), "format": "wav"}, "input_audio.data", "not audio"),
    ({"data": data_url((1, 2, 3)).split(",", 1)[1]}, "input_audio.data", "not audio"),
    ({"data": base64.b64encode(b"RIFF\x10\x00\x00\x00WAVEjunk").decode()}, "input_audio.data", "could not be decoded"),
    ({"data": "AAAA", "format": "ogg"}, "input_audio.format", "must be one of"),
    ({"url": "https://example.com/a.wav"}, "input_audio.url", "not fetched"),
    ({}, "input_audio.data", "base64"),
])
def test_bad_audio_gets_400_naming_the_field(server, audio, param, words):
    r = _post(server, [{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"messages[0].content[0].{param}" and words in err["message"], err


def test_an_image_to_an_audio_projector_gets_400(server):
    r = _post(server, [image_message("x", data_url((5, 5, 5)))])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1].image_url.url"
    assert "no images" in r.json()["error"]["message"] and "vision" in r.json()["error"]["message"]
    assert _post(server, [{"role": "user", "content": "still serving?"}]).status_code == 200


@pytest.mark.parametrize("kind", ["swa", "recurrent"])
def test_a_branch_after_the_clip_keeps_it_on_memory_that_cannot_be_cut(tiny_models, audio_mmproj, kind):
    """Sliding-window and recurrent memory: a prompt that leaves the last one in the text
    after a clip goes back to the checkpoint at the clip's end (recurrent) or cuts there, and
    answers as cold, without the clip encoded or decoded again."""
    proc = warmslot_server(tiny_models[kind], "-np", "1", "-c", "2048", "--mmproj", str(audio_mmproj))
    try:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        clip = sine_wav(300)

        def clip_then(text):
            return [{"role": "user", "content": [audio_message("", clip)["content"][1], {"type": "text", "text": text}]}]

        chat(client, clip_then("Say it in one short line."))
        seen = [metric(proc, f"warmslot_media_{n}_total") for n in ("encodes", "tokens")]
        restored = metric(proc, "warmslot_checkpoints_restored_total")
        warm = chat(client, clip_then("Say it in many words."))
        assert [metric(proc, f"warmslot_media_{n}_total") for n in ("encodes", "tokens")] == seen
        assert warm.usage.prompt_tokens_details.cached_tokens > 750
        if kind == "recurrent":
            assert metric(proc, "warmslot_checkpoints_restored_total") > restored
        cold = chat(client, clip_then("Say it in many words."), extra_body={"cache_prompt": False})
        assert cold.choices[0].message.content == warm.choices[0].message.content
    finally:
        proc.stop()
