"""SamplerChain: logits -> one token, in llama.cpp's order, with a grammar check at the end.

    logit bias -> penalties -> DRY -> top-n-sigma -> top-k -> typical -> top-p -> min-p
               -> XTC -> temperature -> seeded draw

The middle (penalties .. temperature) follows `options.samplers` when given. Mirostat
1/2 replaces it with penalties -> temperature -> mirostat draw. Temperature <= 0 is
greedy: only the logit-rewriting samplers (bias, penalties, DRY) run, then argmax, and
no random number is drawn.

With a grammar, the token is drawn as usual and then checked; only when the grammar
rejects it is the draw repeated over the acceptable tokens. When only the k best of those
can matter (greedy, or a top-k preceded only by per-token rewrites) they are found by
checking tokens best-first; otherwise the whole vocabulary is masked (token_mask.py).
Both give the same token. Text the grammar forces is written in whole tokens, not
letter by letter (_whole_pieces_of_forced_text).
"""

from __future__ import annotations

import copy
from typing import Iterable, Sequence

import numpy as np

from pyengine import _core
from pyengine.errors import InvalidOptionError, SamplingError
from pyengine.sample.candidates import Candidates, top_k_positions
from pyengine.sample.dry import Dry, build_breakers
from pyengine.sample.grammar import Grammar
from pyengine.sample.options import SamplingOptions
from pyengine.sample.samplers import (
    Dist, LogitBias, MinP, Mirostat, MirostatV2, Penalties, Temperature, TopK, TopNSigma,
    TopP, Typical, Xtc)
from pyengine.sample.token_mask import TokenIndex

# Samplers that rewrite logits without removing candidates; greedy decoding runs only these.
_REWRITERS = ("penalties", "dry")
# Best-first grammar search gives up after checking this many tokens and masks the vocabulary.
_LAZY_CHECK_LIMIT = 1024
# Forced text is looked at this many bytes ahead; tokens covering it are checked up to this many.
_FORCED_LOOKAHEAD = 64
_COVER_CHECK_LIMIT = 512


def _keeps_ranking(sampler) -> bool:
    """Whether a sampler before top-k leaves the choice of the k best to per-token logits."""
    if isinstance(sampler, (LogitBias, Penalties, Dry)):
        return True
    if isinstance(sampler, Temperature):
        return sampler.dyn_range <= 0.0 and sampler.temperature > 0.0
    if isinstance(sampler, TopNSigma):
        return sampler.n <= 0.0
    if isinstance(sampler, (Typical, TopP)):
        return sampler.p >= 1.0
    if isinstance(sampler, MinP):
        return sampler.p <= 0.0
    if isinstance(sampler, Xtc):
        return sampler.probability <= 0.0 or sampler.threshold > 0.5
    return False


class SamplerChain:
    """Per-sequence sampling state: the samplers, their history, the RNG, the grammar matcher."""

    def __init__(self, options: SamplingOptions, n_vocab: int, token_pieces: Sequence[bytes] | None = None,
                 eog_ids: Iterable[int] = (), grammar: Grammar | None = None, *,
                 n_ctx: int | None = None) -> None:
        if not isinstance(options, SamplingOptions):
            raise InvalidOptionError(f"options must be SamplingOptions, got {type(options).__name__}")
        if isinstance(n_vocab, bool) or not isinstance(n_vocab, (int, np.integer)) or n_vocab <= 0:
            raise InvalidOptionError(f"n_vocab must be a positive integer, got {n_vocab!r}")
        self.options = options
        self.n_vocab = int(n_vocab)
        self.token_pieces = _check_pieces(token_pieces, self.n_vocab)
        self.eog_ids = frozenset(_check_token(t, self.n_vocab, "eog_ids") for t in eog_ids)
        self._n_ctx = n_ctx
        self._rng = np.random.default_rng(options.seed)
        self._ids = _token_ids(self.n_vocab)
        self._greedy = options.temperature <= 0.0
        self._bias = LogitBias(_check_bias(options.logit_bias, self.n_vocab))
        self._samplers = self._build_samplers()
        self._draw = self._build_draw()
        self._grammar = grammar
        self._matcher = grammar.matcher() if grammar is not None else None
        self._token_index: TokenIndex | None = None
        if grammar is not None and self.token_pieces is None:
            raise InvalidOptionError("grammar-constrained sampling needs token_pieces")

    # ---- construction

    def _last_n(self, value: int) -> int | None:
        """-1 means the whole context (or the whole history when the context size is unknown)."""
        return (self._n_ctx if self._n_ctx else None) if value == -1 else value

    def _build_samplers(self) -> list:
        opts = self.options
        order = opts.sampler_order()
        if opts.mirostat:
            order = tuple(name for name in order if name == "penalties") + ("temperature",)
        if self._greedy:
            order = tuple(name for name in order if name in _REWRITERS)
        samplers = [self._bias] if self._bias.active else []
        for name in order:
            samplers.append(self._make(name))
        return samplers

    def _make(self, name: str):
        opts = self.options
        if name == "penalties":
            return Penalties(self._last_n(opts.repeat_last_n), opts.repeat_penalty,
                             opts.frequency_penalty, opts.presence_penalty)
        if name == "dry":
            enabled = opts.dry_multiplier != 0.0 and opts.dry_penalty_last_n != 0
            breakers = build_breakers(self.token_pieces, opts.dry_sequence_breakers) if enabled else None
            return Dry(opts.dry_multiplier, opts.dry_base, opts.dry_allowed_length,
                       self._last_n(opts.dry_penalty_last_n), breakers)
        if name == "top_n_sigma":
            return TopNSigma(opts.top_n_sigma)
        if name == "top_k":
            return TopK(opts.top_k)
        if name == "typ_p":
            return Typical(opts.typical_p)
        if name == "top_p":
            return TopP(opts.top_p)
        if name == "min_p":
            return MinP(opts.min_p)
        if name == "xtc":
            return Xtc(opts.xtc_probability, opts.xtc_threshold, self._rng)
        if name == "temperature":
            dyn_range = 0.0 if opts.mirostat else opts.dynatemp_range
            return Temperature(opts.temperature, dyn_range, opts.dynatemp_exponent)
        raise InvalidOptionError(f"unknown sampler {name!r}")

    def _build_draw(self):
        opts = self.options
        if self._greedy:
            return None
        if opts.mirostat == 1:
            return Mirostat(self.n_vocab, opts.mirostat_tau, opts.mirostat_eta, self._rng)
        if opts.mirostat == 2:
            return MirostatV2(self.n_vocab, opts.mirostat_tau, opts.mirostat_eta, self._rng)
        return Dist(self._rng)

    # ---- public API

    @property
    def samplers(self) -> list:
        """The sampler objects in the order they run (the draw excluded)."""
        return list(self._samplers)

    @property
    def grammar_state(self):
        """The grammar matcher (None without a grammar); copy it to fork a sequence."""
        return self._matcher

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token from float logits [n_vocab]; the caller's array is not modified."""
        if self._greedy and self._matcher is None:
            token = self._plain_greedy(logits)
            if token is not None:
                return token
        raw, best = self._checked_best(logits)
        token = self._pick(raw, None, best)
        if self._matcher is None:
            return token
        if not self._grammar_allows(token):
            allowed = self._grammar_top_allowed(raw)
            if allowed is None:
                allowed = self._grammar_allowed_ids()
            if allowed.size == 0:
                raise SamplingError("the grammar allows no token of the vocabulary here")
            token = self._pick(raw, allowed)
        return self._whole_pieces_of_forced_text(raw, token)

    def accept(self, token: int) -> None:
        """Record a generated token: penalty/DRY history, mirostat's mu, grammar state."""
        token = _check_token(token, self.n_vocab, "token")
        if self._matcher is not None:
            self._advance_grammar(token)
        for sampler in self._samplers:
            if hasattr(sampler, "accept"):
                sampler.accept(token)
        if self._draw is not None and hasattr(self._draw, "accept"):
            self._draw.accept(token)

    def accept_prompt(self, tokens: Iterable[int]) -> None:
        """Add prompt tokens to the penalty and DRY history (the grammar and mirostat are
        untouched), as llama.cpp's server does so that repeats of the prompt are penalised."""
        ids = [_check_token(token, self.n_vocab, "token") for token in tokens]
        for sampler in self._samplers:
            if isinstance(sampler, (Penalties, Dry)):
                sampler.accept_many(ids)

    def logprobs(self, logits: np.ndarray, token: int, n_top: int) -> tuple[float, list[tuple[int, float]]]:
        """Log-softmax of the raw logits: the token's log-probability and the n_top best."""
        raw, _ = self._checked_best(logits)
        token = _check_token(token, self.n_vocab, "token")
        top = float(raw.max())
        log_norm = top + float(np.log(np.sum(np.exp(raw - top, dtype=np.float32), dtype=np.float64)))
        best = top_k_positions(raw, min(max(int(n_top), 0), self.n_vocab))
        return float(raw[token]) - log_norm, [(int(i), float(raw[i]) - log_norm) for i in best]

    def reset(self) -> None:
        """Forget all history: penalties, DRY, mirostat's mu, grammar; re-seed the RNG."""
        fresh = np.random.default_rng(self.options.seed)
        self._rng.bit_generator.state = fresh.bit_generator.state
        for sampler in [*self._samplers, self._draw]:
            if hasattr(sampler, "reset"):
                sampler.reset()
        if self._grammar is not None:
            self._matcher = self._grammar.matcher()

    def clone(self) -> "SamplerChain":
        """An independent copy with the same history, RNG state and grammar state."""
        shared = (self.token_pieces, self._grammar, self._token_index, self.options, self._ids)
        memo = {id(item): item for item in shared if item is not None}
        return copy.deepcopy(self, memo)

    # ---- internals

    def _checked_row(self, logits: np.ndarray) -> np.ndarray:
        """The logits as contiguous float32 [n_vocab], their shape and type checked."""
        raw = np.asarray(logits)
        if raw.ndim != 1 or raw.shape[0] != self.n_vocab:
            raise SamplingError(f"logits must have shape ({self.n_vocab},), got {raw.shape}")
        if raw.dtype != np.float32:
            if not np.issubdtype(raw.dtype, np.floating):
                raise SamplingError(f"logits must be floating point, got {raw.dtype}")
            raw = raw.astype(np.float32)
        return np.ascontiguousarray(raw)

    def _checked_best(self, logits: np.ndarray) -> tuple[np.ndarray, int]:
        """The logits as float32 [n_vocab], validated, and the id of the largest."""
        raw = self._checked_row(logits)
        # argmax returns the first NaN if there is one, so one pass checks everything.
        best_id = int(np.argmax(raw))
        _check_best(raw[best_id], np.isnan(raw[best_id]))
        return raw, best_id

    def _rewriting(self) -> list:
        """The samplers of the chain that change logits with their current settings."""
        return [s for s in self._samplers if getattr(s, "active", True)]

    def _plain_greedy(self, logits: np.ndarray) -> int | None:
        """Greedy when no sampler rewrites a logit, or penalties alone do (the default
        chain at temperature 0), natively: one pass over the row for the best id outside
        the penalised ones and any NaN, the few penalised logits rewritten apart, the
        better of the two winning (the lower id on a tie); the logits checked as
        _checked_best checks them.  None for any other chain, or when the penalties leave
        nothing finite (the general path then says why)."""
        rewriting = self._rewriting()
        if len(rewriting) > 1 or (rewriting and not isinstance(rewriting[0], Penalties)):
            return None
        raw = self._checked_row(logits)
        if not rewriting:
            best, nan = _core.best_outside(raw)
            _check_best(raw[best] if best >= 0 else -np.inf, nan)
            return best
        penalties = rewriting[0]
        ids, counts = penalties.sorted_window()
        token, status = _core.greedy_penalised(raw, ids, counts, penalties.repeat, penalties.frequency,
                                               penalties.presence)
        if status:
            raise SamplingError(_PROBLEMS[status])
        return token if token >= 0 else None

    def _candidates(self, raw: np.ndarray, subset: np.ndarray | None) -> Candidates:
        if subset is None:
            return Candidates(self._ids, raw.copy(), identity=True)
        return Candidates(subset, raw[subset])

    def _pick(self, raw: np.ndarray, subset: np.ndarray | None, best: int | None = None) -> int:
        """best: the id of raw's largest logit, when subset is None."""
        if self._greedy:
            return self._pick_greedy(raw, subset, best)
        cand = self._candidates(raw, subset)
        for sampler in self._samplers:
            sampler.apply(cand)
        if len(cand) == 0 or not np.isfinite(cand.logits).any():
            raise SamplingError("no candidate token with a finite logit is left to sample")
        return self._draw.select(cand)

    def _pick_greedy(self, raw: np.ndarray, subset: np.ndarray | None, best: int | None) -> int:
        rewriting = self._rewriting()
        if subset is None and not rewriting:
            return int(np.argmax(raw)) if best is None else best
        if subset is None and best is not None:
            token = _greedy_among_touched(raw, best, rewriting)
            if token is not None:
                return token
        cand = self._candidates(raw, subset)
        for sampler in rewriting:
            sampler.apply(cand)
        best = int(np.argmax(cand.logits))
        if cand.logits[best] == -np.inf:
            raise SamplingError("no candidate token with a finite logit is left to sample")
        return int(cand.ids[best])

    def _grammar_allows(self, token: int) -> bool:
        if token in self.eog_ids:
            return self._matcher.can_end()
        piece = self.token_pieces[token]
        return bool(piece) and self._matcher.accepts(piece)

    def _index(self) -> TokenIndex:
        if self._token_index is None:
            self._token_index = TokenIndex.for_pieces(self.token_pieces, self.eog_ids)
        return self._token_index

    def _lazy_k(self) -> int | None:
        """k when only the k best acceptable tokens can matter: greedy (k = 1), or a top-k
        preceded only by samplers that rewrite logits per token or keep the ranking."""
        if self._greedy:
            return 1
        for sampler in self._samplers:
            if isinstance(sampler, TopK):
                return sampler.k if sampler.k > 0 else None
            if not _keeps_ranking(sampler):
                return None
        return None

    def _grammar_top_allowed(self, raw: np.ndarray) -> np.ndarray | None:
        """The k best acceptable tokens (ranked as the chain would), found by checking tokens
        best-first; None when k does not apply or the search gets too long (use the mask)."""
        k = self._lazy_k()
        if k is None:
            return None
        cand = self._candidates(raw, None)
        for sampler in self._samplers:
            if isinstance(sampler, TopK):
                break
            if getattr(sampler, "active", False):
                sampler.apply(cand)
        # Only tokens whose first two bytes may come next are worth a full check; rank those.
        index, found, checks = self._index(), [], 0
        pool = np.flatnonzero(index.prefix_ok(self._matcher))
        if self.eog_ids and self._matcher.can_end():
            pool = np.union1d(pool, np.fromiter(self.eog_ids, dtype=np.int64))
        values = cand.logits[pool]
        checked, width = 0, max(4 * k, 64)
        while checked < pool.shape[0]:
            ranked = pool[top_k_positions(values, min(width, pool.shape[0]))]
            for token in ranked[checked:].tolist():
                if self._grammar_allows(token):
                    found.append(token)
                    if len(found) == k:
                        return np.array(found, dtype=np.int64)
            checks += ranked.shape[0] - checked
            checked = ranked.shape[0]
            if checks >= _LAZY_CHECK_LIMIT:
                return None
            width *= 8
        return np.array(found, dtype=np.int64)

    def _whole_pieces_of_forced_text(self, raw: np.ndarray, token: int) -> int:
        """Where the grammar forces the next bytes (markup, a property name, a const), the
        only choice left is how to split them into tokens, and a model that would not write
        that text on its own splits it into letters, a token each ("arguments" in six). A
        token that ends inside forced text is replaced: by one that covers the forced text
        (picked by the chain among those the grammar allows), else by the longest token that
        is a prefix of it, as a tokenizer splits text. The text is the same either way."""
        forced = self._matcher.forced_bytes(_FORCED_LOOKAHEAD)
        piece = self.token_pieces[token]
        if len(piece) >= len(forced):
            return token   # nothing forced, or the token covers it: the model's own split
        index = self._index()
        starting = index.tokens_starting_with(forced)
        if starting.size <= _COVER_CHECK_LIMIT:
            covering = [t for t in starting.tolist() if self._grammar_allows(t)]
            if covering:
                try:
                    return self._pick(raw, np.array(covering, dtype=np.int64))
                except SamplingError:
                    pass   # the chain filtered every one of them out: split the text instead
        for length in range(len(forced) - 1, len(piece), -1):
            longer = index.token_of(forced[:length])
            if longer is not None:
                return longer
        return token

    def _grammar_allowed_ids(self) -> np.ndarray:
        mask = self._index().allowed_mask(self._matcher)
        allowed = np.flatnonzero(mask)
        if self.eog_ids and self._matcher.can_end():
            allowed = np.union1d(allowed, np.fromiter(self.eog_ids, dtype=np.int64))
        return allowed.astype(np.int64)

    def _advance_grammar(self, token: int) -> None:
        if token in self.eog_ids:
            if not self._matcher.can_end():
                raise SamplingError(f"end-of-generation token {token} is not allowed: the grammar is incomplete")
            return
        piece = self.token_pieces[token]
        if not piece or not self._matcher.accept_bytes(piece):
            raise SamplingError(f"token {token} ({piece!r}) is not allowed by the grammar here")


_ids_cache: dict[int, np.ndarray] = {}


def _token_ids(n_vocab: int) -> np.ndarray:
    """arange(n_vocab), shared read-only between chains of the same vocabulary size."""
    ids = _ids_cache.get(n_vocab)
    if ids is None:
        ids = np.arange(n_vocab, dtype=np.int64)
        ids.flags.writeable = False
        if len(_ids_cache) > 8:
            _ids_cache.clear()
        _ids_cache[n_vocab] = ids
    return ids


def _check_token(token: object, n_vocab: int, what: str) -> int:
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= int(token) < n_vocab:
        raise InvalidOptionError(f"{what}: {token!r} is not a token id in [0, {n_vocab})")
    return int(token)


def _check_bias(bias: dict[int, float] | None, n_vocab: int) -> dict[int, float]:
    for token in bias or {}:
        _check_token(token, n_vocab, "logit_bias")
    return dict(bias or {})


def _check_pieces(pieces: Sequence[bytes] | None, n_vocab: int) -> Sequence[bytes] | None:
    if pieces is None:
        return None
    if len(pieces) != n_vocab:
        raise InvalidOptionError(f"token_pieces has {len(pieces)} entries, expected n_vocab = {n_vocab}")
    return pieces


_PROBLEMS = {_core.GREEDY_NAN: "logits contain NaN (the model produced invalid values)",
             _core.GREEDY_POS_INF: "logits contain +inf (the model produced invalid values)",
             _core.GREEDY_NONE: "every logit is -inf: no token can be sampled"}


def _check_best(best: float, nan: bool) -> None:
    """Raise when the row held a NaN, or its largest logit is +inf or -inf."""
    if nan:
        raise SamplingError(_PROBLEMS[_core.GREEDY_NAN])
    if best == np.inf:
        raise SamplingError(_PROBLEMS[_core.GREEDY_POS_INF])
    if best == -np.inf:
        raise SamplingError(_PROBLEMS[_core.GREEDY_NONE])


def _greedy_among_touched(raw: np.ndarray, best: int, rewriting: list) -> int | None:
    """Greedy under samplers that each rewrite only some tokens' logits, each token's from
    its own (logit bias, penalties, DRY): a token none of them touches keeps its logit, so
    the untouched best is raw's best and only the touched tokens need rewriting, not a
    copy of the whole vocabulary.  None when raw's best is touched (the caller then
    rewrites everything).  Ties go to the lower id, as argmax over the vocabulary does."""
    touched = np.sort(np.concatenate([sampler.touched() for sampler in rewriting]))
    if touched.size > 1:
        touched = touched[np.concatenate(([True], touched[1:] != touched[:-1]))]
    if touched.size and touched[min(int(np.searchsorted(touched, best)), touched.size - 1)] == best:
        return None
    cand = Candidates(touched, raw[touched])
    for sampler in rewriting:
        sampler.apply(cand)
    if len(cand):
        i = int(np.argmax(cand.logits))
        value, untouched = cand.logits[i], raw[best]
        if value > untouched or (value == untouched and touched[i] < best):
            return int(touched[i])
    return best
