"""Speculative decoding: drafts proposed cheaply, verified by the target in one batch.

A generating sequence that asks for it (``speculative="ngram"`` or ``"draft"``) feeds,
instead of its last token alone, that token followed by up to ``draft_max`` drafted
tokens, as rows of one forward pass with logits at every row.  Row i's logits are
what a plain decode step would have seen after the sequence's tokens and the first i
drafts (the native core gives a row the same bits whatever shares its batch), so the
sequence's own sampler chain picks from them in order, exactly as plain decoding
would: when the pick equals the next draft, that draft is accepted and the chain goes
on to the next row; the first pick that differs (or the pick after the last draft) is
the step's last token.  The cache is cut back past the first rejected draft.

Drafts here are point masses (the n-gram continuation; the draft model's most likely
token), so this is Leviathan et al.'s rule with q(x) = 1: a draft x is accepted with
probability p(x), and on rejection the token comes from norm(max(0, p - q)), which is p
without x, renormalised.  Drawing y from p and accepting when y == x does both at
once: P(accept) = p(x), and a rejected draw is p conditioned on y != x.  The chain's
transforms (penalties, top-k/p, temperature, grammar, mirostat) define p, and each
pick sees the chain's state after the tokens accepted before it, so the output is the
same token for token as without speculation, with sampling too (the random draws are
consumed in the same order).  `verify` is that loop; `accept_probability` and
`residual` state the general rule for other drafts (and are what the tests check the
loop's statistics against).

Models whose cache cannot drop its last positions (recurrent state: Mamba, RWKV,
hybrids) refuse speculation with UnsupportedError at submit; plain decoding is what
they do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from pyengine.errors import InvalidOptionError, PyEngineError, TokenizerError, UnsupportedError
from pyengine.kvcache import MAX_SEQUENCES, Cache
from pyengine.ml.nn import CacheSpec
from pyengine.options import RequestOptions
from pyengine.runner.forward import Forward


class Speculator:
    """The engine's drafting: which requests speculate and how (`mode`), their drafts
    (`draft`), and the draft model when one is loaded."""

    def __init__(self, draft_model: "DraftModel | None" = None, default_mode: str | None = None) -> None:
        if default_mode not in (None, "off", "ngram", "draft"):
            raise InvalidOptionError(f"the default speculation must be ngram, draft or off, got {default_mode!r}")
        if default_mode == "draft" and draft_model is None:
            raise InvalidOptionError("speculative decoding with a draft model needs one: load a draft model")
        self.draft_model = draft_model
        self.default_mode = None if default_mode == "off" else default_mode

    def mode(self, options: RequestOptions, *, can_roll_back: bool) -> str | None:
        """The request's speculation ("ngram", "draft" or None), checked against what the
        engine can do: an error for a draft without a draft model, or for a cache that
        cannot roll back."""
        mode = self.default_mode if options.speculative is None else options.speculative
        if mode in (None, "off") or options.max_tokens == 0:
            return None
        if mode == "draft" and self.draft_model is None:
            raise InvalidOptionError("speculative='draft' needs a draft model (LLM(draft_model=...), "
                                     "pyengine serve --draft-model)")
        if not can_roll_back:
            if options.speculative is None:
                return None   # the engine's default does not apply to a model that cannot speculate
            raise UnsupportedError("speculative decoding needs a cache that can drop rejected drafts; this "
                                   "model keeps recurrent state, so it decodes one token at a time")
        return mode

    def draft(self, mode: str, options: RequestOptions, seq_id: int, context: list[int], room: int) -> list[int]:
        """The tokens to verify after `context` (its last token is the one being fed): at
        most `room` and options.draft_max, cut to a power of two; [] when fewer than
        options.draft_min."""
        limit = min(room, options.draft_max)
        if limit <= 0 or limit < options.draft_min:
            return []
        if mode == "ngram":
            tokens = ngram_draft(context, options.ngram_max, options.ngram_min, limit)
        else:
            try:
                tokens = self.draft_model.propose(seq_id, context, limit)
            except PyEngineError:   # the draft's own cache or model failed: a plain step, not an error
                self.draft_model.forget(seq_id)
                tokens = []
        tokens = tokens[:power_of_two_floor(len(tokens))]
        return tokens if len(tokens) >= max(options.draft_min, 1) else []


# ---- drafting -------------------------------------------------------------------------


def ngram_draft(tokens: Sequence[int], n_max: int, n_min: int, limit: int) -> list[int]:
    """Prompt lookup: the longest n (n_max down to n_min) for which the last n tokens
    occur earlier in `tokens`, and up to `limit` tokens that followed their latest
    earlier occurrence.  [] when no such n-gram recurs."""
    if limit <= 0 or len(tokens) < n_min + 1:
        return []
    context = np.asarray(tokens, np.int64)
    end = len(context)
    for n in range(min(n_max, end - 1), n_min - 1, -1):
        key = context[end - n:]
        # candidate starts: where the key's first token sits, with room for the key and one
        # token after it before the suffix (an occurrence may overlap the suffix itself)
        starts = np.flatnonzero(context[:end - n] == key[0])
        for start in starts[::-1].tolist():
            if np.array_equal(context[start:start + n], key):
                follow = context[start + n:start + n + limit]
                return follow.tolist()
    return []


def power_of_two_floor(n: int) -> int:
    """The largest power of two <= n (0 for 0): drafts are cut to these lengths so the
    verification batches come in a few shapes, whose graphs stay built."""
    return 1 << (n.bit_length() - 1) if n > 0 else 0


# ---- verification ----------------------------------------------------------------------


def verify(pick: Callable[[np.ndarray], tuple[int, object]], rows: np.ndarray, draft: Sequence[int],
           stops: Callable[[int], bool], limit: int) -> list[tuple[int, object]]:
    """The tokens a verified step produces: pick(row) for rows 0, 1, ... while each pick
    equals the draft at its index; the first that differs ends the step, as does the pick
    after the last draft, a token `stops` says ends the generation, or `limit` picks.
    pick returns (token, anything to keep with it); it must advance the sampler chain."""
    out: list[tuple[int, object]] = []
    for i in range(min(len(rows), len(draft) + 1, limit)):
        token, extra = pick(rows[i])
        out.append((token, extra))
        if i >= len(draft) or token != draft[i] or stops(token):
            break
    return out


def accept_probability(p: np.ndarray, q: np.ndarray, x: int) -> float:
    """Leviathan et al. 2023: the probability of accepting draft x drawn from q when the
    target's distribution is p: min(1, p(x) / q(x))."""
    return 1.0 if p[x] >= q[x] else float(p[x] / q[x])


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The distribution a rejected draft is replaced from: norm(max(0, p - q))."""
    rest = np.maximum(p - q, 0.0)
    total = rest.sum()
    return rest / total if total > 0 else p


def speculative_draw(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> int:
    """One token by the general rule: draft x ~ q, accepted with accept_probability, else
    a draw from residual(p, q).  Its distribution is p (the tests measure it)."""
    x = int(rng.choice(len(q), p=q))
    if rng.random() < accept_probability(p, q, x):
        return x
    return int(rng.choice(len(p), p=residual(p, q)))


# ---- the draft model ---------------------------------------------------------------------


def check_same_vocab(target_tokenizer, target_vocab: int, draft_tokenizer, draft_vocab: int) -> None:
    """A draft model must share the target's vocabulary: its ids are verified as the
    target's.  TokenizerError naming the first difference."""
    if draft_vocab != target_vocab:
        raise TokenizerError(f"the draft model's vocabulary has {draft_vocab} tokens, the target's {target_vocab}")
    for name in ("bos_id", "eos_id"):
        mine, theirs = getattr(draft_tokenizer, name), getattr(target_tokenizer, name)
        if mine != theirs:
            raise TokenizerError(f"the draft model's {name} is {mine}, the target's {theirs}")
    target = target_tokenizer.piece_table(special=True)
    draft = draft_tokenizer.piece_table(special=True)
    bad = next((i for i, (a, b) in enumerate(zip(target, draft)) if a != b), None)
    if bad is not None:
        raise TokenizerError(f"the draft model's token {bad} is {draft[bad]!r}, the target's {target[bad]!r}")


@dataclass
class _DraftSlot:
    tokens: list[int] = field(default_factory=list)   # what the draft cache holds for this sequence id


class DraftModel:
    """A small model with the target's vocabulary, with its own cache keyed by the
    target's sequence ids: `propose` brings a sequence's cached tokens up to the
    target's (cutting back past what was rejected, feeding what is new) and drafts
    greedily from there."""

    def __init__(self, model, tokenizer, backend, *, n_ctx: int, n_parallel: int, n_batch: int) -> None:
        layout = model.cache_layout()
        if any(not isinstance(spec, CacheSpec) for spec in layout):
            raise UnsupportedError(f"the draft model ({type(model).__name__}) keeps recurrent state, "
                                   "which cannot roll back a rejected draft; use an attention-only draft model")
        self.model, self.tokenizer = model, tokenizer
        self.n_batch = n_batch
        n_cells = n_ctx * n_parallel
        # sliding layers keep every cell: a draft rolls back further than the window margin
        windows = {s.window: n_cells for s in layout if s.window}
        self.cache = Cache.build(layout, n_cells, window_cells=windows,
                                 head_dim=getattr(model.cfg, "head_dim", None))
        self.forward = Forward(model, backend, self.cache, max_tokens=n_batch, n_ctx_seq=n_ctx)
        self._slots = [_DraftSlot() for _ in range(MAX_SEQUENCES)]
        self._row = np.empty((1, model.cfg.n_vocab), np.float32)

    def propose(self, seq_id: int, context: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens the draft model expects after `context` (greedy)."""
        if limit <= 0:
            return []
        slot = self._slots[seq_id]
        common = _common_prefix(slot.tokens, context)
        if common == len(context):   # all of it cached: the last token is re-fed for its logits
            common -= 1
        self.cache.remove(seq_id, common)
        del slot.tokens[common:]
        new = list(context[common:])
        self._reserve(seq_id, len(new) + limit)
        for start in range(0, len(new), self.n_batch):
            piece = new[start:start + self.n_batch]
            row = self._feed(seq_id, piece, len(slot.tokens))
            slot.tokens.extend(piece)
        draft = [int(np.argmax(row))]
        while len(draft) < limit:
            row = self._feed(seq_id, draft[-1:], len(slot.tokens))
            slot.tokens.append(draft[-1])
            draft.append(int(np.argmax(row)))
        return draft

    def forget(self, seq_id: int) -> None:
        self.cache.remove(seq_id)
        self._slots[seq_id].tokens = []

    def _feed(self, seq_id: int, tokens: list[int], start: int) -> np.ndarray:
        n = len(tokens)
        logits = self.forward(np.asarray(tokens, np.int32), np.arange(start, start + n, dtype=np.int32),
                              np.full(n, seq_id, np.int64), np.array([n - 1], np.int32), self._row)
        return logits[0]

    def _reserve(self, seq_id: int, n_new: int) -> None:
        """Room for n_new cells of seq_id, evicting other sequences' drafts (they re-feed later)."""
        order = iter([i for i in range(len(self._slots)) if i != seq_id])

        def evict(among=None) -> bool:
            for i in order:
                if self._slots[i].tokens and (among is None or i in among):
                    self.forget(i)
                    return True
            return False

        self.cache.reserve(n_new, evict, n_seqs=1)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(differ[0]) if differ.size else n
