"""Forward passes with reusable graphs.

A graph is built once per batch shape (tokens, output rows) and kept; a
decode step re-runs the same graph after writing the new token, position,
cache slot, mask and KV length into its input buffers.  Python work per step
is therefore independent of the number of layers."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pyengine.errors import InvalidOptionError
from pyengine.kvcache import KVCache
from pyengine.ml.context import F16, Backend, Context, Tensor

MAX_GRAPHS = 6


@dataclass(frozen=True)
class AttnInputs:
    k: Tensor
    v: Tensor
    slots: Tensor
    mask: Tensor
    kv_len: Tensor


class BatchGraph:
    """The graph for batches of `n_tokens` tokens with `n_out` logit rows."""

    def __init__(self, model, backend: Backend, cache: KVCache, n_tokens: int, n_out: int) -> None:
        self.n_tokens, self.n_out = n_tokens, n_out
        n_cells = cache.n_cells
        self.host_tokens = np.zeros(n_tokens, np.int32)
        self.host_positions = np.zeros(n_tokens, np.int32)
        self.host_slots = np.zeros(n_tokens, np.int32)
        self.host_out_ids = np.zeros(n_out, np.int32)
        self.host_kv_len = np.zeros(1, np.int32)
        self.host_masks = {w: np.full((n_tokens, n_cells), -np.inf, np.float32) for w in cache.windows}

        ctx = Context(backend)
        self.ctx = ctx
        self.tokens = ctx.input(self.host_tokens, "tokens")
        self.positions = ctx.input(self.host_positions, "positions")
        self.out_ids = ctx.input(self.host_out_ids, "out_ids")
        slots = ctx.input(self.host_slots, "slots")
        kv_len = ctx.input(self.host_kv_len, "kv_len")
        masks = {w: ctx.input(m, f"mask_w{w}") for w, m in self.host_masks.items()}
        self._attn = [
            AttnInputs(ctx.cache(cache.k[i], F16, (spec.k_dim, n_cells), f"cache_k.{i}"),
                       ctx.cache(cache.v[i], F16, (spec.v_dim, n_cells), f"cache_v.{i}"),
                       slots, masks[spec.window], kv_len)
            for i, spec in enumerate(cache.layout)
        ]
        self.logits = model.forward(ctx, self)
        ctx.set_output(self.logits)

    def attn_inputs(self, layer: int) -> AttnInputs:
        return self._attn[layer]


class Forward:
    """Runs batches of tokens through a model over one KV cache."""

    def __init__(self, model, backend: Backend, cache: KVCache) -> None:
        self.model = model
        self.backend = backend
        self.cache = cache
        self.n_vocab = model.cfg.n_vocab
        self._graphs: OrderedDict[tuple[int, int], BatchGraph] = OrderedDict()
        self.compute_seconds = 0.0   # time inside the native core, for the bench

    def _graph(self, n_tokens: int, n_out: int) -> BatchGraph:
        key = (n_tokens, n_out)
        g = self._graphs.get(key)
        if g is None:
            g = BatchGraph(self.model, self.backend, self.cache, n_tokens, n_out)
            self._graphs[key] = g
            if len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return g

    def __call__(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
                 out_rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Logits [len(out_rows), n_vocab] for the given rows of the batch."""
        tokens = np.asarray(tokens, np.int32)
        positions = np.asarray(positions, np.int32)
        seq_ids = np.asarray(seq_ids, np.int32)
        out_rows = np.asarray(out_rows, np.int32)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.n_vocab):
            raise InvalidOptionError(f"token ids must be in 0..{self.n_vocab - 1}")
        g = self._graph(len(tokens), len(out_rows))
        slots = self.cache.allocate(positions, seq_ids)
        n_kv = self.cache.n_kv
        g.host_tokens[:] = tokens
        g.host_positions[:] = positions
        g.host_slots[:] = slots
        g.host_out_ids[:] = out_rows
        g.host_kv_len[0] = n_kv
        for window, mask in g.host_masks.items():
            self.cache.fill_mask(mask, positions, seq_ids, n_kv, window)
        t0 = time.perf_counter()
        g.ctx.compute()
        self.compute_seconds += time.perf_counter() - t0
        return g.ctx.read(g.logits, out)
