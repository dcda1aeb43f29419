"""One request's options: the sampler chain and the request around it, validated once.

:class:`RequestOptions` is what :meth:`pyengine.runner.engine.Engine.submit` takes beside
the prompt. It is built once per request by the constructor of the dialect the request
came in (each with its own names and defaults):

- :meth:`RequestOptions.from_ollama`: Ollama's option names (``num_predict``, ``num_ctx``,
  ``repeat_penalty``, ...) and defaults (temperature 0.8, top_k 40, top_p 0.9);
- :meth:`RequestOptions.from_openai`: an OpenAI request body (``max_tokens`` or
  ``max_completion_tokens``, ``temperature``, ``top_p``, penalties, ``logprobs``, plus the
  Ollama / llama.cpp extras the server accepts) and OpenAI's defaults (temperature 1.0,
  no top-k, min-p or penalty);
- :meth:`RequestOptions.from_llama_cpp`: llama-cpp-python's ``create_completion`` /
  ``create_chat_completion`` keywords and defaults (temperature 0.8 / 0.2, top_k 40,
  top_p 0.95, min_p 0.05).

Every bad value raises InvalidOptionError naming the option. What needs the engine (the
context the model was loaded with, the prompt's length) is checked where the request is
made (:func:`context_limit`, used by the engine and by every caller that needs the limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pyengine.errors import InvalidOptionError
from pyengine.sample.grammar import Grammar
from pyengine.sample.options import MAX_TOP_LOGPROBS, SamplingOptions, layered_options

DEFAULT_NUM_KEEP = 4
DEFAULT_MAX_TOKENS = 128
FILL_CONTEXT = -2     # Ollama's num_predict -2: generate until the context is full

# Options (Ollama's names) that shape the request rather than the sampler chain.
REQUEST_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep", "stop", "grammar", "format", "logprobs",
                             "top_logprobs", "shift", "truncate", "cache_prompt", "speculative", "draft_max",
                             "draft_min", "ngram_min", "ngram_max"})
# Those of them that Ollama's `options` object holds (the others are top-level fields there).
OLLAMA_REQUEST_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep", "stop", "shift", "speculative",
                                    "draft_max", "draft_min", "ngram_min", "ngram_max"})

# Speculative decoding (runner/speculative.py): the modes, and the draft sizes' defaults
# (llama.cpp's server drafts up to 16 tokens; n-grams of 4 down to 2 tokens are looked up).
SPECULATIVE_MODES = ("ngram", "draft")
DEFAULT_DRAFT_MAX = 16
DEFAULT_NGRAM_MIN = 2
DEFAULT_NGRAM_MAX = 4
MAX_DRAFT = 64

_SPECULATIVE_OPTIONS = ("speculative", "draft_max", "draft_min", "ngram_min", "ngram_max")

# OpenAI body fields that are no option (the route reads them itself).
_OPENAI_NON_OPTIONS = frozenset({"model", "messages", "prompt", "n", "stream", "stream_options", "user",
                                 "keep_alive", "response_format", "tools", "tool_choice", "parallel_tool_calls",
                                 "store", "metadata", "service_tier", "reasoning_effort", "think", "echo",
                                 "best_of", "suffix", "max_tokens", "max_completion_tokens"})
# llama-cpp-python keywords with another name here, and those it takes that change nothing here.
_LLAMA_CPP_RENAMES = {"max_tokens": "num_predict", "mirostat_mode": "mirostat"}
_LLAMA_CPP_IGNORED = frozenset({"stream", "echo", "suffix", "tfs_z", "model", "logits_processor",
                                "stopping_criteria"})


@dataclass(frozen=True)
class RequestOptions:
    """Everything a request asks of the engine besides its prompt (see the module docs)."""

    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens: int | None = DEFAULT_MAX_TOKENS   # None: until EOG, a stop or the context's end; -2 fills it
    stop: tuple[str, ...] = ()
    num_ctx: int | None = None                    # None: the context the model was loaded with
    num_keep: int = DEFAULT_NUM_KEEP              # tokens a context shift keeps; -1 = the whole prompt
    shift: bool = True                            # shift the context when it fills up (else stop: "length")
    truncate: bool = False                        # cut a prompt longer than the context (else an error)
    grammar: Grammar | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    cache_prompt: bool = True                     # reuse cached prefixes and leave this one cached
    all_logits: bool = False                      # report every prompt position's logits (scoring)
    speculative: str | None = None                # "ngram", "draft" or "off" (None: the engine's default)
    draft_max: int = DEFAULT_DRAFT_MAX            # tokens drafted per step at most
    draft_min: int = 0                            # a shorter draft is not verified (a plain step instead)
    ngram_min: int = DEFAULT_NGRAM_MIN            # n-gram sizes prompt lookup tries, longest first
    ngram_max: int = DEFAULT_NGRAM_MAX

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingOptions):
            raise InvalidOptionError(f"sampling options must be SamplingOptions, got {type(self.sampling).__name__}")
        set_ = object.__setattr__   # a frozen dataclass normalises its own fields once, here
        set_(self, "max_tokens", _max_tokens(self.max_tokens))
        set_(self, "stop", _stops(self.stop))
        if self.num_ctx is not None:
            set_(self, "num_ctx", _int("num_ctx", self.num_ctx, 1))
        set_(self, "num_keep", DEFAULT_NUM_KEEP if self.num_keep is None else _int("num_keep", self.num_keep, -1))
        for name in ("shift", "truncate"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOptionError(f"option {name!r} must be true or false, got {getattr(self, name)!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidOptionError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
        want, n_top = _logprobs(self.logprobs, self.top_logprobs)
        set_(self, "logprobs", want)
        set_(self, "top_logprobs", n_top)
        set_(self, "cache_prompt", bool(self.cache_prompt) and not self.all_logits)
        set_(self, "speculative", speculative_mode(self.speculative))
        for name, low, high in (("draft_max", 1, MAX_DRAFT), ("draft_min", 0, self.draft_max),
                                ("ngram_min", 1, MAX_DRAFT), ("ngram_max", self.ngram_min, MAX_DRAFT)):
            set_(self, name, _int_in(name, getattr(self, name), low, high))

    # ---- one constructor per dialect ------------------------------------------------

    @classmethod
    def from_ollama(cls, options: Mapping[str, Any] | None = None, *, surface: str = "ollama",
                    model: Mapping[str, Any] | None = None, created: Mapping[str, Any] | None = None,
                    max_tokens: int | None = None, sampling: SamplingOptions | None = None) -> "RequestOptions":
        """Options by Ollama's names. What they leave out comes from `created` (a created
        model's parameters, request options included), then the `model` file's
        ``general.sampling.*``, then `surface`'s defaults; `max_tokens` is the limit
        when no ``num_predict`` is given (None: Ollama's -1, no limit of its own).
        `sampling`: the sampler settings, where the caller layered them already
        (``LLM.sampling_options``); the sampling names in `options` are then not read.
        An unknown name raises InvalidOptionError naming it."""
        given = _mapping("options", options)
        created = dict(_mapping("parameters", created))
        request = {**{k: v for k, v in created.items() if k in REQUEST_OPTIONS},
                   **{k: v for k, v in given.items() if k in REQUEST_OPTIONS and v is not None}}
        if sampling is None:
            sampling = sampling_options(surface, {k: v for k, v in given.items() if k not in REQUEST_OPTIONS},
                                        model=model, created=created)
        top = request.get("top_logprobs")
        if top is None and sampling.n_probs:
            top = sampling.n_probs
        return cls(sampling, max_tokens=request.get("num_predict", max_tokens), stop=request.get("stop"),
                   num_ctx=request.get("num_ctx"), num_keep=request.get("num_keep"),
                   shift=request.get("shift", True), truncate=request.get("truncate", False),
                   grammar=_grammar(request.get("grammar"), request.get("format")),
                   logprobs=request.get("logprobs", False), top_logprobs=top,
                   cache_prompt=request.get("cache_prompt", True),
                   **{name: request[name] for name in _SPECULATIVE_OPTIONS if name in request})

    @classmethod
    def from_openai(cls, body: Mapping[str, Any], *, model: Mapping[str, Any] | None = None,
                    created: Mapping[str, Any] | None = None) -> "RequestOptions":
        """An OpenAI request body (chat or completions): its limit (``max_tokens`` or
        ``max_completion_tokens``; none: until the end), sampling fields and the Ollama /
        llama.cpp extras (``top_k``, ``min_p``, ``num_ctx``, ...); OpenAI's defaults for
        what it leaves out. Fields that are no option (``model``, ``messages``, ``stream``,
        ...) are left to the route; an unknown field raises InvalidOptionError."""
        body = _mapping("body", body)
        if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
            raise InvalidOptionError("give max_tokens or max_completion_tokens (the same limit), not both")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        options = {k: v for k, v in body.items() if k not in _OPENAI_NON_OPTIONS}
        if isinstance(options.get("logprobs"), bool) and not options["logprobs"]:
            options.pop("top_logprobs", None)   # OpenAI: top_logprobs only counts with logprobs on
        if limit is not None:
            options["num_predict"] = limit
        return cls.from_ollama(options, surface="openai", model=model, created=created)

    @classmethod
    def from_llama_cpp(cls, kwargs: Mapping[str, Any] | None = None, *, chat: bool = False,
                       model: Mapping[str, Any] | None = None,
                       created: Mapping[str, Any] | None = None) -> "RequestOptions":
        """llama-cpp-python's ``create_completion`` keywords (``chat``: those of
        ``create_chat_completion``, temperature 0.2) with its defaults; ``max_tokens``
        defaults to 128 here as in ``LLM.create_completion`` (None: until the end; the
        chat's default is None). Ollama's names are taken too, as ``LLM`` takes them."""
        kwargs = dict(_mapping("keyword arguments", kwargs))
        options = {_LLAMA_CPP_RENAMES.get(k, k): v for k, v in kwargs.items() if k not in _LLAMA_CPP_IGNORED}
        options.setdefault("num_predict", None if chat else DEFAULT_MAX_TOKENS)
        surface = "llama-cpp-python-chat" if chat else "llama-cpp-python"
        return cls.from_ollama(options, surface=surface, model=model, created=created)


def sampling_options(surface: str, request: Mapping[str, Any], *, model: Mapping[str, Any] | None = None,
                     created: Mapping[str, Any] | None = None) -> SamplingOptions:
    """The sampler settings of a request (Ollama's names): `surface`'s defaults < the
    `model` file's ``general.sampling.*`` < a created model's parameters (`created`, its
    request options left out) < `request`."""
    created = {k: v for k, v in _mapping("parameters", created).items() if k not in REQUEST_OPTIONS}
    return SamplingOptions.from_dict(layered_options(surface, model=model, created=created, request=request))


def speculative_mode(value: object) -> str | None:
    """The speculation a request names: "ngram", "draft", "off" (false, "", "off", "none"),
    or None (not named: the engine's default)."""
    if value is None:
        return None
    if value is False or value in ("", "off", "none"):
        return "off"
    if not isinstance(value, str) or value not in SPECULATIVE_MODES:
        raise InvalidOptionError(f"option 'speculative' must be one of {', '.join(SPECULATIVE_MODES)} or off, "
                                 f"got {value!r}")
    return value


def context_limit(engine_ctx: int, num_ctx: object = None) -> int:
    """The context a request may use: `num_ctx` when given (at most `engine_ctx`, the
    context the model was loaded with), else `engine_ctx`."""
    if num_ctx is None:
        return engine_ctx
    n_ctx = _int("num_ctx", num_ctx, 1)
    if n_ctx > engine_ctx:
        raise InvalidOptionError(f"option 'num_ctx' = {n_ctx} is larger than the context the model was loaded "
                                 f"with ({engine_ctx}); load it with a larger n_ctx")
    return n_ctx


# ---- validators ---------------------------------------------------------------------


def _mapping(what: str, value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidOptionError(f"{what} must be a mapping of option names, got {type(value).__name__}")
    return value


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidOptionError(f"option {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _int_in(name: str, value: object, low: int, high: int) -> int:
    value = _int(name, value, low)
    if value > high:
        raise InvalidOptionError(f"option {name!r} must be an integer in {low}..{high}, got {value!r}")
    return value


def _max_tokens(value: object) -> int | None:
    if value is None:
        return None
    n = _int("num_predict", value, FILL_CONTEXT)
    if n == FILL_CONTEXT:
        return n                    # resolved once the prompt is known
    return None if n < 0 else n     # -1: no limit of its own


def _stops(stop: Sequence[str] | str | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or any(not isinstance(s, str) for s in stop):
        raise InvalidOptionError(f"option 'stop' must be a string or a list of strings, got {stop!r}")
    return tuple(s for s in stop if s)


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


def _grammar(grammar: object, fmt: object) -> Grammar | None:
    if grammar is not None and fmt not in (None, ""):
        raise InvalidOptionError("give either option 'grammar' or option 'format', not both")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        if not isinstance(grammar, str):
            raise InvalidOptionError(f"option 'grammar' must be GBNF text, got {type(grammar).__name__}")
        return Grammar.from_gbnf(grammar) if grammar.strip() else None
    if fmt in (None, ""):
        return None
    return Grammar.from_format(fmt)


__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_NUM_KEEP", "FILL_CONTEXT", "OLLAMA_REQUEST_OPTIONS", "REQUEST_OPTIONS",
           "SPECULATIVE_MODES", "RequestOptions", "context_limit", "sampling_options", "speculative_mode"]
