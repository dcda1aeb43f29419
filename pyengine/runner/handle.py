"""RequestHandle: the caller's end of a submitted request.

The engine thread puts events (Chunk ..., then one Completion) into the
handle; the caller iterates them from a thread (`for event in handle`) or a
coroutine (`async for event in handle`), or just waits for the result.
An error the request hit in the engine is raised to the caller where the
events stop.  `cancel()` may be called from anywhere; the engine finishes
the request at its next step with finish_reason "cancelled".
"""

from __future__ import annotations

import threading
from collections import deque
from typing import AsyncIterator, Callable, Iterator

from pyengine.runner.sequence import Chunk, Completion

Event = Chunk | Completion


class RequestHandle:
    """Events of one request, in order; thread-safe; one consumer."""

    def __init__(self, request_id: int, wake: Callable[[], None]) -> None:
        self.id = request_id
        self._wake = wake
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._events: deque[Event] = deque()
        self._async_wakers: list[Callable[[], None]] = []
        self._cancel = False
        self._finished = False
        self._end_only = False   # the consumer waits in result(): wake it at the end only
        self._error: BaseException | None = None
        self.completion: Completion | None = None

    # ---- caller side -----------------------------------------------------------

    def cancel(self) -> None:
        """Ask the engine to stop this request (no-op once it is finished)."""
        self._cancel = True
        self._wake()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel

    @property
    def done(self) -> bool:
        """Whether the engine has finished with the request (events may remain unread)."""
        return self._finished

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self._next(None)
            yield event
            if isinstance(event, Completion):
                return

    def chunks(self) -> Iterator[Chunk]:
        """The Chunk events only (the Completion is kept in `completion`)."""
        for event in self:
            if isinstance(event, Chunk):
                yield event

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the end (dropping the chunks) and return the Completion.  The engine
        wakes a caller waiting here only at the end, not for every token: on a machine with
        as many compute threads as cores, each wake-up takes a core from the forward pass."""
        with self._ready:
            self._end_only = True
            try:
                if not self._ready.wait_for(lambda: self._finished, timeout):
                    raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
            finally:
                self._end_only = False
            while self._events:
                event = self._event_out(self._events.popleft())
                if isinstance(event, Completion):
                    return event
            if self._error is not None:
                raise self._error
            if self.completion is None:   # (cannot happen: a finished request left one or the other)
                raise RuntimeError(f"request {self.id} finished without a result")
            return self.completion         # asked again: the same Completion

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Event]:
        import asyncio  # here: a caller that iterates it has asyncio loaded already

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

    def _next(self, timeout: float | None) -> Event:
        with self._ready:
            if not self._ready.wait_for(lambda: self._events or self._error is not None, timeout):
                raise TimeoutError(f"request {self.id} produced nothing for {timeout} s")
            if self._events:
                return self._event_out(self._events.popleft())
            raise self._error

    def _take(self, waker: Callable[[], None]) -> Event | BaseException | None:
        with self._lock:
            if self._events:
                return self._event_out(self._events.popleft())
            if self._error is not None:
                return self._error
            self._async_wakers.append(waker)
            return None

    def _event_out(self, event: Event) -> Event:
        if isinstance(event, Completion):
            self.completion = event
        return event

    # ---- engine side -----------------------------------------------------------

    def _put(self, event: Event) -> None:
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
        if self._finished or not self._end_only:
            self._ready.notify_all()
        wakers, self._async_wakers = self._async_wakers, []
        for wake in wakers:
            wake()
