"""A scripted stand-in for the engine, for tests of the HTTP pipeline alone.

The pipeline (`server/pipeline/`) is pure protocol: it submits token ids and turns engine
events into API replies. These tests drive it with events a script chooses, so every finish,
error and choice count can be set up exactly and cheaply. Nothing here stands in for
llama.cpp in a test of caching or inference: those run the real engine.
"""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Callable

from warmslot.slots import EngineError, ErrorKind, Event, FinishReason, GenerateRequest, Usage

SPECIALS = {"<|im_start|>": 256, "<|im_end|>": 257}
BOS = 258


class FakeVocab:
    """A byte-level vocabulary: token b < 256 is byte b, plus chatml's two markers and BOS."""

    n_vocab = 259
    bos = BOS
    eos = SPECIALS["<|im_end|>"]
    add_bos = False

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        out = [BOS] if add_special else []
        i = 0
        while i < len(text):
            marker = next((m for m in SPECIALS if parse_special and text.startswith(m, i)), None)
            if marker is not None:
                out.append(SPECIALS[marker])
                i += len(marker)
            else:
                out += text[i].encode("utf-8")
                i += 1
        return out

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        if token < 256:
            return bytes([token])
        name = {v: k for k, v in SPECIALS.items()}.get(token, "<s>")
        return name.encode() if special else b""

    def longest_piece(self) -> int:
        return max(len(self.token_piece(t)) for t in range(self.n_vocab))

    def detokenize(self, tokens, *, special: bool = True) -> str:
        return b"".join(self.token_piece(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return self.token_piece(token).decode("utf-8", errors="replace")

    def is_special(self, token: int) -> bool:
        return token >= 256

    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def special_text(self, token: int) -> str:
        return self.token_text(token) if token >= 0 else ""

    def is_one_token(self, text: str) -> bool:
        return text in SPECIALS

    def check_grammar(self, spec) -> str | None:
        return None


Script = Callable[[GenerateRequest], list[Event]]


def reply(*pieces: str, finish: FinishReason = FinishReason.STOP) -> Script:
    """A script that answers every request with these text pieces, then `finish`."""

    def script(req: GenerateRequest) -> list[Event]:
        usage = Usage(prompt_tokens=len(req.tokens), cached_tokens=0, completion_tokens=len(pieces))
        events = [Event(text=p, tokens=[ord(p[0]) if p else 0]) for p in pieces]
        return events + [Event(finish=finish, usage=usage)]

    return script


def fail(after: int, kind: ErrorKind = ErrorKind.TIMEOUT, message: str = "the request passed its deadline") -> Script:
    """A script that sends `after` text pieces, then an engine error."""

    def script(req: GenerateRequest) -> list[Event]:
        return [Event(text="x", tokens=[120]) for _ in range(after)] + [Event(error=EngineError(kind, message))]

    return script


class FakeEngine:
    """Answers each submitted request on a thread of its own with the events `script` gives."""

    def __init__(self, script: Script | None = None, n_ctx_slot: int = 4096, delay_s: float = 0.0) -> None:
        self.script = script or reply("Hello", " world")
        self.delay_s = delay_s  # between two events of a request
        self.vocab = FakeVocab()
        self.info = SimpleNamespace(
            n_vocab=FakeVocab.n_vocab, n_ctx_slot=n_ctx_slot, chat_template=None, arch="fake", fingerprint="f" * 16,
            capacity=None, model_name="fake", n_slots=4, n_params=0,
        )
        self.started = False
        self.submitted: list[GenerateRequest] = []
        self.aborted: set[str] = set()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def start(self) -> None:
        self.started = True
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._inbox.put(None)

    def wait_ready(self) -> None:
        pass

    def submit(self, req: GenerateRequest) -> None:
        self.submitted.append(req)
        self._inbox.put(req)

    def abort(self, req_id: str) -> None:
        self.aborted.add(req_id)

    def _run(self) -> None:
        while (req := self._inbox.get()) is not None:
            req.sink.push([Event(started=True)])
            for ev in self.script(req):
                if req.id in self.aborted:
                    break
                req.sink.push([ev])
                time.sleep(self.delay_s)
