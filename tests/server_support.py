"""Running a pyengine server in a background thread for tests, and fake models that
make timing deterministic."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn

from pyengine.chat.parsers import Delta
from pyengine.server import ServerConfig, create_app
from pyengine.session import ChatPiece, ChatResult


@dataclass
class RunningServer:
    url: str
    port: int
    app: object
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self):
        return self.app.state.pyengine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Polls condition() until it holds or the timeout passes; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@contextlib.contextmanager
def running_server(config: ServerConfig | None = None, **create_kwargs):
    """A server on a free loopback port, stopped on exit."""
    config = config or ServerConfig()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config.port = port
    app = create_app(config, **create_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    running = RunningServer(f"http://127.0.0.1:{port}", port, app, server, thread)
    try:
        yield running
    finally:
        running.stop()
        sock.close()


# --------------------------------------------------------------------------------------
# A fake model: each reply is `pieces` words, one every `delay_s` seconds
# --------------------------------------------------------------------------------------


@dataclass
class FakeRun:
    pieces: int
    delay_s: float
    fail_with: Exception | None = None  # raised after the first piece
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    result: ChatResult | None = None

    def cancel(self) -> None:
        if self.result is None:
            self.cancelled.set()

    def __aiter__(self):
        return self._events()

    async def _events(self):
        words = []
        for n in range(self.pieces):
            if self.cancelled.is_set():
                break
            await asyncio.sleep(self.delay_s)
            words.append(f"w{n} ")
            yield ChatPiece((Delta("content", words[-1]),))
            if self.fail_with is not None:
                raise self.fail_with
        reason = "cancelled" if self.cancelled.is_set() else "stop"
        self.result = ChatResult(content="".join(words), reasoning=None, tool_calls=[], finish_reason=reason,
                                 prompt_tokens=3, completion_tokens=len(words))
        self.finished.set()
        yield self.result


class FakeAdapter:
    """Stands in for ModelAdapter: no model, replies of `pieces` words at a fixed pace."""

    n_ctx = 128

    def __init__(self, pieces: int = 5, delay_s: float = 0.05, fail_with: Exception | None = None) -> None:
        self.pieces = pieces
        self.delay_s = delay_s
        self.fail_with = fail_with
        self.runs: list[FakeRun] = []
        self.closed = False

    def _run(self) -> FakeRun:
        run = FakeRun(self.pieces, self.delay_s, self.fail_with)
        self.runs.append(run)
        return run

    def start_chat(self, messages, **kwargs) -> FakeRun:
        return self._run()

    def start_generate(self, prompt, **kwargs) -> FakeRun:
        return self._run()

    def start_completion(self, prompt, **kwargs) -> FakeRun:
        return self._run()

    def embed(self, inputs, *, normalize: bool = True, truncate: bool = True, pooling=None, dimensions=None):
        """One fixed unit vector per input, one token per input."""
        return [[1.0, 0.0, 0.0][:dimensions] for _ in inputs], len(inputs)

    def rerank(self, query, documents, *, top_n=None):
        """Shorter documents first (score 1 / length), one token per document."""
        scores = [1.0 / (1 + len(d)) for d in documents]
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
        return [{"index": i, "relevance_score": scores[i]} for i in order], len(documents)

    def token_bytes(self, token: int) -> bytes:
        return b"?"

    def detokenize(self, ids) -> str:
        return ""

    def close(self) -> None:
        self.closed = True


def fake_loader(adapter: FakeAdapter):
    return lambda name, path, config: adapter
