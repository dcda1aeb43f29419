"""Sampling options: Ollama's names and defaults, validated once at the edge.

Where Ollama has no option (DRY, XTC, top-n-sigma, dynamic temperature) the name and
default follow llama.cpp's common sampling parameters.

What a request leaves out depends on the API it came through: :data:`SURFACE_DEFAULTS`
holds each surface's defaults (Ollama's, OpenAI's, llama-cpp-python's), and
:func:`layered_options` puts a request's options over them in one order:
surface defaults < the model file's ``general.sampling.*`` < a created model's
parameters < the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Mapping, Sequence

from pyengine.errors import InvalidOptionError

# Canonical sampler names (llama.cpp's --samplers spelling) and the aliases it accepts.
SAMPLER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULT_SAMPLER_ORDER = SAMPLER_NAMES
_SAMPLER_ALIASES = {
    "top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "top-n-sigma": "top_n_sigma",
    "typical": "typ_p", "typical_p": "typ_p", "typical-p": "typ_p", "typ": "typ_p", "typ-p": "typ_p",
    "min-p": "min_p", "temp": "temperature", "repetition": "penalties",
}

MAX_TOP_LOGPROBS = 20

# The defaults of each API, for the options a request leaves out. Ollama's are
# api.DefaultOptions (repeat_penalty 1.0 since Ollama stopped applying 1.1 to models
# that set none); OpenAI applies no top-k, min-p or penalty; llama-cpp-python's are
# the defaults of Llama.create_completion and Llama.create_chat_completion (0.3.x, with
# the Llama object's last_n_tokens_size of 64).
_NO_PENALTIES = {"repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
SURFACE_DEFAULTS: dict[str, dict[str, object]] = {
    "ollama": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "typical_p": 1.0, **_NO_PENALTIES},
    "openai": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, **_NO_PENALTIES},
    "llama-cpp-python": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
                         **_NO_PENALTIES},
    "llama-cpp-python-chat": {"temperature": 0.2, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
                              **_NO_PENALTIES},
}

# The model file's recommended sampling (llama.cpp reads the same keys, gguf-py's
# Keys.General.SAMPLING_*), by the option each sets.
MODEL_SAMPLING_KEYS = {
    "general.sampling.sequence": "samplers",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.xtc_probability": "xtc_probability",
    "general.sampling.xtc_threshold": "xtc_threshold",
    "general.sampling.temp": "temperature",
    "general.sampling.penalty_last_n": "repeat_last_n",
    "general.sampling.penalty_repeat": "repeat_penalty",
    "general.sampling.mirostat": "mirostat",
    "general.sampling.mirostat_tau": "mirostat_tau",
    "general.sampling.mirostat_eta": "mirostat_eta",
}


def _default_breakers() -> list[str]:
    return ["\n", ":", "\"", "*"]


@dataclass
class SamplingOptions:
    """Every knob of the sampler chain, with Ollama's defaults (llama.cpp's where Ollama has none)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=_default_breakers)
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    logit_bias: dict[int, float] | None = None
    samplers: list[str] | None = None
    n_probs: int = 0

    def __post_init__(self) -> None:
        for spec in fields(self):
            setattr(self, spec.name, _VALIDATORS[spec.name](spec.name, getattr(self, spec.name)))

    @classmethod
    def from_dict(cls, options: Mapping[str, object]) -> "SamplingOptions":
        """Build from a mapping of Ollama option names; unknown names raise InvalidOptionError."""
        if not isinstance(options, Mapping):
            raise InvalidOptionError(f"sampling options must be a mapping, got {type(options).__name__}")
        unknown = [name for name in options if name not in _VALIDATORS]
        if unknown:
            raise InvalidOptionError(
                f"unknown sampling option {unknown[0]!r}; valid options: {', '.join(sorted(_VALIDATORS))}")
        return cls(**{name: value for name, value in options.items() if value is not None or name == "seed"})

    def sampler_order(self) -> tuple[str, ...]:
        """The configured order of the middle samplers (canonical names)."""
        return tuple(self.samplers) if self.samplers is not None else DEFAULT_SAMPLER_ORDER


OPTION_NAMES = frozenset(spec.name for spec in fields(SamplingOptions))


def model_sampling(metadata: Mapping[str, object]) -> dict[str, object]:
    """The sampling a GGUF recommends (``general.sampling.*``), by option name. A value
    that is not a valid option is skipped, as llama.cpp skips one it cannot parse."""
    found: dict[str, object] = {}
    for key, name in MODEL_SAMPLING_KEYS.items():
        value = metadata.get(key)
        if value is None:
            continue
        if hasattr(value, "item"):  # a numpy scalar
            value = value.item()
        try:
            found[name] = _VALIDATORS[name](name, value)
        except InvalidOptionError:
            continue
    return found


def layered_options(surface: str, *, model: Mapping[str, object] | None = None,
                    created: Mapping[str, object] | None = None,
                    request: Mapping[str, object] | None = None) -> dict[str, object]:
    """A request's options over the defaults, in this order (later wins): the `surface`'s
    defaults (a key of SURFACE_DEFAULTS), the `model` file's ``general.sampling.*``
    (:func:`model_sampling`), a `created` model's parameters, the `request` (where a
    None value means "not given", seed excepted)."""
    try:
        defaults = SURFACE_DEFAULTS[surface]
    except KeyError:
        raise InvalidOptionError(f"unknown sampling surface {surface!r}; one of {sorted(SURFACE_DEFAULTS)}") from None
    layered: dict[str, object] = dict(defaults)
    for layer in (model, created):
        layered.update({name: value for name, value in (layer or {}).items() if value is not None})
    layered.update({name: value for name, value in (request or {}).items() if value is not None or name == "seed"})
    return layered


# ---- validators: each returns the normalised value or raises InvalidOptionError naming the option


def _fail(name: str, value: object, expected: str) -> InvalidOptionError:
    return InvalidOptionError(f"option {name!r} must be {expected}, got {value!r}")


def _number(name: str, value: object, lo: float, hi: float, expected: str,
            lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, value, expected)
    number = float(value)
    if math.isnan(number) or number < lo or number > hi or (lo_open and number == lo):
        raise _fail(name, value, expected)
    return number


def _integer(name: str, value: object, lo: int, hi: int, expected: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(name, value, expected)
    return value


def _float_in(lo: float, hi: float, expected: str, lo_open: bool = False):
    return lambda name, value: _number(name, value, lo, hi, expected, lo_open)


def _int_in(lo: int, hi: int, expected: str):
    return lambda name, value: _integer(name, value, lo, hi, expected)


_INT_MAX = 2**31 - 1
_FINITE = "a finite number"


def _seed(name: str, value: object) -> int | None:
    if value is None:
        return None
    seed = _integer(name, value, -(2**63), 2**64 - 1, "an integer (negative or null for a random seed)")
    return None if seed < 0 else seed


def _mirostat(name: str, value: object) -> int:
    return _integer(name, value, 0, 2, "0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)")


# DRY's sequence breakers: each costs a pass over the vocabulary when the sampler is built,
# and llama.cpp's sampler keeps only the first 40 bytes of one; more than a few dozen short
# ones is no longer a list of separators but a way to make a request expensive.
MAX_DRY_BREAKERS = 32
MAX_DRY_BREAKER_CHARS = 40


def _breakers(name: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidOptionError(f"option {name!r} must be a list of non-empty strings, "
                                 f"got {type(value).__name__}")
    if len(value) > MAX_DRY_BREAKERS:
        raise InvalidOptionError(
            f"option {name!r} holds {len(value)} breakers; at most {MAX_DRY_BREAKERS} are allowed")
    breakers = list(value)
    for item in breakers:
        if not isinstance(item, str) or not item:
            raise _fail(name, item, "a list of non-empty strings")
        if len(item) > MAX_DRY_BREAKER_CHARS:
            raise InvalidOptionError(
                f"option {name!r}: a breaker of {len(item)} characters (at most {MAX_DRY_BREAKER_CHARS} "
                f"are allowed): {item[:MAX_DRY_BREAKER_CHARS]!r}...")
    return breakers


def _logit_bias(name: str, value: object) -> dict[int, float] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise _fail(name, value, "a mapping of token id to bias")
    bias: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _fail(name, value, "a mapping of token id to bias (or a list of [id, bias] pairs)")
        token = _bias_token(name, pair[0])
        bias[token] = bias.get(token, 0.0) + _bias_amount(name, pair[1])
    return bias


def _bias_token(name: str, token: object) -> int:
    if isinstance(token, str) and token.strip().lstrip("-").isdigit():
        token = int(token)
    return _integer(f"{name}[{token!r}]", token, 0, _INT_MAX, "a non-negative token id")


def _bias_amount(name: str, amount: object) -> float:
    # false (JSON) means "never", as in llama.cpp's server; -inf bans a token outright.
    if amount is False:
        return -math.inf
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or math.isnan(amount) \
            or amount == math.inf:
        raise _fail(name, amount, "a finite bias, -inf or false")
    return float(amount)


def _samplers(name: str, value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in value.replace(",", ";").split(";") if part.strip()]
    if not isinstance(value, Sequence) or any(not isinstance(item, str) for item in value):
        raise _fail(name, value, f"a list of sampler names ({', '.join(SAMPLER_NAMES)})")
    order = []
    for item in value:
        canonical = item.strip().lower()
        canonical = _SAMPLER_ALIASES.get(canonical, canonical)
        if canonical not in SAMPLER_NAMES:
            raise InvalidOptionError(
                f"option {name!r}: unknown sampler {item!r}; valid samplers: {', '.join(SAMPLER_NAMES)}")
        order.append(canonical)
    return order


_VALIDATORS = {
    "temperature": _float_in(0.0, math.inf, "a finite number >= 0 (0 = greedy)"),
    "top_k": _int_in(0, _INT_MAX, "an integer >= 0 (0 disables)"),
    "top_p": _float_in(0.0, 1.0, "a number in [0, 1] (1 disables)"),
    "min_p": _float_in(0.0, 1.0, "a number in [0, 1] (0 disables)"),
    "typical_p": _float_in(0.0, 1.0, "a number in [0, 1] (1 disables)"),
    "repeat_penalty": _float_in(0.0, 1e6, "a number > 0 (1 disables)", lo_open=True),
    "repeat_last_n": _int_in(-1, _INT_MAX, "an integer >= -1 (0 disables, -1 = whole context)"),
    "presence_penalty": _float_in(-1e6, 1e6, _FINITE),
    "frequency_penalty": _float_in(-1e6, 1e6, _FINITE),
    "seed": _seed,
    "mirostat": _mirostat,
    "mirostat_tau": _float_in(0.0, 1e6, "a finite number >= 0"),
    "mirostat_eta": _float_in(0.0, 1e6, "a finite number >= 0"),
    "top_n_sigma": _float_in(-1e6, 1e6, "a finite number (<= 0 disables)"),
    "xtc_probability": _float_in(0.0, 1.0, "a number in [0, 1] (0 disables)"),
    "xtc_threshold": _float_in(0.0, 1.0, "a number in [0, 1] (> 0.5 disables)"),
    "dry_multiplier": _float_in(0.0, 1e6, "a finite number >= 0 (0 disables)"),
    "dry_base": _float_in(1.0, 1e6, "a finite number >= 1"),
    "dry_allowed_length": _int_in(0, _INT_MAX, "an integer >= 0"),
    "dry_penalty_last_n": _int_in(-1, _INT_MAX, "an integer >= -1 (0 disables, -1 = whole context)"),
    "dry_sequence_breakers": _breakers,
    "dynatemp_range": _float_in(0.0, 1e6, "a finite number >= 0 (0 disables)"),
    "dynatemp_exponent": _float_in(0.0, 1e6, "a finite number >= 0"),
    "logit_bias": _logit_bias,
    "samplers": _samplers,
    "n_probs": _int_in(0, MAX_TOP_LOGPROBS, f"an integer in [0, {MAX_TOP_LOGPROBS}]"),
}
