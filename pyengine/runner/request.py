"""Request: what a caller asks the engine for, validated before it is queued.

Everything a caller can get wrong is checked here, in the caller's thread, so
a bad option or a prompt that cannot fit raises where the call was made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.sample import Grammar, SamplingOptions
from pyengine.sample.options import MAX_TOP_LOGPROBS

DEFAULT_NUM_KEEP = 4
FILL_CONTEXT = -2     # Ollama's num_predict -2: generate until the context is full


@dataclass
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


def make_request(prompt: Sequence[int], sampling: SamplingOptions | None, *, n_vocab: int, engine_ctx: int,
                 max_tokens: int | None = 128, stop: Sequence[str] | str | None = (),
                 logprobs: bool | int | None = False, top_logprobs: int | None = None,
                 grammar: Grammar | None = None, num_keep: int | None = None, shift: bool = True,
                 num_ctx: int | None = None, cache_prompt: bool = True, all_logits: bool = False,
                 truncate: bool = False) -> Request:
    ids = _prompt_ids(prompt, n_vocab)
    n_ctx = engine_ctx if num_ctx is None else _int("num_ctx", num_ctx, 1)
    if n_ctx > engine_ctx:
        raise InvalidOptionError(f"option 'num_ctx' = {n_ctx} is larger than the context the model was loaded "
                                 f"with ({engine_ctx}); load it with a larger n_ctx")
    keep = DEFAULT_NUM_KEEP if num_keep is None else _int("num_keep", num_keep, -1)
    for name, flag in (("shift", shift), ("truncate", truncate)):
        if not isinstance(flag, bool):
            raise InvalidOptionError(f"option {name!r} must be true or false, got {flag!r}")
    if sampling is None:
        sampling = SamplingOptions()
    elif not isinstance(sampling, SamplingOptions):
        raise InvalidOptionError(f"sampling options must be SamplingOptions, got {type(sampling).__name__}")
    want_logprobs, n_top = _logprobs(logprobs, top_logprobs)
    if grammar is not None and not isinstance(grammar, Grammar):
        raise InvalidOptionError(f"grammar must be a Grammar, got {type(grammar).__name__}")
    req = Request(ids, sampling, _max_tokens(max_tokens), _stops(stop), want_logprobs, n_top, grammar,
                  keep, shift, truncate, n_ctx, bool(cache_prompt) and not all_logits, all_logits)
    _fit_context(req)
    if max_tokens == FILL_CONTEXT:
        req.max_tokens = max(n_ctx - len(req.prompt), 0)
    return req


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


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidOptionError(f"option {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _max_tokens(value: int | None) -> int | None:
    if value is None:
        return None
    n = _int("num_predict", value, FILL_CONTEXT)
    return None if n < 0 else n     # -1: no limit of its own (-2 is resolved once the prompt is known)


def _stops(stop: Sequence[str] | str | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or any(not isinstance(s, str) for s in stop):
        raise InvalidOptionError(f"option 'stop' must be a string or a list of strings, got {stop!r}")
    return [s for s in stop if s]


def _logprobs(logprobs: bool | int | None, top_logprobs: int | None) -> tuple[bool, int]:
    """Ollama's logprobs (bool) + top_logprobs (int), or OpenAI completions' logprobs (int)."""
    want = False
    n_top = 0
    if logprobs is not None and logprobs is not False:
        if logprobs is True:
            want = True
        else:
            n_top = _top("logprobs", logprobs)
            want = True
    if top_logprobs is not None:
        n_top = _top("top_logprobs", top_logprobs)
        want = want or n_top > 0
    return want, n_top


def _top(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidOptionError(f"option {name!r} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
    return value


def _fit_context(req: Request) -> None:
    """A prompt longer than the context: an error, or (truncate on) cut the way a shift
    would cut it: keep num_keep tokens and the latest ones, leaving half the rest free."""
    n, n_ctx = len(req.prompt), req.n_ctx
    if n <= n_ctx:
        return
    if not req.truncate or req.all_logits:
        raise ContextLengthError(f"the prompt has {n} tokens but the context holds {n_ctx} "
                                 f"(raise num_ctx, shorten the prompt, or pass truncate=True)")
    keep = n if req.num_keep < 0 else req.num_keep
    if keep >= n_ctx:
        raise ContextLengthError(f"the prompt has {n} tokens and num_keep={keep} of them must be kept, "
                                 f"but the context holds {n_ctx}")
    tail = (n_ctx - keep) // 2 or 1
    req.truncated = n - keep - tail
    req.prompt = req.prompt[:keep] + req.prompt[n - tail:]
