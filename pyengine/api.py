"""The Python API: `LLM` loads a GGUF model and runs it.

    from pyengine import LLM
    llm = LLM("smollm2-135m")               # a catalog name or a path to a .gguf
    print(llm.generate("Why is the sky blue?", max_tokens=64))
    for piece in llm.generate("Tell me a story", stream=True, temperature=0.7, top_k=40):
        print(piece, end="", flush=True)
    llm.create_completion("Once upon a time", max_tokens=32)   # OpenAI completion dict
    vectors = llm.embed(["first text", "second text"])         # unit vectors of n_embd floats
    llm.rerank("query", ["doc a", "doc b"])                    # [{"index", "relevance_score"}] best first

Sampling defaults depend on the method, as each mirrors an API (see the README's
table): ``generate``, ``chat`` and ``submit`` take Ollama's (temperature 0.8, top_k 40,
top_p 0.9, no penalty), ``create_completion`` / ``create_chat_completion``
llama-cpp-python's (temperature 0.8 / 0.2, top_k 40, top_p 0.95, min_p 0.05); the
model file's ``general.sampling.*`` values come over those, the options given over
everything. ``temperature=0`` is greedy: the most likely token, after a repetition
penalty only where one is in force (given, or set by the file).

Options use Ollama's names (temperature, top_k, top_p, min_p, typical_p,
repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed,
num_predict, stop, mirostat, mirostat_tau, mirostat_eta, num_ctx, num_keep,
grammar, format, logit_bias, logprobs, top_logprobs, shift, truncate, ...); an unknown
name or a bad value raises InvalidOptionError naming it.

Every method may be called from many threads at once: generations share
the engine's batch loop (up to `n_parallel` sequences in each forward pass).
"""

from __future__ import annotations

import os
import time
import uuid
import weakref
from typing import Iterator, Sequence

import numpy as np

from pyengine import embedding
from pyengine.errors import ContextLengthError, InvalidOptionError, UnsupportedCapabilityError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.options import REQUEST_OPTIONS, RequestOptions, sampling_options
from pyengine.runner.engine import DEFAULT_BATCH, DEFAULT_PARALLEL, Engine
from pyengine.runner.handle import RequestHandle
from pyengine.runner.sequence import Chunk, Completion, TokenLogprob
from pyengine.runner.speculative import DraftModel, check_same_vocab
from pyengine.sample import SamplingOptions
from pyengine.sample.options import model_sampling
from pyengine.tokenizer import Tokenizer

DEFAULT_CTX = 4096



class LLM:
    """A loaded model with its tokenizer, KV cache, thread pool and batch loop."""

    def __init__(self, model: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = DEFAULT_BATCH, n_parallel: int = DEFAULT_PARALLEL, kv_type: str | None = None,
                 swa_full: bool = False, mmproj: str | os.PathLike | None = None,
                 draft_model: str | os.PathLike | None = None, speculative: str | None = None) -> None:
        """mmproj: a vision projector (llama.cpp's mmproj GGUF) for images in chats.
        draft_model: a small model with this one's vocabulary, for requests with
        speculative="draft" (runner/speculative.py); speculative: the speculation of
        requests that name none ("ngram", "draft"; None: off)."""
        from pyengine.store import resolve_model

        self.path = resolve_model(model)
        self.model_name = self.path.stem if os.path.sep in str(model) else str(model)
        self.gguf = GGUFFile(self.path)
        self.model = load_model(self.gguf)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.sampling_defaults = model_sampling(self.gguf.metadata)   # the file's general.sampling.*
        cfg = self.model.cfg
        self.n_ctx = _positive_int("n_ctx", n_ctx if n_ctx is not None else min(cfg.n_ctx_train, DEFAULT_CTX))
        self.n_batch = _positive_int("n_batch", n_batch)
        self.backend = Backend(n_threads)
        self.projector = None
        if mmproj is not None:
            from pyengine.vision.projector import load_projector

            self.projector = load_projector(mmproj)
            self.projector.check_fits(getattr(cfg, "n_embd_input", cfg.n_embd), text_model=str(self.path))
        draft = None if draft_model is None else load_draft_model(draft_model, self, n_parallel)
        self.engine = Engine(self.model, self.tokenizer, self.backend, n_ctx=self.n_ctx, n_batch=self.n_batch,
                             n_parallel=n_parallel, kv_type=kv_type, swa_full=swa_full, draft=draft,
                             speculative=speculative,
                             images_both_ways=self.projector is None or self.projector.attends_both_ways)
        self._closer = weakref.finalize(self, self.engine.close)

    # ---- properties ----------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.model.cfg.n_vocab

    @property
    def n_threads(self) -> int:
        return self.backend.n_threads

    @property
    def n_parallel(self) -> int:
        return self.engine.n_parallel

    @property
    def architecture(self) -> str:
        return self.gguf.architecture

    @property
    def cache(self):
        """The engine's KV cache (for inspection and benchmarks)."""
        return self.engine.cache

    @property
    def forward(self):
        """The engine's Forward (benchmarks drive it directly while no request runs)."""
        return self.engine.forward

    def stats(self) -> dict:
        return self.engine.stats()

    def close(self) -> None:
        """Stop the batch loop (unfinished requests end as cancelled)."""
        self._closer()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tokens ----------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # ---- forward ---------------------------------------------------------------

    def forward_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits of every position, float32 [len(ids), n_vocab], as from an empty cache."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidOptionError("ids must be a non-empty 1-D sequence of token ids")
        handle = self.engine.submit(ids.tolist(), max_tokens=0, all_logits=True, shift=False)
        return _wait(handle).logits

    # ---- embeddings --------------------------------------------------------------

    def embed(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], normalize: bool = True,
              truncate: bool = True, return_count: bool = False, pooling: str | int | None = None,
              dimensions: int | None = None) -> list | tuple[list, int]:
        """One vector per input (a text, a list of texts, a list of token ids or a list of
        such lists), all inputs batched into shared forward passes (pyengine/embedding.py).
        `pooling` (default: the file's ``pooling_type``, mean for a decoder): "mean" over
        the final-norm hidden states, as llama.cpp's `--pooling mean`, "cls" or "last" (one
        token's state), "none" (a list of per-token vectors for each input) or "rank" (the
        relevance output of a reranker). L2-normalised unless `normalize` is False;
        `dimensions` keeps the first d components and renormalises (Matryoshka). Texts are
        tokenized with the model's BOS/EOS. An input longer than the context is cut to it
        (`truncate`) or raises ContextLengthError. With `return_count`, also the number of
        tokens embedded, over all inputs."""
        pooling = self.pooling if pooling is None else embedding.pooling_name(pooling)
        prompts = [self._embedding_ids(item, truncate) for item in _embedding_inputs(inputs)]
        vectors = embedding.embed_prompts(self.engine, prompts, pooling, normalize=normalize and pooling != "rank",
                                          dimensions=dimensions)
        vectors = [v.tolist() for v in vectors]
        if return_count:
            return vectors, sum(len(ids) for ids in prompts)
        return vectors

    @property
    def pooling(self) -> str:
        """The pooling the file declares (``{arch}.pooling_type``), mean where it declares none."""
        return embedding.model_pooling(self.gguf.metadata)

    @property
    def is_embedding_model(self) -> bool:
        """Whether the model only embeds (a pooling type in its file, or no LM head)."""
        return embedding.is_embedding_model(self.gguf.metadata)

    def create_embedding(self, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                         model: str | None = None, dimensions: int | None = None) -> dict:
        """OpenAI's embeddings response: ``{"object": "list", "data": [{"object": "embedding",
        "index", "embedding"}], "model", "usage"}``."""
        vectors, count = self.embed(input, return_count=True, dimensions=dimensions)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": model or self.model_name,
                "usage": {"prompt_tokens": count, "total_tokens": count}}

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None, truncate: bool = True,
               return_count: bool = False) -> list[dict] | tuple[list[dict], int]:
        """The documents ordered by relevance to `query`, best first: ``[{"index",
        "relevance_score"}]`` (the first `top_n`). A cross-encoder (a model with a
        classification head) scores "query [SEP] document" as llama.cpp formats it; a
        decoder (Qwen3-Reranker) scores p(yes) after its reranking prompt."""
        if not isinstance(query, str) or isinstance(documents, str) or \
                any(not isinstance(d, str) for d in documents):
            raise InvalidOptionError("rerank takes a query text and a list of document texts")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
            raise InvalidOptionError(f"top_n must be a non-negative integer, got {top_n!r}")
        pairs = embedding.rerank_prompts(self.tokenizer, self.gguf.metadata, self.model, query, list(documents))
        prompts = [self._embedding_ids(ids, truncate) for ids in pairs]
        outputs = embedding.embed_prompts(self.engine, prompts, "rank", normalize=False)
        ranked = embedding.rank_order([float(out[0]) for out in outputs], top_n)
        if return_count:
            return ranked, sum(len(ids) for ids in prompts)
        return ranked

    def _embedding_ids(self, item: str | list[int], truncate: bool) -> list[int]:
        if isinstance(item, str):
            ids = self.tokenize(item, add_special=True, parse_special=False)
        else:
            ids = item
            if any(not 0 <= t < self.n_vocab for t in ids):
                raise InvalidOptionError(f"token ids to embed must be in [0, {self.n_vocab})")
        if not ids:
            raise InvalidOptionError("an input to embed has no tokens")
        if len(ids) > self.n_ctx:
            if not truncate:
                raise ContextLengthError(f"an input to embed has {len(ids)} tokens but the context holds "
                                         f"{self.n_ctx}; shorten it or allow truncation")
            ids = ids[: self.n_ctx]
        return ids

    # ---- generation --------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float | None = None,
                 stream: bool = False, seed: int | None = None, stop: Sequence[str] | str | None = None,
                 **options) -> str | Iterator[str]:
        """Continue `prompt` (text or token ids); the text, or an iterator of text pieces.
        Ollama's sampling defaults (temperature 0.8); ``temperature=0`` for greedy."""
        handle = self.submit(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                             **options)
        if stream:
            return _Stream(handle, lambda event: event.text or None if isinstance(event, Chunk) else None)
        return _wait(handle).text

    def __call__(self, prompt: str | Sequence[int], **kwargs) -> dict | Iterator[dict]:
        """create_completion, as llama-cpp-python's Llama is called."""
        return self.create_completion(prompt, **kwargs)

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float | None = None,
                          stream: bool = False, seed: int | None = None,
                          stop: Sequence[str] | str | None = None, **options) -> dict | Iterator[dict]:
        """OpenAI's completion object (`text_completion`), or its chunks when streaming;
        llama-cpp-python's sampling defaults (temperature 0.8, top_p 0.95, top_k 40, min_p 0.05)."""
        handle = self.submit(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                             surface="llama-cpp-python", **options)
        head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if stream:
            return _Stream(handle, lambda event: self._completion_chunk(head, event))
        result = _wait(handle)
        choice = {"text": result.text, "index": 0,
                  "logprobs": self._openai_logprobs(result.logprobs) if result.logprobs is not None else None,
                  "finish_reason": result.finish_reason}
        return {**head, "choices": [choice], "usage": _usage(result)}

    def submit(self, prompt: str | Sequence[int], *, max_tokens: int | None = 128, temperature: float | None = None,
               seed: int | None = None, stop: Sequence[str] | str | None = None, surface: str = "ollama",
               parameters: dict | None = None, images: Sequence = (), **options) -> RequestHandle:
        """Queue a generation with Ollama-named options; the handle streams Chunk events and
        ends with the Completion (counts, timings, finish_reason, logprobs).

        Options not given take `surface`'s defaults ("ollama", "openai", "llama-cpp-python",
        "llama-cpp-python-chat"), overridden by the file's ``general.sampling.*`` and then
        by `parameters` (a created model's, Ollama's names): see :meth:`sampling_options`.
        An embedding model (:attr:`is_embedding_model`) raises UnsupportedCapabilityError."""
        if self.is_embedding_model:
            raise UnsupportedCapabilityError(self.model_name, "completion", "generate")
        ids = self.tokenize(prompt, parse_special=True) if isinstance(prompt, str) else prompt
        sampling = self.sampling_options(surface, {**{k: v for k, v in options.items() if k not in REQUEST_OPTIONS},
                                                   "temperature": temperature, "seed": seed}, parameters=parameters)
        request = RequestOptions.from_ollama({**options, "stop": stop}, surface=surface, created=parameters,
                                             max_tokens=max_tokens, sampling=sampling)
        return self.engine.submit(ids, request, images=images)

    def sampling_options(self, surface: str, request: dict, parameters: dict | None = None) -> SamplingOptions:
        """The sampler settings of a request (Ollama's names): `surface`'s defaults < this
        file's ``general.sampling.*`` < a created model's `parameters` < `request`."""
        return sampling_options(surface, request, model=self.sampling_defaults, created=parameters)

    # ---- chat ------------------------------------------------------------------

    def chat(self, messages, tools=None, format=None, think=None, stream=False, **options):
        """Ollama-style chat: the model's template, reasoning and tool-call parsing."""
        from pyengine.session import chat

        return chat(self, messages, tools=tools, format=format, think=think, stream=stream, **options)

    def create_chat_completion(self, messages, **kwargs):
        """OpenAI-style chat completion (llama-cpp-python's method of the same name)."""
        from pyengine.session import create_chat_completion

        return create_chat_completion(self, messages, **kwargs)

    # ---- OpenAI shapes -----------------------------------------------------------

    def _completion_chunk(self, head: dict, event: Chunk | Completion) -> dict | None:
        if isinstance(event, Completion):
            choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": event.finish_reason}
            return {**head, "choices": [choice], "usage": _usage(event)}
        if not event.text and not event.logprobs:
            return None
        logprobs = self._openai_logprobs(list(event.logprobs)) if event.logprobs else None
        return {**head, "choices": [{"text": event.text, "index": 0, "logprobs": logprobs, "finish_reason": None}]}

    def _openai_logprobs(self, items: list[TokenLogprob]) -> dict:
        tokens = [self._piece(lp.token) for lp in items]
        offsets = np.cumsum([0] + [len(t) for t in tokens[:-1]]).tolist() if tokens else []
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
                "top_logprobs": [{self._piece(t): v for t, v in lp.top} for lp in items],
                "text_offset": offsets}

    def _piece(self, token: int) -> str:
        return self.tokenizer.token_to_bytes(token).decode("utf-8", "replace")


class _Stream:
    """Iterator over a request's events mapped to values (None: skipped); stopping early
    (close, garbage collection) cancels the request."""

    def __init__(self, handle: RequestHandle, mapper) -> None:
        self._handle = handle
        self._events = iter(handle)
        self._mapper = mapper

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self):
        while True:
            try:
                event = next(self._events)
            except BaseException:
                self._handle.cancel()
                raise
            value = self._mapper(event)
            if value is not None:
                return value

    def close(self) -> None:
        if not self._handle.done:
            self._handle.cancel()

    def __del__(self) -> None:
        self.close()


def _wait(handle: RequestHandle) -> Completion:
    try:
        return handle.result()
    except BaseException:
        handle.cancel()
        raise


def _usage(result: Completion) -> dict:
    usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
             "total_tokens": result.prompt_tokens + result.completion_tokens}
    if result.speculative:
        usage.update(draft_tokens=result.draft_tokens, draft_accepted_tokens=result.draft_accepted)
    return usage


def load_draft_model(path: str | os.PathLike, target: LLM, n_parallel: int) -> DraftModel:
    """The draft model of `target`: same vocabulary (TokenizerError naming what differs),
    the target's context and thread pool."""
    from pyengine.store import resolve_model

    gguf = GGUFFile(resolve_model(path))
    model = load_model(gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    check_same_vocab(target.tokenizer, target.n_vocab, tokenizer, model.cfg.n_vocab)
    return DraftModel(model, tokenizer, target.backend, n_ctx=target.n_ctx, n_parallel=n_parallel,
                      n_batch=target.n_batch)


def _embedding_inputs(inputs: object) -> list[str | list[int]]:
    """The inputs of `embed` as a list of texts and token-id lists."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (bytes, bytearray)) or not isinstance(inputs, (Sequence, np.ndarray)):
        raise InvalidOptionError("embed takes a text, a list of texts or token ids, or a list of token-id lists")
    items = list(inputs)
    if items and all(_is_token(t) for t in items):
        return [[int(t) for t in items]]
    out: list[str | list[int]] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, (list, tuple, np.ndarray)) and all(_is_token(t) for t in item):
            out.append([int(t) for t in item])
        else:
            raise InvalidOptionError(f"cannot embed {type(item).__name__} {str(item)[:40]!r}: give texts or "
                                     "lists of token ids")
    return out


def _is_token(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)




def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return value
