# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin typed layer over the native core (csrc/include/pe.h).

Buffers come in as typed memoryviews; every C error becomes a NativeError (or
a ValueError for bad arguments) in the calling process."""

from libc.stdint cimport int64_t, uint8_t

import numpy as np

from pyengine.errors import NativeError


cdef inline str _last_error():
    return pe_last_error().decode("utf-8", "replace")


cdef inline int _check(int rc) except -1:
    if rc < 0:
        raise NativeError(_last_error())
    return rc


# ---- types ---------------------------------------------------------------

def type_name(int type_id) -> str:
    return pe_type_name(type_id).decode()


def block_size(int type_id) -> int:
    return pe_type_block_size(type_id)


def block_bytes(int type_id) -> int:
    return pe_type_block_bytes(type_id)


def row_bytes(int type_id, int64_t n) -> int:
    return pe_row_bytes(type_id, n)


def type_supported(int type_id) -> bool:
    return pe_type_supported(type_id) != 0


def set_iq_grid(int grid, const uint8_t[::1] values) -> None:
    """Hand the native core one lattice grid of the IQ1/IQ2/IQ3 types (pe.h
    PE_IQ_GRID_*: its levels as bytes, row by row); pyengine.iq_grids does it
    at import."""
    _check(pe_iq_grid_set(grid, &values[0] if values.shape[0] else NULL, values.shape[0]))


def vec_dot_type(int type_id) -> int:
    return pe_type_vec_dot_type(type_id)


def rows8_type(int type_id) -> int:
    """The type weights of type_id are interleaved into (rows by 8) for the
    current ISA's faster decoding, or -1 (see pe_type_rows8 in pe.h)."""
    return pe_type_rows8(type_id)


def repack_rows8(int rows8_type, const uint8_t[::1] src, uint8_t[::1] dst, int64_t n, int64_t nrows) -> None:
    """Interleave nrows rows of n elements (raw blocks of the type rows8_type holds) into dst."""
    cdef size_t nbytes = pe_row_bytes(rows8_type, n) * <size_t>nrows
    if nbytes == 0 or <size_t>src.shape[0] < nbytes or <size_t>dst.shape[0] < nbytes:
        raise ValueError("buffers do not hold nrows rows of n elements")
    cdef int rc
    with nogil:
        rc = pe_repack_rows8(rows8_type, &src[0], &dst[0], n, nrows)
    _check(rc)


# ---- KV cache --------------------------------------------------------------

def kv_mask(float[:, ::1] out, const int32_t[::1] positions, const uint64_t[::1] seq_bits,
            const int32_t[::1] cell_pos, const uint64_t[::1] cell_seq, int64_t n_kv, int window,
            int chunk=0) -> None:
    """out[t, c] for the batch's tokens and the first n_kv cells: 0 where token t may
    attend cell c, -inf elsewhere (pe_kv_mask in pe.h: a sliding window, or chunks)."""
    cdef int64_t n_tokens = positions.shape[0]
    if seq_bits.shape[0] != n_tokens or n_tokens > out.shape[0]:
        raise ValueError("one sequence bit per token, and a mask row per token, are needed")
    if n_kv < 0 or n_kv > out.shape[1] or n_kv > cell_pos.shape[0] or n_kv > cell_seq.shape[0]:
        raise ValueError(f"n_kv={n_kv} is more cells than the mask or the cell table has")
    if n_tokens == 0 or n_kv == 0:
        return
    with nogil:
        pe_kv_mask(&out[0, 0], out.shape[1], &positions[0], &seq_bits[0], n_tokens, &cell_pos[0], &cell_seq[0],
                   n_kv, window, chunk)


# ---- sampling --------------------------------------------------------------

def top_k(const float[::1] x, int64_t k, const int64_t[::1] skip=None):
    """Positions of the k largest of x (leaving out the ascending positions in
    `skip`), largest first, ties to the lower position; NaN passed over
    (pe_top_k in pe.h).  Fewer than k when fewer are left."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    k = min(k, x.shape[0])
    cdef int64_t n_skip = _ascending_length(skip)
    pos = np.empty(k, np.int64)
    val = np.empty(k, np.float32)
    cdef int64_t[::1] p = pos
    cdef float[::1] v = val
    cdef int64_t found = 0
    if k > 0:
        with nogil:
            found = pe_top_k(&x[0], x.shape[0], k, &skip[0] if n_skip else NULL, n_skip, &v[0], &p[0])
    return pos[:found]


def best_outside(const float[::1] x, const int64_t[::1] skip=None):
    """(position, nan): the position of the largest of x outside the ascending
    positions in `skip` (NaN passed over; -1 when none is left), ties to the lower
    position, and whether x holds a NaN (pe_best_outside in pe.h)."""
    cdef int64_t n_skip = _ascending_length(skip)
    cdef int64_t found = -1
    cdef int nan = 0
    if x.shape[0]:
        with nogil:
            found = pe_best_outside(&x[0], x.shape[0], &skip[0] if n_skip else NULL, n_skip, &nan)
    return found, bool(nan)


# why a row of logits gives no greedy pick (pe_greedy_penalised's status)
GREEDY_NAN, GREEDY_POS_INF, GREEDY_NONE = PE_GREEDY_NAN, PE_GREEDY_POS_INF, PE_GREEDY_NONE


def greedy_penalised(const float[::1] x, const int64_t[::1] ids, const float[::1] counts, float repeat,
                     float frequency, float presence):
    """(token, status): greedy's pick once the ascending `ids`, seen `counts` times,
    are penalised (pe_greedy_penalised in pe.h); token -1 when there is none, with
    status the reason (GREEDY_*), or 0 when only the penalties left nothing finite."""
    cdef int64_t n_ids = _ascending_length(ids)
    if counts.shape[0] != n_ids:
        raise ValueError("one count per id")
    if n_ids and (ids[0] < 0 or ids[n_ids - 1] >= x.shape[0]):
        raise ValueError("ids must be positions of x")
    cdef int status = 0
    cdef int64_t token = -1
    if x.shape[0]:
        with nogil:
            token = pe_greedy_penalised(&x[0], x.shape[0], &ids[0] if n_ids else NULL,
                                        &counts[0] if n_ids else NULL, n_ids, repeat, frequency, presence,
                                        &status)
    return token, status


cdef int64_t _ascending_length(const int64_t[::1] skip) except -1:
    """The length of a skip list, which must be strictly ascending."""
    cdef int64_t n_skip = 0 if skip is None else skip.shape[0]
    cdef int64_t i
    for i in range(1, n_skip):
        if skip[i] <= skip[i - 1]:
            raise ValueError("skip must be strictly ascending")
    return n_skip


# ---- instruction sets ----------------------------------------------------

def isa() -> str:
    """The instruction set whose kernels are in use."""
    return pe_isa_current().decode()


def best_isa() -> str:
    return pe_isa_best().decode()


def isa_available(str name) -> bool:
    return pe_isa_available(name.encode()) != 0


def set_isa(str name) -> None:
    """Force an instruction set (for tests); raises if the CPU lacks it."""
    _check(pe_isa_select(name.encode()))


def physical_cores() -> int:
    return pe_physical_cores()


def backends() -> list:
    """The backends this build computes with, the CPU's first: (name, devices it finds) each."""
    found = []
    for i in range(pe_backend_count()):
        n = pe_backend_devices(i)
        _check(n)
        found.append((pe_backend_name(i).decode(), n))
    return found


# ---- row kernels (tests, tools) -----------------------------------------

cdef int64_t _row_len(int type_id, int64_t n) except -1:
    if pe_type_block_size(type_id) == 0:
        raise ValueError(f"unknown type id {type_id}")
    if n % pe_type_block_size(type_id):
        raise ValueError(f"length {n} is not a multiple of {type_name(type_id)}'s block size")
    return n


def quantize(int type_id, const float[::1] x, bint reference=True):
    """Quantize floats into blocks of type_id; returns a uint8 array."""
    cdef int64_t n = _row_len(type_id, x.shape[0])
    out = np.empty(pe_row_bytes(type_id, n), dtype=np.uint8)
    cdef uint8_t[::1] y = out
    cdef int rc
    with nogil:
        if reference:
            rc = pe_quantize_row_ref(type_id, &x[0], &y[0], n)
        else:
            rc = pe_quantize_row(type_id, &x[0], &y[0], n)
    _check(rc)
    return out


def dequantize(int type_id, const uint8_t[::1] data, int64_t n, bint reference=False):
    """Dequantize n elements of type_id from raw blocks."""
    _row_len(type_id, n)
    if <size_t>data.shape[0] < pe_row_bytes(type_id, n):
        raise ValueError("buffer too small for the requested number of elements")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] y = out
    cdef int rc
    with nogil:
        if reference:
            rc = pe_dequantize_row_ref(type_id, &data[0], &y[0], n)
        else:
            rc = pe_dequantize_row(type_id, &data[0], &y[0], n)
    _check(rc)
    return out


def vec_dot(int type_id, const uint8_t[::1] w, const float[::1] x, bint reference=False) -> float:
    """Dot product of a weight row (raw blocks) with float activations, the
    activations quantized to the type's partner first, as matmul does."""
    cdef int64_t n = _row_len(type_id, x.shape[0])
    if <size_t>w.shape[0] < pe_row_bytes(type_id, n):
        raise ValueError("weight buffer too small for the activation length")
    cdef float out = 0
    cdef int rc
    with nogil:
        if reference:
            rc = pe_vec_dot_ref(type_id, &w[0], &x[0], n, &out)
        else:
            rc = pe_vec_dot(type_id, &w[0], &x[0], n, &out)
    _check(rc)
    return out


def vec_dot_blocks(int type_id, const uint8_t[::1] w, const uint8_t[::1] a, int64_t n, bint reference=False) -> float:
    """Dot product of a weight row with activations already quantized to the
    type's partner (both raw blocks), with no quantization step in between."""
    _row_len(type_id, n)
    cdef int vdt = pe_type_vec_dot_type(type_id)
    if vdt < 0 or <size_t>w.shape[0] < pe_row_bytes(type_id, n) or <size_t>a.shape[0] < pe_row_bytes(vdt, n):
        raise ValueError("buffers too small for the row length (or type without a dot product)")
    cdef float out = 0
    cdef int rc
    with nogil:
        rc = pe_vec_dot_blocks(type_id, &w[0], &a[0], n, &out, reference)
    _check(rc)
    return out


def attn_scores_f16(const float[:, ::1] x, const uint16_t[:, ::1] y, int nacc):
    """Attention's score products of up to 4 queries with up to 4 F16 rows (raw bits), as
    the current ISA computes them (nacc 4: a generated token's, 1: a prompt batch's)."""
    if x.shape[1] != y.shape[1]:
        raise ValueError("queries and rows need the same length")
    out = np.empty((x.shape[0], y.shape[0]), np.float32)
    cdef float[:, ::1] o = out
    cdef int rc
    with nogil:
        rc = pe_attn_scores_f16(&x[0, 0], <int>x.shape[0], &y[0, 0], <int>y.shape[0], x.shape[1], nacc, &o[0, 0])
    _check(rc)
    return out


def attn_values_f16(const float[:, ::1] p, const uint16_t[:, ::1] v, const int32_t[::1] cell, int nacc):
    """Attention's product of up to 4 heads' probabilities p[nh][n] with the F16 rows v[n][hd]
    (raw bits) of cells cell[n] (-1: none), as the current ISA computes it (nacc 4: a
    generated token's, 1: a prompt batch's)."""
    if p.shape[1] != v.shape[0] or cell.shape[0] != p.shape[1]:
        raise ValueError("p, v and cell need one entry per slot")
    out = np.empty((p.shape[0], v.shape[1]), np.float32)
    cdef float[:, ::1] o = out
    cdef int rc
    with nogil:
        rc = pe_attn_values_f16(&p[0, 0], <int>p.shape[0], p.shape[1], &v[0, 0], &cell[0], v.shape[1], nacc, &o[0, 0])
    _check(rc)
    return out


def attn_lanes():
    """The float lanes attention's kernels accumulate in (the same on every ISA)."""
    return pe_attn_lanes()


# ---- thread pool -------------------------------------------------------------

cdef class ThreadPool:
    """Persistent worker threads shared by every graph computed with it."""
    cdef pe_pool *pool

    def __cinit__(self, int n_threads=0):
        self.pool = pe_pool_new(n_threads)
        if self.pool == NULL:
            raise NativeError(_last_error())

    def __dealloc__(self):
        if self.pool != NULL:
            pe_pool_free(self.pool)
            self.pool = NULL

    @property
    def n_threads(self) -> int:
        return pe_pool_n_threads(self.pool)


# ---- graph -------------------------------------------------------------------

cdef int _fill_ne(object shape, int64_t *ne) except -1:
    cdef int n = len(shape)
    if n < 1 or n > 4:
        raise ValueError(f"tensors have 1 to 4 dimensions, got shape {shape}")
    for i in range(n):
        ne[i] = shape[i]
    return n


cdef class Graph:
    """A computation graph: leaves over caller buffers, then ops; computed as a
    whole, as many times as needed.  Shapes are GGML-ordered (ne0 first)."""
    cdef pe_graph *g
    cdef list _keep      # buffers whose memory the graph points into
    cdef dict _bound     # output id -> the array it is computed into

    def __cinit__(self):
        self.g = pe_graph_new()
        if self.g == NULL:
            raise NativeError(_last_error())
        self._keep = []
        self._bound = {}

    def __dealloc__(self):
        if self.g != NULL:
            pe_graph_free(self.g)
            self.g = NULL

    cdef int _id(self, int rc) except -1:
        if rc < 0:
            raise NativeError(_last_error())
        return rc

    def external(self, int type_id, tuple shape, buffer, str name="") -> int:
        """A leaf over `buffer` (a C-contiguous array or buffer, kept alive)."""
        arr = np.asarray(buffer)
        if not arr.flags.c_contiguous:
            raise ValueError(f"tensor '{name}': buffer must be C-contiguous")
        cdef const uint8_t[::1] mv = arr.reshape(-1).view(np.uint8)
        cdef int64_t ne[4]
        cdef int nd = _fill_ne(shape, ne)
        if mv.shape[0] == 0:
            raise ValueError(f"tensor '{name}': empty buffer")
        self._keep.append(arr)
        return self._id(pe_graph_external(self.g, type_id, nd, ne, <void *>&mv[0], mv.shape[0], name.encode()))

    def view(self, int t, tuple shape, tuple strides=None, size_t offset=0) -> int:
        cdef int64_t ne[4]
        cdef size_t nb[4]
        cdef int nd = _fill_ne(shape, ne)
        if strides is None:
            return self._id(pe_graph_view(self.g, t, nd, ne, NULL, offset))
        if len(strides) != nd:
            raise ValueError("strides must match the shape's length")
        for i in range(nd):
            nb[i] = strides[i]
        return self._id(pe_graph_view(self.g, t, nd, ne, nb, offset))

    def reshape(self, int t, tuple shape) -> int:
        cdef int64_t ne[4]
        cdef int nd = _fill_ne(shape, ne)
        return self._id(pe_graph_reshape(self.g, t, nd, ne))

    def get_rows(self, int table, int ids) -> int:
        return self._id(pe_op_get_rows(self.g, table, ids))

    def mul_mat(self, int w, int x) -> int:
        return self._id(pe_op_mul_mat(self.g, w, x))

    def mul_mat_id(self, int w, int x, int ids) -> int:
        return self._id(pe_op_mul_mat_id(self.g, w, x, ids))

    def add(self, int a, int b) -> int:
        return self._id(pe_op_add(self.g, a, b))

    def mul(self, int a, int b) -> int:
        return self._id(pe_op_mul(self.g, a, b))

    def scale(self, int a, float s) -> int:
        return self._id(pe_op_scale(self.g, a, s))

    def softcap(self, int a, float cap) -> int:
        return self._id(pe_op_softcap(self.g, a, cap))

    def rms_norm(self, int a, int weight, float eps) -> int:
        return self._id(pe_op_rms_norm(self.g, a, weight, eps))

    def layer_norm(self, int a, int weight, float eps) -> int:
        return self._id(pe_op_layer_norm(self.g, a, weight, eps))

    def unary(self, int a, int op) -> int:
        return self._id(pe_op_unary(self.g, a, op))

    def glu(self, int gate, int up, int op) -> int:
        return self._id(pe_op_glu(self.g, gate, up, op))

    def softmax(self, int a) -> int:
        return self._id(pe_op_softmax(self.g, a))

    def rope(self, int a, int pos, int freq_factors, int n_dims, int mode, float freq_base,
             float freq_scale=1.0, float ext_factor=0.0, float attn_factor=1.0,
             float beta_fast=32.0, float beta_slow=1.0, int n_ctx_orig=0) -> int:
        return self._id(pe_op_rope(self.g, a, pos, freq_factors, n_dims, mode, freq_base, freq_scale,
                                   ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig))

    def rope_multi(self, int a, int pos, int n_dims, sections, int mode, float freq_base,
                   float freq_scale=1.0) -> int:
        cdef int sec[4]
        if len(sections) != 4:
            raise ValueError(f"rope_multi needs 4 sections, got {len(sections)}")
        for i in range(4):
            sec[i] = sections[i]
        return self._id(pe_op_rope_multi(self.g, a, pos, n_dims, sec, mode, freq_base, freq_scale))

    def set_rows(self, int cache, int src, int slots) -> int:
        return self._id(pe_op_set_rows(self.g, cache, src, slots))

    def attn(self, int q, int k, int v, int mask, int kv_len, int n_head_kv, float scale,
             float softcap=0.0, int cell_pos=-1) -> int:
        return self._id(pe_op_attn(self.g, q, k, v, mask, kv_len, cell_pos, n_head_kv, scale, softcap))

    def attn_alibi(self, int attn, float max_bias) -> int:
        return self._id(pe_op_attn_alibi(self.g, attn, max_bias))

    def topk(self, int a, int k) -> int:
        return self._id(pe_op_topk(self.g, a, k))

    def moe_weights(self, int logits, int ids, bint normalize) -> int:
        return self._id(pe_op_moe_weights(self.g, logits, ids, normalize))

    def weighted_sum(self, int a, int w) -> int:
        return self._id(pe_op_weighted_sum(self.g, a, w))

    def concat(self, int a, int b) -> int:
        return self._id(pe_op_concat(self.g, a, b))

    def moe_route(self, int logits, int bias, int k, int gating, int n_group, int n_group_used) -> int:
        return self._id(pe_op_moe_route(self.g, logits, bias, k, gating, n_group, n_group_used))

    def moe_sigmoid_weights(self, int logits, int ids, bint normalize) -> int:
        return self._id(pe_op_moe_sigmoid_weights(self.g, logits, ids, normalize))

    def cont(self, int a) -> int:
        return self._id(pe_op_cont(self.g, a))

    def attn_sinks(self, int attn, int sinks) -> int:
        return self._id(pe_op_attn_sinks(self.g, attn, sinks))

    def moe_softmax_chosen(self, int logits, int ids) -> int:
        return self._id(pe_op_moe_softmax_chosen(self.g, logits, ids))

    def add_id(self, int a, int b, int ids) -> int:
        return self._id(pe_op_add_id(self.g, a, b, ids))

    def swiglu_oai(self, int gate, int up, float alpha, float limit) -> int:
        return self._id(pe_op_swiglu_oai(self.g, gate, up, alpha, limit))

    def l2_norm(self, int a, float eps) -> int:
        return self._id(pe_op_l2_norm(self.g, a, eps))

    def ssm_conv(self, int x, int w, int state, int seqs) -> int:
        return self._id(pe_op_ssm_conv(self.g, x, w, state, seqs))

    def ssm_scan(self, int x, int dt, int A, int B, int C, int D, int dt_bias, int state, int seqs) -> int:
        return self._id(pe_op_ssm_scan(self.g, x, dt, A, B, C, D, dt_bias, state, seqs))

    def delta_net(self, int q, int k, int v, int gate, int beta, int state, int seqs, float scale,
                  int chunk) -> int:
        return self._id(pe_op_delta_net(self.g, q, k, v, gate, beta, state, seqs, scale, chunk))

    def set_output(self, int t) -> None:
        self._id(pe_graph_set_output(self.g, t))

    def bind_output(self, int t, out) -> None:
        """Compute output t straight into `out` (a writable C-contiguous array of exactly
        its bytes, kept alive until another takes its place) instead of the graph's memory;
        None takes it back into the graph's memory."""
        if out is None:
            self._id(pe_graph_bind_output(self.g, t, NULL, 0))
            self._bound.pop(t, None)
            return
        if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("an output is bound to a writable C-contiguous numpy array")
        cdef uint8_t[::1] mv = out.reshape(-1).view(np.uint8)
        if mv.shape[0] == 0:
            raise ValueError("an output is bound to a non-empty array")
        self._id(pe_graph_bind_output(self.g, t, <void *>&mv[0], mv.shape[0]))
        self._bound[t] = out

    def set_name(self, int t, str name) -> None:
        self._id(pe_graph_set_name(self.g, t, name.encode()))

    def shape(self, int t) -> tuple:
        cdef int nd = pe_tensor_n_dims(self.g, t)
        if nd == 0:
            raise ValueError(f"unknown tensor {t}")
        return tuple(pe_tensor_ne(self.g, t, i) for i in range(nd))

    def type_of(self, int t) -> int:
        return pe_tensor_type(self.g, t)

    def compute(self, ThreadPool pool) -> None:
        cdef int rc
        with nogil:
            rc = pe_graph_compute(self.g, pool.pool)
        if rc < 0:
            raise NativeError(_last_error())

    def read(self, int t, out=None):
        """Copy an F32/I32 tensor's values out (numpy shape is ne reversed)."""
        cdef int type_id = pe_tensor_type(self.g, t)
        if type_id != 0 and type_id != 26:
            raise ValueError("only F32 and I32 tensors can be read")
        cdef void *p = pe_tensor_data(self.g, t)
        if p == NULL:
            raise ValueError("tensor has no data yet: compute the graph first")
        shape = self.shape(t)
        cdef int nd = len(shape)
        cdef size_t row = pe_tensor_nb(self.g, t, 1)
        if row != shape[0] * 4 or (nd > 2 and pe_tensor_nb(self.g, t, 2) != row * shape[1]):
            raise ValueError("only contiguous tensors can be read")
        cdef size_t nbytes = 4
        for d in shape:
            nbytes *= d
        cdef const uint8_t[::1] src = <const uint8_t[:nbytes]> p
        dtype = np.float32 if type_id == 0 else np.int32
        if out is None:
            out = np.empty(tuple(reversed(shape)), dtype=dtype)
        elif out.dtype != dtype or out.nbytes != nbytes or not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous array of the tensor's size and dtype")
        cdef uint8_t[::1] dst = out.reshape(-1).view(np.uint8)
        dst[:] = src
        return out

    @property
    def arena_bytes(self) -> int:
        return pe_graph_arena_bytes(self.g)

    @property
    def n_tensors(self) -> int:
        return pe_graph_n_tensors(self.g)


# ---- tokenizer inner loops ------------------------------------------------------

include "_tok.pxi"


# the IQ types' grids, from the gguf package, before any model can ask for them
from pyengine import iq_grids as _iq_grids
_iq_grids.install(set_iq_grid)


# ---- the float kernels one by one, for the tests that compare instruction sets ----

cdef extern from *:
    """
    int pe_vec_probe(const char *name, int64_t n, const void *x, const float *u, float s, void *y, double *result);
    int pe_vec_probe_values_t(const float *p, int nh, int64_t n, const uint16_t *vt, int64_t hd, float *out);
    """
    int pe_vec_probe(const char *name, int64_t n, const void *x, const float *u, float s, void *y,
                     double *result) nogil
    int pe_vec_probe_values_t(const float *p, int nh, int64_t n, const uint16_t *vt, int64_t hd,
                              float *out) nogil


def vec_kernel(str name, x, u=None, float s=0.0):
    """Float kernel `name` of the current ISA's table (cpu/vec.c) on the array x (float32; for
    f16_to_f32 uint16), u the second input of silu_mul/gelu_mul, s the scalar argument.
    Returns (elements, value): the output array (None where the kernel writes none; uint16 for
    f32_to_f16; for max_nan [flag]) and the value it returns (0.0 where none)."""
    src = np.ascontiguousarray(x)
    cdef int64_t n = src.shape[0]
    if name == "f32_to_f16":
        out = np.zeros(max(n, 1), np.uint16)
    else:
        out = np.zeros(max(n, 1), np.float32)
    second = np.ascontiguousarray(u if u is not None else np.zeros(max(n, 1), np.float32), dtype=np.float32)
    if second.shape[0] < n:
        raise ValueError("u must be as long as x")
    cdef const uint8_t[::1] xb = src.reshape(-1).view(np.uint8) if n else np.zeros(4, np.uint8)
    cdef const float[::1] ub = second
    cdef uint8_t[::1] yb = out.view(np.uint8)
    cdef double result = 0.0
    cdef bytes key = name.encode()
    cdef const char *kname = key
    cdef int rc
    with nogil:
        rc = pe_vec_probe(kname, n, &xb[0], &ub[0], s, &yb[0], &result)
    _check(rc)
    if name in ("max", "sum_sq"):
        return None, result
    if name == "max_nan":
        return out[:1], result
    return out[:n], result


def vec_values_t_f16(const float[:, ::1] p, const uint16_t[:, ::1] vt):
    """values_t_f16 of the current ISA: heads' probabilities p[nh][n] with a transposed F16 V
    vt[hd][n] (raw bits), out[nh][hd]."""
    if p.shape[1] != vt.shape[1]:
        raise ValueError("p and vt need one entry per slot")
    out = np.empty((p.shape[0], vt.shape[0]), np.float32)
    cdef float[:, ::1] o = out
    cdef int rc
    with nogil:
        rc = pe_vec_probe_values_t(&p[0, 0], <int>p.shape[0], p.shape[1], &vt[0, 0], vt.shape[0], &o[0, 0])
    _check(rc)
    return out
