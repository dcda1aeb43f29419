"""Engine: the batch loop.

Requests queue; a background thread runs steps.  Each step gathers one
token from every generating sequence and then prompt chunks of the others,
up to n_batch tokens in all, into ONE forward pass whose output rows are only
the rows whose logits someone needs.  Then each sequence samples with its own
chain, checks end-of-generation, stop strings, max_tokens and the context,
and streams what is safe to show.

    engine = Engine(model, tokenizer, backend, n_ctx=4096)
    handle = engine.submit(ids, SamplingOptions(temperature=0), max_tokens=64)
    for event in handle: ...            # Chunk ... Completion

Each request in flight is one Sequence (runner/inflight.py): its checked inputs, what the
cache holds of it (and how much of that a later prompt may reuse), its sampler chain,
text and timings; its Completion is made from it when it ends.

Requests with the same prompt (n choices of one OpenAI request, or clients that
happen to ask the same) compute it once: a request whose prompt equals that of a
live sequence (waiting for it while it is still in its prompt) starts on its cells
(shared, not copied) and samples its first token from the logits that sequence kept
of its prompt's last token.

A prompt may hold images: spans of its positions whose rows a vision projector
made (`submit(images=...)`).  Such a span is fed alone, as one batch of rows
attended both ways (Forward.embedded), when the sequence's prefill reaches it; the
token chunks around it stop at its edges.  For prefix reuse an image's positions
are keyed by a hash of its rows (negative ids no token has), so a later prompt
with the same image reuses its cells and one with another image does not; a reused
prefix never ends inside an image.  Such prompts are not shifted (a shift could cut
an image).

A generating sequence that speculates (runner/speculative.py) feeds its next token and a
draft after it; its chain picks from each of those rows in turn while the picks equal the
draft, and the cache drops what follows the first rejected draft (_advance_verified).

Batch invariance: a sequence's tokens do not depend on what shares its batch
or on how its prompt is chunked.  The native matmul treats each row alike
whatever the batch size, attention visits only the sequence's own cells and
in position order (kvcache/cells.py), and each sequence samples alone.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import abc, deque
from dataclasses import replace
from typing import Callable

import numpy as np

from pyengine.errors import InvalidOptionError, PyEngineError
from pyengine.kvcache import DEFAULT_CHECKPOINTS, MAX_SEQUENCES, Cache, KeyRotator
from pyengine.ml.context import Backend
from pyengine.ml.nn import CacheSpec
from pyengine.options import RequestOptions
from pyengine.runner.forward import Forward
from pyengine.runner.handle import RequestHandle
from pyengine.runner.request import make_request
from pyengine.runner.inflight import Sequence
from pyengine.runner.sequence import Chunk, TokenLogprob
from pyengine.runner.slots import SlotTable
from pyengine.runner.speculative import DraftModel, Speculator, verify
from pyengine.sample import SamplerChain, SamplingOptions
from pyengine.tokenizer import StreamDecoder, Tokenizer

DEFAULT_BATCH = 512
DEFAULT_PARALLEL = 4
SWA_MARGIN = 32   # sliding-window cells kept beyond the window, so a prompt may diverge a little late


class Engine:
    """The batch loop over one model and one KV cache, in a background thread."""

    def __init__(self, model, tokenizer: Tokenizer, backend: Backend, *, n_ctx: int,
                 n_batch: int = DEFAULT_BATCH, n_parallel: int = DEFAULT_PARALLEL, kv_type: str | None = None,
                 swa_margin: int = SWA_MARGIN, swa_full: bool = False, state_checkpoints: int = DEFAULT_CHECKPOINTS,
                 background: bool = True, draft: DraftModel | None = None, speculative: str | None = None,
                 images_both_ways: bool = True) -> None:
        """state_checkpoints: recurrent states kept per sequence for prefix reuse (models with
        recurrent layers only; kvcache/recurrent.py).  draft: a draft model for
        speculative="draft" requests; speculative: the mode of requests that name none.
        images_both_ways: an image's rows see each other both ways (Gemma 3's projector), else
        causally (the projector says)."""
        _check_int("n_ctx", n_ctx, 1, 1 << 24)
        _check_int("n_batch", n_batch, 1, 1 << 16)
        _check_int("n_parallel", n_parallel, 1, MAX_SEQUENCES)
        _check_int("swa_margin", swa_margin, 0, 1 << 20)
        _check_int("state_checkpoints", state_checkpoints, 1, 1 << 10)
        self.model, self.tokenizer, self.backend = model, tokenizer, backend
        self.n_ctx, self.n_batch, self.n_parallel = n_ctx, n_batch, n_parallel
        self.n_vocab = model.cfg.n_vocab
        self.swa_margin = swa_margin
        self.images_both_ways = images_both_ways
        layout = model.cache_layout()
        n_cells = n_ctx * n_parallel
        # a sliding layer keeps window + margin cells per sequence, plus room for a batch
        windows = {s.window: n_cells if swa_full else min(n_cells, n_parallel * (s.window + swa_margin) + n_batch)
                   for s in layout if isinstance(s, CacheSpec) and s.window}
        # kv_type None: $PYENGINE_KV_CACHE_TYPE, else f16 (kvcache/rows.py)
        self.cache = Cache.build(layout, n_cells, window_cells=windows, kv_type=kv_type,
                                 head_dim=getattr(model.cfg, "head_dim", None),
                                 state_rows=state_rows(n_parallel, state_checkpoints),
                                 max_checkpoints=state_checkpoints)
        # a sequence may fill n_ctx cells: what Phi-3's LongRoPE picks its factors by
        self.forward = Forward(model, backend, self.cache, max_tokens=n_batch, n_ctx_seq=n_ctx)
        # a decode step's logits land here (read before the next step), not in fresh pages;
        # one view per row count, the same object every step (a graph keeps it bound)
        step_logits = np.empty((n_parallel, self.n_vocab), np.float32)
        self._step_logits = [step_logits[:n] for n in range(n_parallel + 1)]
        self.rotator = KeyRotator(model, backend, n_ctx_seq=n_ctx)
        self.slots = SlotTable(self.cache)
        self.speculator = Speculator(draft, speculative)
        self.eog_ids = frozenset(t for t in tokenizer.eog_ids if 0 <= t < self.n_vocab)
        self._pieces: list[bytes] | None = None
        self._cv = threading.Condition()
        self._queue: deque[Sequence] = deque()
        self._commands: deque[tuple[Callable[[], object], list]] = deque()
        self._waiting: deque[Sequence] = deque()
        self._live: list[Sequence] = []
        self._closed = False
        self._next_id = 0
        self.steps = 0
        self.prompt_tokens_computed = 0   # prompt tokens fed to the model (cached ones are not)
        self._thread = threading.Thread(target=self._run, name="pyengine-engine", daemon=True)
        if background:
            self._thread.start()

    # ---- public ----------------------------------------------------------------------

    def submit(self, prompt: abc.Sequence[int], options: RequestOptions | SamplingOptions | None = None, *,
               images: abc.Sequence[tuple[int, np.ndarray]] = (), **fields) -> RequestHandle:
        """Queue a request; returns its handle at once (errors in the options raise here).

        `options` is the request's RequestOptions; a SamplingOptions (or None) with the
        other fields as keywords (RequestOptions' names) builds one.
        images: (start, rows) pairs: prompt positions start..start+len(rows)-1 hold
        placeholder ids and are fed as those rows (float32 [n, n_embd]) instead."""
        if isinstance(options, RequestOptions):
            if fields:
                raise InvalidOptionError(f"give the options in the RequestOptions, not as keywords "
                                         f"({', '.join(sorted(fields))})")
        else:
            options = RequestOptions(SamplingOptions() if options is None else options, **fields)
        if images:
            if options.truncate or options.all_logits:
                raise InvalidOptionError("a prompt with images cannot be truncated or scored")
            options = replace(options, shift=False)
        req = make_request(prompt, options, n_vocab=self.n_vocab, engine_ctx=self.n_ctx)
        mode = self.speculator.mode(options, can_roll_back=self.cache.recurrent is None)
        spans, grids = self._image_spans(images, len(req.prompt))
        chain = SamplerChain(req.sampling, self.n_vocab, token_pieces=self.token_pieces(),
                             eog_ids=self.eog_ids, grammar=req.grammar, n_ctx=req.n_ctx)
        with self._cv:
            if self._closed:
                raise PyEngineError("the engine is closed")
            self._next_id += 1
            handle = RequestHandle(self._next_id, self._wake)
            seq = Sequence(req, options, handle, chain, StreamDecoder(self.tokenizer), speculative=mode,
                           images=spans, grids=grids, keys=image_keyed(req.prompt, spans) if spans else None)
            self._queue.append(seq)
            self._cv.notify_all()
        return handle

    def _image_spans(self, images: abc.Sequence[tuple[int, np.ndarray]],
                     n_prompt: int) -> tuple[dict[int, np.ndarray], dict[int, tuple[int, int]]]:
        """The images of a prompt checked: inside it, apart, each fitting one batch; rows
        given as a grid [n_rows, n_columns, n_embd] (M-RoPE's towers; a model over M-RoPE
        positions takes no other) are kept flat with their grid beside."""
        spans: dict[int, np.ndarray] = {}
        grids: dict[int, tuple[int, int]] = {}
        end = 0
        n_embd = self.forward.n_embd_input
        for start, rows in sorted(((int(s), np.ascontiguousarray(r, np.float32)) for s, r in images),
                                  key=lambda item: item[0]):
            if rows.ndim == 3:
                grids[start] = rows.shape[:2]
                rows = rows.reshape(-1, rows.shape[2])
            elif self.forward.rope_streams > 1:   # without its grid an image has no M-RoPE positions
                raise InvalidOptionError("this model places an image's rows by their grid: give them as "
                                         "[n_rows, n_columns, n_embd], as its projector's embed() does")
            if rows.ndim != 2 or rows.shape[1] != n_embd or not 0 < len(rows) <= self.n_batch:
                raise InvalidOptionError(f"an image's rows must be [1..{self.n_batch}, {n_embd}], "
                                         f"got {list(rows.shape)}")
            if start < end or start + len(rows) > n_prompt:
                raise InvalidOptionError(f"an image at prompt positions {start}..{start + len(rows) - 1} "
                                         f"overlaps another or passes the prompt's {n_prompt} tokens")
            spans[start] = rows
            end = start + len(rows)
        return spans, grids

    def token_pieces(self) -> list[bytes]:
        """Each token's bytes (control tokens empty), padded to the model's vocabulary."""
        if self._pieces is None:
            pieces = list(self.tokenizer.piece_table(special=False))[: self.n_vocab]
            self._pieces = pieces + [b""] * (self.n_vocab - len(pieces))
        return self._pieces

    def stats(self) -> dict:
        """Live/waiting requests and cells in use (live ones, cached ones), read between steps."""
        def read() -> dict:
            return {"live": len(self._live), "waiting": len(self._waiting) + len(self._queue),
                    "cells_used": self.cache.n_used, "cells_live": self.slots.live_cells(),
                    "cached_slots": len(self.slots.idle_with_cells()), "steps": self.steps,
                    "prompt_tokens_computed": self.prompt_tokens_computed}
        return self.call(read)

    def drop_cache(self) -> None:
        """Forget every cached (idle) prefix; cells of running requests stay."""
        def drop() -> None:
            while self.slots.evict_lru():
                pass
        self.call(drop)

    def call(self, fn: Callable[[], object]) -> object:
        """Run fn in the engine thread between two steps and return its result."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return fn()
        box: list = []
        with self._cv:
            self._commands.append((fn, box))
            self._cv.notify_all()
            self._cv.wait_for(lambda: box or not self._thread.is_alive())
        if not box:
            return fn()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def step(self) -> bool:
        """Run one step in the calling thread (for an engine made with background=False);
        whether requests remain."""
        if self._thread.is_alive():
            raise PyEngineError("this engine runs its own loop; step() is for background=False")
        self._one_round()
        return bool(self._live or self._waiting or self._queue)

    def close(self) -> None:
        """Stop the loop; unfinished requests end as cancelled."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if not self._thread.is_alive():
            self._shutdown()
        elif threading.current_thread() is not self._thread:
            self._thread.join()

    # ---- loop ------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _has_work(self) -> bool:
        if self._closed or self._queue or self._commands or self._live:
            return True
        return any(s.handle.cancel_requested for s in self._waiting) or bool(
            self._waiting and len(self._live) < self.n_parallel)

    def _run(self) -> None:
        while True:
            with self._cv:
                idle = not self._has_work()
                if idle and self.cache.prefault.done:
                    self._cv.wait_for(self._has_work)
                if self._closed:
                    break
            if idle and not self.cache.prefault.done:
                self.cache.prefault.step()   # one piece of the cache's memory (hugepages.Prefault)
                continue
            self._one_round()
        self._shutdown()

    def _one_round(self) -> None:
        with self._cv:
            self._waiting.extend(self._queue)
            self._queue.clear()
            commands = list(self._commands)
            self._commands.clear()
        self._run_commands(commands)
        try:
            self._step()
        except BaseException as error:   # keep serving: fail what was running, not the loop
            self._fail_all(error)

    def _run_commands(self, commands) -> None:
        for fn, box in commands:
            try:
                box.append((True, fn()))
            except BaseException as error:
                box.append((False, error))
        if commands:
            with self._cv:
                self._cv.notify_all()

    def _shutdown(self) -> None:
        with self._cv:
            self._waiting.extend(self._queue)
            self._queue.clear()
            commands = list(self._commands)
            self._commands.clear()
        self._run_commands(commands)
        for seq in list(self._live) + list(self._waiting):
            self._finish(seq, "cancelled")
        self._waiting.clear()

    # ---- one step --------------------------------------------------------------------

    def _step(self) -> None:
        self.slots.check_epoch()
        self._reap_cancelled()
        for seq in list(self._waiting) if len(self._live) < self.n_parallel else ():
            if len(self._live) >= self.n_parallel:
                break
            if self._waits_for_twin(seq):
                continue   # started once its twin has computed the prompt; others go first
            self._waiting.remove(seq)
            try:
                self._start(seq)
            except PyEngineError as error:
                self._finish(seq, "error", error)
        self._feed_images()
        batch = self._plan()
        if not batch:
            return
        self._make_room(batch)
        tokens, positions, seq_ids = self._batch_inputs(batch)
        rows, owners, start = [], [], 0
        for seq, toks in batch:
            wanted = self._rows_wanted(seq, len(toks))
            rows.extend(start + r for r in wanted)
            owners.append((seq, toks, len(rows) - len(wanted), len(wanted)))
            start += len(toks)
        try:
            # a step of prompt chunks only still has to run; it reads one row it ignores
            out_rows = np.asarray(rows or [0], np.int32)
            out = self._step_logits[len(out_rows)] if len(out_rows) < len(self._step_logits) else None
            logits = self.forward(tokens, positions, seq_ids, out_rows, out,
                                  rope_positions=self._text_rope(batch, positions))
        except BaseException as error:
            for seq, _ in batch:
                self._finish(seq, "error", error)
            return
        self.steps += 1
        self.prompt_tokens_computed += sum(len(toks) for seq, toks in batch if seq.prefill)
        for seq, toks, first, count in owners:
            self._advance(seq, toks, logits[first:first + count] if count else None)

    def _feed_images(self) -> None:
        """Each prefilling sequence whose next prompt positions are an image feeds it now,
        alone: its rows as one batch, attended both ways where the projector wants it."""
        for seq in [s for s in self._live if s.prefill and len(s.cache_tokens) in s.images]:
            pos = len(seq.cache_tokens)
            rows = seq.images[pos]
            n = len(rows)
            toks = seq.pending[:n]
            try:
                self._make_room([(seq, toks)])
                logits = self.forward.embedded(rows, np.arange(pos, pos + n, dtype=np.int32),
                                               np.full(n, seq.slot.id, np.int64), np.array([n - 1], np.int32),
                                               both_ways=self.images_both_ways,
                                               rope_positions=self._image_rope(seq, pos, n))
            except BaseException as error:
                self._finish(seq, "error", error)
                continue
            self.prompt_tokens_computed += n
            self._advance(seq, toks, logits if n == len(seq.pending) else None)

    def _text_rope(self, batch: list[tuple[Sequence, list[int]]], positions: np.ndarray) -> np.ndarray | None:
        """M-RoPE positions of a batch of tokens where a sequence has had an image with a
        grid (its text goes on from the image's t + max(rows, columns)); None: every
        stream is the token's position."""
        if self.forward.rope_streams == 1 or not any(seq.grids for seq, _ in batch):
            return None
        shifts = np.concatenate([np.full(len(toks), 0, np.int64) if not seq.grids else
                                 rope_shift(seq.grids, seq.images, positions[i:i + len(toks)])
                                 for (seq, toks), i in zip(batch, np.cumsum([0] + [len(t) for _, t in batch]))])
        p = positions + shifts
        return np.stack([p, p, p, np.zeros_like(p)], axis=1).astype(np.int32)

    def _image_rope(self, seq: Sequence, start: int, n: int) -> np.ndarray | None:
        """An image's rows' M-RoPE positions (t, t + row, t + column, 0), t its first
        position after the images before it; None where the model or image has none."""
        if self.forward.rope_streams == 1 or start not in seq.grids:
            return None
        n_y, n_x = seq.grids[start]
        t = start + int(rope_shift(seq.grids, seq.images, np.array([start]))[0])
        ty, tx = np.divmod(np.arange(n), n_x)
        return np.stack([np.full(n, t), t + ty, t + tx, np.zeros(n, np.int64)], axis=1).astype(np.int32)

    def _batch_inputs(self, batch: list[tuple[Sequence, list[int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch's tokens, positions and sequence ids; a decode step's (a token of
        each generating sequence) straight from lists, in a few calls."""
        if all(not seq.prefill and len(toks) == 1 for seq, toks in batch):
            return (np.array([toks[0] for _, toks in batch], np.int32),
                    np.array([len(seq.cache_tokens) for seq, _ in batch], np.int32),
                    np.array([seq.slot.id for seq, _ in batch], np.int64))
        tokens = np.concatenate([np.asarray(toks, np.int32) for _, toks in batch])
        positions = np.concatenate([np.arange(len(s.cache_tokens), len(s.cache_tokens) + len(toks))
                                    for s, toks in batch])
        seq_ids = np.concatenate([np.full(len(toks), s.slot.id) for s, toks in batch])
        return tokens, positions, seq_ids

    def _reap_cancelled(self) -> None:
        for seq in [s for s in self._waiting if s.handle.cancel_requested]:
            self._waiting.remove(seq)
            self._finish(seq, "cancelled")
        for seq in [s for s in self._live if s.handle.cancel_requested]:
            self._finish(seq, "cancelled")

    def _waits_for_twin(self, seq: Sequence) -> bool:
        """Whether `seq` waits for a live sequence that is computing the same prompt (its
        twin, also found when the prompt is computed already)."""
        if seq.twin is None and seq.req.cache_prompt and not seq.req.all_logits:
            prompt = seq.req.prompt
            seq.twin = next((s for s in self._live if (s.prefill or s.prompt_row is not None) and not s.images
                             and len(s.req.prompt) == len(prompt) and s.req.prompt == prompt), None)
        return seq.twin is not None and seq.twin.prefill and seq.twin in self._live

    def _start(self, seq: Sequence) -> None:
        """Give a sequence a slot, reusing the longest cached prefix of its prompt (all of
        it, when a twin computed the prompt and left its last logits)."""
        prompt = seq.prompt_keys
        row = seq.twin.prompt_row if seq.twin is not None else None
        seq.twin = None
        reuse, n = self.slots.best_prefix(prompt, leave=0) if row is not None else (None, 0)
        if n < len(prompt):
            row = None
            reuse, n = self.slots.best_prefix(prompt) if seq.req.cache_prompt else (None, 0)
        n = before_image(seq.images, n)
        if reuse is not None and not reuse.live:
            slot = reuse
            self.cache.remove(slot.id, n)
        else:
            slot = self.slots.free_slot()
            if reuse is not None:
                # a recurrent state is copied: room for its row first, which may have cost
                # the checkpoint at n (then the copy starts from an earlier one)
                self.cache.reserve(0, self.slots.evict_lru, n_seqs=1)
                n = before_image(seq.images, self.cache.usable_prefix(reuse.id, n))
                row = row if n == len(prompt) else None
                self.cache.copy_prefix(reuse.id, slot.id, n)
        slot.seq, slot.tokens, slot.valid = seq, [], 0   # the sequence owns what the cells hold now
        self.slots.touch(slot)
        seq.start(slot, n)
        seq.chain.accept_prompt(seq.req.prompt)
        if seq.req.all_logits:
            seq.logits = np.empty((len(prompt), self.n_vocab), np.float32)
        self._live.append(seq)
        if row is not None:
            self._start_after_prompt(seq, row)

    def _start_after_prompt(self, seq: Sequence, row: np.ndarray) -> None:
        """A sequence whose whole prompt is in the cache samples its first token at once,
        from the logits its twin computed for the prompt's last token."""
        seq.prefill = False
        seq.t_first = seq.t_start   # no prompt left to compute: its time is none
        if seq.req.max_tokens is not None and seq.req.max_tokens <= 0:
            self._finish(seq, "length")
            return
        try:
            self._sample(seq, row)
        except PyEngineError as error:
            self._finish(seq, "error", error)

    def _plan(self) -> list[tuple[Sequence, list[int]]]:
        """One token of each generating sequence, then prompt chunks, n_batch tokens at most."""
        budget = self.n_batch
        batch = []
        for seq in [s for s in self._live if not s.prefill]:
            if budget == 0:
                break
            try:
                full = len(seq.cache_tokens) >= seq.req.n_ctx and not self._shift(seq)
            except PyEngineError as error:
                self._finish(seq, "error", error)
                continue
            if full:
                self._finish(seq, "length")
                continue
            toks = seq.pending[:1] + self._draft(seq, budget - 1)
            batch.append((seq, toks))
            budget -= len(toks)
        for seq in [s for s in self._live if s.prefill]:
            if budget == 0:
                break
            chunk = seq.pending[:min(budget, _tokens_before_image(seq))]
            if chunk:   # none: the sequence is at an image, fed alone (_feed_images)
                batch.append((seq, chunk))
                budget -= len(chunk)
        return batch

    def _draft(self, seq: Sequence, budget: int) -> list[int]:
        """Draft tokens to verify after the sequence's next token (none unless it
        speculates): within the batch's budget, the context and max_tokens."""
        if seq.speculative is None:
            return []
        room = min(budget, seq.req.n_ctx - len(seq.cache_tokens) - 1)
        if seq.req.max_tokens is not None:
            room = min(room, seq.req.max_tokens - len(seq.tokens) - 1)
        return self.speculator.draft(seq.speculative, seq.options, seq.slot.id, seq.cache_tokens + seq.pending[:1], room)

    def _rows_wanted(self, seq: Sequence, n: int) -> range:
        if not seq.prefill:
            return range(n)
        if seq.req.all_logits:
            return range(n)
        return range(n - 1, n) if n == len(seq.pending) else range(0)

    def _make_room(self, batch: list[tuple[Sequence, list[int]]]) -> None:
        """Free sliding-window cells out of reach, then evict idle slots until every group
        has a cell for each new token (live sequences always fit: see the sizes in __init__)."""
        for seq, _ in batch:
            self.cache.slide(seq.slot.id, len(seq.cache_tokens), self.swa_margin)
        n_new = sum(len(toks) for _, toks in batch)
        self.cache.reserve(n_new, self.slots.evict_lru, n_seqs=len(batch))

    def _advance(self, seq: Sequence, toks: list[int], logits: np.ndarray | None) -> None:
        """Book the tokens just fed; sample when the sequence got its logits."""
        if not seq.prefill and len(toks) > 1:
            self._advance_verified(seq, toks, logits)
            return
        n_before = len(seq.cache_tokens)
        seq.extend_cache(toks)
        del seq.pending[:len(toks)]
        self.cache.slide(seq.slot.id, len(seq.cache_tokens), self.swa_margin)
        if seq.prefill:
            self.cache.checkpoint(seq.slot.id)   # a prompt chunk's end: a recurrent state to resume from
            if seq.req.all_logits and logits is not None:
                seq.logits[n_before:n_before + len(toks)] = logits
            if seq.pending:
                return
            seq.prefill = False
            seq.t_first = time.perf_counter()
            if not seq.req.all_logits:   # for twins (a copy: the step's buffer is reused)
                seq.prompt_row = np.array(logits[-1], np.float32)
        if seq.req.max_tokens is not None and len(seq.tokens) >= seq.req.max_tokens:
            self._finish(seq, "length")
            return
        try:
            self._sample(seq, logits[-1])
        except PyEngineError as error:
            self._finish(seq, "error", error)

    def _advance_verified(self, seq: Sequence, toks: list[int], logits: np.ndarray) -> None:
        """A generating sequence's token and its draft were fed: the chain picks from each
        row in turn while its pick equals the next draft (runner/speculative.py); the
        cache drops what follows the first rejected draft; the picks stream."""
        req = seq.req
        left = len(toks) if req.max_tokens is None else req.max_tokens - len(seq.tokens)
        try:
            picked = verify(lambda row: self._pick(seq, row), logits, toks[1:], self.eog_ids.__contains__, left)
        except PyEngineError as error:
            self._finish(seq, "error", error)
            return
        n_fed = len(picked)   # the fed tokens whose cells stay: the next token and the accepted drafts
        self.cache.remove(seq.slot.id, len(seq.cache_tokens) + n_fed)
        seq.extend_cache(toks[:n_fed])
        del seq.pending[:]
        self.cache.slide(seq.slot.id, len(seq.cache_tokens), self.swa_margin)
        seq.draft_tokens += len(toks) - 1
        seq.draft_accepted += sum(1 for (token, _), draft in zip(picked, toks[1:]) if token == draft)
        for token, lp in picked:
            self._emit(seq, token, lp)
            if seq.finished:   # a stop string, EOG or max_tokens
                return

    def _sample(self, seq: Sequence, row: np.ndarray) -> None:
        token, lp = self._pick(seq, row)
        self._emit(seq, token, lp)

    def _pick(self, seq: Sequence, row: np.ndarray) -> tuple[int, TokenLogprob | None]:
        """The chain's token from a row (and its log-probabilities when asked), accepted
        into the chain's history."""
        req = seq.req
        token = seq.chain.sample(row)
        lp = None
        if req.logprobs:
            value, top = seq.chain.logprobs(row, token, req.top_logprobs)
            lp = TokenLogprob(token, value, tuple(top))
        seq.chain.accept(token)
        return token, lp

    def _emit(self, seq: Sequence, token: int, lp: TokenLogprob | None) -> None:
        """A picked token: the end (EOG, a stop string, max_tokens) or text to stream."""
        if token in self.eog_ids:
            self._finish(seq, "stop")
            return
        seq.tokens.append(token)
        if lp is not None:
            seq.logprobs.append(lp)
        text = seq.matcher.push(seq.decoder.push(token))
        seq.text += text
        seq.handle._put(Chunk(text, (token,), (lp,) if lp is not None else None))
        max_tokens = seq.req.max_tokens
        if seq.matcher.stopped:
            self._finish(seq, "stop")
        elif max_tokens is not None and len(seq.tokens) >= max_tokens:
            self._finish(seq, "length")
        else:
            seq.pending = [token]

    def _shift(self, seq: Sequence) -> bool:
        """Make room for one more token by dropping half of what follows num_keep."""
        if not seq.req.shift:
            return False
        n_past = len(seq.cache_tokens)
        keep = len(seq.req.prompt) if seq.req.num_keep < 0 else seq.req.num_keep
        keep = min(keep, n_past)
        n_discard = (n_past - keep) // 2
        if n_discard <= 0:
            return False
        self.cache.check_shift()
        self.cache.reserve(0, self.slots.evict_lru, shift=(seq.slot.id, keep + n_discard))
        self.cache.shift(seq.slot.id, keep, n_discard, self.rotator)
        seq.shifted(keep, n_discard)
        return True

    def _finish(self, seq: Sequence, reason: str, error: BaseException | None = None) -> None:
        if reason in ("stop", "length") and not seq.matcher.stopped:
            tail = seq.matcher.push(seq.decoder.flush()) + seq.matcher.flush()
            if seq.matcher.stopped:
                reason = "stop"
            if tail:
                seq.text += tail
                seq.handle._put(Chunk(tail))
        seq.end(reason)
        self._release(seq, keep=reason in ("stop", "length") and seq.req.cache_prompt)
        if error is not None:
            seq.handle._fail(error)
            return
        seq.handle._put(seq.completion())

    def _release(self, seq: Sequence, keep: bool) -> None:
        seq.prompt_row = None
        if seq in self._live:
            self._live.remove(seq)
        slot = seq.slot
        if slot is None:
            return
        slot.seq = None
        seq.slot = None
        if keep:
            self.cache.checkpoint(slot.id)   # a turn's end: where a follow-up turn resumes
            slot.tokens, slot.valid = seq.cache_tokens, seq.valid
            self.slots.touch(slot)
        else:
            self.slots.evict(slot)

    def _fail_all(self, error: BaseException) -> None:
        for seq in list(self._live):
            self._finish(seq, "error", error)


def state_rows(n_parallel: int, checkpoints: int) -> int:
    """Rows of the recurrent state pool: the empty row, and for every live sequence (and
    one embedding beside them) its checkpoints, its current state and the row its next
    step writes; idle sequences' states are evicted when rows run short."""
    return 1 + (n_parallel + 1) * (checkpoints + 2)


def _tokens_before_image(seq: Sequence) -> int:
    """How many of the sequence's pending prompt tokens come before its next image."""
    if not seq.images:
        return len(seq.pending)
    pos = len(seq.cache_tokens)
    return min([s - pos for s in seq.images if s >= pos] + [len(seq.pending)])


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidOptionError(f"{name} must be an integer in {low}..{high}, got {value!r}")


def image_keyed(prompt: list[int], images: dict[int, np.ndarray]) -> list[int]:
    """`prompt` with each image position replaced by a negative id from a hash of the
    image's rows and the position within it (at most 1 << 16, n_batch's bound): equal
    images give equal ids, different ones (but for a 2**-40 chance) different ids, and
    no id is a token's."""
    keys = list(prompt)
    for start, rows in images.items():
        base = int.from_bytes(hashlib.blake2b(rows.tobytes(), digest_size=5).digest(), "little") << 16
        keys[start:start + len(rows)] = [-1 - (base + i) for i in range(len(rows))]
    return keys


def rope_shift(grids: dict[int, tuple[int, int]], images: dict[int, np.ndarray], positions: np.ndarray) -> np.ndarray:
    """How far each position's M-RoPE position lies from it: an image of n_y x n_x rows
    takes max(n_y, n_x) rope positions, not n_y * n_x (llama.cpp's mtmd), so the
    positions after it move back by the difference."""
    shift = np.zeros(len(positions), np.int64)
    for start, (n_y, n_x) in grids.items():
        end = start + len(images[start])
        shift[positions >= end] += max(n_y, n_x) - n_y * n_x
    return shift


def before_image(images: dict[int, np.ndarray], n: int) -> int:
    """`n` reused positions, cut back to an image's start where it would end inside one
    (an image is fed whole, as one batch)."""
    for start, rows in images.items():
        if start < n < start + len(rows):
            return start
    return n
