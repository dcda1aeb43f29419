"""Submitting token ids to an `LLM` and reading back its events.

:func:`submit` returns a handle: iterate it (``for`` in a thread, ``async for`` in a
coroutine) for text chunks and, last, the :class:`~pyengine.runner.sequence.Completion`;
``cancel()`` stops the generation from anywhere.

The handle is the batching engine's own, so requests run concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pyengine.errors import ContextLengthError, InvalidOptionError

# Options about the request rather than the sampler chain (Ollama's names).
REQUEST_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep", "grammar", "format", "logprobs",
                             "top_logprobs", "shift", "cache_prompt"})


@dataclass(frozen=True)
class TextChunk:
    """A piece of generated text (the shape of the engine's Chunk that callers read)."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple | None = None


def context_limit(llm: Any, options: dict) -> int:
    """The context a request may use: ``num_ctx`` when given (at most the model's), else the model's."""
    value = options.get("num_ctx")
    if value is None:
        return llm.n_ctx
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"option 'num_ctx' must be a positive integer, got {value!r}")
    if value > llm.n_ctx:
        raise InvalidOptionError(f"option 'num_ctx' = {value} is larger than the context the model was loaded "
                                 f"with ({llm.n_ctx})")
    return value


def check_fits(llm: Any, ids: Sequence[int], options: dict) -> None:
    """A prompt longer than the context is an error (never silently truncated here)."""
    limit = context_limit(llm, options)
    if len(ids) > limit:
        raise ContextLengthError(f"the prompt has {len(ids)} tokens but the context holds {limit}; "
                                 "shorten the conversation or raise num_ctx")


def submit(llm: Any, ids: Sequence[int], *, max_tokens: int | None, temperature: float | None = None,
           seed: int | None = None, stop: Sequence[str] | str | None = None, images: Sequence = (),
           **options: Any):
    """Start generating after `ids`; returns a handle of chunks then a Completion.

    `max_tokens` None runs until end of generation, a stop string or the context's end
    (at most the tokens left in the context).
    Options use Ollama's names; an unknown one or a bad value raises InvalidOptionError here.
    """
    check_fits(llm, ids, options)
    if max_tokens is None:
        # "Until the end" stops where the context does: never an endless shifting run.
        max_tokens = max(context_limit(llm, options) - len(ids), 1)
    if images:   # (start, rows) pairs of pyengine.vision.prompt
        options["images"] = images
    return llm.submit(list(ids), max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                      **options)


__all__ = ["REQUEST_OPTIONS", "TextChunk", "check_fits", "context_limit", "submit"]
