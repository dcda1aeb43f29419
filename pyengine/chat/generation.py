"""Submitting token ids to an `LLM` and reading back its events, whatever its runner.

:func:`submit` returns a handle: iterate it (``for`` in a thread, ``async for`` in a
coroutine) for text chunks and, last, the :class:`~pyengine.runner.sequence.Completion`;
``cancel()`` stops the generation from anywhere.

With the batching engine (an `LLM` that has ``submit``) the handle is the engine's own
and requests run concurrently. With the single-sequence `LLM`, :class:`ThreadedRun`
drives ``LLM._generate`` in a thread of its own (its lock must be taken and released
by one thread), so requests for one model take turns. This module is the only place
that knows the difference.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.runner.sequence import Completion

# Options about the request rather than the sampler chain (Ollama's names).
REQUEST_OPTIONS = frozenset({"num_predict", "num_ctx", "num_keep", "grammar", "format", "logprobs",
                             "top_logprobs", "shift", "cache_prompt"})
# Options only the batching engine implements.
_ENGINE_ONLY = ("grammar", "format", "logprobs", "top_logprobs")
_LOCK_POLL_S = 0.05


@dataclass(frozen=True)
class TextChunk:
    """A piece of generated text (the shape of the engine's Chunk that callers read)."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple | None = None


def has_engine(llm: Any) -> bool:
    """Whether `llm` runs requests through the batching engine (concurrently)."""
    return callable(getattr(llm, "submit", None))


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


def submit(llm: Any, ids: Sequence[int], *, max_tokens: int | None, temperature: float,
           seed: int | None = None, stop: Sequence[str] | str | None = None, **options: Any):
    """Start generating after `ids`; returns a handle of chunks then a Completion.

    `max_tokens` None runs until end of generation, a stop string or the context's end
    (at most the tokens left in the context).
    Options use Ollama's names; an unknown one or a bad value raises InvalidOptionError here.
    """
    check_fits(llm, ids, options)
    if max_tokens is None:
        # "Until the end" stops where the context does: never an endless shifting run.
        max_tokens = max(context_limit(llm, options) - len(ids), 1)
    if has_engine(llm):
        return llm.submit(list(ids), max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                          **options)
    return ThreadedRun(llm, list(ids), max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                       options=options)


class ThreadedRun:
    """One generation of a single-sequence `LLM`, driven by a thread of its own.

    The thread waits for the model's lock (giving up at once when cancelled), then
    runs the generator and queues its events; the caller reads them from any thread
    or coroutine.
    """

    def __init__(self, llm: Any, ids: list[int], *, max_tokens: int | None, temperature: float,
                 seed: int | None, stop: Sequence[str] | str | None, options: dict) -> None:
        options = dict(options)
        unsupported = [name for name in _ENGINE_ONLY if options.get(name) not in (None, False, "", 0)]
        if unsupported:
            raise InvalidOptionError(f"option {unsupported[0]!r} is not supported by this model runner")
        for name in REQUEST_OPTIONS:
            options.pop(name, None)
        # _generate validates everything eagerly and returns the (not yet started) generator.
        self._pieces = llm._generate(ids, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                     stop=stop, options=options)
        self._llm = llm
        self._n_prompt = len(ids)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._events: deque = deque()
        self._wakers: list[Callable[[], None]] = []
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._finished = False
        self.completion: Completion | None = None
        self._thread = threading.Thread(target=self._drive, name="pyengine-generate", daemon=True)
        self._thread.start()

    # ---- caller side ---------------------------------------------------------------

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def done(self) -> bool:
        return self._finished

    def __iter__(self) -> Iterator[TextChunk | Completion]:
        while True:
            event = self._next()
            yield event
            if isinstance(event, Completion):
                return

    def result(self) -> Completion:
        for event in self:
            if isinstance(event, Completion):
                return event
        raise AssertionError("unreachable: a run always ends with its Completion")

    def __aiter__(self) -> AsyncIterator[TextChunk | Completion]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[TextChunk | Completion]:
        loop = asyncio.get_running_loop()
        while True:
            future = loop.create_future()

            def wake(fut=future) -> None:
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

            event = self._take(wake)
            if event is None:
                await future
                continue
            if isinstance(event, BaseException):
                raise event
            yield event
            if isinstance(event, Completion):
                return

    def _next(self) -> TextChunk | Completion:
        with self._ready:
            self._ready.wait_for(lambda: self._events or self._error is not None)
            if self._events:
                return self._out(self._events.popleft())
            raise self._error

    def _take(self, waker: Callable[[], None]):
        with self._lock:
            if self._events:
                return self._out(self._events.popleft())
            if self._error is not None:
                return self._error
            self._wakers.append(waker)
            return None

    def _out(self, event):
        if isinstance(event, Completion):
            self.completion = event
        return event

    # ---- the generating thread -------------------------------------------------------

    def _drive(self) -> None:
        model_lock = getattr(self._llm, "_lock", None)
        got_lock = False
        try:
            if model_lock is not None:
                while not model_lock.acquire(timeout=_LOCK_POLL_S):
                    if self._cancel.is_set():
                        self._put(Completion(finish_reason="cancelled", prompt_tokens=self._n_prompt))
                        return
                got_lock = True
            self._run()
        except BaseException as exc:  # handed to the reader, which raises it
            self._fail(exc)
        finally:
            self._pieces.close()
            if got_lock:
                model_lock.release()

    def _run(self) -> None:
        text: list[str] = []
        for item in self._pieces:
            if isinstance(item, Completion):
                self._put(item)
                return
            text.append(item)
            self._put(TextChunk(item))
            if self._cancel.is_set():
                self._put(Completion(text="".join(text), finish_reason="cancelled", prompt_tokens=self._n_prompt))
                return
        raise RuntimeError("the generator ended without its Completion")

    def _put(self, event) -> None:
        with self._lock:
            self._events.append(event)
            if isinstance(event, Completion):
                self._finished = True
            self._notify()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self._error = error
            self._finished = True
            self._notify()

    def _notify(self) -> None:
        self._ready.notify_all()
        wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()


__all__ = ["REQUEST_OPTIONS", "TextChunk", "ThreadedRun", "check_fits", "context_limit", "has_engine", "submit"]
