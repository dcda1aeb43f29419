"""The runner: forward passes over the KV cache, requests, and the batch loop."""

from pyengine.runner.engine import Engine
from pyengine.runner.handle import RequestHandle
from pyengine.runner.sequence import Chunk, Completion, StopMatcher, TokenLogprob

__all__ = ["Engine", "RequestHandle", "Chunk", "Completion", "StopMatcher", "TokenLogprob"]
