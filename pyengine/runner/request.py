"""Request: what a caller asks the engine for, checked before it is queued.

The options were validated when their RequestOptions was built; what needs the
engine (the prompt's ids, the context, whether the prompt fits) is checked here, in
the caller's thread, so an error raises where the call was made.  A Request does not
change once made; the engine's runner/inflight.Sequence holds it with the request's
changing state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.options import DEFAULT_NUM_KEEP, FILL_CONTEXT, RequestOptions, context_limit
from pyengine.sample import Grammar, SamplingOptions


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens: int | None = 128          # None: until EOG, a stop string or the context's end
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: Grammar | None = None
    num_keep: int = DEFAULT_NUM_KEEP      # tokens a context shift keeps; -1 = the whole prompt
    shift: bool = True                    # shift the context when it fills up (else stop: "length")
    truncate: bool = False                # cut a prompt longer than the context (else an error)
    n_ctx: int = 0                        # this request's context (<= the engine's)
    cache_prompt: bool = True             # reuse cached prefixes and leave this one cached
    all_logits: bool = False              # report every prompt position's logits (scoring)
    truncated: int = 0                    # prompt tokens dropped to fit (shift on)


def make_request(prompt: Sequence[int], options: RequestOptions, *, n_vocab: int, engine_ctx: int) -> Request:
    """The request of `prompt` under `options` (validated when they were built) in an
    engine of `engine_ctx` cells per sequence: the context and the prompt's fit are checked here."""
    if not isinstance(options, RequestOptions):
        raise InvalidOptionError(f"request options must be RequestOptions, got {type(options).__name__}")
    ids = _prompt_ids(prompt, n_vocab)
    n_ctx = context_limit(engine_ctx, options.num_ctx)
    ids, truncated = _fit_context(ids, n_ctx, options)
    max_tokens = max(n_ctx - len(ids), 0) if options.max_tokens == FILL_CONTEXT else options.max_tokens
    return Request(ids, options.sampling, max_tokens, list(options.stop), options.logprobs, options.top_logprobs,
                   options.grammar, options.num_keep, options.shift, options.truncate, n_ctx, options.cache_prompt,
                   options.all_logits, truncated)


def _prompt_ids(prompt: Sequence[int], n_vocab: int) -> list[int]:
    if isinstance(prompt, (str, bytes)):
        raise InvalidOptionError("the engine takes token ids; tokenize the text first")
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise InvalidOptionError("the prompt must be a sequence of token ids") from None
    if not ids:
        raise InvalidOptionError("the prompt is empty")
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidOptionError(f"prompt token id {bad} is out of range [0, {n_vocab})")
    return ids


def _fit_context(ids: list[int], n_ctx: int, options: RequestOptions) -> tuple[list[int], int]:
    """The prompt fitted to the context, and how many tokens were dropped: a prompt longer
    than the context is an error, or (truncate on) cut the way a shift would cut it: keep
    num_keep tokens and the latest ones, leaving half the rest free."""
    n = len(ids)
    if n <= n_ctx:
        return ids, 0
    if not options.truncate or options.all_logits:
        raise ContextLengthError(f"the prompt has {n} tokens but the context holds {n_ctx} "
                                 f"(raise num_ctx, shorten the prompt, or pass truncate=True)")
    keep = n if options.num_keep < 0 else options.num_keep
    if keep >= n_ctx:
        raise ContextLengthError(f"the prompt has {n} tokens and num_keep={keep} of them must be kept, "
                                 f"but the context holds {n_ctx}")
    tail = (n_ctx - keep) // 2 or 1
    return ids[:keep] + ids[n - tail:], n - keep - tail
