"""Forward passes with reusable graphs.

A graph is built once per batch shape (tokens, output rows) and kept; a
decode step re-runs the same graph after writing the new tokens, positions,
cache slots, masks and KV lengths into its input buffers.  Python work per
step is therefore independent of the number of layers.

The cache has one group of cells per attention window (kvcache/causal.py);
each group gives the graph its own slots, mask and KV length, and
`attn_inputs(layer)` hands a layer those of its group.

Recurrent layers (kvcache/recurrent.py) get `recurrent_inputs(layer)`: their
state tables and, for each sequence of the batch, the row it reads and the row
it writes; a recurrent model's graphs are also kept per number of sequences.
Cross-attention layers get `encoder_inputs(layer)`: the memory rows and a mask.

The input buffers are shared by every graph: a graph for T tokens reads the
first T rows of them.  Only one graph computes at a time, so one set of
buffers (the masks are the big ones: tokens x cells per group) serves all.

An embedding graph (`hidden=True`) stops before the output projection and
returns the final-norm hidden rows instead of logits (see `_HeadCapture`).

A batch may bring its input rows instead of token ids (`Forward.embedded`: an
image's embeddings from a vision projector), optionally attending both ways among
its own rows (Gemma 3's images).

A model whose config says ROPE_STREAMS = 4 (M-RoPE: Qwen2-VL) takes each token's
rope positions as (t, row, column, 0) in `positions` [4, n]; a batch may bring them
(`rope_positions`, an image's rows), else every stream is the token's position.
The cache and its masks keep the plain positions (the tokens' order).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError, NativeError, UnsupportedError
from pyengine.kvcache import MAX_SEQUENCES, Cache, KVCache
from pyengine.kvcache.cells import rows_by_sequence
from pyengine.ml.context import F32, Backend, Context, Tensor

MAX_GRAPHS = 12


@dataclass(frozen=True)
class AttnInputs:
    k: Tensor
    v: Tensor | None   # None where the layer keeps no V rows (CacheSpec.v_dim 0)
    slots: Tensor
    mask: Tensor
    kv_len: Tensor
    cell_pos: Tensor  # per cell: its position (attention runs in position order)


@dataclass(frozen=True)
class RecurrentInputs:
    """A recurrent layer's state tables and the batch's rows in them (StepRows)."""

    conv: Tensor | None    # F32 [conv_dim, n_rows] (None: the layer keeps no conv window)
    state: Tensor | None   # F32 [state_dim, n_rows] (None: no SSM state)
    read: Tensor           # I32 [n_seqs]: the row each sequence's state is read from
    write: Tensor          # I32 [n_seqs]: the row its new state goes to
    seq_last: Tensor       # I32 [n_seqs]: the batch row of its last token
    token_seq: Tensor      # I32 [n_tokens]: each token's sequence (0..n_seqs-1)
    seqs: Tensor           # I32 [5, n_seqs]: the ops' table (first, count, read, write, position)


@dataclass(frozen=True)
class EncoderInputs:
    """A cross-attention layer's memory rows and which of them each token may attend."""

    k: Tensor
    v: Tensor
    mask: Tensor     # F32 [n_rows, n_tokens]: 0 or -inf
    kv_len: Tensor


class HostBuffers:
    """Input arrays for batches of up to `capacity` tokens, shared by every graph."""

    def __init__(self, cache: Cache, capacity: int, rope_streams: int = 1) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, np.int32)
        self.positions = np.zeros(capacity, np.int32)
        # the rope's positions, each token's streams together (M-RoPE); None: `positions`
        self.rope_positions = np.zeros((capacity, rope_streams), np.int32) if rope_streams > 1 else None
        self.out_ids = np.zeros(capacity, np.int32)
        self.slots = [np.zeros(capacity, np.int32) for _ in cache.groups]
        self.kv_len = [np.zeros(1, np.int32) for _ in cache.groups]
        # filled per step up to the cells in use; zeros so untouched pages cost no memory
        self.masks = [np.zeros((capacity, g.n_cells), np.float32) for g in cache.groups]
        if cache.recurrent is not None:
            self.read_rows = np.zeros(MAX_SEQUENCES, np.int32)
            self.write_rows = np.zeros(MAX_SEQUENCES, np.int32)
            self.seq_last = np.zeros(MAX_SEQUENCES, np.int32)
            self.token_seq = np.zeros(capacity, np.int32)
            self.seq_table = np.zeros((MAX_SEQUENCES, 5), np.int32)
        if cache.encoder is not None:
            self.memory_mask = np.zeros((capacity, cache.encoder.n_rows), np.float32)
            self.memory_len = np.full(1, cache.encoder.n_rows, np.int32)


class _HeadCapture:
    """Stands in for the Context while a model builds an embedding graph.

    Every model ends with `self.output(ctx, norm(x))`, a mul_mat by its `output`
    weight: that projection is not built, its input (the final-norm hidden rows) is
    kept, and whatever the model adds after it (a bias, a soft-cap) is skipped, so one
    code path serves every architecture and the graph computes nothing past the norm."""

    def __init__(self, ctx: Context, model) -> None:
        head = getattr(model, "output", None)
        if getattr(head, "weight", None) is None:
            raise UnsupportedError(f"{type(model).__name__} has no output projection; it cannot embed")
        self._ctx = ctx
        self._head_id = ctx.weight(head.weight).id
        self.hidden: Tensor | None = None

    def mul_mat(self, w: Tensor, x: Tensor) -> Tensor:
        if self.hidden is None and w.id == self._head_id:
            self.hidden = x
        return self.hidden if self.hidden is not None else self._ctx.mul_mat(w, x)

    def __getattr__(self, name: str):
        attr = getattr(self._ctx, name)
        if self.hidden is None or not callable(attr) or name in ("weight", "input", "cache"):
            return attr
        return lambda *args, **kwargs: self.hidden   # past the head: nothing more to build


class BatchGraph:
    """The graph for batches of `n_tokens` tokens with `n_out` logit rows (or, with
    `hidden`, `n_out` final-norm hidden rows of n_embd values)."""

    def __init__(self, model, backend: Backend, cache: Cache, buffers: HostBuffers,
                 n_tokens: int, n_out: int, hidden: bool = False, n_ctx_seq: int | None = None,
                 embeddings: np.ndarray | None = None, n_seqs: int = 0) -> None:
        """embeddings: float32 [capacity, n_embd_input] rows the batch brings in place of tokens."""
        self.n_tokens, self.n_out, self.n_seqs = n_tokens, n_out, n_seqs
        self.n_ctx_seq = cache.n_cells if n_ctx_seq is None else n_ctx_seq   # the context one sequence may fill
        ctx = Context(backend)
        self.ctx = ctx
        self.tokens = ctx.input(buffers.tokens[:n_tokens], "tokens")
        self.embeddings = None if embeddings is None else ctx.input(embeddings[:n_tokens], "embeddings")
        rope = buffers.positions if buffers.rope_positions is None else buffers.rope_positions
        self.positions = ctx.input(rope[:n_tokens], "positions")
        self.out_ids = ctx.input(buffers.out_ids[:n_out], "out_ids")
        per_group = []
        for gi, group in enumerate(cache.groups):
            slots = ctx.input(buffers.slots[gi][:n_tokens], f"slots.g{gi}")
            kv_len = ctx.input(buffers.kv_len[gi], f"kv_len.g{gi}")
            mask = ctx.input(buffers.masks[gi][:n_tokens], f"mask.g{gi}")
            cell_pos = ctx.input(group.cells.pos, f"cell_pos.g{gi}")   # updated in place by the cache
            per_group.append((slots, mask, kv_len, cell_pos))
        self._attn: list[AttnInputs | None] = []
        for i, spec in enumerate(cache.layout):
            group = cache.layer_group[i]
            if group is None:
                self._attn.append(None)
                continue
            slots, mask, kv_len, cell_pos = per_group[cache.groups.index(group)]
            self._attn.append(AttnInputs(
                ctx.cache(group.k[i], cache.type_id, (spec.k_dim, group.n_cells), f"cache_k.{i}"),
                # no V rows (v_dim 0): a layer that reads V from its K rows (MLA's latent)
                ctx.cache(group.v[i], cache.type_id, (spec.v_dim, group.n_cells), f"cache_v.{i}") if spec.v_dim else None,
                slots, mask, kv_len, cell_pos))
        self._recurrent = self._recurrent_inputs(ctx, cache, buffers, n_tokens, n_seqs)
        self._encoder = self._encoder_inputs(ctx, cache, buffers, n_tokens)
        if hidden and getattr(model, "EMBEDDING_ONLY", False):   # an encoder: no head to stop before
            self.logits = model.hidden(ctx, self)
        elif hidden:
            capture = _HeadCapture(ctx, model)
            model.forward(capture, self)
            if capture.hidden is None:
                raise UnsupportedError(f"{type(model).__name__}.forward never used its output projection")
            self.logits = capture.hidden
        else:
            self.logits = model.forward(ctx, self)
        ctx.set_output(self.logits)
        self.row_width = ctx.graph.shape(self.logits.id)[0]   # floats per output row
        self.bindable = True   # until binding the output to a caller's buffer fails
        self.bound_to: np.ndarray | None = None   # the caller's buffer the output goes into now

    def attn_inputs(self, layer: int) -> AttnInputs:
        return self._attn[layer]

    def recurrent_inputs(self, layer: int) -> RecurrentInputs:
        return self._recurrent[layer]

    def encoder_inputs(self, layer: int) -> EncoderInputs:
        return self._encoder[layer]

    @staticmethod
    def _recurrent_inputs(ctx: Context, cache: Cache, buffers: HostBuffers, n_tokens: int,
                          n_seqs: int) -> dict[int, RecurrentInputs]:
        state = cache.recurrent
        if state is None:
            return {}
        read = ctx.input(buffers.read_rows[:n_seqs], "state_read")
        write = ctx.input(buffers.write_rows[:n_seqs], "state_write")
        seq_last = ctx.input(buffers.seq_last[:n_seqs], "state_seq_last")
        token_seq = ctx.input(buffers.token_seq[:n_tokens], "state_token_seq")
        seqs = ctx.input(buffers.seq_table[:n_seqs], "state_seqs")

        def table(rows: np.ndarray | None, name: str) -> Tensor | None:
            return None if rows is None else ctx.cache(rows, F32, (rows.shape[1], rows.shape[0]), name)

        return {i: RecurrentInputs(table(state.conv[i], f"state_conv.{i}"), table(state.state[i], f"state_ssm.{i}"),
                                   read, write, seq_last, token_seq, seqs) for i in state.layers}

    @staticmethod
    def _encoder_inputs(ctx: Context, cache: Cache, buffers: HostBuffers, n_tokens: int) -> dict[int, EncoderInputs]:
        memory = cache.encoder
        if memory is None:
            return {}
        mask = ctx.input(buffers.memory_mask[:n_tokens], "memory_mask")
        kv_len = ctx.input(buffers.memory_len, "memory_len")
        return {i: EncoderInputs(
            ctx.cache(memory.k[i], cache.type_id, (cache.layout[i].k_dim, memory.n_rows), f"memory_k.{i}"),
            ctx.cache(memory.v[i], cache.type_id, (cache.layout[i].v_dim, memory.n_rows), f"memory_v.{i}"),
            mask, kv_len) for i in memory.layers}


class Forward:
    """Runs batches of tokens (of one or more sequences) through a model over one KV cache."""

    def __init__(self, model, backend: Backend, cache: Cache | KVCache, max_tokens: int = 512,
                 n_ctx_seq: int | None = None) -> None:
        """n_ctx_seq: the context one sequence may fill (None: all of the cache)."""
        self.model = model
        self.n_ctx_seq = n_ctx_seq
        self.backend = backend
        self.cache = Cache.wrap(cache)
        cache = self.cache
        self.n_vocab = model.cfg.n_vocab
        # an encoder's tokens attend to their whole sequence, which must come in one batch
        self.causal = getattr(model.cfg, "causal", True)
        self.alibi = getattr(model.cfg, "alibi_max_bias", 0.0) > 0   # its mask then holds distances
        self.rope_streams = getattr(model.cfg, "ROPE_STREAMS", 1)
        # width of the rows an embedded batch brings: n_embd, or more where layers take pieces of them
        self.n_embd_input = getattr(model.cfg, "n_embd_input", model.cfg.n_embd)
        self._buffers = HostBuffers(cache, max_tokens, self.rope_streams)
        self._graphs: OrderedDict[tuple[int, int, bool, bool, int], BatchGraph] = OrderedDict()
        self._embeddings: np.ndarray | None = None   # [capacity, n_embd_input], made by the first embedded batch
        self.compute_seconds = 0.0   # time inside the native core, for the bench
        self.n_graphs_built = 0

    def _graph(self, n_tokens: int, n_out: int, hidden: bool = False, embedded: bool = False,
               n_seqs: int = 0) -> BatchGraph:
        if n_tokens > self._buffers.capacity:
            # graphs keep views of the old buffers: start over with bigger ones
            self._buffers = HostBuffers(self.cache, n_tokens, self.rope_streams)
            self._embeddings = None
            self._graphs.clear()
        if embedded and self._embeddings is None:
            self._embeddings = np.zeros((self._buffers.capacity, self.n_embd_input), np.float32)
        key = (n_tokens, n_out, hidden, embedded, n_seqs)
        g = self._graphs.get(key)
        if g is None:
            g = BatchGraph(self.model, self.backend, self.cache, self._buffers, n_tokens, n_out, hidden,
                           self.n_ctx_seq, self._embeddings if embedded else None, n_seqs)
            self.n_graphs_built += 1
            self._graphs[key] = g
            if len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return g

    def __call__(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
                 out_rows: np.ndarray, out: np.ndarray | None = None,
                 rope_positions: np.ndarray | None = None) -> np.ndarray:
        """Logits [len(out_rows), n_vocab] for the given rows of the batch.

        Token t of the batch sits at positions[t] of sequence seq_ids[t]; within a
        sequence positions must increase and follow what the cache holds.  A row's
        logits are the same bits whatever else shares the batch.  rope_positions:
        int [T, ROPE_STREAMS] for an M-RoPE model (default: each stream the position,
        the fourth 0)."""
        return self._run(tokens, positions, seq_ids, out_rows, out, hidden=False, rope_positions=rope_positions)

    def hidden(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
               out_rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The final-norm hidden states [len(out_rows), n_embd] of the given rows (what the
        output projection would read), for embeddings; the cache is filled as by __call__."""
        return self._run(tokens, positions, seq_ids, out_rows, out, hidden=True)

    def embedded(self, embeddings: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
                 out_rows: np.ndarray, *, both_ways: bool = False, out: np.ndarray | None = None,
                 rope_positions: np.ndarray | None = None) -> np.ndarray:
        """As __call__, for a batch that brings its rows (float32 [T, n_embd_input]) instead of
        token ids.  both_ways: every row also sees the rows after it of its sequence in
        this batch (an image attended as a whole); the window, if any, then counts from
        the batch's last position of the sequence."""
        embeddings = np.asarray(embeddings, np.float32)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.n_embd_input:
            raise InvalidOptionError(f"embeddings must be [tokens, {self.n_embd_input}], "
                                     f"got {list(embeddings.shape)}")
        return self._run(np.zeros(len(embeddings), np.int32), positions, seq_ids, out_rows, out, hidden=False,
                         embeddings=embeddings, both_ways=both_ways, rope_positions=rope_positions)

    def _run(self, tokens, positions, seq_ids, out_rows, out: np.ndarray | None, hidden: bool,
             embeddings: np.ndarray | None = None, both_ways: bool = False,
             rope_positions: np.ndarray | None = None) -> np.ndarray:
        tokens = np.asarray(tokens, np.int32)
        positions = np.asarray(positions, np.int32)
        seq_ids = np.asarray(seq_ids, np.int64)
        out_rows = np.asarray(out_rows, np.int32)
        n = len(tokens)
        if n == 0 or tokens.ndim != 1 or positions.shape != tokens.shape or seq_ids.shape != tokens.shape:
            raise InvalidOptionError("a batch needs one position and one sequence id per token, and a token")
        lo, hi = _span(tokens)
        if lo < 0 or hi >= self.n_vocab:
            raise InvalidOptionError(f"token ids must be in 0..{self.n_vocab - 1}")
        if _span(positions)[0] < 0:
            raise InvalidOptionError("positions must be >= 0")
        rows_lo, rows_hi = _span(out_rows) if out_rows.ndim == 1 and out_rows.size else (-1, -1)
        if rows_lo < 0 or rows_hi >= n:
            raise InvalidOptionError(f"output rows must be in 0..{n - 1}")
        if not self.causal:
            self._check_whole_sequences(positions, seq_ids)
        rope_positions = self._rope_positions(positions, rope_positions)
        cache = self.cache
        n_seqs = len(rows_by_sequence(seq_ids)) if cache.recurrent is not None else 0
        g = self._graph(n, len(out_rows), hidden, embeddings is not None, n_seqs)
        slots, state_rows = cache.allocate(positions, seq_ids)
        buf = self._buffers
        buf.tokens[:n] = tokens
        if embeddings is not None:
            self._embeddings[:n] = embeddings
        seen_to = _last_position_per_sequence(positions, seq_ids) if both_ways else positions
        buf.positions[:n] = positions
        if rope_positions is not None:
            buf.rope_positions[:n] = rope_positions
        buf.out_ids[:len(out_rows)] = out_rows
        for gi, group in enumerate(cache.groups):
            n_kv = group.cells.n_kv
            buf.slots[gi][:n] = slots[gi]
            buf.kv_len[gi][0] = n_kv
            window, chunk = (0, group.window) if group.chunked else (group.window, 0)
            group.cells.fill_mask(buf.masks[gi], seen_to, seq_ids, n_kv, window, self.causal, self.alibi, chunk)
        if state_rows is not None:
            buf.read_rows[:n_seqs] = state_rows.read
            buf.write_rows[:n_seqs] = state_rows.write
            buf.seq_last[:n_seqs] = state_rows.seq_last
            buf.token_seq[:n] = state_rows.token_seq
            buf.seq_table[:n_seqs] = state_rows.table
        if cache.encoder is not None:
            cache.encoder.fill_mask(buf.memory_mask, positions, seq_ids)
        into = out is not None and (out is g.bound_to or g.bindable and out.dtype == np.float32
                                    and out.flags.c_contiguous and out.flags.writeable
                                    and out.size == len(out_rows) * g.row_width)
        if into and out is not g.bound_to:   # the logits computed straight into the caller's buffer
            try:
                g.ctx.bind_output(g.logits, out)
                g.bound_to = out
            except (NativeError, ValueError):   # a model whose output is a view: copied out
                g.bindable = into = False
        elif not into and g.bound_to is not None:   # never into a buffer an earlier call gave
            g.ctx.bind_output(g.logits, None)
            g.bound_to = None
        t0 = time.perf_counter()
        g.ctx.compute()
        self.compute_seconds += time.perf_counter() - t0
        return out if into else g.ctx.read(g.logits, out)

    def _rope_positions(self, positions: np.ndarray, given: np.ndarray | None) -> np.ndarray | None:
        """int32 [T, streams] for an M-RoPE model: `given`, checked, or each text token's
        position in the first three streams (the fourth 0, as llama.cpp fills it)."""
        if self.rope_streams == 1:
            if given is not None:
                raise InvalidOptionError(f"{type(self.model).__name__} takes one position a token, not rope_positions")
            return None
        if given is None:
            out = np.zeros((len(positions), self.rope_streams), np.int32)
            out[:, :3] = positions[:, None]
            return out
        given = np.asarray(given, np.int32)
        if given.shape != (len(positions), self.rope_streams) or (given.size and int(given.min()) < 0):
            raise InvalidOptionError(f"rope_positions must be [{len(positions)}, {self.rope_streams}] "
                                     f"non-negative, got {list(given.shape)}")
        return given

    def _check_whole_sequences(self, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """A non-causal model sees each sequence whole: a token attends to the tokens
        after it too, so a sequence cannot be split over batches (llama.cpp asks the
        same of an encoder: its whole input in one ubatch), nor (a model with learned
        position embeddings) run past the positions its table holds."""
        limit = getattr(self.model, "max_positions", lambda: None)()
        for sid in np.unique(seq_ids).tolist():
            if self.cache.seq_positions(sid).size:
                raise InvalidOptionError(f"sequence {sid} already holds tokens: an encoder (non-causal) model "
                                         "reads a sequence's whole input in one batch; clear the sequence first")
            mine = positions[seq_ids == sid]
            if limit is not None and int(mine.max()) >= limit:
                raise ContextLengthError(f"an input of {mine.size} tokens is longer than the {limit} positions "
                                         "this encoder model has embeddings for; truncate the input")


def _last_position_per_sequence(positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
    """For each row, the batch's last position of the row's sequence: the position up to
    which a row attending both ways sees its sequence."""
    last = {}
    for p, s in zip(positions.tolist(), seq_ids.tolist()):
        last[s] = max(p, last.get(s, p))
    return np.array([last[s] for s in seq_ids.tolist()], np.int32)


def _span(values: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty 1-d array; the few values of a decode step as Python
    ints, where numpy's reductions cost more than the work."""
    if values.size <= 16:
        items = values.tolist()
        return min(items), max(items)
    return int(values.min()), int(values.max())
