/* x86_gemm.h - the dot products of the block types as a GEMM micro-kernel
 * (4 weight rows x up to 4 activation rows) and as vec_dot (1 x 1), written
 * once for avx2_gemm.c and avx512_gemm.c: the shared pieces and the legacy
 * types Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 here, Q4_K Q5_K Q6_K in
 * x86_gemm_kquants.h.  Both files compile this with AVX2; the AVX-512 one
 * defines PE_GEMM_VNNI first, which swaps the integer dot products (maddubs +
 * madd) for vpdpbusd and the fifth-bit insertion for byte masks.
 * PYENGINE_GEMM=0 in the environment installs vec_dot only (A/B timing).
 *
 * Batch invariance.  A row's result may not depend on which other rows share
 * its tile, so every (weight row, activation row) pair follows one
 * accumulation scheme whether it is computed alone or in a tile:
 *   - a block's integer dot product is split in two exact sums by the parity
 *     of its 4-element groups: E over elements 8k..8k+3, O over 8k+4..8k+7;
 *   - two float lanes accumulate block after block, even = fma(dw*da, E,
 *     even) and odd = fma(dw*da, O, odd), with dw*da one rounded product;
 *   - the _1 types' min terms go to a third lane, mins = fma(mw, sa, mins);
 *   - the result is (even + odd) + mins.
 * The integer sums are exact however they are formed, and the float
 * operations are the same ones in the same order, so a tile's elements equal
 * vec_dot's bit for bit (and AVX2's equal AVX-512's).  Two lanes rather than
 * one keep vec_dot's chain of dependent multiply-adds short; the tile has
 * enough independent pairs either way.
 *
 * The tile layout.  Weight codes are transposed once per block: vector t[k]
 * holds the codes of elements 8k..8k+7 of the four rows, row r in 64-bit lane
 * r.  An activation row's elements 8k..8k+7, broadcast to the four lanes,
 * meet them in one multiply-add, which leaves row r's partial E and O in
 * 32-bit lanes 2r and 2r+1: one vector is one activation row against four
 * weight rows, with no horizontal sums until the end.  Signed codes (the _0
 * types) move their sign onto the activations (|w| * sign(a, w)). */
#ifndef PE_X86_GEMM_H
#define PE_X86_GEMM_H

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "x86_reduce.h"
#include "internal.h"

#if defined(_MSC_VER)
#define GM_INLINE static __forceinline
#else
#define GM_INLINE static inline __attribute__((always_inline))
#endif

/* ---- loads ----------------------------------------------------------------------- */

static inline uint32_t gm_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __m128i gm_load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline __m256i gm_load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 8 bytes in each 64-bit lane */
static inline __m256i gm_bcast8(const void *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi64x(v);
}

/* 16 bytes at each of four rows: lo = bytes 0..7, hi = bytes 8..15, row r in 64-bit lane r */
static inline void gm_transpose16(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3,
                                  __m256i *lo, __m256i *hi) {
    const __m256i y02 = _mm256_inserti128_si256(_mm256_castsi128_si256(gm_load128(p0)), gm_load128(p2), 1);
    const __m256i y13 = _mm256_inserti128_si256(_mm256_castsi128_si256(gm_load128(p1)), gm_load128(p3), 1);
    *lo = _mm256_unpacklo_epi64(y02, y13);
    *hi = _mm256_unpackhi_epi64(y02, y13);
}

/* ---- integer dot products ------------------------------------------------------------ */

/* How a type's codes multiply: unsigned (< 32), signed with |w| <= 16, or
 * Q8_0's full signed bytes (whose 16-bit pair sums may not be added up).
 * Activations are in [-127, 127] (the q8 quantizers never give -128), so
 * sign(a, w) cannot overflow and maddubs pair sums stay below 2^15. */
enum { GM_UNSIGNED, GM_SIGNED, GM_SIGNED8 };

/* Row form: per 32-bit lane t, the dot product of elements 4t..4t+3. */
GM_INLINE __m256i gm_dot_row(__m256i codes, const int8_t *a, int kind) {
    __m256i u = codes, s = gm_load256(a);
    if (kind != GM_UNSIGNED) {
        s = _mm256_sign_epi8(s, codes);
        u = _mm256_abs_epi8(codes);
    }
#if defined(PE_GEMM_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* Tile form: t[k] as above (u[k] = |t[k]| for the signed kinds) against one
 * activation block; row r's E and O land in 32-bit lanes 2r and 2r + 1. */
GM_INLINE __m256i gm_dot_tile(const __m256i t[4], const __m256i u[4], const int8_t *a, int kind) {
    __m256i b[4];
    for (int k = 0; k < 4; k++) {
        b[k] = gm_bcast8(a + 8 * k);
        if (kind != GM_UNSIGNED) b[k] = _mm256_sign_epi8(b[k], t[k]);
    }
    const __m256i *w = kind == GM_UNSIGNED ? t : u;
#if defined(PE_GEMM_VNNI)
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[0], b[0]);
    for (int k = 1; k < 4; k++) s = _mm256_dpbusd_epi32(s, w[k], b[k]);
    return s;
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == GM_SIGNED8) { /* pair sums up to 32512: widen each before adding */
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(w[0], b[0]), ones);
        for (int k = 1; k < 4; k++) s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(w[k], b[k]), ones));
        return s;
    }
    /* pair sums <= 2 * 31 * 127: four of them still fit 16 bits */
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], b[0]), _mm256_maddubs_epi16(w[1], b[1]));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], b[2]), _mm256_maddubs_epi16(w[3], b[3]));
    return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones);
#endif
}

/* The row form's 8 lanes folded to the parity sums: [E, O, E, O]. */
static inline __m128i gm_parity(__m256i v) {
    const __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
}

/* ---- legacy block codes ------------------------------------------------------------- */

/* Row form: a block's 32 codes in element order (low nibbles are elements
 * 0..15, high nibbles 16..31). */
static inline __m256i gm_nibbles_row(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(gm_load128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* Tile form: the four rows' nibbles, t[k] = elements 8k..8k+7. */
static inline void gm_nibbles_tile(const uint8_t *q0, const uint8_t *q1, const uint8_t *q2, const uint8_t *q3,
                                   __m256i t[4]) {
    __m256i lo, hi;
    gm_transpose16(q0, q1, q2, q3, &lo, &hi);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    t[0] = _mm256_and_si256(lo, m4);
    t[1] = _mm256_and_si256(hi, m4);
    t[2] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
    t[3] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4);
}

/* Fifth bits (bit e of qh for element e) of Q5_0 / Q5_1.  Unsigned codes
 * get 16 added where the bit is set; signed ones (code - 16) get 16 taken
 * off where it is clear, which for nibbles is an OR with 0xF0. */
#if defined(PE_GEMM_VNNI)
static inline __m256i gm_fifth_row(__m256i codes, uint32_t qh, int is_signed) {
    const __m256i sixteen = _mm256_set1_epi8(16);
    if (is_signed) return _mm256_mask_sub_epi8(codes, _cvtu32_mask32(~qh), codes, sixteen);
    return _mm256_mask_add_epi8(codes, _cvtu32_mask32(qh), codes, sixteen);
}
#else
static inline __m256i gm_fifth_row(__m256i codes, uint32_t qh, int is_signed) {
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    if (is_signed) return _mm256_or_si256(codes, _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
    return _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}
#endif

/* Tile form: byte k of row r's qh spread over the 8 bytes of 64-bit lane r,
 * one bit per byte, for t[k]. */
static inline void gm_fifth_tile(uint32_t h0, uint32_t h1, uint32_t h2, uint32_t h3, __m256i t[4], int is_signed) {
    const __m256i rows = _mm256_broadcastsi128_si256(_mm_setr_epi32((int)h0, (int)h1, (int)h2, (int)h3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i idx = _mm256_setr_epi64x(0, 0x0404040404040404LL, 0x0808080808080808LL, 0x0C0C0C0C0C0C0C0CLL);
    for (int k = 0; k < 4; k++, idx = _mm256_add_epi8(idx, _mm256_set1_epi8(1))) {
        const __m256i sel = _mm256_shuffle_epi8(rows, idx);
#if defined(PE_GEMM_VNNI)
        if (is_signed)
            t[k] = _mm256_mask_sub_epi8(t[k], _mm256_testn_epi8_mask(sel, bit), t[k], _mm256_set1_epi8(16));
        else
            t[k] = _mm256_mask_add_epi8(t[k], _mm256_test_epi8_mask(sel, bit), t[k], _mm256_set1_epi8(16));
#else
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit);
        if (is_signed)
            t[k] = _mm256_or_si256(t[k], _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
        else
            t[k] = _mm256_or_si256(t[k], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
#endif
    }
}

static inline void gm_offset_tile(__m256i t[4], int offset) {
    for (int k = 0; k < 4; k++) t[k] = _mm256_sub_epi8(t[k], _mm256_set1_epi8((char)offset));
}

/* Per type: the row form (codes of block b) and the tile form (codes of
 * block ib of the four rows w[0..3]), signed where the type is. */
static inline __m256i gm_row_q4_0(const block_q4_0 *b) {
    return _mm256_sub_epi8(gm_nibbles_row(b->qs), _mm256_set1_epi8(8));
}
static inline __m256i gm_row_q4_1(const block_q4_1 *b) { return gm_nibbles_row(b->qs); }
static inline __m256i gm_row_q5_0(const block_q5_0 *b) { return gm_fifth_row(gm_nibbles_row(b->qs), gm_u32(b->qh), 1); }
static inline __m256i gm_row_q5_1(const block_q5_1 *b) { return gm_fifth_row(gm_nibbles_row(b->qs), gm_u32(b->qh), 0); }
static inline __m256i gm_row_q8_0(const block_q8_0 *b) { return gm_load256(b->qs); }

#define GM_ROWS(TYPE, w, ib)                                                     \
    const TYPE *b0 = (const TYPE *)w[0] + ib, *b1 = (const TYPE *)w[1] + ib,     \
               *b2 = (const TYPE *)w[2] + ib, *b3 = (const TYPE *)w[3] + ib

GM_INLINE void gm_tile_q4_0(const uint8_t *const w[4], int64_t ib, __m256i t[4]) {
    GM_ROWS(block_q4_0, w, ib);
    gm_nibbles_tile(b0->qs, b1->qs, b2->qs, b3->qs, t);
    gm_offset_tile(t, 8);
}
GM_INLINE void gm_tile_q4_1(const uint8_t *const w[4], int64_t ib, __m256i t[4]) {
    GM_ROWS(block_q4_1, w, ib);
    gm_nibbles_tile(b0->qs, b1->qs, b2->qs, b3->qs, t);
}
GM_INLINE void gm_tile_q5_0(const uint8_t *const w[4], int64_t ib, __m256i t[4]) {
    GM_ROWS(block_q5_0, w, ib);
    gm_nibbles_tile(b0->qs, b1->qs, b2->qs, b3->qs, t);
    gm_fifth_tile(gm_u32(b0->qh), gm_u32(b1->qh), gm_u32(b2->qh), gm_u32(b3->qh), t, 1);
}
GM_INLINE void gm_tile_q5_1(const uint8_t *const w[4], int64_t ib, __m256i t[4]) {
    GM_ROWS(block_q5_1, w, ib);
    gm_nibbles_tile(b0->qs, b1->qs, b2->qs, b3->qs, t);
    gm_fifth_tile(gm_u32(b0->qh), gm_u32(b1->qh), gm_u32(b2->qh), gm_u32(b3->qh), t, 0);
}
GM_INLINE void gm_tile_q8_0(const uint8_t *const w[4], int64_t ib, __m256i t[4]) {
    GM_ROWS(block_q8_0, w, ib);
    gm_transpose16((const uint8_t *)b0->qs, (const uint8_t *)b1->qs, (const uint8_t *)b2->qs,
                   (const uint8_t *)b3->qs, &t[0], &t[1]);
    gm_transpose16((const uint8_t *)b0->qs + 16, (const uint8_t *)b1->qs + 16, (const uint8_t *)b2->qs + 16,
                   (const uint8_t *)b3->qs + 16, &t[2], &t[3]);
}

/* Weights stream from memory once per token in decoding, and a tile reads
 * four rows at a time: too short a run per row for the hardware prefetcher
 * to follow.  Each block step asks for the same bytes 16 rows further on
 * (rows are adjacent in memory: the tiles this thread or the next one is
 * about to read), into L2: prefetches into L1 held up the loads. */
#define GM_PREFETCH_ROWS 16
static inline void gm_prefetch_ahead(const uint8_t *const w[4], size_t bw, size_t off, size_t len) {
    for (int r = 0; r < 4; r++)
        for (size_t o = 0; o < len; o += 64)
            _mm_prefetch((const char *)(w[r] + GM_PREFETCH_ROWS * bw + off + o), _MM_HINT_T1);
}

/* ---- float scales and results ---------------------------------------------------------- */

/* the f16 pairs opening block ib of the four rows: [d0 m0 d1 m1 d2 m2 d3 m3]
 * (m is whatever follows d in the _0 types, never used) */
static inline __m256 gm_scales_tile(const uint8_t *const w[4], size_t block_bytes, int64_t ib) {
    const size_t off = (size_t)ib * block_bytes;
    const __m128i h = _mm_setr_epi32((int)gm_u32(w[0] + off), (int)gm_u32(w[1] + off), (int)gm_u32(w[2] + off),
                                     (int)gm_u32(w[3] + off));
    return _mm256_cvtph_ps(h);
}

/* the f16 pair opening an activation block in every lane pair: [da sa da sa ...] */
static inline __m256 gm_scales_act(const void *block) { return _mm256_cvtph_ps(_mm_set1_epi32((int)gm_u32(block))); }

/* the f16 pairs opening block ib of activation rows 0..3 (rows past nc
 * repeat the last): [da0 sa0 da1 sa1 da2 sa2 da3 sa3] */
static inline __m256 gm_scales_acts(const uint8_t *a, size_t ba, size_t block_bytes, int64_t ib, int nc) {
    const uint8_t *p = a + (size_t)ib * block_bytes;
    const size_t s1 = nc > 1 ? ba : 0, s2 = nc > 2 ? 2 * ba : s1, s3 = nc > 3 ? 3 * ba : s2;
    const __m128i h = _mm_setr_epi32((int)gm_u32(p), (int)gm_u32(p + s1), (int)gm_u32(p + s2), (int)gm_u32(p + s3));
    return _mm256_cvtph_ps(h);
}

static inline __m256 gm_lane(__m256 v, int i) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i)); }

/* lane i in the low half, lane k in the high half */
static inline __m256 gm_lanes2(__m256 v, int i, int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(i, i, i, i, k, k, k, k));
}

/* min terms kept as lane r + 4h (weight row r, activation row 2q + h) moved
 * to lane 2r, where gm_finish_tile reads them */
static inline __m256 gm_spread_mins(__m256 m, int h) {
    const int b = 4 * h;
    return _mm256_permutevar8x32_ps(m, _mm256_setr_epi32(b, b, b + 1, b + 1, b + 2, b + 2, b + 3, b + 3));
}

/* (even + odd) + mins of one pair */
static inline float gm_finish_row(__m128 acc, __m128 mins, int with_min) {
    __m128 r = _mm_add_ss(acc, _mm_movehdup_ps(acc));
    if (with_min) r = _mm_add_ss(r, mins);
    return _mm_cvtss_f32(r);
}

/* The same for the four pairs of one activation row (lanes 2r, 2r + 1, and
 * lane 2r of mins), stored for the first nr weight rows. */
static inline void gm_finish_tile(float *s, __m256 acc, __m256 mins, int with_min, int nr) {
    __m256 r = _mm256_add_ps(acc, _mm256_permute_ps(acc, _MM_SHUFFLE(2, 3, 0, 1)));
    if (with_min) r = _mm256_add_ps(r, mins);
    const __m128 v = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
    if (nr == 4) {
        _mm_storeu_ps(s, v);
    } else {
        float tmp[4];
        _mm_storeu_ps(tmp, v);
        for (int i = 0; i < nr; i++) s[i] = tmp[i];
    }
}

/* The four weight rows of a tile; rows past nr repeat the last one (their
 * results are not stored). */
static inline void gm_rows(const void *w, size_t bw, int nr, const uint8_t *rows[4]) {
    for (int i = 0; i < 4; i++) rows[i] = (const uint8_t *)w + (size_t)(i < nr ? i : nr - 1) * bw;
}

/* ---- legacy kernels ------------------------------------------------------------------ */

/* The legacy types follow llama.cpp's x86 dot products to the bit, so that
 * logits match its recorded ones: per block, eight exact integer sums (lane
 * t = elements 4t..4t+3) go to float and are multiply-added into eight
 * accumulators, acc = fma(dw*da, sum, acc) with dw*da one rounded product;
 * the _1 types' min terms run as one float chain, mins = mins + mw*sa (one
 * rounding each); the result is x86_sum_ps8(acc) + mins, adding halves
 * (lanes t and t+4, then t and t+2, then the last two).  A pair's result is
 * the same whether vec_dot or a tile computes it. */
static inline float gm_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

#define GM_DEFINE_LEGACY_VEC_DOT(NAME, WB, AB, ROW, KIND, WITH_MIN)                                       \
    static void vec_dot_##NAME(int64_t n, float *s, const void *vw, const void *va) {                     \
        const WB *w = vw;                                                                                 \
        const AB *a = va;                                                                                 \
        __m256 acc = _mm256_setzero_ps();                                                                 \
        float mins = 0.0f;                                                                                \
        for (int64_t ib = 0; ib < n / 32; ib++) {                                                         \
            const __m256i lanes = gm_dot_row(ROW(&w[ib]), a[ib].qs, KIND);                                \
            const float d = gm_f16(&w[ib].d) * gm_f16(&a[ib].d);                                          \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);                     \
            if (WITH_MIN) mins += gm_f16((const uint8_t *)&w[ib] + 2) * gm_f16((const uint8_t *)&a[ib] + 2); \
        }                                                                                                 \
        *s = x86_sum_ps8(acc) + mins;                                                                        \
    }

#if defined(PE_GEMM_VNNI)
/* The tile, AVX-512: two weight rows share a 512-bit vector (row 2p in the
 * low half, 2p + 1 in the high half) against an activation block broadcast
 * to both halves; one vpdpbusd gives both rows' eight lane sums.  vpdpbusd
 * multiplies unsigned by signed bytes: unsigned codes (Q4_1, Q5_1) take the
 * activations as they are; the signed types take them shifted to unsigned
 * (a + 128), the shift coming off through the accumulator's start value,
 * -128 * (the weights' 4-element sums), made once per row pair and block. */
static inline __m512i gm_pair(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* [x0 x1 ... x7] -> 16 lanes picked by idx */
static inline __m512 gm_pick(__m256 x, __m512i idx) { return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(x)); }

static inline __m512i gm_idx(int a, int b) {
    return _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
}

/* up to 8 activation rows: the f16 pair opening each one's block ib, as
 * floats [d0 s0 d1 s1 ...] in two halves (rows 0..3, 4..7) */
static inline void gm_scales_acts8(const uint8_t *a, size_t ba, size_t block_bytes, int64_t ib, int nc,
                                   __m256 out[2]) {
    out[0] = gm_scales_acts(a, ba, block_bytes, ib, nc < 4 ? nc : 4);
    out[1] = nc > 4 ? gm_scales_acts(a + 4 * ba, ba, block_bytes, ib, nc - 4) : out[0];
}

/* ROW gives a block's codes (signed for SIGNED), for up to 8 activation rows */
#define GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, SIGNED, WITH_MIN)                                        \
    GM_INLINE void gemm_##NAME##_n(int64_t n, float *s, size_t bs, const uint8_t *const w[4],             \
                                   const uint8_t *a, size_t ba, size_t bw, int nr, const int nc) {        \
        __m512 acc[2][8], mins[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; /* lane 4r + j % 4 */     \
        for (int p = 0; p < 2; p++)                                                                       \
            for (int j = 0; j < 8; j++) acc[p][j] = _mm512_setzero_ps();                                  \
        const __m512i c128 = _mm512_set1_epi8((char)0x80);                                                \
        for (int64_t ib = 0; ib < n / 32; ib++) {                                                         \
            gm_prefetch_ahead(w, bw, (size_t)ib * sizeof(WB), sizeof(WB));                                \
            __m512i codes[2], start[2];                                                                   \
            for (int p = 0; p < 2; p++) {                                                                 \
                codes[p] = gm_pair(ROW((const WB *)w[2 * p] + ib), ROW((const WB *)w[2 * p + 1] + ib));   \
                start[p] = SIGNED ? _mm512_sub_epi32(_mm512_setzero_si512(),                              \
                                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, codes[p])) \
                                  : _mm512_setzero_si512();                                               \
            }                                                                                             \
            const __m256 wd = gm_scales_tile(w, sizeof(WB), ib);   /* [d0 m0 d1 m1 d2 m2 d3 m3] */        \
            __m256 ad[2];                                                                                 \
            gm_scales_acts8(a, ba, sizeof(AB), ib, nc, ad);                                               \
            const __m512 dw[2] = {gm_pick(wd, gm_idx(0, 2)), gm_pick(wd, gm_idx(4, 6))};                  \
            for (int j = 0; j < nc; j++) {                                                                \
                const AB *aj = (const AB *)(a + (size_t)j * ba) + ib;                                     \
                __m512i av = _mm512_broadcast_i64x4(gm_load256(aj->qs));                                  \
                if (SIGNED) av = _mm512_xor_si512(av, c128);                                              \
                const __m512 da = gm_pick(ad[j / 4], _mm512_set1_epi32(2 * (j % 4)));                     \
                for (int p = 0; p < 2; p++) {                                                             \
                    const __m512i lanes = SIGNED ? _mm512_dpbusd_epi32(start[p], av, codes[p])           \
                                                 : _mm512_dpbusd_epi32(start[p], codes[p], av);          \
                    acc[p][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], da), _mm512_cvtepi32_ps(lanes), acc[p][j]); \
                }                                                                                         \
            }                                                                                             \
            if (WITH_MIN) {                                                                               \
                const __m512 mw = gm_pick(wd, _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7)); \
                const __m512i sidx = _mm512_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7);   \
                mins[0] = _mm512_add_ps(mins[0], _mm512_mul_ps(mw, gm_pick(ad[0], sidx)));               \
                if (nc > 4) mins[1] = _mm512_add_ps(mins[1], _mm512_mul_ps(mw, gm_pick(ad[1], sidx)));   \
            }                                                                                             \
        }                                                                                                 \
        float m[2][16];                                                                                   \
        _mm512_storeu_ps(m[0], mins[0]);                                                                  \
        _mm512_storeu_ps(m[1], mins[1]);                                                                  \
        for (int j = 0; j < nc; j++)                                                                      \
            for (int r = 0; r < nr; r++) {                                                                \
                const __m512 v = acc[r / 2][j];                                                           \
                const __m256 half = r % 2 ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v);     \
                s[(size_t)j * bs + r] = x86_sum_ps8(half) + (WITH_MIN ? m[j / 4][4 * r + j % 4] : 0.0f);     \
            }                                                                                             \
    }
#else
/* The tile, AVX2: each pair keeps its own eight lanes as in vec_dot. */
#define GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, KIND, WITH_MIN)                                          \
    GM_INLINE void gemm_##NAME##_n(int64_t n, float *s, size_t bs, const uint8_t *const w[4],             \
                                   const uint8_t *a, size_t ba, size_t bw, int nr, const int nc) {        \
        __m256 acc[4][4];                                                                                 \
        float mins[4][4] = {{0}};                                                                         \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();                                  \
        for (int64_t ib = 0; ib < n / 32; ib++) {                                                         \
            gm_prefetch_ahead(w, bw, (size_t)ib * sizeof(WB), sizeof(WB));                                \
            __m256i codes[4];                                                                             \
            float dw[4], mw[4];                                                                           \
            for (int r = 0; r < 4; r++) {                                                                 \
                const WB *b = (const WB *)w[r] + ib;                                                      \
                codes[r] = ROW(b);                                                                        \
                dw[r] = gm_f16(&b->d);                                                                    \
                mw[r] = gm_f16((const uint8_t *)b + 2);                                                   \
            }                                                                                             \
            for (int j = 0; j < nc; j++) {                                                                \
                const AB *aj = (const AB *)(a + (size_t)j * ba) + ib;                                     \
                const float da = gm_f16(&aj->d), sa = gm_f16((const uint8_t *)aj + 2);                    \
                for (int r = 0; r < nr; r++) {                                                            \
                    const __m256i lanes = gm_dot_row(codes[r], aj->qs, KIND);                             \
                    acc[r][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * da), _mm256_cvtepi32_ps(lanes), acc[r][j]); \
                    if (WITH_MIN) mins[r][j] += mw[r] * sa;                                               \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int j = 0; j < nc; j++)                                                                      \
            for (int r = 0; r < nr; r++) s[(size_t)j * bs + r] = x86_sum_ps8(acc[r][j]) + mins[r][j];        \
    }
#endif

/* activation rows per kernel call: AVX-512's tile holds 8, AVX2's 4 */
#if defined(PE_GEMM_VNNI)
#define GM_TILE_COLS 8
#define GM_TILE_CASES_5_TO_8(NAME, sj, aj)                                  \
    case 5: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 5); break; \
    case 6: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 6); break; \
    case 7: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 7); break; \
    case 8: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 8); break;
#else
#define GM_TILE_COLS 4
#define GM_TILE_CASES_5_TO_8(NAME, sj, aj)
#endif

#define GM_DEFINE_LEGACY_DISPATCH(NAME)                                                                   \
    static void gemm_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a,      \
                            size_t ba, int nr, int nc, unsigned paths) {                                  \
        (void)paths; /* one arithmetic for every row */                                                   \
        const uint8_t *rows[4];                                                                           \
        gm_rows(w, bw, nr, rows);                                                                         \
        for (int j0 = 0; j0 < nc; j0 += GM_TILE_COLS) {                                                   \
            const uint8_t *aj = (const uint8_t *)a + (size_t)j0 * ba;                                     \
            float *sj = s + (size_t)j0 * bs;                                                              \
            switch (nc - j0 < GM_TILE_COLS ? nc - j0 : GM_TILE_COLS) {                                    \
            case 1: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 1); break;                           \
            case 2: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 2); break;                           \
            case 3: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 3); break;                           \
            GM_TILE_CASES_5_TO_8(NAME, sj, aj)                                                            \
            default: gemm_##NAME##_n(n, sj, bs, rows, aj, ba, bw, nr, 4); break;                          \
            }                                                                                             \
        }                                                                                                 \
    }

/* unsigned codes of the signed types, for the AVX-512 tile */
static inline __m256i gm_urow_q4_0(const block_q4_0 *b) { return gm_nibbles_row(b->qs); }
static inline __m256i gm_urow_q5_0(const block_q5_0 *b) { return gm_fifth_row(gm_nibbles_row(b->qs), gm_u32(b->qh), 0); }
static inline __m256i gm_urow_q8_0(const block_q8_0 *b) {
    return _mm256_xor_si256(gm_load256(b->qs), _mm256_set1_epi8((char)0x80));
}

#if defined(PE_GEMM_VNNI)
#define GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN, UROW, SHIFT) \
    GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, (KIND) != GM_UNSIGNED, WITH_MIN)
#else
#define GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN, UROW, SHIFT) \
    GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, KIND, WITH_MIN)
#endif

#define GM_DEFINE_LEGACY(NAME, WB, AB, ROW, KIND, WITH_MIN, UROW, SHIFT) \
    GM_DEFINE_LEGACY_VEC_DOT(NAME, WB, AB, ROW, KIND, WITH_MIN)          \
    GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN, UROW, SHIFT)       \
    GM_DEFINE_LEGACY_DISPATCH(NAME)

#define GM_DEFINE_ALL_LEGACY()                                                                                  \
    GM_DEFINE_LEGACY(q4_0, block_q4_0, block_q8_0, gm_row_q4_0, GM_SIGNED, 0, gm_urow_q4_0, 3)               \
    GM_DEFINE_LEGACY(q4_1, block_q4_1, block_q8_1, gm_row_q4_1, GM_UNSIGNED, 1, gm_row_q4_1, -1)             \
    GM_DEFINE_LEGACY(q5_0, block_q5_0, block_q8_0, gm_row_q5_0, GM_SIGNED, 0, gm_urow_q5_0, 4)               \
    GM_DEFINE_LEGACY(q5_1, block_q5_1, block_q8_1, gm_row_q5_1, GM_UNSIGNED, 1, gm_row_q5_1, -1)             \
    GM_DEFINE_LEGACY(q8_0, block_q8_0, block_q8_0, gm_row_q8_0, GM_SIGNED8, 0, gm_urow_q8_0, 7)

/* PYENGINE_GEMM=0 leaves the tiles to vec_dot pair by pair (for A/B timing). */
static inline int gm_gemm_enabled(void) {
    const char *v = getenv("PYENGINE_GEMM");
    return !(v && strcmp(v, "0") == 0);
}

#define GM_INSTALL(k, TYPE, NAME, with_gemm)                                                        \
    do {                                                                                            \
        (k)->type[TYPE].vec_dot = vec_dot_##NAME;                                                   \
        (k)->type[TYPE].gemm = (with_gemm) ? gemm_##NAME : NULL;                                    \
    } while (0)

#endif /* PE_X86_GEMM_H */
