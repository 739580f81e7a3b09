"""libmtmd, llama.cpp's multimodal library (in llama-cpp-python's wheel): a vision or audio
projector (`--mmproj`) beside the model. Every ctypes call to it lives here.

- `Projector.tokenize_media` turns an image's or an audio clip's bytes into what the prompt
  holds in its place: text tokens (some models wrap media in tokens of their own) and one
  `MediaChunk`, the preprocessed image or mel spectrogram, whose embeddings are computed only
  when the engine prefills it. Any thread (the tokenize pool).
- `Projector.encode` runs the encoder on one chunk and returns its embeddings (a copy).
- `Projector.decode` writes embeddings into a sequence of the context, in batches of
  `n_batch`. Engine thread only (it decodes with the engine's context).

NOTE: one lock keeps the tokenize pool's image preprocessing and the engine's encodes apart:
both use the projector's context, which llama.cpp does not promise to be thread-safe.
"""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)
import llama_cpp.mtmd_cpp as mtmd

import collections
import ctypes
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .backend import LlamaError
from .context import Context
from .model import Model


IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
AUDIO_MAGIC = (b"ID3", b"fLaC")  # MP3 with a tag, FLAC (a bare MP3 starts with a frame sync: _is_audio)


RECENT_BYTES = 256 << 20  # preprocessed images kept for the next turns (their pixels, as float32)


def _parts_bytes(parts: list) -> int:
    return sum(p.nx * p.ny * (1 if p.audio else 3) * 4 for p in parts if isinstance(p, MediaChunk))


def _is_image(data: bytes) -> bool:
    return data.startswith(IMAGE_MAGIC) or data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def _is_audio(data: bytes) -> bool:
    mpeg_frame = len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0  # 11 sync bits
    return data.startswith(AUDIO_MAGIC) or mpeg_frame or data[:4] == b"RIFF" and data[8:12] == b"WAVE"


class MediaError(ValueError):
    """Media libmtmd cannot take: not decodable, of a kind the projector has no encoder for,
    or over the pixel limit."""


class MediaChunk:
    """One image or audio clip as the model sees it: `n_tokens` embeddings at `n_pos`
    positions, named by `media_id` (a hash of the bytes: the same bytes give the same id).
    Owns the libmtmd chunk, freed with this object."""

    __slots__ = ("_ptr", "media_id", "n_tokens", "n_pos", "nx", "ny", "audio", "__weakref__")

    def __init__(self, ptr: int, media_id: str, nx: int, ny: int, audio: bool = False) -> None:
        self._ptr = ptr
        self.media_id = media_id
        self.n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(ptr))
        self.n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(ptr))
        self.nx, self.ny = nx, ny  # an image's size in pixels; a clip's samples, and 1
        self.audio = audio
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, ptr)

    @property
    def kind(self) -> str:
        return "audio" if self.audio else "image"

    def __repr__(self) -> str:
        return f"MediaChunk({self.kind} {self.media_id[:12]}, {self.n_tokens} tokens)"


@dataclass(frozen=True, slots=True)
class ProjectorParams:
    use_gpu: bool = True  # False: --no-mmproj-offload
    n_threads: int = 0  # 0: llama.cpp's default
    image_min_tokens: int = -1  # -1: the projector's own (dynamic-resolution models only)
    image_max_tokens: int = -1


class Projector:
    """A vision (or audio) projector loaded for `model`."""

    def __init__(
        self, path: str, model: Model, params: ProjectorParams = ProjectorParams(), on_preprocess: Callable[[], None] | None = None,
    ) -> None:
        """`on_preprocess()` is called for each image decoded and preprocessed (any thread)."""
        self._on_preprocess = on_preprocess or (lambda: None)
        cp = mtmd.mtmd_context_params_default()
        cp.use_gpu = params.use_gpu
        if params.n_threads > 0:
            cp.n_threads = params.n_threads
        cp.print_timings = False
        cp.warmup = True
        cp.image_min_tokens = params.image_min_tokens
        cp.image_max_tokens = params.image_max_tokens
        ctx = mtmd.mtmd_init_from_file(os.fsencode(path), model.ptr, cp)
        if not ctx:
            raise LlamaError(f"llama.cpp could not load the projector {path} (see the log above)")
        self.ptr = ctx
        self.path = path
        self.size_bytes = os.path.getsize(path)
        self.n_embd = model.info.n_embd
        self.vision = bool(mtmd.mtmd_support_vision(ctx))
        self.audio = bool(mtmd.mtmd_support_audio(ctx))
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))
        self.marker = (mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self._lock = threading.Lock()
        self._recent: collections.OrderedDict[tuple[str, int], list] = collections.OrderedDict()  # see tokenize_media
        self._recent_bytes = 0

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("vision",) * self.vision + ("audio",) * self.audio

    def tokenize_media(self, data: bytes, media_id: str, *, audio: bool = False, max_pixels: int = 0) -> list[list[int] | MediaChunk]:
        """The prompt's parts in the place of an image (or with `audio`, of a clip: WAV, MP3
        or FLAC), in order: token lists and one chunk. Raises MediaError for bytes that are
        not of that kind or cannot be decoded, media the projector has no encoder for, or an
        image of more than `max_pixels` pixels (0: any).

        The parts of recent media are kept by their id (chunks are never changed), so an
        image that every turn of a conversation sends again is decoded and preprocessed once,
        not once a turn."""
        if not (self.audio if audio else self.vision):
            raise MediaError(f"this model takes no {'audio' if audio else 'images'}: its projector has no {'audio' if audio else 'vision'} encoder")
        key = (media_id, max_pixels)
        with self._lock:
            parts = self._recent.get(key)
            if parts is not None:
                self._recent.move_to_end(key)
                return list(parts)
        parts = self._tokenize_new(data, media_id, audio, max_pixels)
        self._on_preprocess()
        with self._lock:
            self._recent[key] = parts
            self._recent_bytes += _parts_bytes(parts)
            while self._recent_bytes > RECENT_BYTES and len(self._recent) > 1:
                self._recent_bytes -= _parts_bytes(self._recent.popitem(last=False)[1])
        return list(parts)

    def _tokenize_new(self, data: bytes, media_id: str, audio: bool, max_pixels: int) -> list[list[int] | MediaChunk]:
        # NOTE: libmtmd hands data it does not recognise to a video probe (an ffprobe
        # process): only formats it decodes itself go in
        if audio and not _is_audio(data):
            raise MediaError("the data is not audio (WAV, MP3 or FLAC)")
        if not audio and not _is_image(data):
            raise MediaError("the data is not an image (PNG, JPEG, GIF, BMP or WebP)")
        what = "audio" if audio else "image"
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._lock:
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False)
            if not bitmap:
                formats = "WAV, MP3, FLAC" if audio else "PNG, JPEG, GIF, BMP, WebP"
                raise MediaError(f"the {what} could not be decoded ({formats} are read)")
            try:
                nx, ny = int(mtmd.mtmd_bitmap_get_nx(bitmap)), int(mtmd.mtmd_bitmap_get_ny(bitmap))
                if bool(mtmd.mtmd_bitmap_is_audio(bitmap)) != audio:
                    raise MediaError(f"the data is {'an image' if audio else 'audio'}, not {'audio' if audio else 'an image'}")
                if not audio and max_pixels and nx * ny > max_pixels:
                    raise MediaError(f"the image is {nx}x{ny} pixels; at most {max_pixels} are accepted")
                if audio and nx == 0:
                    raise MediaError("the audio holds no samples")
                mtmd.mtmd_bitmap_set_id(bitmap, media_id.encode())
                return self._tokenize(bitmap, media_id, nx, ny, audio)
            finally:
                mtmd.mtmd_bitmap_free(bitmap)

    def _tokenize(self, bitmap, media_id: str, nx: int, ny: int, audio: bool) -> list[list[int] | MediaChunk]:
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            text = self.marker.encode()
            inp = mtmd.mtmd_input_text(text, len(text), False, True)
            bitmaps = (ctypes.c_void_p * 1)(bitmap)
            rc = mtmd.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), bitmaps, 1)
            if rc != 0:
                raise MediaError(f"the {'audio' if audio else 'image'} could not be tokenized (libmtmd error {rc})")
            parts: list[list[int] | MediaChunk] = []
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                kind = mtmd.mtmd_input_chunk_get_type(chunk)
                if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    parts.append([int(ptr[k]) for k in range(n.value)])
                elif kind == (mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO if audio else mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE):
                    parts.append(MediaChunk(mtmd.mtmd_input_chunk_copy(chunk), media_id, nx, ny, audio))
                else:
                    raise MediaError(f"the projector made a chunk of another kind of a {'clip' if audio else 'image'}")
            return parts
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    def encode(self, chunk: MediaChunk) -> np.ndarray:
        """Run the encoder on one chunk: its embeddings, (n_tokens, n_embd) float32 (a copy)."""
        with self._lock:
            rc = mtmd.mtmd_encode_chunk(self.ptr, chunk._ptr)
            if rc != 0:
                raise LlamaError(f"the projector failed to encode {'a clip' if chunk.audio else 'an image'} ({rc})")
            out = mtmd.mtmd_get_output_embd(self.ptr)
            n = chunk.n_tokens * self.n_embd
            return np.ctypeslib.as_array(out, shape=(n,)).reshape(chunk.n_tokens, self.n_embd).copy()

    def decode(self, ctx: Context, chunk: MediaChunk, embd: np.ndarray, n_past: int, seq: int) -> int:
        """Decode the chunk's embeddings into sequence `seq` from position `n_past` (in
        batches of the context's n_batch, non-causal where the model wants it). Returns the
        position after it; raises LlamaError when a decode fails."""
        embd = np.ascontiguousarray(embd, dtype=np.float32)
        new_n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            self.ptr, ctx.ptr, chunk._ptr, embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            n_past, seq, ctx.n_batch, ctypes.byref(new_n_past), mtmd.mtmd_helper_post_decode_callback(), None,
        )
        if rc != 0:
            raise LlamaError(f"decoding an image's embeddings failed ({rc})")
        return int(new_n_past.value)

    def close(self) -> None:
        if self.ptr:
            mtmd.mtmd_free(self.ptr)
            self.ptr = None
