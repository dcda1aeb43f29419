# _tok.pxi - included by _core.pyx: the tokenizer's inner loops (csrc/tok, pe_tok.h).
#
# pyengine/tokenizer/native.py builds these from a vocabulary; pyengine/tokenizer/ works
# without them (pure Python, same ids), only slower.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

cdef extern from "pe_tok.h":
    ctypedef struct pe_tok_ids:
        int32_t *data
        int64_t len
        int64_t cap
    void pe_tok_ids_free(pe_tok_ids *ids)
    int pe_tok_ids_push(pe_tok_ids *ids, int32_t id)

    int PE_TOK_ENOMEM
    int PE_TOK_EINVAL
    int PE_TOK_ENOBYTE
    int PE_TOK_ECHARSMAP
    int PE_TOK_ENOUNK
    int PE_TOK_N_CODEPOINTS

    ctypedef struct pe_tok_spm:
        pass
    pe_tok_spm *pe_tok_spm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                               const float *scores, const int32_t *byte_ids, int32_t unk_id,
                               const uint32_t *glued, int32_t n_glued)
    void pe_tok_spm_free(pe_tok_spm *spm)
    int pe_tok_spm_encode(pe_tok_spm *spm, const char *text, int64_t len, pe_tok_ids *out)
    int pe_tok_spm_encode_text(pe_tok_spm *spm, const char *text, int64_t len, int prefix_space,
                               pe_tok_ids *out)

    ctypedef struct pe_tok_bpe_params:
        int32_t n_vocab
        int32_t n_symbols
        const char *symbol_bytes
        const int64_t *symbol_offsets
        const int32_t *merges
        int32_t n_merges
        const int32_t *byte_symbols
        const int32_t *byte_fallback
        int32_t flags
        int32_t splitter
        const uint8_t *cp_classes
    ctypedef struct pe_tok_bpe:
        pass
    pe_tok_bpe *pe_tok_bpe_new(const pe_tok_bpe_params *params)
    void pe_tok_bpe_free(pe_tok_bpe *bpe)
    int pe_tok_bpe_encode(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *out)
    int pe_tok_bpe_encode_words(pe_tok_bpe *bpe, const char *text, int64_t len,
                                const int64_t *word_cps, int64_t n_words, pe_tok_ids *out)
    int pe_tok_bpe_split(pe_tok_bpe *bpe, const char *text, int64_t len, pe_tok_ids *word_cps)

    ctypedef struct pe_tok_ugm:
        pass
    pe_tok_ugm *pe_tok_ugm_new(const char *texts, const int64_t *offsets, int32_t n_tokens,
                               const float *scores, const uint8_t *kinds, int32_t unk_id,
                               float unknown_score, const char *charsmap, int64_t charsmap_len,
                               int32_t flags)
    void pe_tok_ugm_free(pe_tok_ugm *ugm)
    int pe_tok_ugm_encode(pe_tok_ugm *ugm, const char *text, int64_t len, pe_tok_ids *out)

    ctypedef struct pe_tok_wpm:
        pass
    pe_tok_wpm *pe_tok_wpm_new(const char *texts, const int64_t *offsets, int32_t n_tokens, int32_t unk_id)
    void pe_tok_wpm_free(pe_tok_wpm *wpm)
    int pe_tok_wpm_encode(pe_tok_wpm *wpm, const char *text, int64_t len, pe_tok_ids *out)


from pyengine.errors import TokenizerError as _TokenizerError


cdef list _tok_take_ids(pe_tok_ids *ids, int rc):
    """The ids as a list (freeing the buffer), or the error rc stands for."""
    cdef Py_ssize_t i
    cdef list result
    try:
        if rc == PE_TOK_ENOMEM:
            raise MemoryError("out of memory while tokenizing")
        if rc == PE_TOK_ENOBYTE:
            raise _TokenizerError("the text has a byte with no token, and the vocabulary "
                                  "has no unknown token")
        if rc == PE_TOK_ECHARSMAP:
            raise _TokenizerError("corrupt tokenizer.ggml.precompiled_charsmap: it points "
                                  "outside itself")
        if rc == PE_TOK_ENOUNK:
            raise _TokenizerError("the text has a character no token starts with, and the "
                                  "vocabulary has no unknown token")
        if rc < 0:
            raise _TokenizerError(f"the native tokenizer rejected its input (code {rc})")
        result = [ids.data[i] for i in range(ids.len)]
    finally:
        pe_tok_ids_free(ids)
    return result


cdef const char *_tok_utf8(str text, Py_ssize_t *size) except NULL:
    # The str's cached UTF-8 (no copy); callers pass text without lone surrogates.
    return PyUnicode_AsUTF8AndSize(text, size)


cdef class TokSPM:
    """SentencePiece segmentation of U+2581-escaped text (pe_tok_spm)."""

    cdef pe_tok_spm *spm

    def __cinit__(self, bytes texts, const int64_t[::1] offsets, const float[::1] scores,
                  const int32_t[::1] byte_ids, int32_t unk_id, const uint32_t[::1] glued):
        cdef Py_ssize_t n_tokens = scores.shape[0]
        if offsets.shape[0] != n_tokens + 1 or byte_ids.shape[0] != 256 or n_tokens == 0:
            raise ValueError("TokSPM: arrays of inconsistent lengths")
        if offsets[0] < 0 or offsets[n_tokens] > len(texts):
            raise ValueError("TokSPM: offsets outside the token texts")
        self.spm = pe_tok_spm_new(texts, &offsets[0], <int32_t> n_tokens, &scores[0],
                                  &byte_ids[0], unk_id,
                                  &glued[0] if glued.shape[0] else NULL, <int32_t> glued.shape[0])
        if self.spm is NULL:
            raise MemoryError("TokSPM: cannot build the vocabulary tables")

    def __dealloc__(self):
        pe_tok_spm_free(self.spm)

    def encode(self, str text) -> list:
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(text, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_spm_encode(self.spm, data, size, &ids)
        return _tok_take_ids(&ids, rc)

    def encode_fragments(self, list fragments, bint space_prefix) -> list:
        """Raw text fragments (str) and special token ids (int) to ids, as llama.cpp's
        SPM tokenize: spaces become U+2581, and with space_prefix every text that opens
        the input or follows a special token gets one in front."""
        cdef Py_ssize_t size
        cdef const char *data
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = 0
        cdef bint after_special = True
        for fragment in fragments:
            if type(fragment) is str:
                data = _tok_utf8(<str> fragment, &size)
                rc = pe_tok_spm_encode_text(self.spm, data, size, space_prefix and after_special,
                                            &ids)
                after_special = False
            else:
                rc = pe_tok_ids_push(&ids, <int32_t> fragment)
                after_special = True
            if rc < 0:
                break
        return _tok_take_ids(&ids, rc)


cdef class TokBPE:
    """BPE merges of words, split by a built-in splitter or given (pe_tok_bpe)."""

    cdef pe_tok_bpe *bpe
    cdef object _classes  # the code point table the C side points into

    def __cinit__(self, int32_t n_vocab, bytes symbol_bytes, const int64_t[::1] symbol_offsets,
                  const int32_t[:, ::1] merges, const int32_t[::1] byte_symbols,
                  const int32_t[::1] byte_fallback, int32_t flags, int32_t splitter,
                  const uint8_t[::1] cp_classes):
        cdef pe_tok_bpe_params p
        cdef Py_ssize_t n_symbols = symbol_offsets.shape[0] - 1
        if n_symbols < n_vocab or byte_symbols.shape[0] != 256 or byte_fallback.shape[0] != 256:
            raise ValueError("TokBPE: arrays of inconsistent lengths")
        if merges.shape[0] and merges.shape[1] != 3:
            raise ValueError("TokBPE: merges must be rows of (left, right, result)")
        if symbol_offsets[0] < 0 or symbol_offsets[n_symbols] > len(symbol_bytes):
            raise ValueError("TokBPE: offsets outside the symbol bytes")
        if cp_classes is not None and cp_classes.shape[0] != PE_TOK_N_CODEPOINTS:
            raise ValueError("TokBPE: the code point table has the wrong size")
        p.n_vocab = n_vocab
        p.n_symbols = <int32_t> n_symbols
        p.symbol_bytes = symbol_bytes
        p.symbol_offsets = &symbol_offsets[0]
        p.merges = &merges[0, 0] if merges.shape[0] else NULL
        p.n_merges = <int32_t> merges.shape[0]
        p.byte_symbols = &byte_symbols[0]
        p.byte_fallback = &byte_fallback[0]
        p.flags = flags
        p.splitter = splitter
        p.cp_classes = &cp_classes[0] if cp_classes is not None else NULL
        self._classes = cp_classes
        self.bpe = pe_tok_bpe_new(&p)
        if self.bpe is NULL:
            raise ValueError("TokBPE: inconsistent tables (or out of memory)")

    def __dealloc__(self):
        pe_tok_bpe_free(self.bpe)

    def encode(self, str text) -> list:
        """Split with the built-in splitter, then merge every word."""
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(text, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_bpe_encode(self.bpe, data, size, &ids)
        return _tok_take_ids(&ids, rc)

    def encode_fragments(self, list fragments) -> list:
        """Raw text fragments (str, split by the built-in splitter) and special token
        ids (int) to ids."""
        cdef Py_ssize_t size
        cdef const char *data
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = 0
        for fragment in fragments:
            if type(fragment) is str:
                data = _tok_utf8(<str> fragment, &size)
                rc = pe_tok_bpe_encode(self.bpe, data, size, &ids)
            else:
                rc = pe_tok_ids_push(&ids, <int32_t> fragment)
            if rc < 0:
                break
        return _tok_take_ids(&ids, rc)

    def encode_words(self, str text, const int64_t[::1] word_lengths) -> list:
        """Merge the words text is made of (lengths in code points, summing to len(text))."""
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(text, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_bpe_encode_words(
            self.bpe, data, size, &word_lengths[0] if word_lengths.shape[0] else NULL,
            word_lengths.shape[0], &ids)
        return _tok_take_ids(&ids, rc)

    def split(self, str text) -> list:
        """Word lengths (code points) the built-in splitter finds."""
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(text, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_bpe_split(self.bpe, data, size, &ids)
        return _tok_take_ids(&ids, rc)


cdef class TokUGM:
    """Unigram normalization and Viterbi segmentation (pe_tok_ugm)."""

    cdef pe_tok_ugm *ugm

    def __cinit__(self, bytes texts, const int64_t[::1] offsets, const float[::1] scores,
                  const uint8_t[::1] kinds, int32_t unk_id, float unknown_score,
                  bytes charsmap, int32_t flags):
        cdef Py_ssize_t n_tokens = scores.shape[0]
        if offsets.shape[0] != n_tokens + 1 or kinds.shape[0] != n_tokens or n_tokens == 0:
            raise ValueError("TokUGM: arrays of inconsistent lengths")
        if offsets[0] < 0 or offsets[n_tokens] > len(texts):
            raise ValueError("TokUGM: offsets outside the token texts")
        self.ugm = pe_tok_ugm_new(texts, &offsets[0], <int32_t> n_tokens, &scores[0], &kinds[0],
                                  unk_id, unknown_score, charsmap, len(charsmap), flags)
        if self.ugm is NULL:
            raise _TokenizerError("TokUGM: cannot build the tables (corrupt charsmap, or out of memory)")

    def __dealloc__(self):
        pe_tok_ugm_free(self.ugm)

    def encode(self, str text) -> list:
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(text, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_ugm_encode(self.ugm, data, size, &ids)
        return _tok_take_ids(&ids, rc)


cdef class TokWPM:
    """WordPiece's greedy cutting of normalized words (pe_tok_wpm)."""

    cdef pe_tok_wpm *wpm

    def __cinit__(self, bytes texts, const int64_t[::1] offsets, int32_t unk_id):
        cdef Py_ssize_t n_tokens = offsets.shape[0] - 1
        if n_tokens <= 0:
            raise ValueError("TokWPM: no tokens")
        if offsets[0] < 0 or offsets[n_tokens] > len(texts):
            raise ValueError("TokWPM: offsets outside the token texts")
        self.wpm = pe_tok_wpm_new(texts, &offsets[0], <int32_t> n_tokens, unk_id)
        if self.wpm is NULL:
            raise _TokenizerError("TokWPM: cannot build the tables (bad unknown id, or out of memory)")

    def __dealloc__(self):
        pe_tok_wpm_free(self.wpm)

    def encode(self, str words) -> list:
        """Ids of the normalized words, separated by single spaces."""
        cdef Py_ssize_t size
        cdef const char *data = _tok_utf8(words, &size)
        cdef pe_tok_ids ids
        ids.data = NULL
        ids.len = 0
        ids.cap = 0
        cdef int rc = pe_tok_wpm_encode(self.wpm, data, size, &ids)
        return _tok_take_ids(&ids, rc)
