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


def vec_dot_type(int type_id) -> int:
    return pe_type_vec_dot_type(type_id)


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
