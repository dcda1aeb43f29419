/* x86_gemm_kquants.h - vec_dot and the GEMM micro-kernel of Q4_K, Q5_K and
 * Q6_K (include x86_gemm.h first).
 *
 * Like the legacy types, these follow llama.cpp's x86 dot products for a
 * row alone, in every batch:
 *   - Q5_K, Q6_K: per super-block of 256 elements,
 *     eight exact integer lanes (lane t sums, over every 32-element
 *     sub-block, the sub-block's scale times the products of its elements
 *     4t..4t+3; Q6_K takes its codes' offset of 32 off lane t for elements
 *     32t..32t+31), acc = fma(d, lanes, acc) with d = da * dw one rounded
 *     product; Q5_K adds its min term as one float chain; x86_sum_ps8(acc) + mins.
 *   - Q4_K, which llama.cpp repacks on x86: the whole integer sum and min
 *     term multiply-added into one float each, per super-block (its GEMV).
 *
 * The tile decodes a weight row's super-block once and multiplies it with
 * each activation row; on AVX-512, Q4_K's
 * tile holds sixteen pairs in the lanes of one vector (gmk_q4k_quad). */
#ifndef PE_X86_GEMM_KQUANTS_H
#define PE_X86_GEMM_KQUANTS_H

#include "x86_kquants.h"

/* ---- sub-block products ---------------------------------------------------------------- */

/* 8 scale bytes as 32-bit lanes, zero- or sign-extended (AVX2: the value in
 * both 16-bit halves, for madd). */
static inline __m256i gmk_scales_row(__m128i bytes, int is_signed) {
    const __m256i v = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

/* scale lo for elements 0..15 of a 32-element vector, hi for 16..31 */
static inline __m256i gmk_pick(__m256i scales, int lo, int hi) {
    return _mm256_permutevar8x32_epi32(scales, _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi));
}

/* 32 unsigned codes against 32 activations, per 32-bit lane of 4, scaled */
static inline __m256i gmk_sub_row(__m256i codes, const int8_t *a, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, gm_load256(a)), sc);
}

/* A decoded super-block: 8 vectors of 32 codes (sub-block k, elements in
 * order) with their scale lanes, and the offset the codes carry (Q6_K: 32). */
typedef struct {
    __m256i codes[8], sc[8];
    __m128i mins;   /* Q4_K / Q5_K: k4_unpack's bytes (mins in the high half) */
} gmk_block;

/* sum over sub-blocks of scale * codes . a, in lanes */
GM_INLINE __m256i gmk_isum(const gmk_block *b, const int8_t *a) {
    __m256i isum = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) isum = _mm256_add_epi32(isum, gmk_sub_row(b->codes[k], a + 32 * k, b->sc[k]));
    return isum;
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------- */

/* chunk c (32 bytes of qs) gives sub-blocks 2c (low nibbles) and 2c + 1
 * (high); Q5_K's qh bits 2c and 2c + 1 are their fifth bits.  Q5_K's lane
 * products need the scales spread over lanes; Q4_K applies them to whole
 * sub-block sums (gmk_subblock_sums) and skips that. */
GM_INLINE void gmk_k4_decode(const uint8_t *qs, const uint8_t *qh, const uint8_t *scales, gmk_block *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    b->mins = k4_unpack(scales);
    const __m256i sc = qh ? gmk_scales_row(b->mins, 0) : _mm256_setzero_si256();
    __m256i hbits = qh ? gm_load256(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i bits = gm_load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), b4));
            hbits = _mm256_srli_epi16(hbits, 2);
        }
        b->codes[2 * c] = lo;
        b->codes[2 * c + 1] = hi;
        if (qh) {
            b->sc[2 * c] = gmk_pick(sc, 2 * c, 2 * c);
            b->sc[2 * c + 1] = gmk_pick(sc, 2 * c + 1, 2 * c + 1);
        }
    }
}

/* [m0 B0 + m1 B1, m2 B2 + m3 B3, ...]: B_s the activations' sum over sub-block s */
static inline __m128i gmk_mins_lanes(__m128i unpacked, const int16_t *bsums) {
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(unpacked, 8));
    const __m256i b = _mm256_madd_epi16(gm_load256(bsums), _mm256_set1_epi16(1));
    const __m128i b16 = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm_madd_epi16(m16, b16);
}

/* one pair's accumulators through one super-block (Q5_K: mins_chain used) */
typedef struct {
    __m256 acc;
    __m128 mins;
    float  chain;
    float  whole, whole_mins;   /* Q4_K: one float each */
} gmk_acc;

/* Q4_K as llama.cpp computes it from its repacked (8-row interleaved) copy,
 * which every AVX2 build uses for Q4_K: the integer dot product and the min
 * term multiply-added into one float each (d = dw * da, dmin = dminw * da),
 * the result acc - mins, added per super-block (its row product, GEMV).
 * Q5_K follows the row dot product:
 * lanes, and the min term as a chain. */
/* the eight sub-blocks' scaled dot products, one per lane: each sub-block's
 * 32 products summed (horizontal adds of the eight vectors at once), times
 * its scale; exact integers */
GM_INLINE __m256i gmk_subblock_sums(const gmk_block *b, const int8_t *a) {
    __m256i v[8];
    for (int k = 0; k < 8; k++) {
        v[k] = gm_dpbusd(_mm256_setzero_si256(), b->codes[k], gm_load256(a + 32 * k));
    }
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* each 128-bit half holds the four sub-blocks' sums of its lanes */
    const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
    return _mm256_mullo_epi32(sums, _mm256_cvtepu8_epi32(b->mins));   /* scales: the low 8 bytes */
}

GM_INLINE void gmk_q4k_step(const gmk_block *b, const pe_f16 *d_dmin, const block_q8_K *a, gmk_acc *r) {
    const float d = f16(d_dmin[0]) * a->d, dmin = f16(d_dmin[1]) * a->d;
    const __m128i mins = gmk_mins_lanes(b->mins, a->bsums);
    const __m256i sub = gmk_subblock_sums(b, a->qs);
    r->whole = fmaf((float)x86_sum_epi32x8(sub), d, r->whole);
    r->whole_mins = fmaf((float)x86_sum_epi32x4(mins), dmin, r->whole_mins);
}

GM_INLINE void gmk_q5k_step(const gmk_block *b, const pe_f16 *d_dmin, const block_q8_K *a, gmk_acc *r) {
    const __m256i isum = gmk_isum(b, a->qs);
    const int mins = x86_sum_epi32x4(gmk_mins_lanes(b->mins, a->bsums));
    const float d = a->d * f16(d_dmin[0]), dmin = -a->d * f16(d_dmin[1]);
    r->acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), r->acc);
    r->chain += dmin * (float)mins;
}

static inline float gmk_result(const gmk_acc *r) {
    return x86_sum_ps8(r->acc) + x86_sum_ps4(r->mins) + r->chain + (r->whole - r->whole_mins);
}

static inline gmk_acc gmk_zero(void) { return (gmk_acc){_mm256_setzero_ps(), _mm_setzero_ps(), 0.0f, 0.0f, 0.0f}; }

/* ---- Q6_K -------------------------------------------------------------------------------- */

/* half h, quarter q: 32 codes (ql low or high nibbles, qh bits 2q..2q+1 on top) */
GM_INLINE void gmk_q6_decode(const block_q6_K *x, gmk_block *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m128i sc8 = gm_load128(x->scales);
    const __m256i scales[2] = {gmk_scales_row(sc8, 1), gmk_scales_row(_mm_unpackhi_epi64(sc8, sc8), 1)};
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = gm_load256(x->ql + 64 * h), ql1 = gm_load256(x->ql + 64 * h + 32);
        const __m256i qh = gm_load256(x->qh + 32 * h);
        __m256i *q = b->codes + 4 * h;
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        for (int k = 0; k < 4; k++) b->sc[4 * h + k] = gmk_pick(scales[h], 2 * k, 2 * k + 1);
    }
}

/* The codes' offset of 32 comes off as 32 * (scale * bsum) of each 16-element
 * sub-block; the lanes' integers summed into one, multiply-added as
 * gmk_q4k_step's (ref_kquants.c's vec_dot_q6_K). */
GM_INLINE void gmk_q6_step(const gmk_block *b, const block_q6_K *x, const block_q8_K *a, gmk_acc *r) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(gm_load128(x->scales));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(gm_load256(a->bsums), sc16), 5);
    const __m256i lanes = _mm256_sub_epi32(gmk_isum(b, a->qs), offset);
    r->whole = fmaf((float)x86_sum_epi32x8(lanes), f16(x->d) * a->d, r->whole);
}

/* ---- Q4_K tiles of 4 x 4 pairs (AVX-512) -------------------------------------------------

   Lane 4r + j of a 512-bit vector holds the pair (weight row r, activation
   row j).  For each 4-byte group g of a sub-block, a permute puts row r's
   bytes and column j's bytes in that lane, and vpdpbusd sums the sub-block
   in the lane: the sixteen pairs' exact sub-block sums with no horizontal
   adds.  Scales, mins and llama.cpp's float steps (as gmk_q4k_step) then run
   on all sixteen pairs at once. */
#if defined(PE_GEMM_VNNI)
/* lanes 4r + j take element 8 * r' + g of (lo: rows 0,1 | hi: rows 2,3)
 * (by row) or of the same layout by column */
static inline __m512i gmk_row_base(void) {
    return _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
}
static inline __m512i gmk_col_base(void) {
    return _mm512_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24);
}

static inline __m512i gmk_pair256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* the sub-block sums B_s of up to 4 activation rows: [row0 B0..7 | row1 ...], [row2 | row3] */
static inline void gmk_bsums_quad(const block_q8_K *const a[4], __m512i out[2]) {
    __m256i b[4];
    for (int j = 0; j < 4; j++) b[j] = _mm256_madd_epi16(gm_load256(a[j]->bsums), _mm256_set1_epi16(1));
    /* madd gives pairs in 128-bit halves: [B0 B1 B2 B3 | B4 B5 B6 B7] already in order */
    out[0] = gmk_pair256(b[0], b[1]);
    out[1] = gmk_pair256(b[2], b[3]);
}

/* One quad of columns (a[0..3], results for nc columns) against the 4 rows
 * w[0..3] (bw apart, the next tiles' rows prefetched as gm_prefetch_ahead
 * says), per super-block as gmk_q4k_step. */
static void gmk_q4k_quad(int64_t n, float *s, size_t bs, const uint8_t *const w[4], size_t bw,
                         const uint8_t *const a[4], int nr, int nc) {
    const __m512i rbase = gmk_row_base(), cbase = gmk_col_base();
    __m512 whole = _mm512_setzero_ps(), whole_mins = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        gm_prefetch_ahead(w, bw, (size_t)ib * sizeof(block_q4_K), sizeof(block_q4_K));
        const block_q4_K *x[4];
        const block_q8_K *y[4];
        for (int r = 0; r < 4; r++) x[r] = (const block_q4_K *)w[r] + ib;
        for (int j = 0; j < 4; j++) y[j] = (const block_q8_K *)a[j] + ib;
        /* scales and mins of the four rows, as int32 [row0 0..7 | row1 0..7], [row2 | row3] */
        __m256i sc[4], mn[4];
        for (int r = 0; r < 4; r++) {
            const __m128i u = k4_unpack(x[r]->scales);
            sc[r] = _mm256_cvtepu8_epi32(u);
            mn[r] = _mm256_cvtepu8_epi32(_mm_srli_si128(u, 8));
        }
        const __m512i sc01 = gmk_pair256(sc[0], sc[1]), sc23 = gmk_pair256(sc[2], sc[3]);
        const __m512i mn01 = gmk_pair256(mn[0], mn[1]), mn23 = gmk_pair256(mn[2], mn[3]);
        __m512i bsum[2];
        gmk_bsums_quad(y, bsum);
        /* d and dmin per pair: f16(dw_r) * da_j, as llama.cpp rounds them */
        float dw[16], dmw[16], da[16];
        for (int l = 0; l < 16; l++) {
            dw[l] = f16(x[l / 4]->d);
            dmw[l] = f16(x[l / 4]->dmin);
            da[l] = y[l % 4]->d;
        }
        const __m512 dav = _mm512_loadu_ps(da);
        const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(dw), dav), dmin = _mm512_mul_ps(_mm512_loadu_ps(dmw), dav);
        __m512i tot = _mm512_setzero_si512(), tot_mins = _mm512_setzero_si512();
        for (int sb = 0; sb < 8; sb++) {
            /* codes of sub-block sb: chunk sb / 2, low or high nibbles */
            __m256i codes[4];
            for (int r = 0; r < 4; r++) {
                const __m256i bits = gm_load256(x[r]->qs + 32 * (sb / 2));
                codes[r] = _mm256_and_si256(sb % 2 ? _mm256_srli_epi16(bits, 4) : bits, _mm256_set1_epi8(0x0F));
            }
            const __m512i w01 = gmk_pair256(codes[0], codes[1]), w23 = gmk_pair256(codes[2], codes[3]);
            const __m512i a01 = gmk_pair256(gm_load256(y[0]->qs + 32 * sb), gm_load256(y[1]->qs + 32 * sb));
            const __m512i a23 = gmk_pair256(gm_load256(y[2]->qs + 32 * sb), gm_load256(y[3]->qs + 32 * sb));
            __m512i sum = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                const __m512i gv = _mm512_set1_epi32(g);
                const __m512i u = _mm512_permutex2var_epi32(w01, _mm512_add_epi32(rbase, gv), w23);
                const __m512i v = _mm512_permutex2var_epi32(a01, _mm512_add_epi32(cbase, gv), a23);
                sum = _mm512_dpbusd_epi32(sum, u, v);
            }
            const __m512i sv = _mm512_set1_epi32(sb);
            const __m512i scaled = _mm512_mullo_epi32(sum, _mm512_permutex2var_epi32(sc01, _mm512_add_epi32(rbase, sv), sc23));
            const __m512i mins = _mm512_mullo_epi32(_mm512_permutex2var_epi32(mn01, _mm512_add_epi32(rbase, sv), mn23),
                                                    _mm512_permutex2var_epi32(bsum[0], _mm512_add_epi32(cbase, sv), bsum[1]));
            tot = _mm512_add_epi32(tot, scaled);
            tot_mins = _mm512_add_epi32(tot_mins, mins);
        }
        whole = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), d, whole);
        whole_mins = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot_mins), dmin, whole_mins);
    }
    float out[16];
    _mm512_storeu_ps(out, _mm512_sub_ps(whole, whole_mins));
    for (int j = 0; j < nc; j++)
        for (int r = 0; r < nr; r++) s[(size_t)j * bs + r] = out[4 * r + j];
}

/* Q4_K's tile in quads of columns; returns 0 to leave a single activation
 * row (decoding), which would fill a quarter of the lanes, to the
 * pair-by-pair kernel. */
static int gmk_q4k_quads(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba, int nr,
                         int nc) {
    if (nc < 2) return 0;
    const uint8_t *rows[4];
    gm_rows(w, bw, nr, rows);
    for (int j0 = 0; j0 < nc; j0 += 4) {
        const int ncq = nc - j0 < 4 ? nc - j0 : 4;
        const uint8_t *cols[4];
        for (int j = 0; j < 4; j++) cols[j] = (const uint8_t *)a + (size_t)(j0 + (j < ncq ? j : ncq - 1)) * ba;
        gmk_q4k_quad(n, s + (size_t)j0 * bs, bs, rows, bw, cols, nr, ncq);
    }
    return 1;
}
#define GMK_QUADS_q4_K gmk_q4k_quads
#else
#define GMK_QUADS_q4_K(...) 0
#endif
#define GMK_QUADS_q5_K(...) 0
#define GMK_QUADS_q6_K(...) 0

#include "x86_gemm_packed.h"

/* ---- kernels ----------------------------------------------------------------------------- */

/* DECODE(x, &blk) fills a gmk_block from block x; STEP(&blk, x, a, &acc) */
#define GMK_DEFINE_KQUANT(NAME, WB, DECODE, STEP)                                                     \
    static void vec_dot_##NAME(int64_t n, float *s, const void *vw, const void *va) {                 \
        const WB *x = vw;                                                                             \
        const block_q8_K *a = va;                                                                     \
        gmk_acc r = gmk_zero();                                                                       \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                      \
            gmk_block b;                                                                              \
            DECODE(&x[i], &b);                                                                        \
            STEP(&b, &x[i], &a[i], &r);                                                               \
        }                                                                                             \
        *s = gmk_result(&r);                                                                          \
    }                                                                                                 \
                                                                                                      \
    static void gemm_pairs_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, \
                                  size_t ba, int nr, int nc) {                                        \
        gmk_acc r[PE_GEMM_ROWS][PE_GEMM_COLS];                                                                              \
        const uint8_t *rows[4];                                                                       \
        gm_rows(w, bw, nr, rows);                                                                     \
        for (int i = 0; i < nr; i++)                                                                  \
            for (int j = 0; j < nc; j++) r[i][j] = gmk_zero();                                        \
        for (int64_t ib = 0; ib < n / QK_K; ib++) {                                                   \
            gm_prefetch_ahead(rows, bw, (size_t)ib * sizeof(WB), sizeof(WB));                         \
            for (int i = 0; i < nr; i++) {                                                            \
                const WB *x = (const WB *)((const uint8_t *)w + (size_t)i * bw) + ib;                 \
                gmk_block b;                                                                          \
                DECODE(x, &b);                                                                        \
                for (int j = 0; j < nc; j++)                                                          \
                    STEP(&b, x, (const block_q8_K *)((const uint8_t *)a + (size_t)j * ba) + ib, &r[i][j]); \
            }                                                                                         \
        }                                                                                             \
        for (int j = 0; j < nc; j++)                                                                  \
            for (int i = 0; i < nr; i++) s[(size_t)j * bs + i] = gmk_result(&r[i][j]);               \
    }                                                                                                 \
    static void gemm_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a,  \
                            size_t ba, int nr, int nc) {                                              \
        if (!GMK_QUADS_##NAME(n, s, bs, w, bw, a, ba, nr, nc))                                        \
            gemm_pairs_##NAME(n, s, bs, w, bw, a, ba, nr, nc);                                        \
    }

#define GMK_Q4K_DECODE(x, b) gmk_k4_decode((x)->qs, NULL, (x)->scales, b)
#define GMK_Q5K_DECODE(x, b) gmk_k4_decode((x)->qs, (x)->qh, (x)->scales, b)
#define GMK_Q4K_STEP(b, x, a, r) gmk_q4k_step(b, &(x)->d, a, r)
#define GMK_Q5K_STEP(b, x, a, r) gmk_q5k_step(b, &(x)->d, a, r)
#define GMK_Q6K_DECODE(x, b) gmk_q6_decode(x, b)
#define GMK_Q6K_STEP(b, x, a, r) gmk_q6_step(b, x, a, r)

#define GMK_DEFINE_ALL_KQUANTS()                                                  \
    GMK_DEFINE_KQUANT(q4_K, block_q4_K, GMK_Q4K_DECODE, GMK_Q4K_STEP)             \
    GMK_DEFINE_KQUANT(q5_K, block_q5_K, GMK_Q5K_DECODE, GMK_Q5K_STEP)             \
    GMK_DEFINE_KQUANT(q6_K, block_q6_K, GMK_Q6K_DECODE, GMK_Q6K_STEP)

/* Both ISA files install the same types from the kernels the macros above
 * define in them. */
#define GM_INSTALL_ALL(k)                                \
    do {                                                 \
        const int with_gemm = gm_gemm_enabled();         \
        GM_INSTALL(k, PE_TYPE_Q4_0, q4_0, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q4_1, q4_1, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_0, q5_0, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_1, q5_1, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q8_0, q8_0, with_gemm);    \
        if (with_gemm) {                                 \
            GM_INSTALL_GEMM8(k, PE_TYPE_Q4_0, q4_0);     \
            GM_INSTALL_GEMM8(k, PE_TYPE_Q4_1, q4_1);     \
            GM_INSTALL_GEMM8(k, PE_TYPE_Q5_0, q5_0);     \
            GM_INSTALL_GEMM8(k, PE_TYPE_Q5_1, q5_1);     \
            GM_INSTALL_GEMM8(k, PE_TYPE_Q8_0, q8_0);     \
        }                                                \
        GM_INSTALL(k, PE_TYPE_Q4_K, q4_K, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_K, q5_K, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q6_K, q6_K, with_gemm);    \
        if (with_gemm) GMK_PACK16_INSTALL(k);            \
    } while (0)

#endif /* PE_X86_GEMM_KQUANTS_H */
