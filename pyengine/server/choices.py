"""OpenAI's ``n``: several choices of one request, sampled as parallel sequences.

The n generations are started one after the other with the same prompt; the engine
computes that prompt once and starts the others on its cache cells (runner/engine.py:
twins). Each choice has its own seed, derived from the request's, so the choices differ
and the whole response is still reproducible. :class:`Choices` holds the runs: the
server collects them, or merges their streamed events, each tagged with its index.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

from pyengine.server.streaming import collect

MAX_CHOICES = 8               # n above this is a 400: every choice holds a sequence slot
_SEED_STEP = 0x9E3779B97F4A7C15   # an odd 64-bit step (the golden ratio's): derived seeds spread out


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index`: the request's for the first, one derived from it for the
    others; no seed (or a negative one, meaning random) stays random for every choice."""
    if seed is None or seed < 0 or index == 0:
        return seed
    return (seed + index * _SEED_STEP) % 2**64


class Choices:
    """The runs (ChatStreams) of one request's n choices; cancel() stops them all."""

    def __init__(self, runs: list[Any]) -> None:
        self.runs = runs

    def cancel(self) -> None:
        for run in self.runs:
            run.cancel()

    async def collect(self, receive) -> list[Any] | None:
        """Every choice's result, or None when the client went away first."""
        results = []
        for run in self.runs:
            result = await collect(run, receive)
            if result is None:
                self.cancel()
                return None
            results.append(result)
        return results

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """(index, event) pairs of all the runs as they come, each run's in its order."""
        iterators = [run.__aiter__() for run in self.runs]
        pending = {asyncio.ensure_future(it.__anext__()): i for i, it in enumerate(iterators)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=pending.__getitem__):
                    index = pending.pop(task)
                    try:
                        event = task.result()
                    except StopAsyncIteration:
                        continue
                    pending[asyncio.ensure_future(iterators[index].__anext__())] = index
                    yield index, event
        finally:
            for task in pending:
                task.cancel()
            self.cancel()


def start_choices(start: Callable[[dict], Any], options: dict, n: int) -> Any:
    """Start n choices with `start(options)`: the run itself for n = 1, else Choices
    (the runs started so far are cancelled if a later one fails to start)."""
    if n == 1:
        return start(options)
    runs: list[Any] = []
    try:
        for index in range(n):
            runs.append(start({**options, "seed": choice_seed(options.get("seed"), index)}))
    except BaseException:
        for run in runs:
            run.cancel()
        raise
    return Choices(runs)


def merged_usage(results: list[Any]) -> dict:
    """Usage of n choices: the prompt counted once, the completions summed."""
    prompt = results[0].prompt_tokens
    completion = sum(result.completion_tokens for result in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


__all__ = ["Choices", "MAX_CHOICES", "choice_seed", "merged_usage", "start_choices"]
