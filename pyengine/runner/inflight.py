"""Sequence: a request in flight in the engine, from submit to its Completion."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pyengine.runner.handle import RequestHandle
from pyengine.runner.request import Request
from pyengine.runner.sequence import Completion, StopMatcher, TokenLogprob

if TYPE_CHECKING:
    from pyengine.options import RequestOptions
    from pyengine.runner.slots import Slot
    from pyengine.sample import SamplerChain
    from pyengine.tokenizer import StreamDecoder


@dataclass(eq=False)
class Sequence:
    """A request in flight, from submit to its Completion: what was asked (fixed), what
    the cache holds of it, and what it produced so far.  The engine thread alone reads
    and writes it."""

    # ---- what was asked, and how it samples and decodes
    req: Request
    options: RequestOptions          # the request's options (the draft sizes)
    handle: RequestHandle
    chain: SamplerChain
    decoder: StreamDecoder
    speculative: str | None = None   # "ngram" / "draft": drafts verified with each step (runner/speculative.py)
    images: dict[int, np.ndarray] = field(default_factory=dict)   # prompt position -> rows [n, n_embd]
    grids: dict[int, tuple[int, int]] = field(default_factory=dict)   # prompt position -> an image's token grid
    keys: list[int] | None = None    # the prompt as the cache is keyed: images' positions by content
    matcher: StopMatcher = field(init=False)

    # ---- its place in the cache
    slot: Slot | None = None
    cache_tokens: list[int] = field(default_factory=list)   # fed to the model, position order
    valid: int = 0                   # leading cache_tokens whose K/V equal a fresh computation of them
    pending: list[int] = field(default_factory=list)        # to feed next
    prefill: bool = True
    twin: Sequence | None = None     # a live sequence with the same prompt, computing or computed
    prompt_row: np.ndarray | None = None   # the logits of the prompt's last token, while live

    # ---- what it produced
    tokens: list[int] = field(default_factory=list)   # generated (an ending EOG not among them)
    text: str = ""                   # released so far
    logprobs: list[TokenLogprob] | None = None   # a list when the request asked for them
    logits: np.ndarray | None = None   # every prompt position's logits, for scoring requests
    reused_tokens: int = 0           # prompt tokens found in the cache
    context_shifts: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    finish_reason: str | None = None   # set when it ends ("stop", "length", "cancelled", "error")
    t_submit: float = field(default_factory=time.perf_counter)
    t_start: float = 0.0             # given a slot
    t_first: float = 0.0             # the first token's logits
    t_end: float = 0.0

    def __post_init__(self) -> None:
        self.matcher = StopMatcher(self.req.stop)
        if self.req.logprobs:
            self.logprobs = []

    @property
    def prompt_keys(self) -> list[int]:
        """The prompt as the cache holds it (an image's positions keyed by its content)."""
        return self.keys if self.keys is not None else self.req.prompt

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def start(self, slot: Slot, n_reused: int) -> None:
        """Runs in `slot`, whose cells hold the prompt's first n_reused positions."""
        prompt = self.prompt_keys
        self.slot = slot
        self.cache_tokens, self.valid = prompt[:n_reused], n_reused
        self.pending = prompt[n_reused:]
        self.reused_tokens = n_reused
        self.t_start = time.perf_counter()

    def cached(self) -> tuple[list[int], int]:
        """The tokens in the cache and how many leading ones another request may reuse."""
        return self.cache_tokens, self.valid

    def extend_cache(self, tokens: list[int]) -> None:
        """Tokens just fed: valid grows with them until a shift has cut it (what follows a
        shift attended to what it dropped, so no fresh computation matches it)."""
        if self.valid == len(self.cache_tokens):
            self.valid += len(tokens)
        self.cache_tokens.extend(tokens)

    def shifted(self, keep: int, n_discard: int) -> None:
        """The cache dropped n_discard positions after the first `keep` and moved the rest back."""
        del self.cache_tokens[keep:keep + n_discard]
        self.valid = min(self.valid, keep)
        self.context_shifts += 1

    def end(self, reason: str) -> None:
        self.finish_reason = reason
        self.t_end = time.perf_counter()

    def completion(self) -> Completion:
        """What the request reports, once it has ended."""
        queue = prompt = generation = 0.0
        if self.t_start:
            queue = self.t_start - self.t_submit
            prompt = (self.t_first or self.t_end) - self.t_start
        if self.t_first:
            generation = self.t_end - self.t_first
        return Completion(text=self.text, tokens=self.tokens, finish_reason=self.finish_reason,
                          prompt_tokens=len(self.req.prompt), prompt_seconds=prompt, generation_seconds=generation,
                          queue_seconds=queue, cached_tokens=self.reused_tokens, truncated_tokens=self.req.truncated,
                          context_shifts=self.context_shifts, stop_string=self.matcher.matched,
                          logprobs=self.logprobs, logits=self.logits, speculative=self.speculative,
                          draft_tokens=self.draft_tokens, draft_accepted=self.draft_accepted)
