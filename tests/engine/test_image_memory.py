"""Images on the memory kinds whose prefix is not simply cut back: sliding-window attention, recurrent,
hybrid (recurrent + attention) and M-RoPE positions, through the real libmtmd with tiny
random-weight projectors.

On each, a conversation continued warm answers exactly as the same conversation evaluated
cold, and the counters show that the image was neither encoded nor decoded again. The
hybrid and M-RoPE models use a Qwen2-VL projector: an image of 4x3 tokens there takes 4
positions, not 12, so every position after it differs from its token index (a cut or a
restore at the wrong position would be refused by llama.cpp or answer differently)."""

from __future__ import annotations

import openai
import pytest

from tests.helpers import metric, warmslot_server
from tests.engine.test_images import data_url
from tests.tiny_models import write_tiny_mmproj, write_tiny_model

PROJECTOR = {"swa": "mlp", "recurrent": "mlp", "hybrid": "qwen2vl", "mrope": "qwen2vl"}


@pytest.fixture(scope="module", params=sorted(PROJECTOR))
def served(request, tmp_path_factory, tiny_models):
    kind = request.param
    out = tmp_path_factory.mktemp(f"image-{kind}")
    model = tiny_models[kind] if kind in tiny_models else write_tiny_model(kind, out / f"{kind}.gguf")
    mmproj = write_tiny_mmproj(out / "mmproj.gguf", projector=PROJECTOR[kind])
    proc = warmslot_server(model, "-np", "1", "-c", "2048", "--mmproj", str(mmproj))
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield kind, proc, client
    proc.stop()


def chat(client, messages, **kw):
    return client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0, **kw)


def image_then(text, color):
    """A user message: an image, then text about it (the prompt goes on past the image)."""
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(color)}}, {"type": "text", "text": text}]}


def counters(server):
    return {name: metric(server, f"warmslot_media_{name}_total") for name in ("encodes", "tokens", "embeddings_reused")}


def test_the_next_turn_reuses_the_image_and_answers_as_cold(served):
    kind, server, client = served
    first = [image_then("What is in this picture?", (30, 160, 90))]
    r1 = chat(client, first)
    seen = counters(server)
    assert seen["encodes"] >= 1 and seen["tokens"] >= 12
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Say more."}]
    warm = chat(client, second)
    # the image and the text after it came from the slot: nothing of the image ran again
    assert counters(server) == seen, kind
    assert warm.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 16, (kind, warm.usage, r1.usage)
    cold = chat(client, second, extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert counters(server)["tokens"] > seen["tokens"]  # the cold run decoded the image again
    assert cold.choices[0].message.content == warm.choices[0].message.content, kind


def test_a_prompt_that_leaves_the_last_one_after_its_image_answers_as_cold(served):
    """The memory is cut (attention, sliding window) or restored from a checkpoint (hybrid)
    inside the text after the image: at a position that M-RoPE shifts from the token index."""
    kind, server, client = served
    color = (120, 40, 200)
    chat(client, [image_then("Describe the picture in one short line.", color)])
    seen = counters(server)
    restored = metric(server, "warmslot_checkpoints_restored_total")
    branch = [image_then("Describe the picture in many words.", color)]
    warm = chat(client, branch)
    assert counters(server) == seen, kind  # the image was kept
    if kind in ("hybrid", "recurrent"):  # its memory cannot be cut: it went back to a checkpoint after the image
        assert metric(server, "warmslot_checkpoints_restored_total") > restored
    assert warm.usage.prompt_tokens_details.cached_tokens > 12, kind
    cold = chat(client, branch, extra_body={"cache_prompt": False})
    assert cold.choices[0].message.content == warm.choices[0].message.content, kind
