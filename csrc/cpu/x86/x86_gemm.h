/* x86_gemm.h - the dot products of the block types as vec_dot (1 x 1), as
 * a GEMM tile (4 weight rows x up to 4 activation rows on AVX2, 8 on
 * AVX-512) and, for decoding, as an 8-row kernel (gemm8: up to 4 activation
 * rows), written once for avx2_gemm.c and avx512_gemm.c: the shared
 * pieces and the legacy types Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 here, Q4_K Q5_K Q6_K
 * in x86_gemm_kquants.h.  Both files compile this with AVX2; the AVX-512 one
 * defines PE_GEMM_VNNI first, which swaps the integer dot products (maddubs +
 * madd) for vpdpbusd, the fifth-bit insertion for byte masks, and the tile
 * for one that holds two weight rows per 512-bit vector.  avxvnni_gemm.c
 * compiles avx2_gemm.c again with PE_GEMM_AVXVNNI: the integer dot products
 * only, through AVX-VNNI's vpdpbusd (gm_dpbusd).
 * PYENGINE_GEMM=0 in the environment installs vec_dot only, =8 no AVX-512
 * pair kernels (A/B timing).
 *
 * Batch invariance.  A row's result may not depend on which other rows share
 * its tile, so every (weight row, activation row) pair follows one
 * accumulation scheme, llama.cpp's (see "legacy kernels" below), whether
 * vec_dot or a tile computes it: the integer sums are exact however they
 * are formed, and the float operations are the same ones in the same order,
 * so a tile's elements equal vec_dot's bit for bit (and AVX2's equal
 * AVX-512's). */
#ifndef PE_X86_GEMM_H
#define PE_X86_GEMM_H

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "x86_reduce.h"
#include "internal.h"

#define GM_INLINE PE_ALWAYS_INLINE
#if defined(_MSC_VER)
#define GM_MAYBE_UNUSED
#else
#define GM_MAYBE_UNUSED __attribute__((unused))
#endif

/* Keep v in a register here: in the unrolled tiles gcc otherwise turns a
 * chain of integer adds into a tree and spills the terms it defers (the
 * AVX2 Q4_K tile stored every product sum to the stack: 25% of its time). */
#if defined(__GNUC__)
#define GM_IN_REG(v) __asm__("" : "+x"(v))
#else
#define GM_IN_REG(v) ((void)0)
#endif

/* ---- loads ----------------------------------------------------------------------- */

static inline uint32_t gm_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __m128i gm_load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline __m256i gm_load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- integer dot products ------------------------------------------------------------ */

/* How a type's codes multiply: unsigned (< 32), signed with |w| <= 16, or
 * Q8_0's full signed bytes (whose 16-bit pair sums may not be added up).
 * Activations are in [-127, 127] (the q8 quantizers never give -128), so
 * sign(a, w) cannot overflow and maddubs pair sums stay below 2^15. */
enum { GM_UNSIGNED, GM_SIGNED, GM_SIGNED8 };

/* Per 32-bit lane: start + the four products of unsigned bytes u with
 * signed bytes s.  vpdpbusd where the table has it: AVX-512 VNNI's EVEX form
 * (avx512_gemm.c) or AVX-VNNI's VEX form (avxvnni_gemm.c, PE_GEMM_AVXVNNI);
 * else maddubs + madd, the same sums wherever a pair of products stays
 * inside 16 bits, as every caller's codes do (each says why). */
#if defined(PE_GEMM_VNNI)
#define GM_DPBUSD 1
GM_INLINE __m256i gm_dpbusd(__m256i start, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(start, u, s); }
#elif defined(PE_GEMM_AVXVNNI)
#define GM_DPBUSD 1
GM_INLINE __m256i gm_dpbusd(__m256i start, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(start, u, s); }
#else
GM_INLINE __m256i gm_dpbusd(__m256i start, __m256i u, __m256i s) {
    return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

/* Several groups' products summed per 32-bit lane: gm_dot_acc adds one
 * group's, gm_dot_total gives the lanes' sums.  With vpdpbusd they chain in
 * 32 bits; without, maddubs' 16-bit pair sums are added up as they are and
 * widened once at the end, so a caller bounds how many groups it adds. */
#if defined(GM_DPBUSD)
GM_INLINE __m256i gm_dot_acc(__m256i acc, __m256i u, __m256i s) { return gm_dpbusd(acc, u, s); }
GM_INLINE __m256i gm_dot_total(__m256i acc) { return acc; }
#else
GM_INLINE __m256i gm_dot_acc(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
}
GM_INLINE __m256i gm_dot_total(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#endif

/* gm_dot_total(acc) x sc per lane, sc (below 2^15) given as gm_scale_operand(sc)
 * once for several accumulators: without vpdpbusd the 16-bit pair sums meet the
 * scale doubled into both halves in one madd, where widening and vpmulld took two */
#if defined(GM_DPBUSD)
GM_INLINE __m256i gm_scale_operand(__m256i sc) { return sc; }
GM_INLINE __m256i gm_scaled_total(__m256i acc, __m256i op) { return _mm256_mullo_epi32(acc, op); }
#else
GM_INLINE __m256i gm_scale_operand(__m256i sc) { return _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)); }
GM_INLINE __m256i gm_scaled_total(__m256i acc, __m256i op) { return _mm256_madd_epi16(acc, op); }
#endif

/* Row form: per 32-bit lane t, the dot product of elements 4t..4t+3. */
GM_INLINE __m256i gm_dot_row(__m256i codes, const int8_t *a, int kind) {
    __m256i u = codes, s = gm_load256(a);
    if (kind != GM_UNSIGNED) {
        s = _mm256_sign_epi8(s, codes);
        u = _mm256_abs_epi8(codes);
    }
    return gm_dpbusd(_mm256_setzero_si256(), u, s);
}

/* The sum of an activation block's 32 codes, exact: sums of absolute
 * differences of the codes with their sign bit flipped (a + 128, unsigned). */
static inline int gm_sum_codes32(const int8_t *qs) {
    const __m256i biased = _mm256_xor_si256(gm_load256(qs), _mm256_set1_epi8((char)0x80));
    const __m256i sums = _mm256_sad_epu8(biased, _mm256_setzero_si256());
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
    return _mm_cvtsi128_si32(t) - 32 * 128;
}

/* ---- legacy block codes ------------------------------------------------------------- */

/* Row form: a block's 32 codes in element order (low nibbles are elements
 * 0..15, high nibbles 16..31). */
static inline __m256i gm_nibbles_row(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(gm_load128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
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

/* Per type: the 32 codes of block b in element order, signed where the
 * type is. */
static inline __m256i gm_row_q4_0(const block_q4_0 *b) {
    return _mm256_sub_epi8(gm_nibbles_row(b->qs), _mm256_set1_epi8(8));
}
static inline __m256i gm_row_q4_1(const block_q4_1 *b) { return gm_nibbles_row(b->qs); }
static inline __m256i gm_row_q5_0(const block_q5_0 *b) { return gm_fifth_row(gm_nibbles_row(b->qs), gm_u32(b->qh), 1); }
static inline __m256i gm_row_q5_1(const block_q5_1 *b) { return gm_fifth_row(gm_nibbles_row(b->qs), gm_u32(b->qh), 0); }
static inline __m256i gm_row_q8_0(const block_q8_0 *b) { return gm_load256(b->qs); }

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

/* an activation block's opening f16 pair (d, and q8_1's s) as floats in one
 * 64-bit element, for a broadcast to [da sa da sa ...] */
static inline __m128d gm_act_pair(const void *y) {
    return _mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128((int)gm_u32(y))));
}

/* the f16 pairs opening block ib of activation rows 0..3 (rows past nc
 * repeat the last): [da0 sa0 da1 sa1 da2 sa2 da3 sa3] */
static inline __m256 gm_scales_acts(const uint8_t *a, size_t ba, size_t block_bytes, int64_t ib, int nc) {
    const uint8_t *p = a + (size_t)ib * block_bytes;
    const size_t s1 = nc > 1 ? ba : 0, s2 = nc > 2 ? 2 * ba : s1, s3 = nc > 3 ? 3 * ba : s2;
    const __m128i h = _mm_setr_epi32((int)gm_u32(p), (int)gm_u32(p + s1), (int)gm_u32(p + s2), (int)gm_u32(p + s3));
    return _mm256_cvtph_ps(h);
}

/* The four weight rows of a tile; rows past nr repeat the last one (their
 * results are not stored). */
static inline void gm_rows(const void *w, size_t bw, int nr, const uint8_t *rows[4]) {
    for (int i = 0; i < 4; i++) rows[i] = (const uint8_t *)w + (size_t)(i < nr ? i : nr - 1) * bw;
}

/* The pe_q8_0_scales after a Q8_0 activation row of n elements (a product's
 * rows carry them for the kernels that take them: rows8.scales, packed.scales). */
static inline const pe_q8_0_scales *gm_q8_0_scales(const void *row, int64_t n) {
    return (const pe_q8_0_scales *)((const uint8_t *)row + PE_Q8_0_SCALES_AT(n));
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

/* The accumulator's start for a row pair whose activations go in shifted
 * to unsigned (a + 128): -128 times the codes' 4-element sums; 0 for the
 * unsigned types. */
static inline __m512i gm_shift_start(__m512i codes, int is_signed) {
    if (!is_signed) return _mm512_setzero_si512();
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), codes);
    return _mm512_sub_epi32(_mm512_setzero_si512(), sums);
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
                start[p] = gm_shift_start(codes[p], SIGNED);                                              \
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
/* The tile, AVX2: each pair keeps its own eight lanes as in vec_dot.  Two
 * weight rows at a time against up to 4 activation rows: 8 accumulators,
 * which with the codes fit the 16 registers (4 x 4 would spill). */
#define GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, KIND, WITH_MIN)                                          \
    GM_INLINE void gemm_##NAME##_n(int64_t n, float *s, size_t bs, const uint8_t *const w[4],             \
                                   const uint8_t *a, size_t ba, size_t bw, int nr, const int nc) {        \
        for (int r0 = 0; r0 < nr; r0 += 2) {                                                              \
            __m256 acc[2][4];                                                                             \
            float mins[2][4] = {{0}};                                                                     \
            for (int r = 0; r < 2; r++)                                                                   \
                for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();                              \
            for (int64_t ib = 0; ib < n / 32; ib++) {                                                     \
                if (r0 == 0) gm_prefetch_ahead(w, bw, (size_t)ib * sizeof(WB), sizeof(WB));               \
                __m256i codes[2];                                                                         \
                float dw[2], mw[2];                                                                       \
                for (int r = 0; r < 2; r++) {                                                             \
                    const WB *b = (const WB *)w[r0 + r] + ib;                                             \
                    codes[r] = ROW(b);                                                                    \
                    dw[r] = gm_f16(&b->d);                                                                \
                    mw[r] = gm_f16((const uint8_t *)b + 2);                                               \
                }                                                                                         \
                for (int j = 0; j < nc; j++) {                                                            \
                    const AB *aj = (const AB *)(a + (size_t)j * ba) + ib;                                 \
                    const float da = gm_f16(&aj->d), sa = gm_f16((const uint8_t *)aj + 2);                \
                    for (int r = 0; r < 2; r++) {                                                         \
                        const __m256i lanes = gm_dot_row(codes[r], aj->qs, KIND);                         \
                        acc[r][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * da), _mm256_cvtepi32_ps(lanes), acc[r][j]); \
                        if (WITH_MIN) mins[r][j] += mw[r] * sa;                                           \
                    }                                                                                     \
                }                                                                                         \
            }                                                                                             \
            for (int j = 0; j < nc; j++)                                                                  \
                for (int r = 0; r < 2 && r0 + r < nr; r++)                                                \
                    s[(size_t)j * bs + r0 + r] = x86_sum_ps8(acc[r][j]) + mins[r][j];                     \
        }                                                                                                 \
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
                            size_t ba, int nr, int nc) {                                                  \
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

#if defined(PE_GEMM_VNNI)
/* Decoding, AVX-512: 8 weight rows against up to 4 activation rows (the
 * generated tokens of a few sequences).  The float scale work is taken out
 * of the product loop: for a chunk of blocks, the 8 rows' f16 pairs (d, m)
 * convert in one instruction and one multiply by [da sa da sa ...] per
 * activation row gives every row's dw * da (into a table) and mw * sa (the
 * _1 types' min chains, lanes 2r + 1); then 4 rows at a time go through the
 * chunk with one 256-bit accumulator per (row, column), each fma taking its
 * dw * da from the table by broadcast.  Taking the scales from registers
 * (a permute per fma) left the loop ~25% slower on Zen 4; the chunk keeps
 * the table in L1 and off the stack's limits. */
#define GM8_CHUNK 32   /* blocks per chunk */
#define GM_DEFINE_LEGACY_GEMM8(NAME, WB, AB, ROW, SIGNED, WITH_MIN)                                       \
    /* the chunk's dw * da for 8 rows and nc columns, table[(b * 4 + j) * 16 + 2r]; min chains on */    \
    GM_INLINE void gemm8_##NAME##_scales(int64_t ib0, int64_t nb, const uint8_t *const rows[8], size_t bw, \
                                         const uint8_t *a, size_t ba, float *table, __m512 mins[4],       \
                                         const int nc) {                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                                \
            const size_t off = (size_t)(ib0 + b) * sizeof(WB);                                            \
            const __m512 dm = _mm512_cvtph_ps(_mm256_setr_epi32( /* [d0 m0 d1 m1 ... d7 m7] */           \
                (int)gm_u32(rows[0] + off), (int)gm_u32(rows[1] + off), (int)gm_u32(rows[2] + off),       \
                (int)gm_u32(rows[3] + off), (int)gm_u32(rows[4] + off), (int)gm_u32(rows[5] + off),       \
                (int)gm_u32(rows[6] + off), (int)gm_u32(rows[7] + off)));                                 \
            for (int j = 0; j < nc; j++) {                                                                \
                const AB *y = (const AB *)(a + (size_t)j * ba) + ib0 + b;                                 \
                const __m512 prod = _mm512_mul_ps(dm, _mm512_castpd_ps(_mm512_broadcastsd_pd(gm_act_pair(y)))); \
                _mm512_store_ps(table + (b * 4 + j) * 16, prod);                                          \
                if (WITH_MIN) mins[j] = _mm512_add_ps(mins[j], prod);                                     \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    /* 4 rows (h = which half of the 8 the table's lanes are) through the chunk */                      \
    GM_INLINE void gemm8_##NAME##_rows4(int64_t ib0, int64_t nb, const uint8_t *const rows[4], size_t bw, \
                                        const uint8_t *a, size_t ba, const float *table, int h,           \
                                        __m256 sums[4][4], const int nc) {                                \
        const __m256i c128 = _mm256_set1_epi8((char)0x80);                                                \
        __m256 acc[4][4];   /* in registers for the loop (written through sums, they went to memory) */  \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int j = 0; j < nc; j++) acc[r][j] = ib0 ? sums[r][j] : _mm256_setzero_ps();             \
        for (int64_t b = 0; b < nb; b++) {                                                                \
            gm_prefetch_ahead(rows, bw, (size_t)(ib0 + b) * sizeof(WB), sizeof(WB));                      \
            __m256i codes[4], start[4];                                                                   \
            for (int r = 0; r < 4; r++) {                                                                 \
                codes[r] = ROW((const WB *)rows[r] + ib0 + b);                                            \
                start[r] = SIGNED ? _mm256_sub_epi32(_mm256_setzero_si256(),                              \
                                                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), c128, codes[r])) \
                                  : _mm256_setzero_si256();                                               \
            }                                                                                             \
            for (int j = 0; j < nc; j++) {                                                                \
                __m256i av = gm_load256(((const AB *)(a + (size_t)j * ba) + ib0 + b)->qs);                \
                if (SIGNED) av = _mm256_xor_si256(av, c128);                                              \
                const float *d = table + (b * 4 + j) * 16 + 8 * h;                                        \
                for (int r = 0; r < 4; r++) {                                                             \
                    const __m256i lanes = SIGNED ? _mm256_dpbusd_epi32(start[r], av, codes[r])           \
                                                 : _mm256_dpbusd_epi32(start[r], codes[r], av);          \
                    acc[r][j] = _mm256_fmadd_ps(_mm256_set1_ps(d[2 * r]), _mm256_cvtepi32_ps(lanes), acc[r][j]); \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int j = 0; j < nc; j++) sums[r][j] = acc[r][j];                                          \
    }                                                                                                     \
    GM_INLINE void gemm8_##NAME##_n(int64_t n, float *s, size_t bs, const uint8_t *w, size_t bw,          \
                                    const uint8_t *a, size_t ba, const int nc) {                          \
        const uint8_t *rows[8];                                                                           \
        for (int r = 0; r < 8; r++) rows[r] = w + (size_t)r * bw;                                         \
        _Alignas(64) float table[GM8_CHUNK * 4 * 16];                                                     \
        __m256 acc[2][4][4];   /* set by the first chunk (zeroing the array each call cost ~10%) */      \
        __m512 mins[4];                                                                                   \
        for (int j = 0; j < 4; j++) mins[j] = _mm512_setzero_ps();                                        \
        for (int64_t ib0 = 0; ib0 < n / 32; ib0 += GM8_CHUNK) {                                           \
            const int64_t nb = n / 32 - ib0 < GM8_CHUNK ? n / 32 - ib0 : GM8_CHUNK;                       \
            gemm8_##NAME##_scales(ib0, nb, rows, bw, a, ba, table, mins, nc);                             \
            for (int h = 0; h < 2; h++) gemm8_##NAME##_rows4(ib0, nb, rows + 4 * h, bw, a, ba, table, h, acc[h], nc); \
        }                                                                                                 \
        for (int j = 0; j < nc; j++) {                                                                    \
            float m[16];                                                                                  \
            _mm512_storeu_ps(m, mins[j]);                                                                 \
            for (int r = 0; r < 8; r++)                                                                   \
                s[(size_t)j * bs + r] = x86_sum_ps8(acc[r / 4][r % 4][j]) + (WITH_MIN ? m[2 * r + 1] : 0.0f); \
        }                                                                                                 \
    }                                                                                                     \
    GM_MAYBE_UNUSED static void gemm8_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw,    \
                                             const void *a, size_t ba, int nc) {                          \
        switch (nc) {                                                                                     \
        case 1: gemm8_##NAME##_n(n, s, bs, w, bw, a, ba, 1); break;                                       \
        case 2: gemm8_##NAME##_n(n, s, bs, w, bw, a, ba, 2); break;                                       \
        case 3: gemm8_##NAME##_n(n, s, bs, w, bw, a, ba, 3); break;                                       \
        default: gemm8_##NAME##_n(n, s, bs, w, bw, a, ba, 4); break;                                      \
        }                                                                                                 \
    }
#define GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN) \
    GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, (KIND) != GM_UNSIGNED, WITH_MIN)
#define GM_LEGACY_GEMM8(NAME, WB, AB, ROW, KIND, WITH_MIN) \
    GM_DEFINE_LEGACY_GEMM8(NAME, WB, AB, ROW, (KIND) != GM_UNSIGNED, WITH_MIN)
#else
/* Decoding, AVX2: 8 weight rows against one activation row, in two groups
 * of 4.  The 4 rows' f16 pairs (d, m) convert in one instruction and one
 * multiply by [da sa da sa ...] gives every row's dw * da and mw * sa (the
 * _1 types' min chains run in the odd lanes), where the tile converts and
 * multiplies each row's scalars.  With 2-4 activation rows the same
 * products of a chunk of blocks go into a table first (4 weight rows at a
 * time), then 2 rows x the columns run through the chunk, each fma taking
 * its dw * da from the table by broadcast: the 16 registers hold 8
 * accumulators with the codes. */
#define GM2_CHUNK 32   /* blocks per chunk */
#define GM_DEFINE_LEGACY_GEMM8(NAME, WB, AB, ROW, KIND, WITH_MIN)                                         \
    /* the chunk's products for 4 rows and nc columns: table[(b * 4 + j) * 8 + 2r] = dw * da, and the   \
     * min chains (lanes 2r + 1) */                                                                     \
    GM_INLINE void gemm8_##NAME##_scales4(int64_t ib0, int64_t nb, const uint8_t *const rows[4], size_t bw, \
                                          const uint8_t *a, size_t ba, float *table, __m256 mins[4],      \
                                          const int nc) {                                                 \
        for (int64_t b = 0; b < nb; b++) {                                                                \
            gm_prefetch_ahead(rows, bw, (size_t)(ib0 + b) * sizeof(WB), sizeof(WB));                      \
            const __m256 wd = gm_scales_tile(rows, sizeof(WB), ib0 + b);   /* [d0 m0 d1 m1 ...] */        \
            for (int j = 0; j < nc; j++) {                                                                \
                const AB *y = (const AB *)(a + (size_t)j * ba) + ib0 + b;                                 \
                const __m256 prod = _mm256_mul_ps(wd, _mm256_castpd_ps(_mm256_broadcastsd_pd(gm_act_pair(y)))); \
                _mm256_store_ps(table + (b * 4 + j) * 8, prod);                                           \
                if (WITH_MIN) mins[j] = _mm256_add_ps(mins[j], prod);                                     \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    /* rows 2q, 2q + 1 of the 4 through the chunk */                                                    \
    GM_INLINE void gemm8_##NAME##_rows2(int64_t ib0, int64_t nb, const uint8_t *const rows[2],            \
                                        const uint8_t *a, size_t ba, const float *table, int q,           \
                                        __m256 sums[2][4], const int nc) {                                \
        __m256 acc[2][4];                                                                                 \
        for (int r = 0; r < 2; r++)                                                                       \
            for (int j = 0; j < nc; j++) acc[r][j] = ib0 ? sums[r][j] : _mm256_setzero_ps();             \
        for (int64_t b = 0; b < nb; b++) {                                                                \
            const __m256i codes[2] = {ROW((const WB *)rows[0] + ib0 + b), ROW((const WB *)rows[1] + ib0 + b)}; \
            for (int j = 0; j < nc; j++) {                                                                \
                const int8_t *qs = ((const AB *)(a + (size_t)j * ba) + ib0 + b)->qs;                      \
                const float *d = table + (b * 4 + j) * 8 + 4 * q;                                         \
                for (int r = 0; r < 2; r++)                                                               \
                    acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + 2 * r),                           \
                                                _mm256_cvtepi32_ps(gm_dot_row(codes[r], qs, KIND)), acc[r][j]); \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < 2; r++)                                                                       \
            for (int j = 0; j < nc; j++) sums[r][j] = acc[r][j];                                          \
    }                                                                                                     \
    GM_INLINE void gemm8_##NAME##_cols(int64_t n, float *s, size_t bs, const uint8_t *w, size_t bw,       \
                                       const uint8_t *a, size_t ba, const int nc) {                       \
        _Alignas(32) float table[GM2_CHUNK * 4 * 8];                                                      \
        for (int g = 0; g < 2; g++) {                                                                     \
            const uint8_t *rows[4];                                                                       \
            for (int r = 0; r < 4; r++) rows[r] = w + (size_t)(4 * g + r) * bw;                           \
            __m256 acc[2][2][4], mins[4];   /* acc: set by the first chunk */                             \
            for (int j = 0; j < 4; j++) mins[j] = _mm256_setzero_ps();                                    \
            for (int64_t ib0 = 0; ib0 < n / 32; ib0 += GM2_CHUNK) {                                       \
                const int64_t nb = n / 32 - ib0 < GM2_CHUNK ? n / 32 - ib0 : GM2_CHUNK;                   \
                gemm8_##NAME##_scales4(ib0, nb, rows, bw, a, ba, table, mins, nc);                        \
                for (int q = 0; q < 2; q++) gemm8_##NAME##_rows2(ib0, nb, rows + 2 * q, a, ba, table, q, acc[q], nc); \
            }                                                                                             \
            for (int j = 0; j < nc; j++) {                                                                \
                float m[8];                                                                               \
                _mm256_storeu_ps(m, mins[j]);                                                             \
                for (int r = 0; r < 4; r++)                                                               \
                    s[(size_t)j * bs + 4 * g + r] = x86_sum_ps8(acc[r / 2][r % 2][j]) + (WITH_MIN ? m[2 * r + 1] : 0.0f); \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    static void gemm8_##NAME##_one(int64_t n, float *s, const uint8_t *w, size_t bw, const uint8_t *a) {  \
        const uint8_t *rows[8];                                                                           \
        for (int r = 0; r < 8; r++) rows[r] = w + (size_t)r * bw;                                         \
        __m256 acc[8], mins[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                              \
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();                                         \
        for (int64_t ib = 0; ib < n / 32; ib++) {                                                         \
            const size_t off = (size_t)ib * sizeof(WB);                                                   \
            gm_prefetch_ahead(rows, bw, off, sizeof(WB));                                                 \
            gm_prefetch_ahead(rows + 4, bw, off, sizeof(WB));                                             \
            const AB *y = (const AB *)a + ib;                                                             \
            const __m256 scale = _mm256_castpd_ps(_mm256_broadcastsd_pd(gm_act_pair(y)));   /* [da sa ...] */ \
            for (int g = 0; g < 2; g++) {                                                                 \
                const __m256 prod = _mm256_mul_ps(gm_scales_tile(rows + 4 * g, sizeof(WB), ib), scale);   \
                if (WITH_MIN) mins[g] = _mm256_add_ps(mins[g], prod);                                     \
                for (int r = 0; r < 4; r++) {                                                             \
                    const __m256i lanes = gm_dot_row(ROW((const WB *)rows[4 * g + r] + ib), y->qs, KIND);  \
                    const __m256 d = _mm256_permutevar8x32_ps(prod, _mm256_set1_epi32(2 * r));            \
                    acc[4 * g + r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[4 * g + r]);       \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        float m[2][8];                                                                                    \
        _mm256_storeu_ps(m[0], mins[0]);                                                                  \
        _mm256_storeu_ps(m[1], mins[1]);                                                                  \
        for (int r = 0; r < 8; r++) s[r] = x86_sum_ps8(acc[r]) + (WITH_MIN ? m[r / 4][2 * (r % 4) + 1] : 0.0f); \
    }                                                                                                     \
    GM_MAYBE_UNUSED static void gemm8_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw,    \
                                             const void *a, size_t ba, int nc) {                          \
        switch (nc) {                                                                                     \
        case 1: gemm8_##NAME##_one(n, s, w, bw, a); break;                                                \
        case 2: gemm8_##NAME##_cols(n, s, bs, w, bw, a, ba, 2); break;                                    \
        case 3: gemm8_##NAME##_cols(n, s, bs, w, bw, a, ba, 3); break;                                    \
        default: gemm8_##NAME##_cols(n, s, bs, w, bw, a, ba, 4); break;                                   \
        }                                                                                                 \
    }
#define GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN) \
    GM_DEFINE_LEGACY_GEMM(NAME, WB, AB, ROW, KIND, WITH_MIN)
#define GM_LEGACY_GEMM8(NAME, WB, AB, ROW, KIND, WITH_MIN) \
    GM_DEFINE_LEGACY_GEMM8(NAME, WB, AB, ROW, KIND, WITH_MIN)
#endif
#define GM_INSTALL_GEMM8(k, TYPE, NAME) ((k)->type[TYPE].rows8.gemm8 = gemm8_##NAME)

#define GM_DEFINE_LEGACY(NAME, WB, AB, ROW, KIND, WITH_MIN)      \
    GM_DEFINE_LEGACY_VEC_DOT(NAME, WB, AB, ROW, KIND, WITH_MIN) \
    GM_LEGACY_TILE(NAME, WB, AB, ROW, KIND, WITH_MIN)           \
    GM_DEFINE_LEGACY_DISPATCH(NAME)                             \
    GM_LEGACY_GEMM8(NAME, WB, AB, ROW, KIND, WITH_MIN)

#define GM_DEFINE_ALL_LEGACY()                                                  \
    GM_DEFINE_LEGACY(q4_0, block_q4_0, block_q8_0, gm_row_q4_0, GM_SIGNED, 0)   \
    GM_DEFINE_LEGACY(q4_1, block_q4_1, block_q8_1, gm_row_q4_1, GM_UNSIGNED, 1) \
    GM_DEFINE_LEGACY(q5_0, block_q5_0, block_q8_0, gm_row_q5_0, GM_SIGNED, 0)   \
    GM_DEFINE_LEGACY(q5_1, block_q5_1, block_q8_1, gm_row_q5_1, GM_UNSIGNED, 1) \
    GM_DEFINE_LEGACY(q8_0, block_q8_0, block_q8_0, gm_row_q8_0, GM_SIGNED8, 0)

/* PYENGINE_GEMM=0 leaves the tiles to vec_dot pair by pair, =8 keeps
 * AVX-512's decoding kernels to 8 rows in 256-bit vectors (x86_gemm_rows16.h
 * not installed), both for A/B timing. */
static inline int gm_gemm_switched(const char *value) {
    const char *v = getenv("PYENGINE_GEMM");
    return v && strcmp(v, value) == 0;
}
static inline int gm_gemm_enabled(void) { return !gm_gemm_switched("0"); }

#define GM_INSTALL(k, TYPE, NAME, with_gemm)                                                        \
    do {                                                                                            \
        (k)->type[TYPE].vec_dot = vec_dot_##NAME;                                                   \
        (k)->type[TYPE].gemm = (with_gemm) ? gemm_##NAME : NULL;                                    \
    } while (0)

#endif /* PE_X86_GEMM_H */
