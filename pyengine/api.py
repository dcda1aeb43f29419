"""The Python API: `LLM` loads a GGUF model and runs it.

    from pyengine import LLM
    llm = LLM("smollm2-135m")               # a catalog name or a path to a .gguf
    print(llm.generate("Why is the sky blue?", max_tokens=64))
    for piece in llm.generate("Tell me a story", stream=True):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import os
import threading
import time
from typing import Iterator, Sequence

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.gguf import GGUFFile
from pyengine.kvcache import KVCache
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.forward import Forward
from pyengine.runner.sequence import Completion, StopMatcher
from pyengine.sample import SamplerChain, SamplingOptions
from pyengine.tokenizer import StreamDecoder, Tokenizer

DEFAULT_CTX = 4096
DEFAULT_BATCH = 512


class LLM:
    """A loaded model with its tokenizer, KV cache and thread pool."""

    def __init__(self, model: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = DEFAULT_BATCH) -> None:
        from pyengine.store import resolve_model

        self.path = resolve_model(model)
        self.gguf = GGUFFile(self.path)
        self.model = load_model(self.gguf)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        cfg = self.model.cfg
        self.n_ctx = _positive_int("n_ctx", n_ctx if n_ctx is not None else min(cfg.n_ctx_train, DEFAULT_CTX))
        self.n_batch = _positive_int("n_batch", n_batch)
        self.backend = Backend(n_threads)
        self.cache = KVCache(self.model.cache_layout(), self.n_ctx)
        self.forward = Forward(self.model, self.backend, self.cache)
        self._lock = threading.RLock()

    # ---- properties ----------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.model.cfg.n_vocab

    @property
    def n_threads(self) -> int:
        return self.backend.n_threads

    @property
    def architecture(self) -> str:
        return self.gguf.architecture

    # ---- tokens ----------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # ---- forward ---------------------------------------------------------------

    def forward_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits of every position, float32 [len(ids), n_vocab], from an empty cache."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise InvalidOptionError("ids must be a non-empty 1-D sequence of token ids")
        self._check_fits(ids.size, 0)
        with self._lock:
            self.cache.clear()
            out = np.empty((ids.size, self.n_vocab), np.float32)
            for start in range(0, ids.size, self.n_batch):
                chunk = ids[start:start + self.n_batch]
                n = chunk.size
                self.forward(chunk, np.arange(start, start + n), np.zeros(n), np.arange(n), out[start:start + n])
            self.cache.clear()
            return out

    def _prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Run the prompt in chunks; return the last position's logits."""
        ids = np.asarray(ids, dtype=np.int64)
        logits = None
        for start in range(0, ids.size, self.n_batch):
            chunk = ids[start:start + self.n_batch]
            n = chunk.size
            logits = self.forward(chunk, np.arange(start, start + n), np.zeros(n), np.array([n - 1]))
        return logits[0]

    def _check_fits(self, n_prompt: int, n_more: int) -> None:
        if n_prompt > self.n_ctx:
            raise ContextLengthError(
                f"the prompt has {n_prompt} tokens but the context holds {self.n_ctx} (raise n_ctx / num_ctx)")

    # ---- generation --------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.0,
                 stream: bool = False, seed: int | None = None, stop: Sequence[str] | str | None = None,
                 **options) -> str | Iterator[str]:
        """Continue `prompt` (text or token ids); the text, or an iterator of pieces."""
        pieces = self._generate(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                stop=stop, options=options)
        if stream:
            return (p for p in pieces if not isinstance(p, Completion))
        return "".join(p for p in pieces if not isinstance(p, Completion))

    def _generate(self, prompt, *, max_tokens, temperature, seed, stop, options) -> Iterator[str | Completion]:
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise InvalidOptionError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        sampling = SamplingOptions.from_dict({"temperature": temperature, "seed": seed, **options})
        ids = self.tokenize(prompt, parse_special=True) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidOptionError("the prompt is empty")
        self._check_fits(len(ids), 0)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return self._run(ids, max_tokens, sampling, stops)

    def _run(self, ids: list[int], max_tokens: int, sampling: SamplingOptions,
             stops: list[str]) -> Iterator[str | Completion]:
        with self._lock:
            chain = SamplerChain(sampling, self.n_vocab, eog_ids=self.tokenizer.eog_ids)
            chain.accept_prompt(ids)
            decoder = StreamDecoder(self.tokenizer)
            matcher = StopMatcher(stops)
            result = Completion(prompt_tokens=len(ids))
            self.cache.clear()
            t0 = time.perf_counter()
            logits = self._prefill(ids)
            result.prompt_seconds = time.perf_counter() - t0
            pos = len(ids)
            t1 = time.perf_counter()
            try:
                while len(result.tokens) < max_tokens:
                    token = chain.sample(logits)
                    chain.accept(token)
                    if self.tokenizer.is_eog(token):
                        result.finish_reason = "stop"
                        break
                    result.tokens.append(token)
                    text = matcher.push(decoder.push(token))
                    if text:
                        result.text += text
                        yield text
                    if matcher.stopped:
                        result.finish_reason = "stop"
                        break
                    if pos >= self.n_ctx:
                        break
                    logits = self.forward(np.array([token]), np.array([pos]), np.zeros(1), np.zeros(1))[0]
                    pos += 1
                tail = matcher.push(decoder.flush()) + matcher.flush()
                if tail:
                    result.text += tail
                    yield tail
            finally:
                self.cache.clear()
            result.generation_seconds = time.perf_counter() - t1
            yield result


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return value
