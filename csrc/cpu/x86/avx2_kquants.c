/* avx2_kquants.c - AVX2 kernels of the k-quants and IQ4 types.
 *
 * The dot products take whole super-blocks: maddubs multiplies the unsigned
 * weight levels with the signed Q8_K activations into 16-bit pairs, madd
 * applies the 16-bit sub-block scales, and the 32-bit sums stay in a vector
 * until one float multiply-add per super-block.  Signed levels are stored
 * with a bias (Q3_K: +4); the bias comes back out through the
 * activations' per-16 sums (bsums), so the inner loop stays unsigned.
 * Only the final horizontal sum leaves the vectors.  Q4_K, Q5_K and Q6_K
 * have their dot products (vec_dot and gemm) in avx2_gemm.c. */
#include <immintrin.h>
#include <math.h>

#include "internal.h"
#include "x86_kquants.h"

/* Sixteen 16-bit scales, one per 16 elements (Q2_K, Q3_K): the scale
 * vector for 32 elements starting at element 128 h + 32 k holds scale
 * 8h + 2k in its low lane and 8h + 2k + 1 in its high lane.  scales_for_half
 * broadcasts lane h; the shuffle index then advances by 4 bytes per k. */
static inline __m256i scales_for_half(__m256i sc16, int h) {
    return h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
}
static inline __m256i pair_index_first(void) {
    return _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
}

/* ---- Q8_K: quantize the activations (bit-exact with the reference) --------- */

/* the index of the first element whose magnitude equals amax */
static int first_absmax(const float *x, float amax) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 vam = _mm256_set1_ps(amax);
    for (int v = 0; v < QK_K / 8; v++) {
        const __m256 ax = _mm256_and_ps(_mm256_loadu_ps(x + 8 * v), absmask);
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(ax, vam, _CMP_EQ_OQ));
        for (int l = 0; m && l < 8; l++)
            if ((m >> l) & 1) return 8 * v + l;
    }
    return 0;
}

static float absmax_256(const float *x) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* four chains to hide the max latency; max_ps returns its second operand
     * when the first is NaN, so NaNs are skipped */
    __m256 m[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int v = 0; v < QK_K / 8; v++) m[v % 4] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * v), absmask), m[v % 4]);
    m[0] = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m[0]), _mm256_extractf128_ps(m[0], 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* pe_nearest_int on 8 lanes, then min(v, 127) and the low byte as int32.
 * cvtps rounds to nearest even like the magic-number trick, and it keeps the
 * product a rounded float (mul + add would be fused into one FMA); NaN and
 * inf give INT_MIN, whose low byte 0 is what the trick gives too. */
static inline __m256i round_to_byte(__m256 v) {
    const __m256i i = _mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127));
    return _mm256_and_si256(i, _mm256_set1_epi32(0xFF));
}

/* per-16 sums of 256 int8 held in 8 vectors of 32 */
static void store_bsums(const __m256i q[8], int16_t *bsums) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i w[8];
    for (int g = 0; g < 8; g++) w[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q[g]), ones16);
    /* w[g]: four partial sums of group 2g in the low lane, of 2g + 1 in the high */
    const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(w[0], w[1]), _mm256_hadd_epi32(w[2], w[3]));
    const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(w[4], w[5]), _mm256_hadd_epi32(w[6], w[7]));
    /* lanes: even groups low, odd groups high */
    const __m256i pk = _mm256_packs_epi32(lo, hi);
    const __m128i even = _mm256_castsi256_si128(pk), odd = _mm256_extracti128_si256(pk, 1);
    _mm_storeu_si128((__m128i *)bsums, _mm_unpacklo_epi16(even, odd));
    _mm_storeu_si128((__m128i *)(bsums + 8), _mm_unpackhi_epi16(even, odd));
}

static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float amax = absmax_256(x);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / x[first_absmax(x, amax)];
        const __m256 vis = _mm256_set1_ps(iscale);
        __m256i q[8];
        for (int g = 0; g < 8; g++) {
            const float *xg = x + 32 * g;
            const __m256i i0 = round_to_byte(_mm256_mul_ps(_mm256_loadu_ps(xg), vis));
            const __m256i i1 = round_to_byte(_mm256_mul_ps(_mm256_loadu_ps(xg + 8), vis));
            const __m256i i2 = round_to_byte(_mm256_mul_ps(_mm256_loadu_ps(xg + 16), vis));
            const __m256i i3 = round_to_byte(_mm256_mul_ps(_mm256_loadu_ps(xg + 24), vis));
            /* values are 0..255: the unsigned packs keep them, the permute undoes
             * the per-lane interleaving */
            const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(i0, i1), _mm256_packus_epi32(i2, i3));
            q[g] = _mm256_permutevar8x32_epi32(b, order);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), q[g]);
        }
        store_bsums(q, y[i].bsums);
        y[i].d = 1 / iscale;
    }
}

static void dequantize_q8_K(const void *vx, float *y, int64_t n) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256 d = _mm256_set1_ps(x[i].d);
        for (int j = 0; j < QK_K; j += 8, y += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[i].qs + j)));
            _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

/* ---- Q2_K ------------------------------------------------------------------ */

/* One super-block's integer sums: per 128-element half h, isum[h] lanes (the
 * chunk scales times the products, lane t over bytes 4t..4t+3, as llama.cpp's
 * dot product forms them) and the min term lanes msum (lanes 0..3: the first
 * half's sub-blocks, 4..7 the second's). */
static inline void q2k_sums(const block_q2_K *x, const block_q8_K *a, __m256i isum[2], __m256i *msum) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i sc8 = load128(x->scales);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    *msum = _mm256_madd_epi16(mins, load256(a->bsums));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
    const int8_t *q8 = a->qs;
    for (int h = 0; h < 2; h++) {
        __m256i bits = load256(x->qs + 32 * h);
        const __m256i sc = scales_for_half(sc16, h);
        __m256i idx = pair_index_first();
        isum[h] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++, q8 += 32) {
            const __m256i q2 = _mm256_and_si256(bits, m3);
            const __m256i p = _mm256_maddubs_epi16(q2, load256(q8));
            isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, idx)));
            bits = _mm256_srli_epi16(bits, 2);
            idx = _mm256_add_epi8(idx, four);
        }
    }
}

static void vec_dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float dall = a[i].d * f16(x[i].d), dmin = -a[i].d * f16(x[i].dmin);
        __m256i isum[2], msum;
        q2k_sums(&x[i], &a[i], isum, &msum);
        /* llama.cpp multiply-adds the min term first */
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(msum), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(_mm256_add_epi32(isum[0], isum[1])), acc);
    }
    *s = x86_sum_ps8(acc);
}

/* ---- Q3_K ------------------------------------------------------------------ */

/* A super-block's eight integer lanes, as llama.cpp's x86 dot product forms
 * them: lane t sums, over the 32-element chunks, the chunk's scale times the
 * products of its bytes 4t..4t+3 with the signed levels lo - 4 (1 - hbit)
 * (the offset comes off per byte pair, so it lands in the same lanes). */
static inline __m256i q3k_lanes(const block_q3_K *x, const block_q8_K *a) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i sc16 = q3k_scales(x->scales);
    __m256i hbits = load256(x->hmask);
    const int8_t *q8 = a->qs;
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i bits = load256(x->qs + 32 * h);
        const __m256i sc = scales_for_half(sc16, h);
        __m256i idx = pair_index_first();
        for (int k = 0; k < 4; k++, q8 += 32) {
            /* 4 where hmask bit 4h + k is clear */
            const __m256i off = _mm256_andnot_si256(_mm256_slli_epi16(hbits, 2), four);
            const __m256i a8 = load256(q8);
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(_mm256_and_si256(bits, m3), a8),
                                               _mm256_maddubs_epi16(off, a8));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, idx)));
            bits = _mm256_srli_epi16(bits, 2);
            hbits = _mm256_srli_epi16(hbits, 1);
            idx = _mm256_add_epi8(idx, four);
        }
    }
    return isum;
}

static void vec_dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q3_K *x = vw;
    const block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q3k_lanes(&x[i], &a[i])), acc);
    }
    *s = x86_sum_ps8(acc);
}

/* ---- IQ4_NL / IQ4_XS --------------------------------------------------------- */

/* sum of signed byte products in 16-bit pairs: maddubs wants an unsigned
 * left operand, so move the weights' signs onto the activations */
static inline __m256i mul_signed_pairs(__m256i w, __m256i a) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* 16 bytes of grid indices -> the 32 grid values in element order */
static inline __m256i iq4_values_32(const uint8_t *qs, __m256i grid) {
    const __m128i v = load128(qs);
    const __m256i idx = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_shuffle_epi8(grid, _mm256_and_si256(idx, _mm256_set1_epi8(0xF)));
}

static void vec_dot_iq4_nl(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_nl *x = vw;
    const block_q8_0 *a = va;
    const __m256i grid = _mm256_broadcastsi128_si256(load128(pe_iq4nl_values));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK4_NL;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m256i p0 = _mm256_madd_epi16(mul_signed_pairs(iq4_values_32(x[i].qs, grid), load256(a[i].qs)), ones);
        const __m256i p1 = _mm256_madd_epi16(mul_signed_pairs(iq4_values_32(x[i + 1].qs, grid), load256(a[i + 1].qs)), ones);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(a[i].d) * f16(x[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16(a[i + 1].d) * f16(x[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; i < nb; i++) {
        const __m256i p0 = _mm256_madd_epi16(mul_signed_pairs(iq4_values_32(x[i].qs, grid), load256(a[i].qs)), ones);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(a[i].d) * f16(x[i].d)), _mm256_cvtepi32_ps(p0), acc0);
    }
    *s = x86_sum_ps8(_mm256_add_ps(acc0, acc1));
}

/* a super-block's eight lanes: sub-block scale times the 4-element products */
static inline __m256i iq4xs_lanes(const block_iq4_xs *x, const block_q8_K *a, __m256i grid) {
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const __m256i p = mul_signed_pairs(iq4_values_32(x->qs + 16 * ib, grid), load256(a->qs + 32 * ib));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16((int16_t)pe_iq4xs_scale(x, ib))));
    }
    return isum;
}

static void vec_dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_xs *x = vw;
    const block_q8_K *a = va;
    const __m256i grid = _mm256_broadcastsi128_si256(load128(pe_iq4nl_values));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(iq4xs_lanes(&x[i], &a[i], grid)), acc);
    }
    *s = x86_sum_ps8(acc);
}

/* ---- to_float (embedding rows) ---------------------------------------------- */

/* 8 bytes -> 8 int32 */
static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Q4_K / Q5_K: d1 * q - m1 is exact in float (d1 has at most 17 significant
 * bits, q at most 5), so the fused form rounds like the reference. */
static void dequantize_k4(const uint8_t *qs, const uint8_t *qh, const uint8_t *packed, float d, float dmin, float *y) {
    for (int j = 0; j < 4; j++) {
        uint8_t sc0, mn0, sc1, mn1;
        pe_k4_scale_min(2 * j, packed, &sc0, &mn0);
        pe_k4_scale_min(2 * j + 1, packed, &sc1, &mn1);
        const __m256 d0 = _mm256_set1_ps(d * sc0), m0 = _mm256_set1_ps(dmin * mn0);
        const __m256 d1 = _mm256_set1_ps(d * sc1), m1 = _mm256_set1_ps(dmin * mn1);
        for (int t = 0; t < 4; t++) {
            const __m256i b = u8x8(qs + 32 * j + 8 * t);
            __m256i lo = _mm256_and_si256(b, _mm256_set1_epi32(0xF)), hi = _mm256_srli_epi32(b, 4);
            if (qh) {
                const __m256i h = u8x8(qh + 8 * t);
                lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * j), _mm256_set1_epi32(1)), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * j + 1), _mm256_set1_epi32(1)), 4));
            }
            _mm256_storeu_ps(y + 64 * j + 8 * t, _mm256_fmsub_ps(d0, _mm256_cvtepi32_ps(lo), m0));
            _mm256_storeu_ps(y + 64 * j + 32 + 8 * t, _mm256_fmsub_ps(d1, _mm256_cvtepi32_ps(hi), m1));
        }
    }
}

static void dequantize_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        dequantize_k4(x[i].qs, NULL, x[i].scales, f16(x[i].d), f16(x[i].dmin), y);
}

static void dequantize_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        dequantize_k4(x[i].qs, x[i].qh, x[i].scales, f16(x[i].d), f16(x[i].dmin), y);
}

static void dequantize_q6_K(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx;
    const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sc = x[i].scales + 8 * h;
            for (int t = 0; t < 4; t++) {
                const __m256i l0 = u8x8(ql + 8 * t), l1 = u8x8(ql + 32 + 8 * t), hb = u8x8(qh + 8 * t);
                const __m256i q[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi32(_mm256_and_si256(hb, m3), 4)),
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), m3), 4)),
                    _mm256_or_si256(_mm256_srli_epi32(l0, 4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), m3), 4)),
                    _mm256_or_si256(_mm256_srli_epi32(l1, 4), _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4)),
                };
                for (int k = 0; k < 4; k++) {
                    /* elements 32k + 8t .. +7 use scale 2k + t / 2 of this half */
                    const __m256 dl = _mm256_set1_ps(d * sc[2 * k + t / 2]);
                    const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], bias));
                    _mm256_storeu_ps(y + 32 * k + 8 * t, _mm256_mul_ps(dl, v));
                }
            }
        }
    }
}

void pe_fill_avx2_kquants(pe_kernels *k) {
    k->type[PE_TYPE_Q8_K].from_float = quantize_q8_K;
    k->type[PE_TYPE_Q8_K].to_float = dequantize_q8_K;
    k->type[PE_TYPE_Q2_K].vec_dot = vec_dot_q2_K;
    k->type[PE_TYPE_Q3_K].vec_dot = vec_dot_q3_K;
    k->type[PE_TYPE_Q4_K].to_float = dequantize_q4_K;
    k->type[PE_TYPE_Q5_K].to_float = dequantize_q5_K;
    k->type[PE_TYPE_Q6_K].to_float = dequantize_q6_K;
    k->type[PE_TYPE_IQ4_NL].vec_dot = vec_dot_iq4_nl;
    k->type[PE_TYPE_IQ4_XS].vec_dot = vec_dot_iq4_xs;
}
