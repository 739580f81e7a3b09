"""A reasoning item's `encrypted_content`: the turn the model generated, signed by the server.

With `include: ["reasoning.encrypted_content"]` a response's first output item is a reasoning
item (empty when the model did not think) whose `encrypted_content` carries an `ExactTurn`:
every token the reply generated, and the length and digest of the prompt it followed. A
stateless client (`store: false`, as the Codex CLI) sends the item back with the rest of the
history, and the server puts the turn back into the prompt as those exact tokens
(`exact_turns`), so the next prompt starts with everything the slot already holds.

The blob is signed, not encrypted: it holds token ids of text the client already has. Its
form is `ws1.` + base64url(HMAC-SHA256 tag (16 bytes) + zlib(payload)), the payload
`version (u8) | prompt_len | prompt digest (16 bytes) | h | n | h token ids (the generation
prompt that ended the prompt) | n token ids (the reply)`, counts little-endian uint32, token
ids little-endian int32. The key is
derived from the server's secret (`--responses-secret`, else random per process) and the
model's identity (architecture, vocabulary size, parameter count), so a blob is accepted only
by a server with the same secret and model. A blob that does not verify (another server's, one
from before a restart without `--responses-secret`, OpenAI's own, or a tampered one) is
ignored: the turn renders from the item's text as any history does, the request still
succeeds, and the response names the item in `warmslot.encrypted_content_ignored`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import zlib

from ...prompt.exact_turns import DIGEST_BYTES, ExactTurn, token_bytes

PREFIX = "ws1."
VERSION = 1
TAG_BYTES = 16
_HEAD = struct.Struct(f"<BI{DIGEST_BYTES}sII")  # version, prompt_len, digest, h head tokens, n tokens
MAX_TOKENS = 1 << 22  # a turn longer than any context: refused before it is unpacked


class TurnSigner:
    """Signs and verifies turns for one server secret and one model. Pure; thread-safe."""

    def __init__(self, secret: bytes, model: str) -> None:
        self._key = hmac.new(secret, b"warmslot responses turn\0" + model.encode(), hashlib.sha256).digest()

    def _tag(self, packed: bytes) -> bytes:
        return hmac.new(self._key, packed, hashlib.sha256).digest()[:TAG_BYTES]

    def sign(self, turn: ExactTurn) -> str:
        head = _HEAD.pack(VERSION, turn.prompt_len, turn.prompt_digest, len(turn.head), len(turn.tokens))
        payload = head + token_bytes(turn.head + turn.tokens)
        packed = zlib.compress(payload, 6)
        return PREFIX + base64.urlsafe_b64encode(self._tag(packed) + packed).decode("ascii").rstrip("=")

    def verify(self, blob: object) -> ExactTurn | None:
        """The turn a blob carries, or None when it is not one this server signed for this
        model (checked before anything is unpacked)."""
        if not isinstance(blob, str) or not blob.startswith(PREFIX):
            return None
        text = blob[len(PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            return None
        tag, packed = raw[:TAG_BYTES], raw[TAG_BYTES:]
        if len(tag) != TAG_BYTES or not hmac.compare_digest(tag, self._tag(packed)):
            return None
        unpacker = zlib.decompressobj()
        payload = unpacker.decompress(packed, _HEAD.size + 4 * MAX_TOKENS)
        version, prompt_len, digest, h, n = _HEAD.unpack_from(payload)
        body = payload[_HEAD.size:]
        if version != VERSION or not 0 <= h <= prompt_len or len(body) != 4 * (h + n):
            return None
        tokens = struct.unpack(f"<{h + n}i", body)
        return ExactTurn(prompt_len, digest, tokens[h:], tokens[:h])


def model_identity(arch: str, n_vocab: int, n_params: int) -> str:
    """What a blob is bound to besides the secret: the same weights under any path or on any
    replica verify, another model (whose token ids mean other text) does not."""
    return f"{arch}:{n_vocab}:{n_params}"
