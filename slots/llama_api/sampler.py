"""Native sampler chains, and checking grammars against llama.cpp's compiler."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
import enum
import math
from typing import Protocol, Sequence

import numpy as np

from .context import Context
from .grammar import GrammarError, GrammarSpec, shape_error
from .model import Model

# top-k up to this many is taken in numpy (`_top_k`); a larger k goes through the chain's own
TOP_K_FAST = 256
# where a grammar forbids one of the k best, how many of the best it is asked about next
WIDE_TOP = 1024
_BLOCK = 256  # `_top_k`: the maxima of blocks this long bound the k-th largest logit


class TokenForcer(Protocol):
    """Tokens forced over the model's choice (the engine's reasoning budget): asked before
    each draw, told every token drawn."""

    def forced_token(self) -> int | None: ...

    def accept(self, token: int) -> None: ...


class ChainParams(Protocol):
    """What a sampler chain is built from (the engine's `SamplingParams`)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    frequency_penalty: float
    presence_penalty: float
    seed: int | None
    logit_bias: dict[int, float]
    grammar: GrammarSpec | None

    @property
    def greedy(self) -> bool: ...

    def token_forcer(self) -> TokenForcer | None:
        """A fresh forcer for one request's draws (None: nothing is forced)."""


class NoToken(str, enum.Enum):
    """Why no token could be sampled from a row of logits."""

    NAN = "NaN"  # the model wrote a NaN logit
    POS_INF = "+inf"  # a logit of +inf: its softmax is NaN
    ALL_NEG_INF = "-inf"  # every logit is -inf
    NO_CANDIDATE = "no candidate"  # the request's grammar or logit_bias allows no token here

    @property
    def model_output(self) -> bool:
        """The model's own logits are broken (not the request's constraints)."""
        return self is not NoToken.NO_CANDIDATE


class SamplingFailed(Exception):
    """A row of logits gives no token: raised by `Sampler.sample` before the chain accepts
    anything, so the request can end with an error and every other one go on (llama.cpp
    itself would abort the process on an empty candidate set or a grammar's dead end)."""

    def __init__(self, cause: NoToken, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause
        self.detail = detail


class Sampler:
    """A native llama.cpp sampler chain for one request."""

    _token_ids: np.ndarray | None = None

    def __init__(self, model: Model, params: ChainParams) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        self.n_vocab = model.n_vocab
        self.budget = params.token_forcer()
        # a chain of the greedy sampler alone keeps no state: its token is the logits' first
        # maximum, which numpy finds in place (llama_sampler_sample first copies the whole
        # vocabulary into a candidate array: a third of a millisecond a row at 152k tokens)
        unbiased = not params.logit_bias and (
            params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0)
        self._argmax = params.greedy and params.grammar is None and unbiased and self.budget is None
        # a chain that keeps the k best logits first (top-k, or greedy: k = 1) and has no
        # bias or penalties, while no token is forced: llama.cpp would copy the whole vocabulary into a
        # candidate array and partially sort it (half a millisecond a token at 248k tokens),
        # so the k best are found in numpy and the whole chain runs on those alone (`_draw_top`):
        # the same candidates in the same order, the same random number, the same token (see
        # tests/engine/test_sampling_fast.py). A grammar is asked first about those k alone
        # (`_allowed`): it rules on each token apart, and where it allows all of them they
        # are also the k best that it allows; where it does not, a wider set is asked, then
        # the whole vocabulary.
        self._k = 1 if params.greedy else params.top_k
        self._candidates: np.ndarray | None = None  # the full chain's candidate array, reused
        self._why_empty = _why_empty(params)
        # a grammar's sampler aborts the process when asked to accept a token it forbids:
        # its chain draws from candidates of ours, checked before anything is accepted
        self._guarded = params.grammar is not None
        self._impossible = params.logit_bias  # tokens of bias -inf are impossible
        self._top_first = unbiased and 0 < self._k <= TOP_K_FAST
        self._grammar_smpl = None  # the chain's grammar sampler (its first), asked apart
        try:
            for smpl in self._build(model, params):
                llama_cpp.llama_sampler_chain_add(self.ptr, smpl)
            if self._guarded:
                self._grammar_smpl = llama_cpp.llama_sampler_chain_get(self.ptr, 0)
        except BaseException:
            self.close()
            raise

    def _build(self, model: Model, p: ChainParams):
        if p.grammar is not None:
            yield self._grammar(model, p.grammar)
        if p.logit_bias:
            n = len(p.logit_bias)
            arr = (llama_cpp.llama_logit_bias * n)()
            for i, (tok, bias) in enumerate(p.logit_bias.items()):
                arr[i].token = tok
                arr[i].bias = bias
            yield llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, n, arr)
        if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            yield llama_cpp.llama_sampler_init_penalties(
                self.n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        if p.greedy:
            yield llama_cpp.llama_sampler_init_greedy()
            return
        if p.top_k > 0:
            yield llama_cpp.llama_sampler_init_top_k(p.top_k)
        if p.top_p < 1.0:
            yield llama_cpp.llama_sampler_init_top_p(p.top_p, 1)
        if p.min_p > 0.0:
            yield llama_cpp.llama_sampler_init_min_p(p.min_p, 1)
        yield llama_cpp.llama_sampler_init_temp(p.temperature)
        seed = llama_cpp.LLAMA_DEFAULT_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        yield llama_cpp.llama_sampler_init_dist(seed)

    @staticmethod
    def _grammar(model: Model, spec: GrammarSpec):
        error = shape_error(spec.grammar)
        if error is not None:
            raise GrammarError(error)
        smpl = _init_grammar(model, spec)
        if not smpl:
            raise GrammarError("llama.cpp could not parse the grammar")
        return smpl

    def sample(self, ctx: Context, index: int) -> int:
        """Sample from the logits of batch output `index`; the chain accepts the token.

        Raises `SamplingFailed`, with nothing accepted, when the row holds a NaN or a +inf,
        every logit is -inf, or the grammar and logit_bias leave no candidate: llama.cpp
        would abort the process on the empty candidate set, or on a grammar asked to accept
        a token it forbids."""
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ptr, index), shape=(self.n_vocab,))
        if self._argmax:
            token = int(np.argmax(row))
            # NOTE: argmax stops at the first NaN, and a +inf or an all -inf row is the maximum
            # itself: one value tells whether the row can be sampled
            _require_finite(row[token])
            return token
        forced = self.budget is not None and self.budget.forced_token() is not None
        if self._top_first or self._guarded or forced:
            return self.sample_logits(row)
        _require_finite(row.max())  # one vectorized pass: a NaN makes the maximum NaN
        # NOTE: llama.cpp's own draw fills its candidate array faster than numpy fills ours
        # (1.4 against 1.6 ms at 262k tokens). Without a grammar nothing in the chain aborts
        # on an impossible token, and the chain selects one only when every token is
        # impossible: the selection tells, after the fact
        token = int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, index))
        if self._impossible and self._impossible.get(token) == -math.inf:
            raise SamplingFailed(NoToken.NO_CANDIDATE, self._why_empty)
        if self.budget is not None:
            self.budget.accept(token)
        return token

    def sample_logits(self, logits: np.ndarray) -> int:
        """Sample from a row of logits (saved, or the context's own, which is only read):
        the same chain, acceptance and failures as `sample`."""
        forced = self.budget.forced_token() if self.budget is not None else None
        token = self._draw_top(logits) if self._top_first and forced is None else None
        if token is None:
            token = self._draw_whole(logits, forced)
        if self.budget is not None:
            self.budget.accept(token)
        return token

    def _draw_whole(self, logits: np.ndarray, forced: int | None) -> int:
        """The chain's draw over the whole vocabulary (only `forced`, where it is given)."""
        # one vectorized pass: a NaN anywhere makes the maximum NaN, a +inf makes it +inf
        _require_finite(logits.max())
        if forced is not None:
            # NOTE: only the forced token stays a candidate, so the grammar and the penalties
            # of the chain see it as they would see a sampled token
            keep = float(logits[forced])
            logits = np.full_like(logits, -np.inf)
            logits[forced] = keep if np.isfinite(keep) else 0.0
        return self._sample_array(logits)

    def _sample_array(self, logits: np.ndarray) -> int:
        n = logits.shape[0]
        if Sampler._token_ids is None or Sampler._token_ids.shape[0] != n:
            Sampler._token_ids = np.arange(n, dtype=np.int32)
        if self._candidates is None or self._candidates.shape[0] != n:
            self._candidates = np.empty(n, dtype=_TOKEN_DATA)
        return _draw(self.ptr, Sampler._token_ids, logits, is_sorted=False, out=self._candidates, why_empty=self._why_empty)

    def _draw_top(self, logits: np.ndarray) -> int | None:
        """The chain's draw from the k best logits (sorted as llama.cpp sorts them,
        descending); None where the grammar allows fewer than k of the WIDE_TOP best (the
        whole vocabulary is then asked). A row with a NaN or a +inf, or only -inf, raises."""
        ids = _top_k(logits, self._k)
        if self._grammar_smpl is not None:
            ids = self._allowed(ids, logits)
            if ids is None and self._k < WIDE_TOP < logits.shape[0]:
                ids = self._allowed(_top_k(logits, WIDE_TOP), logits)
            if ids is None:
                return None
        return _draw(self.ptr, ids, logits[ids], is_sorted=True, why_empty=self._why_empty)

    def _allowed(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray | None:
        """The first k of `ids` (in order) that the grammar allows now, or None when it
        allows fewer (or one of them is -inf already: the whole chain then decides)."""
        data = _candidates(ids, logits[ids])
        if not np.isfinite(data["logit"]).all():
            return None
        arr = _array(data, is_sorted=True)
        llama_cpp.llama_sampler_apply(self._grammar_smpl, ctypes.byref(arr))
        kept = ids[np.isfinite(data["logit"])]
        return kept[: self._k] if len(kept) >= self._k else None

    def close(self) -> None:
        self._candidates = None
        self._grammar_smpl = None  # owned by the chain
        if getattr(self, "ptr", None):
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


def _why_empty(p: ChainParams) -> str:
    """What leaves a chain of these parameters without a candidate (`SamplingFailed`)."""
    bias = any(b == -math.inf for b in p.logit_bias.values())
    if p.grammar is not None and bias:
        return "the grammar and logit_bias allow no token here"
    if p.grammar is not None:
        return "the grammar allows no token here (a dead end)"
    if bias:
        return "logit_bias removes every token"
    return "the sampling settings leave no token"


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


def _require_finite(top) -> None:
    """Raise SamplingFailed unless `top`, the maximum of a row (or the logit argmax found),
    is a finite number."""
    if np.isfinite(top):
        return
    if np.isnan(top):
        raise SamplingFailed(NoToken.NAN, "the model's logits hold a NaN")
    if top > 0:
        raise SamplingFailed(NoToken.POS_INF, "the model's logits hold +inf")
    raise SamplingFailed(NoToken.ALL_NEG_INF, "every one of the model's logits is -inf")


def _candidates(ids: np.ndarray, logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A llama_token_data array of these ids and logits (written into `out` when given)."""
    data = np.empty(len(ids), dtype=_TOKEN_DATA) if out is None else out
    data["id"] = ids
    data["logit"] = logits
    data["p"] = 0.0
    return data


def _array(data: np.ndarray, is_sorted: bool):
    """A llama_token_data_array over `data` (which must outlive it)."""
    return llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=len(data), selected=-1,
        sorted=is_sorted,
    )


def _draw(chain, ids: np.ndarray, logits: np.ndarray, *, is_sorted: bool, why_empty: str, out: np.ndarray | None = None) -> int:
    """Apply `chain` to the candidates (ids and their logits, copied into `out` when given);
    the chain accepts the token it selects, which is returned. A selection that is no
    candidate (the chain emptied the set, or every candidate left is -inf) raises
    SamplingFailed before anything is accepted."""
    data = _candidates(ids, logits, out)
    arr = _array(data, is_sorted)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
    if not 0 <= arr.selected < arr.size:
        raise SamplingFailed(NoToken.NO_CANDIDATE, why_empty)
    chosen = ctypes.cast(arr.data, ctypes.POINTER(llama_cpp.llama_token_data))[arr.selected]
    # a grammar or a logit_bias of -inf marks a token impossible with -inf: a chain that
    # selects one had nothing else (a grammar's dead end); accepting it would abort
    if not chosen.logit > -math.inf:
        raise SamplingFailed(NoToken.NO_CANDIDATE, why_empty)
    token = int(chosen.id)
    llama_cpp.llama_sampler_accept(chain, token)
    return token


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits, largest first (ties by id). The k-th largest maximum
    of blocks of logits (_BLOCK long, shorter where the row has fewer than 2k such blocks)
    is a floor that at least k logits reach (each of those k blocks holds one), so only the
    logits at or above it are sorted. A row with a NaN or a +inf, or only -inf, raises
    SamplingFailed (a NaN floor would select nothing, and llama.cpp aborts on an empty
    candidate set)."""
    n = logits.shape[0]
    k = min(k, n)
    block = min(_BLOCK, max(1, n // (2 * k)))
    full = n // block * block
    if full // block < k:
        _require_finite(logits.max())
        floor = -np.inf
    else:
        maxima = logits[:full].reshape(-1, block).max(axis=1)
        # the blocks' maxima carry a NaN or a +inf of the row (np.max and np.maximum keep a
        # NaN): checking them and the short tail is checking the row
        top = maxima.max() if full == n else np.maximum(maxima.max(), logits[full:].max())
        _require_finite(top)
        floor = np.partition(maxima, len(maxima) - k)[len(maxima) - k]
    ids = np.flatnonzero(logits >= floor)
    order = np.lexsort((ids, -logits[ids]))[:k]
    return ids[order].astype(np.int32)


def trigger_tokens(model: Model, texts: Sequence[str]) -> list[int]:
    """The ids of the trigger texts that are exactly one token of the vocabulary."""
    ids = []
    for text in texts:
        tokens = model.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1:
            ids.append(tokens[0])
    return ids


def _init_grammar(model: Model | None, spec: GrammarSpec):
    """A native grammar sampler for `spec`, or NULL when llama.cpp rejects it: with a model,
    a copy of the one compiled for the same spec before (`GrammarTemplates`). Without a
    model the grammar is compiled without a vocabulary, and trigger texts are left out."""
    if model is None:
        return _compile_grammar(None, spec)
    return model.grammars.sampler(spec, lambda spec: _compile_grammar(model, spec))


def _compile_grammar(model: Model | None, spec: GrammarSpec):
    vocab = model.vocab if model is not None else None
    text, root = spec.grammar.encode(), spec.root.encode()
    if not spec.lazy:
        return llama_cpp.llama_sampler_init_grammar(vocab, text, root)
    tokens = trigger_tokens(model, spec.trigger_texts) if model is not None else []
    patterns = [pattern.encode() for pattern in spec.trigger_patterns]
    pats = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
    toks = (llama_cpp.llama_token * max(1, len(tokens)))(*tokens)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, text, root, pats, len(patterns), toks, len(tokens))


def check_grammar(model: Model | None, spec: GrammarSpec) -> str | None:
    """Why llama.cpp would refuse `spec`, or None when it compiles (with `model`'s vocabulary,
    or none).

    A grammar beyond the limits of `grammar.shape_error` is refused without calling llama.cpp,
    whose compiler would otherwise run unbounded or overflow its stack. Thread-safe (it only
    reads the vocabulary); within the limits compiling takes up to a few tenths of a second,
    so call it off the event loop.
    """
    error = shape_error(spec.grammar)
    if error is not None:
        return error
    sampler = _init_grammar(model, spec)
    if not sampler:
        return "llama.cpp could not parse the grammar"
    llama_cpp.llama_sampler_free(sampler)
    return None
