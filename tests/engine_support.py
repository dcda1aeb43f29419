"""What the engine tests share: an engine factory for fixtures, random prompts, greedy options
whose lengths are predictable, a driver for engines stepped by hand, and the scenario of two
requests that share a live prefix and both shift past the context; for the embedding tests, an
LLM's final-norm hidden rows and unit vectors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from pyengine.runner.engine import Engine
from pyengine.runner.sequence import Completion
from pyengine.sample import SamplingOptions

if TYPE_CHECKING:
    from pyengine import LLM


def engine_factory(parts, **defaults) -> Iterator[Callable[..., Engine]]:
    """The body of a `make` fixture: engines over `parts` (model, tokenizer, backend) with
    `defaults` for options the test leaves out; every engine built is closed afterwards."""
    engines = []

    def build(**kw) -> Engine:
        model, tok, backend = parts
        engine = Engine(model, tok, backend, **{**defaults, **kw})
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


def random_prompt(seed: int, n: int = 10, high: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(5, high, n).tolist()


def never_eog(engine: Engine) -> SamplingOptions:
    """Greedy with the end-of-generation tokens banned, so lengths are predictable."""
    return SamplingOptions(temperature=0.0, repeat_penalty=1.0,
                           logit_bias={t: False for t in engine.eog_ids})


def drive(engine: Engine) -> None:
    for _ in range(10_000):
        if not engine.step():
            return
    raise AssertionError("the engine did not finish")


def shift_with_a_live_sharer(engine: Engine, shared: list[int],
                             max_tokens: int) -> tuple[list[list[int]], Completion, Completion]:
    """Runs shared + [7] and shared + [9, 11] each alone, then the second while the first is
    live (so it reuses the first's prefix cells) for max_tokens each, past the context.
    Returns the alone outputs and the two shared runs' results."""
    opts = never_eog(engine)
    a, b = shared + [7], shared + [9, 11]
    alone = []
    for p in (a, b):
        handle = engine.submit(p, opts, max_tokens=max_tokens, cache_prompt=False)
        drive(engine)
        alone.append(handle.result().tokens)
    first = engine.submit(a, opts, max_tokens=max_tokens)
    engine.step()                        # a's prompt is in, a is live
    second = engine.submit(b, opts, max_tokens=max_tokens)
    drive(engine)
    return alone, first.result(), second.result()


def hidden_rows(model: LLM, ids: list[int]) -> np.ndarray:
    """Final-norm hidden states of every position of `ids`, alone in an empty sequence 0."""
    engine = model.engine
    positions = np.arange(len(ids))

    def run():
        try:
            return engine.forward.hidden(ids, positions, np.zeros(len(ids)), positions)
        finally:
            engine.cache.remove(0)

    return engine.call(run)


def unit(v) -> np.ndarray:
    """`v` (a vector, or rows along the last axis) scaled to length 1, in float64."""
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)
