"""Submitting token ids to an `LLM` and reading back its events.

:func:`submit` returns a handle: iterate it (``for`` in a thread, ``async for`` in a
coroutine) for text chunks and, last, the :class:`~pyengine.runner.sequence.Completion`;
``cancel()`` stops the generation from anywhere.

The handle is the batching engine's own, so requests run concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pyengine.options import context_limit


@dataclass(frozen=True)
class TextChunk:
    """A piece of generated text (the shape of the engine's Chunk that callers read)."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple | None = None


def submit(llm: Any, ids: Sequence[int], *, max_tokens: int | None, temperature: float | None = None,
           seed: int | None = None, stop: Sequence[str] | str | None = None, images: Sequence = (),
           **options: Any):
    """Start generating after `ids`; returns a handle of chunks then a Completion.

    `max_tokens` None runs until end of generation, a stop string or the context's end
    (at most the tokens left in the context).
    Options use Ollama's names; an unknown one or a bad value raises InvalidOptionError here.
    """
    # A conversation is never cut to fit: one too long is the engine's ContextLengthError.
    options.pop("truncate", None)
    if max_tokens is None:
        # "Until the end" stops where the context does: never an endless shifting run.
        max_tokens = max(context_limit(llm.n_ctx, options.get("num_ctx")) - len(ids), 1)
    if images:   # (start, rows) pairs of pyengine.vision.prompt
        options["images"] = images
    return llm.submit(list(ids), max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                      **options)


__all__ = ["TextChunk", "submit"]
