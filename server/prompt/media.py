"""Images and audio in chat messages: parsing the content parts, and turning a rendered
prompt's media markers into the media runs the engine decodes (`warmslot.slots.MediaSpan`).

A message's image or audio part becomes libmtmd's media marker in the message's text, so the
chat template places it where the part was; the media's bytes ride along in the message
(`IMAGES_KEY`). Once the prompt is tokenized (the builder gives each marker one token of
its own, `MEDIA_TOKEN`), each marker is replaced by what the projector makes of its media:
a run of placeholder ids named by the bytes' hash, plus any text tokens the model wraps
media in.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from warmslot.slots import MediaError, MediaSpan, placeholder_ids

from .builder import Prompt
from .tokenizer import MEDIA_TOKEN
from ..errors import InvalidRequest

IMAGES_KEY = "_images"  # a parsed message's media (images and audio), in the order of its markers
# a media part's field in the request an adapter converted (Responses `input_image`), for errors
PARAM_KEY = "_param"
MEDIA_MARKER = "<__media__>"  # libmtmd's default marker: where an image or a clip goes in the text
AUDIO_FORMATS = ("wav", "mp3", "flac")  # what libmtmd decodes
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.ASCII)


@dataclass(frozen=True, slots=True)
class MediaInput:
    data: bytes
    param: str  # the request field it came from, for errors
    file: str = ""  # a file:// URL's path under --media-path, read when the prompt is planned
    url: str = ""  # an http(s) URL, fetched when the prompt is planned (with --image-fetch)
    audio: bool = False  # an audio clip (`input_audio`), not an image

    @property
    def media_id(self) -> str:
        """The media's identity: a hash of its bytes (the same bytes, the same prefix)."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def what(self) -> str:
        return "audio" if self.audio else "image"


def image_part(part: dict, param: str) -> MediaInput:
    """A chat `image_url` part ({"image_url": {"url": "data:image/png;base64,..."}} or the
    URL as a string) as an image's bytes, a file:// URL read under --media-path, or an
    http(s) URL fetched with --image-fetch."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    param = f"{param}.image_url.url" if isinstance(value, dict) else f"{param}.image_url"
    if isinstance(part.get(PARAM_KEY), str):
        param = part[PARAM_KEY]
    if not isinstance(url, str):
        raise InvalidRequest("'image_url.url' must be a string", param=param)
    return image_from_url(url, param)


def image_from_url(url: str, param: str) -> MediaInput:
    if url.startswith("file://"):
        return MediaInput(b"", param, file=url[len("file://"):])
    if url.startswith(("http://", "https://")):
        return MediaInput(b"", param, url=url)
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidRequest("an image must be a base64 data: URL (data:image/png;base64,...)", param=param)
    mime = (match.group("mime") or "").lower()
    if mime and not mime.startswith("image/"):
        raise InvalidRequest(f"media of type {mime!r} is not supported; send an image", param=param)
    return MediaInput(_base64(url[match.end():], "image", param), param)


def audio_part(part: dict, param: str) -> MediaInput:
    """A chat `input_audio` part ({"input_audio": {"data": BASE64, "format": "wav"}}, as
    OpenAI's API sends audio): the clip's bytes. `data` may also be a data: URL, and a file://
    URL under --media-path (in `data` or `url`, as llama-server reads them)."""
    value = part.get("input_audio")
    param = f"{part[PARAM_KEY] if isinstance(part.get(PARAM_KEY), str) else param}.input_audio"
    if not isinstance(value, dict):
        raise InvalidRequest("'input_audio' must be an object with 'data' (base64) and 'format'", param=param)
    fmt = value.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        raise InvalidRequest(f"'format' must be one of {', '.join(AUDIO_FORMATS)}", param=f"{param}.format")
    data = value.get("data", value.get("url"))
    param = f"{param}.{'url' if 'url' in value and 'data' not in value else 'data'}"
    if not isinstance(data, str) or not data:
        raise InvalidRequest("'input_audio.data' must be the clip's bytes in base64", param=param)
    if data.startswith("file://"):
        return MediaInput(b"", param, file=data[len("file://"):], audio=True)
    if data.startswith(("http://", "https://")):
        raise InvalidRequest("audio is sent inline, in base64 (audio URLs are not fetched)", param=param)
    match = _DATA_URL.match(data)
    if match is not None:
        mime = (match.group("mime") or "").lower()
        if mime and not mime.startswith("audio/"):
            raise InvalidRequest(f"media of type {mime!r} is not audio", param=param)
        data = data[match.end():]
    return MediaInput(_base64(data, "audio", param), param, audio=True)


def _base64(text: str, what: str, param: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"the {what}'s data is not valid base64", param=param) from None
    if not data:
        raise InvalidRequest(f"the {what} is empty", param=param)
    return data


def message_images(messages: list[dict]) -> list[MediaInput]:
    """A request's media, images and clips, in the order of their markers."""
    return [media for m in messages for media in m.get(IMAGES_KEY, ())]


def read_media_file(root: str | None, path: str, max_bytes: int, param: str, what: str = "image") -> bytes:
    """The bytes of a file:// image or clip: a path relative to --media-path, never outside it (no
    `..`, no link out of it), as llama-server's --media-path allows."""
    if root is None:
        raise InvalidRequest("file:// URLs are read only from a folder the server names with --media-path", param=param)
    rel = os.path.normpath(path.lstrip("/"))
    if rel == "." or rel.startswith("..") or os.path.isabs(rel):
        raise InvalidRequest("a file:// URL names a file inside --media-path (no '..')", param=param)
    base = os.path.realpath(root)
    full = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, full]) != base:
        raise InvalidRequest("a file:// URL names a file inside --media-path (no link out of it)", param=param)
    try:
        with open(full, "rb") as f:
            data = f.read(max_bytes + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise InvalidRequest(f"no file {rel!r} in --media-path", param=param) from None
    except OSError as exc:
        raise InvalidRequest(f"the file {rel!r} cannot be read: {exc.strerror}", param=param) from None
    if len(data) > max_bytes:
        raise InvalidRequest(f"the {what} has more than {max_bytes} bytes (--image-max-bytes)", param=param)
    if not data:
        raise InvalidRequest(f"the {what} is empty", param=param)
    return data


class _HttpRedirectsOnly(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to another http(s) URL (urllib's own also goes to ftp)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not newurl.startswith(("http://", "https://")):
            raise urllib.error.HTTPError(newurl, code, "a redirect out of http(s)", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpRedirectsOnly)


def fetch_image(url: str, timeout: float | None, max_bytes: int, param: str) -> bytes:
    """The bytes at an http(s) image URL, within `timeout` seconds in all and `max_bytes`;
    None for `timeout`: fetching is off (--image-fetch), and the URL gets 400."""
    if timeout is None:
        raise InvalidRequest(
            "image URLs are not fetched unless the server runs with --image-fetch; send the image inline as a data: URL"
            " (data:image/png;base64,...)", param=param,
        )
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"User-Agent": "warmslot", "Accept": "image/*"})
    chunks, size = [], 0
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = response.read(1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise InvalidRequest(f"the image at {url} has more than {max_bytes} bytes (--image-max-bytes)", param=param)
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        raise InvalidRequest(f"fetching the image at {url} failed: HTTP {exc.code} ({exc.reason})", param=param) from None
    except (TimeoutError, OSError, ValueError) as exc:
        why = f"it took more than {timeout:g} s (--image-fetch-timeout)" if isinstance(exc, TimeoutError) else str(exc)
        raise InvalidRequest(f"fetching the image at {url} failed: {why}", param=param) from None
    if not size:
        raise InvalidRequest("the image is empty", param=param)
    return b"".join(chunks)


def attach_images(
    prompt: Prompt, images: list[MediaInput], projector: Any, *, max_bytes: int, max_pixels: int, media_path: str | None = None,
    fetch_timeout: float | None = None,
) -> tuple[Prompt, tuple[MediaSpan, ...]]:
    """Replace each marker token of `prompt` by its media's parts (on the tokenize pool:
    libmtmd decodes and preprocesses an image, or a clip into its mel spectrogram). Raises
    InvalidRequest naming the media's field for media that is too large, cannot be decoded or
    is of a kind the projector has no encoder for, a file:// URL that --media-path does not
    hold, or an http(s) image that cannot be fetched (or is not: see fetch_image)."""
    images = [
        dataclasses.replace(i, data=read_media_file(media_path, i.file, max_bytes, i.param, i.what), file="") if i.file
        else dataclasses.replace(i, data=fetch_image(i.url, fetch_timeout, max_bytes, i.param), url="") if i.url else i
        for i in images
    ]
    at = [i for i, t in enumerate(prompt.tokens) if t == MEDIA_TOKEN]
    if len(at) != len(images):
        raise InvalidRequest(
            f"the rendered prompt holds {len(at)} media markers for {len(images)} media parts (a template that drops"
            f" media, or text holding {projector.marker!r})", param=images[0].param if images else "messages",
        )
    tokens: list[int] = []
    spans: list[MediaSpan] = []
    shifts: list[tuple[int, int]] = []  # (old index of a marker, tokens it became)
    last = 0
    for index, image in zip(at, images):
        if len(image.data) > max_bytes:
            raise InvalidRequest(f"the {image.what} has {len(image.data)} bytes; at most {max_bytes} are accepted (--image-max-bytes)", param=image.param)
        try:
            parts = projector.tokenize_media(image.data, image.media_id, audio=image.audio, max_pixels=max_pixels)
        except MediaError as exc:
            raise InvalidRequest(f"{exc}", param=image.param) from None
        tokens += prompt.tokens[last:index]
        before = len(tokens)
        for part in parts:
            if isinstance(part, list):
                tokens += part
            else:
                spans.append(MediaSpan(len(tokens), part))
                tokens += placeholder_ids(part.media_id, part.n_tokens)
        shifts.append((index, len(tokens) - before))
        last = index + 1
    tokens += prompt.tokens[last:]

    def moved(i: int | None) -> int | None:
        """Where the old token index i is now (a marker's index: where its parts start)."""
        if i is None:
            return None
        return i + sum(n - 1 for old, n in shifts if old < i)

    messages = [(role, moved(glue), moved(content)) for role, glue, content in prompt.messages]
    return dataclasses.replace(
        prompt, tokens=tokens, messages=messages,
        generation_start=moved(prompt.generation_start), system_end=moved(prompt.system_end),
    ), tuple(spans)
