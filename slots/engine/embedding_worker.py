"""Embeddings on a context of their own, owned by one worker thread.

The generation context belongs to the engine thread and its slots; embeddings use a second
context on the same model (no second copy of the weights), with embeddings on and the
chosen pooling, so an embedding request neither waits for a slot nor disturbs what the
slots hold. Vectors are L2-normalized, as llama-server's /v1/embeddings returns them.

Inputs are decoded together, as many as one batch holds (`EmbeddingContext.groups`): 2,048
one-word inputs take a few dozen decodes, not 2,048. The worker checks between decodes
whether the request was cancelled.

NOTE: an input's vector depends slightly on what shares its decode. llama.cpp's CPU kernels
take other paths at other batch sizes: on the default Gemma 3 270M an input's vector moved by
at most 3e-3 (cosine 0.9999) between decoding it alone and with three others. The KV cache is
one pool (`kv_unified`): with a stream per sequence the drift was a few percent. Flash
attention stays off unless asked for (`-fa on`): llama.cpp's CPU kernel rounds through f16
over the KV cells.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
from typing import Protocol, Sequence

import numpy as np

from ..fitting.gguf_tensors import tensor_sizes
from ..llama_api import Model
from ..llama_api.embedding import EmbeddingContext, model_pooling

log = logging.getLogger("warmslot.embeddings")

N_SEQ = 64  # the most inputs one llama_decode takes
CHUNK = 64  # tokens per decode of a generative model's input: its buffers hold that many tokens' logits


class Job(Protocol):
    """What the caller gives to follow and cancel one request's work (any thread)."""

    def start(self) -> bool: ...

    def cancelled(self) -> bool: ...


class InputTooLong(ValueError):
    """An input has more tokens than the embedding context holds."""

    def __init__(self, index: int, n_tokens: int, n_ctx: int) -> None:
        super().__init__(f"input {index} has {n_tokens} tokens; an embedding input holds at most {n_ctx}")
        self.index = index


def choose_pooling(model: Model, setting: str) -> str:
    """--pooling: "auto" takes the model's own pooling, or mean for a model that declares
    none (a generative model has no pooled output of its own)."""
    if setting != "auto":
        return setting
    declared = model_pooling(model)
    return "mean" if declared in ("none", "rank") else declared


class Embedder:
    purpose = "embeddings"

    def __init__(self, model: Model, *, pooling: str, n_ctx: int, n_threads: int = 0, flash_attn: str = "off") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="warmslot-embed")
        self.pooling = choose_pooling(model, pooling)
        fa = "on" if flash_attn == "on" else "off"

        # a generative model (no pooling of its own) is causal: its inputs go in chunks
        chunk = CHUNK if model_pooling(model) in ("none", "rank") and self.pooling != "rank" else 0

        def make() -> EmbeddingContext:
            return EmbeddingContext(
                model, n_ctx=n_ctx, n_seq=N_SEQ, pooling=self.pooling, n_threads=n_threads, flash_attn=fa, chunk=chunk,
            )

        self._ctx = self._pool.submit(make).result()
        self.n_ctx = self._ctx.n_ctx
        self.memory_bytes = _memory_bound(model, self._ctx.n_ctx, chunk or self._ctx.n_ctx)
        self.n_embd = self._ctx.n_embd
        log.info("%s: %s pooling, inputs up to %d tokens, %d dimensions", self.purpose, self.pooling, self.n_ctx, self.n_embd)

    def check(self, inputs: Sequence[Sequence[int]]) -> None:
        """Raise InputTooLong for an input the context cannot hold (any thread)."""
        for i, tokens in enumerate(inputs):
            if len(tokens) > self.n_ctx:
                raise InputTooLong(i, len(tokens), self.n_ctx)

    def embed(self, inputs: Sequence[Sequence[int]], *, job: "Job | None" = None) -> concurrent.futures.Future:
        """A Future of one normalized float32 vector per input, in order (pooling "none": a
        matrix of one vector per token, not normalized). `job`: the worker
        calls `job.start()` first (False: skip the work) and stops between decodes once
        `job.cancelled()` (the Future's result is then incomplete; the waiter ignores it)."""
        self.check(inputs)
        return self._pool.submit(self._embed, [list(t) for t in inputs], job)

    def _embed(self, inputs: list[list[int]], job: "Job | None") -> list[np.ndarray]:
        if job is not None and not job.start():
            return []
        # each distinct input is decoded once: copies get its vector, exactly
        first: dict[tuple[int, ...], int] = {}
        where = [first.setdefault(tuple(t), len(first)) for t in inputs]
        distinct = list(map(list, first))
        out: list[np.ndarray] = []
        if self.pooling == "none":  # a vector per token, as llama.cpp gives them (not normalized)
            for tokens in distinct:
                if job is not None and job.cancelled():
                    return out
                out.append(self._ctx.per_token(tokens))
            return [out[i] for i in where]
        for group in self._ctx.groups(distinct):
            if job is not None and job.cancelled():
                return out
            out += [_normalized(v) for v in self._ctx.pooled([distinct[i] for i in group])]
        return [out[i] for i in where]

    def close(self) -> None:
        self._pool.submit(self._ctx.close).result()
        self._pool.shutdown(wait=True)


class Reranker(Embedder):
    """Relevance scores of (query, document) pairs (--reranking): a context of its own with
    llama.cpp's rank pooling, a classifier's output for a reranker model. Pairs are decoded
    together as embedding inputs are."""

    purpose = "reranking"

    def __init__(self, model: Model, *, n_ctx: int, n_threads: int = 0, flash_attn: str = "off") -> None:
        super().__init__(model, pooling="rank", n_ctx=n_ctx, n_threads=n_threads, flash_attn=flash_attn)
        self.template = model.named_template("rerank")  # with {query} and {document}
        self._bos = [model.bos] if model.add_bos and model.bos >= 0 else []
        eos = model.eos if model.eos >= 0 else model.sep
        self._eos = [eos] if model.add_eos and eos >= 0 else []
        self._sep = [model.sep] if model.add_sep and model.sep >= 0 else []
        # NOTE: llama.cpp reads pair k's score at float k of the pooled rows, which holds for
        # a classifier's rows of n_cls_out values only: without one (rows of n_embd) every
        # pair but the first of a decode would read another's value, so each gets its own
        self.together = "cls.output.weight" in tensor_sizes(model.info.path)

    def prompt(self, vocab: "Tokenizes", query: str, document: str) -> list[int]:
        """One pair's tokens: the model's rerank template, else BOS query EOS SEP document EOS
        (each special token where the vocabulary adds it), as llama-server builds them."""
        if self.template is not None:
            fields = {"{query}": query, "{document}": document}
            text = re.sub(r"\{query\}|\{document\}", lambda m: fields[m.group(0)], self.template)
            return vocab.tokenize(text, add_special=False, parse_special=True)
        q = vocab.tokenize(query, add_special=False, parse_special=False)
        d = vocab.tokenize(document, add_special=False, parse_special=False)
        return self._bos + q + self._eos + self._sep + d + self._eos

    def score(self, inputs: Sequence[Sequence[int]], *, job: "Job | None" = None) -> concurrent.futures.Future:
        """A Future of one score per input, in order (`job` as for `embed`)."""
        self.check(inputs)
        return self._pool.submit(self._score, [list(t) for t in inputs], job)

    def _score(self, inputs: list[list[int]], job: "Job | None") -> list[float]:
        if job is not None and not job.start():
            return []
        out: list[float] = []
        groups = self._ctx.groups(inputs) if self.together else [range(i, i + 1) for i in range(len(inputs))]
        for group in groups:
            if job is not None and job.cancelled():
                break
            out += self._ctx.scores([inputs[i] for i in group])
        return out


class Tokenizes(Protocol):
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]: ...


def _memory_bound(model: Model, n_ctx: int, n_batch: int) -> int:
    """About the most the embedding context takes: its f16 KV cache for `n_ctx` tokens, and
    for `n_batch` tokens the outputs (logits and vectors) twice, once in the compute buffer
    and once copied out."""
    kv = (model.kv_bytes_per_token("f16", "f16") or 0) * n_ctx
    return kv + 2 * n_batch * (model.info.n_vocab + model.info.n_embd) * 4


def _normalized(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)
