"""Context and Tensor: the Python face of a native graph.

A model's forward pass calls Context methods; each adds one node to the
native graph and returns a Tensor handle.  The graph is computed as a whole
(`Context.compute`) and can be computed again after its input buffers change,
which is how a decode step costs O(1) Python work however deep the model is.
Shapes are GGML-ordered: shape[0] is the innermost (row) dimension.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pyengine import _core
from pyengine.errors import InvalidOptionError

F32, F16, Q8_0, I32 = 0, 1, 8, 26
SILU, GELU = 0, 1
SIGMOID, SOFTPLUS = 4, 5   # pe.h's pe_unary_op: the recurrent layers' gates
RELU = 3                   # (Nemotron-H's squared-ReLU MLP)
ROPE_NORMAL, ROPE_NEOX, ROPE_MROPE, ROPE_VISION, ROPE_IMROPE = 0, 2, 8, 24, 40   # ggml's numbers

_NUMPY_TYPES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}


def default_threads() -> int:
    """Threads to use: $PYENGINE_THREADS, else the number of physical cores."""
    env = os.environ.get("PYENGINE_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise InvalidOptionError(f"PYENGINE_THREADS={env!r} is not an integer") from None
        if n < 1:
            raise InvalidOptionError(f"PYENGINE_THREADS must be >= 1, got {n}")
        return n
    return max(1, _core.physical_cores())


class Backend:
    """The CPU backend: a persistent thread pool shared by every graph."""

    def __init__(self, n_threads: int | None = None) -> None:
        if n_threads is None:
            n_threads = default_threads()
        if not isinstance(n_threads, int) or not 1 <= n_threads <= 256:
            raise InvalidOptionError(f"n_threads must be an integer in 1..256, got {n_threads!r}")
        _select_isa_from_env()
        self.pool = _core.ThreadPool(n_threads)
        self.n_threads = n_threads

    @property
    def isa(self) -> str:
        return _core.isa()


_env_isa_applied = False


def _select_isa_from_env() -> None:
    """PYENGINE_ISA, checked for every backend and applied by the first one only, so
    that a later `_core.set_isa` (tests forcing each ISA in turn) is not undone."""
    global _env_isa_applied
    forced = os.environ.get("PYENGINE_ISA")
    if not forced:
        return
    if not _core.isa_available(forced):
        raise InvalidOptionError(f"PYENGINE_ISA={forced!r} is not available on this CPU (best: {_core.best_isa()})")
    if not _env_isa_applied:
        _core.set_isa(forced)
        _env_isa_applied = True


@dataclass(frozen=True, slots=True)
class Tensor:
    """A node of a graph: its id and GGML-ordered shape."""

    id: int
    shape: tuple[int, ...]


class Context:
    """Builds one graph; weights and inputs are registered once and reused."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.graph = _core.Graph()
        self._externals: dict[int, Tensor] = {}
        self._identities: dict[int, Tensor] = {}  # width -> the identity matrix (transpose)

    # ---- leaves ------------------------------------------------------------

    def _tensor(self, tid: int) -> Tensor:
        return Tensor(tid, self.graph.shape(tid))

    def weight(self, w) -> Tensor:
        """A weight (anything with .type, .shape, .data and .name) as a leaf."""
        key = id(w)
        t = self._externals.get(key)
        if t is None:
            t = self._tensor(self.graph.external(w.type, tuple(w.shape), w.data, w.name))
            self._externals[key] = t
        return t

    def input(self, array: np.ndarray, name: str, shape: tuple[int, ...] | None = None) -> Tensor:
        """A caller-owned buffer as a leaf; writing into it changes the next compute."""
        type_id = _NUMPY_TYPES.get(array.dtype)
        if type_id is None:
            raise TypeError(f"input '{name}': unsupported dtype {array.dtype}")
        if shape is None:
            shape = tuple(reversed(array.shape))
        return self._tensor(self.graph.external(type_id, shape, array, name))

    def cache(self, array: np.ndarray, type_id: int, shape: tuple[int, ...], name: str) -> Tensor:
        """A KV-cache buffer (raw bytes of `type_id` rows) as a leaf."""
        return self._tensor(self.graph.external(type_id, shape, array, name))

    # ---- shapes ------------------------------------------------------------

    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        if -1 in shape:
            known = 1
            for d in shape:
                known *= d if d != -1 else 1
            total = 1
            for d in x.shape:
                total *= d
            shape = tuple(total // known if d == -1 else d for d in shape)
        return self._tensor(self.graph.reshape(x.id, shape))

    def view(self, x: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> Tensor:
        return self._tensor(self.graph.view(x.id, shape, strides, offset))

    def rows_slice(self, x: Tensor, start: int, length: int) -> Tensor:
        """Elements [start, start+length) of every row of a 2-D F32 tensor (a strided view)."""
        row = x.shape[0] * 4
        return self.view(x, (length, x.shape[1]), (4, row), start * 4)

    def cont(self, x: Tensor) -> Tensor:
        return self._tensor(self.graph.cont(x.id))

    def transpose(self, x: Tensor) -> Tensor:
        """2-D F32 x [a, b] as [b, a], through a product of x (as the weight) with the a x a
        identity: views cannot move a row's elements apart.  Exact for finite x (each value
        times 1 plus zeros); an inf or NaN spreads over its whole row of the result."""
        a = x.shape[0]
        eye = self._identities.get(a)
        if eye is None:
            eye = self._identities[a] = self.input(np.eye(a, dtype=np.float32), f"identity_{a}")
        return self.mul_mat(x, eye)

    # ---- ops ---------------------------------------------------------------

    def get_rows(self, table: Tensor, ids: Tensor) -> Tensor:
        return self._tensor(self.graph.get_rows(table.id, ids.id))

    def mul_mat(self, w: Tensor, x: Tensor) -> Tensor:
        return self._tensor(self.graph.mul_mat(w.id, x.id))

    def mul_mat_id(self, w: Tensor, x: Tensor, ids: Tensor) -> Tensor:
        return self._tensor(self.graph.mul_mat_id(w.id, x.id, ids.id))

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self._tensor(self.graph.add(a.id, b.id))

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        return self._tensor(self.graph.mul(a.id, b.id))

    def scale(self, a: Tensor, s: float) -> Tensor:
        return self._tensor(self.graph.scale(a.id, s))

    def softcap(self, a: Tensor, cap: float) -> Tensor:
        return self._tensor(self.graph.softcap(a.id, cap))

    def rms_norm(self, a: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        return self._tensor(self.graph.rms_norm(a.id, -1 if weight is None else weight.id, eps))

    def layer_norm(self, a: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        """(a - mean) / sqrt(var + eps) over each row, times weight (the bias is the caller's add)."""
        return self._tensor(self.graph.layer_norm(a.id, -1 if weight is None else weight.id, eps))

    def silu(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.unary(a.id, SILU))

    def gelu(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.unary(a.id, GELU))

    def relu(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.unary(a.id, RELU))

    def sigmoid(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.unary(a.id, SIGMOID))

    def softplus(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.unary(a.id, SOFTPLUS))

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        return self._tensor(self.graph.glu(gate.id, up.id, SILU))

    def geglu(self, gate: Tensor, up: Tensor) -> Tensor:
        return self._tensor(self.graph.glu(gate.id, up.id, GELU))

    def softmax(self, a: Tensor) -> Tensor:
        return self._tensor(self.graph.softmax(a.id))

    def rope(self, x: Tensor, positions: Tensor, *, n_dims: int, mode: int, base: float,
             scale: float = 1.0, freq_factors: Tensor | None = None, ext_factor: float = 0.0,
             attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             n_ctx_orig: int = 0) -> Tensor:
        ff = -1 if freq_factors is None else freq_factors.id
        return self._tensor(self.graph.rope(x.id, positions.id, ff, n_dims, mode, base, scale,
                                            ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig))

    def rope_multi(self, x: Tensor, positions: Tensor, *, n_dims: int, sections, mode: int, base: float,
                   scale: float = 1.0) -> Tensor:
        """M-RoPE (mode ROPE_MROPE; ROPE_IMROPE interleaves the streams pair by pair, as
        Qwen3-VL does) or the vision towers' 2D rope (ROPE_VISION): positions
        I32 [4, n] (numpy [n, 4]: each token's streams together), `sections` the pairs
        each stream turns; vision's n_dims is half the rotated width, as ggml counts it."""
        return self._tensor(self.graph.rope_multi(x.id, positions.id, n_dims, tuple(sections), mode, base, scale))

    def set_rows(self, cache: Tensor, src: Tensor, slots: Tensor) -> Tensor:
        return self._tensor(self.graph.set_rows(cache.id, src.id, slots.id))

    def attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, kv_len: Tensor, *,
             n_head_kv: int, scale: float, softcap: float = 0.0, cell_pos: Tensor | None = None,
             sinks: Tensor | None = None, alibi_max_bias: float = 0.0) -> Tensor:
        """sinks: F32 [n_head] logits that join each head's softmax denominator (gpt-oss).
        alibi_max_bias > 0: ALiBi, each head's scores plus its slope times the mask
        (whose visible cells then hold -|distance|)."""
        tid = self.graph.attn(q.id, k.id, v.id, mask.id, kv_len.id, n_head_kv, scale, softcap,
                              -1 if cell_pos is None else cell_pos.id)
        if sinks is not None:
            tid = self.graph.attn_sinks(tid, sinks.id)
        if alibi_max_bias > 0:
            tid = self.graph.attn_alibi(tid, alibi_max_bias)
        return self._tensor(tid)

    def topk(self, a: Tensor, k: int) -> Tensor:
        return self._tensor(self.graph.topk(a.id, k))

    def moe_weights(self, logits: Tensor, ids: Tensor, normalize: bool) -> Tensor:
        return self._tensor(self.graph.moe_weights(logits.id, ids.id, normalize))

    def weighted_sum(self, a: Tensor, w: Tensor) -> Tensor:
        return self._tensor(self.graph.weighted_sum(a.id, w.id))

    def concat(self, a: Tensor, b: Tensor) -> Tensor:
        """[Na+Nb, ...]: a's rows with b's appended (they agree beyond dim 0)."""
        return self._tensor(self.graph.concat(a.id, b.id))

    def moe_route(self, logits: Tensor, k: int, *, sigmoid: bool, bias: Tensor | None = None,
                  n_group: int = 1, n_group_used: int = 1) -> Tensor:
        """i32 [k, T]: experts chosen by gate(logits) + bias within the best groups (DeepSeek's)."""
        return self._tensor(self.graph.moe_route(logits.id, -1 if bias is None else bias.id, k, int(sigmoid),
                                                 n_group, n_group_used))

    def moe_sigmoid_weights(self, logits: Tensor, ids: Tensor, normalize: bool) -> Tensor:
        """[U, T] the sigmoid of each chosen logit, over their sum when normalize."""
        return self._tensor(self.graph.moe_sigmoid_weights(logits.id, ids.id, normalize))

    def moe_softmax_chosen(self, logits: Tensor, ids: Tensor) -> Tensor:
        """[U, T] the softmax over each token's chosen logits alone."""
        return self._tensor(self.graph.moe_softmax_chosen(logits.id, ids.id))

    def add_id(self, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        """a [N, U, T] plus row ids[u, t] of b [N, E] (a bias per chosen expert)."""
        return self._tensor(self.graph.add_id(a.id, b.id, ids.id))

    def swiglu_oai(self, gate: Tensor, up: Tensor, *, alpha: float, limit: float) -> Tensor:
        """min(gate, limit) * sigmoid(alpha * that) * (clamp(up, -limit, limit) + 1)."""
        return self._tensor(self.graph.swiglu_oai(gate.id, up.id, alpha, limit))

    # ---- recurrent layers (pe.h: states in caller-owned F32 rows, `seqs` an I32
    # [5, n_seqs] input of {first token, token count, row read, row written, first position})

    def l2_norm(self, a: Tensor, eps: float) -> Tensor:
        return self._tensor(self.graph.l2_norm(a.id, eps))

    def ssm_conv(self, x: Tensor, w: Tensor, state: Tensor, seqs: Tensor) -> Tensor:
        """Causal depthwise convolution of x [d, T] with w [K, d] over each sequence's window."""
        return self._tensor(self.graph.ssm_conv(x.id, w.id, state.id, seqs.id))

    def ssm_scan(self, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Tensor, seqs: Tensor, *,
                 D: Tensor | None = None, dt_bias: Tensor | None = None) -> Tensor:
        """Mamba-2's selective scan: x [P, H, T], dt [H, T], A [H], B and C [N, G, T] -> [P, H, T]."""
        return self._tensor(self.graph.ssm_scan(x.id, dt.id, A.id, B.id, C.id, -1 if D is None else D.id,
                                                -1 if dt_bias is None else dt_bias.id, state.id, seqs.id))

    def delta_net(self, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, beta: Tensor, state: Tensor, seqs: Tensor,
                  *, scale: float, chunk: int = 32) -> Tensor:
        """The gated delta rule: q, k [Dk, Hk, T], v [Dv, H, T], gate (log decay) and beta [H, T] -> [Dv, H, T];
        chunk 0 runs token by token, else pieces cut at positions that are multiples of chunk (32: the
        fastest on one x86 core, benchmarks/delta_net.py)."""
        return self._tensor(self.graph.delta_net(q.id, k.id, v.id, gate.id, beta.id, state.id, seqs.id, scale,
                                                 chunk))

    # ---- running -----------------------------------------------------------

    def set_output(self, t: Tensor) -> None:
        self.graph.set_output(t.id)

    def bind_output(self, t: Tensor, out: np.ndarray | None) -> None:
        """Compute output t straight into `out` (float32, C-contiguous, exactly its size);
        None takes it back into the graph's own memory."""
        self.graph.bind_output(t.id, out)

    def compute(self) -> None:
        self.graph.compute(self.backend.pool)

    def read(self, t: Tensor, out: np.ndarray | None = None) -> np.ndarray:
        return self.graph.read(t.id, out)
