/* x86_gemm_rows16.h - AVX-512 decoding kernels over two adjacent groups of
 * 8 interleaved rows (16 weight rows, the second group at w + 8 bw), one
 * 512-bit vector holding lane t of all 16: the lower half the first group's,
 * the upper half the second's.  Each lane does exactly what the 8-row
 * kernels' lane does (x86_gemm_rows8.h: the same integer sums, the same
 * multiplies, fma and fold in the same order), so every result is the same
 * bits; the wider vectors take half the instructions per product, which is
 * what bounds a decoding step of several activation rows once the weights
 * come from cache.  Included by avx512_gemm.c after x86_gemm_rows8.h. */
#ifndef PE_X86_GEMM_ROWS16_H
#define PE_X86_GEMM_ROWS16_H

/* 32 bytes at lo in the lower half, 32 at hi in the upper */
static inline __m512i gp_join(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(gm_load256(lo)), gm_load256(hi), 1);
}

/* 8 f16 at lo and 8 at hi as 16 floats */
static inline __m512 gp_halves(const pe_f16 *lo, const pe_f16 *hi) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(gm_load128(lo)), gm_load128(hi), 1));
}

/* Lane vectors t = 0..7 of 16 rows added in x86_sum_ps8's order (gr_fold8). */
static inline __m512 gp_fold8(const __m512 acc[8]) {
    __m512 h[4];
    for (int t = 0; t < 4; t++) h[t] = _mm512_add_ps(acc[t + 4], acc[t]);
    return _mm512_add_ps(_mm512_add_ps(h[0], h[2]), _mm512_add_ps(h[1], h[3]));
}

/* The codes of lane u of 16 rows (gr_nibbles for two groups). */
static inline void gp_nibbles(const uint8_t lo[4][8][4], const uint8_t hi[4][8][4], __m512i code[8]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        const __m512i q = gp_join(lo[t], hi[t]);
        code[t] = _mm512_and_si512(q, low4);
        code[t + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    }
}

/* The prefetch of a pair kernel at block b (of nb per group) of pass `pass`
 * of `passes` over the pair: one pass streams the two groups as one run
 * (gr_prefetch_run); two ask at gr_prefetch's pace for the block where its
 * position p falls, in both groups of this pair or, past their end, of the
 * next (x + nb + p, x + 2 nb + p). */
static inline void gp_prefetch(const void *x, size_t size, int64_t b, int64_t nb, int pass, int passes) {
    if (passes == 1) {
        gr_prefetch_run(x, 2 * (size_t)b * size, 2 * size);
        return;
    }
    const int64_t t = pass * nb + b;
    if (t & 1) return;
    const int64_t p = (nb + GR_PREFETCH_BLOCKS) / 2 + t / 2;
    const uint8_t *first = (const uint8_t *)x + (size_t)(p + (p >= nb ? nb : 0)) * size;
    pe_prefetch(first, size);
    pe_prefetch(first + (size_t)nb * size, size);
}

/* lane r: start + the 4 products of row r's codes (lane r of `codes`,
 * unsigned) with the activation's 4 codes at a4 (gr_dot4) */
static inline __m512i gp_dot4(__m512i start, __m512i codes, const int8_t *a4) {
    return _mm512_dpbusd_epi32(start, codes, _mm512_set1_epi32((int)gm_u32(a4)));
}

/* the same for signed codes: their magnitudes against the activation codes
 * carrying the codes' signs */
static inline __m512i gp_dot4_signed(__m512i start, __m512i mag, __m512i codes, const int8_t *a4) {
    const __m512i act = _mm512_set1_epi32((int)gm_u32(a4));
    const __m512i signed_act = _mm512_mask_sub_epi8(act, _mm512_movepi8_mask(codes), _mm512_setzero_si512(), act);
    return _mm512_dpbusd_epi32(start, mag, signed_act);
}

/* gemm8_q4_1x8_cols over 16 rows: groups x and x2 */
GM_INLINE void gemm8_pair_q4_1x8_cols(int64_t n, float *s, size_t bs, const block_q4_1x8 *x,
                                      const block_q8_1 *const y[2], const int nc, int pass, int passes) {
    const int64_t nb = n / QK4_1;
    const block_q4_1x8 *x2 = x + nb;
    __m512 acc[2][8], mins[2];
    for (int j = 0; j < nc; j++) {
        mins[j] = _mm512_setzero_ps();
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        gp_prefetch(x, sizeof *x, b, nb, pass, passes);
        __m512i code[8];
        gp_nibbles(x[b].qs, x2[b].qs, code);
        const __m512 dw = gp_halves(x[b].d, x2[b].d), mw = gp_halves(x[b].m, x2[b].m);
        for (int j = 0; j < nc; j++) {
            const block_q8_1 *a = y[j] + b;
            const float *da = (const float *)(y[j] + nb) + b, *sa = da + nb;
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(*da));
            for (int t = 0; t < 8; t++) {
                const __m512i sum = gp_dot4(_mm512_setzero_si512(), code[t], a->qs + 4 * t);
                acc[j][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[j][t]);
            }
            mins[j] = _mm512_add_ps(mins[j], _mm512_mul_ps(mw, _mm512_set1_ps(*sa)));
        }
    }
    for (int j = 0; j < nc; j++) _mm512_storeu_ps(s + (size_t)j * bs, _mm512_add_ps(gp_fold8(acc[j]), mins[j]));
}

/* The start of a pass over activation rows y[0..nc) (gr_q8_0_pass). */
GM_INLINE void gp_q8_0_pass(int64_t n, const block_q8_0 *const y[2], const int nc, const pe_q8_0_scales *sc[2],
                            __m512 acc[2][8]) {
    for (int j = 0; j < nc; j++) {
        sc[j] = gm_q8_0_scales(y[j], n);
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    }
}

/* Block b's float scales of 16 rows times each activation row's d (gr_block_d). */
GM_INLINE void gp_block_d(__m512 dw, const pe_q8_0_scales *const sc[2], int64_t b, const int nc, __m512 d[2]) {
    for (int j = 0; j < nc; j++) d[j] = _mm512_mul_ps(dw, _mm512_set1_ps(sc[j][b].d));
}

/* Each activation row's 16 results (gr_store_folds). */
GM_INLINE void gp_store_folds(float *s, size_t bs, const __m512 acc[2][8], const int nc) {
    for (int j = 0; j < nc; j++)
        _mm512_storeu_ps(s + (size_t)j * bs, _mm512_add_ps(gp_fold8(acc[j]), _mm512_setzero_ps()));
}

/* gemm8_q8_0x8_cols over 16 rows: groups x and x2 */
GM_INLINE void gemm8_pair_q8_0x8_cols(int64_t n, float *s, size_t bs, const block_q8_0x8 *x,
                                      const block_q8_0 *const y[2], const int nc, int pass, int passes) {
    const int64_t nb = n / QK8_0;
    const block_q8_0x8 *x2 = x + nb;
    const pe_q8_0_scales *sc[2];
    __m512 acc[2][8];
    gp_q8_0_pass(n, y, nc, sc, acc);
    for (int64_t b = 0; b < nb; b++) {
        gp_prefetch(x, sizeof *x, b, nb, pass, passes);
        __m512 d[2];
        gp_block_d(gp_halves(x[b].d, x2[b].d), sc, b, nc, d);
        for (int t = 0; t < 8; t++) {
            const __m512i code = gp_join(x[b].qs[t], x2[b].qs[t]);
            for (int j = 0; j < nc; j++) {
                const __m512i sum = gp_dot4(_mm512_set1_epi32(sc[j][b].start8[t]), code, y[j][b].qs + 4 * t);
                acc[j][t] = _mm512_fmadd_ps(d[j], _mm512_cvtepi32_ps(sum), acc[j][t]);
            }
        }
    }
    gp_store_folds(s, bs, acc, nc);
}

/* gemm8_q5_0x8_cols over 16 rows: groups x and x2; the fifth bits of lane
 * t of both groups are one 64-bit byte mask */
GM_INLINE void gemm8_pair_q5_0x8_cols(int64_t n, float *s, size_t bs, const block_q5_0x8 *x,
                                      const block_q8_0 *const y[2], const int nc, int pass, int passes) {
    const int64_t nb = n / QK5_0;
    const block_q5_0x8 *x2 = x + nb;
    const __m512i sixteen = _mm512_set1_epi8(16);
    const pe_q8_0_scales *sc[2];
    __m512 acc[2][8];
    gp_q8_0_pass(n, y, nc, sc, acc);
    for (int64_t b = 0; b < nb; b++) {
        gp_prefetch(x, sizeof *x, b, nb, pass, passes);
        __m512i code[8];
        gp_nibbles(x[b].qs, x2[b].qs, code);
        __m512 d[2];
        gp_block_d(gp_halves(x[b].d, x2[b].d), sc, b, nc, d);
        for (int t = 0; t < 8; t++) {
            const __mmask64 fifth = _cvtu64_mask64((uint64_t)x[b].qh[t] | (uint64_t)x2[b].qh[t] << 32);
            const __m512i u = _mm512_mask_add_epi8(code[t], fifth, code[t], sixteen);   /* n + 16 f */
            for (int j = 0; j < nc; j++) {
                const __m512i sum = gp_dot4(_mm512_set1_epi32(sc[j][b].start5[t]), u, y[j][b].qs + 4 * t);
                acc[j][t] = _mm512_fmadd_ps(d[j], _mm512_cvtepi32_ps(sum), acc[j][t]);
            }
        }
    }
    gp_store_folds(s, bs, acc, nc);
}

/* gr_q4k_six_bits for 16 rows */
static inline __m512i gp_q4k_six_bits(int k, __m512i word01, __m512i word2, int high) {
    if (k < 4) return _mm512_and_si512(_mm512_srli_epi32(word01, 8 * k), _mm512_set1_epi32(63));
    const __m512i low = _mm512_and_si512(_mm512_srli_epi32(word2, 8 * (k - 4) + 4 * high), _mm512_set1_epi32(15));
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(word01, 8 * (k - 4) + 6), _mm512_set1_epi32(3));
    return _mm512_or_si512(low, _mm512_slli_epi32(top, 4));
}

/* gemm8_q4_Kx8_n over 16 rows: groups x and x + nb */
GM_INLINE void gemm8_pair_q4_Kx8_n(int64_t n, float *s, size_t bs, const block_q4_Kx8 *x, const uint8_t *a, size_t ba,
                                   const int nc) {
    const int64_t nb = n / QK_K;
    const block_q4_Kx8 *x2 = x + nb;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 whole[4], mins[4];
    for (int j = 0; j < nc; j++) whole[j] = mins[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        gr_prefetch_run(x, 2 * (size_t)b * sizeof *x, 2 * sizeof *x);
        const __m512i word0 = gp_join(x[b].scales[0], x2[b].scales[0]);
        const __m512i word1 = gp_join(x[b].scales[1], x2[b].scales[1]);
        const __m512i word2 = gp_join(x[b].scales[2], x2[b].scales[2]);
        const __m512 dw = gp_halves(x[b].d, x2[b].d), dminw = gp_halves(x[b].dmin, x2[b].dmin);
        __m512 d[4], dmin[4];
        __m512i total[4], mins_total[4];
        for (int j = 0; j < nc; j++) {
            const __m512 da = _mm512_set1_ps(((const block_q8_K *)(a + (size_t)j * ba) + b)->d);
            d[j] = _mm512_mul_ps(dw, da);
            dmin[j] = _mm512_mul_ps(dminw, da);
            total[j] = mins_total[j] = _mm512_setzero_si512();
        }
        for (int c = 0; c < 4; c++) {   /* chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            __m512i lo[8], hi[8];
            for (int g = 0; g < 8; g++) {
                const __m512i q = gp_join(x[b].qs[c][g], x2[b].qs[c][g]);
                lo[g] = _mm512_and_si512(q, low4);
                hi[g] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
            }
            const __m512i scale_lo = gp_q4k_six_bits(2 * c, word0, word2, 0);
            const __m512i scale_hi = gp_q4k_six_bits(2 * c + 1, word0, word2, 0);
            const __m512i min_lo = gp_q4k_six_bits(2 * c, word1, word2, 1);
            const __m512i min_hi = gp_q4k_six_bits(2 * c + 1, word1, word2, 1);
            for (int j = 0; j < nc; j++) {
                const block_q8_K *y = (const block_q8_K *)(a + (size_t)j * ba) + b;
                const int8_t *q = y->qs + 64 * c;
                __m512i sum_lo = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();
                for (int g = 0; g < 8; g++) {
                    sum_lo = gp_dot4(sum_lo, lo[g], q + 4 * g);
                    sum_hi = gp_dot4(sum_hi, hi[g], q + 32 + 4 * g);
                }
                const __m512i part = _mm512_add_epi32(_mm512_mullo_epi32(sum_lo, scale_lo),
                                                      _mm512_mullo_epi32(sum_hi, scale_hi));
                const int16_t *bs16 = y->bsums + 4 * c;   /* 16-element sums: 4 per 64 elements */
                const __m512i part_mins =
                    _mm512_add_epi32(_mm512_mullo_epi32(min_lo, _mm512_set1_epi32(bs16[0] + bs16[1])),
                                     _mm512_mullo_epi32(min_hi, _mm512_set1_epi32(bs16[2] + bs16[3])));
                total[j] = _mm512_add_epi32(total[j], part);
                mins_total[j] = _mm512_add_epi32(mins_total[j], part_mins);
            }
        }
        for (int j = 0; j < nc; j++) {
            whole[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[j]), d[j], whole[j]);
            mins[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins_total[j]), dmin[j], mins[j]);
        }
    }
    for (int j = 0; j < nc; j++)
        _mm512_storeu_ps(s + (size_t)j * bs, _mm512_add_ps(_mm512_setzero_ps(), _mm512_sub_ps(whole[j], mins[j])));
}

/* gr_mxfp4_scales for 16 rows: the exponents of groups x and x2 */
static inline __m512 gp_mxfp4_scales(const uint8_t lo[8], const uint8_t hi[8]) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)lo),
                                                              _mm_loadl_epi64((const __m128i *)hi)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(x, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), x);
    const __mmask16 tiny = _mm512_cmplt_epi32_mask(x, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, normal, subnormal));
}

/* gr_mxfp4_block for 16 rows: block b of groups x and x2 */
GM_INLINE void gp_mxfp4_block(const block_mxfp4x8 *x, const block_mxfp4x8 *x2, const block_q8_0 *y,
                              const pe_q8_0_scales *sc, __m512i grid, __m512 acc[8]) {
    __m512i code[8];
    gp_nibbles(x->qs, x2->qs, code);
    const __m512 d = _mm512_mul_ps(gp_mxfp4_scales(x->e, x2->e), _mm512_set1_ps(sc->d));
    for (int t = 0; t < 8; t++) {
        const __m512i level16 = _mm512_shuffle_epi8(grid, code[t]);
        const __m512i sum = gp_dot4(_mm512_set1_epi32(sc->start5[t]), level16, y->qs + 4 * t);
        acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[t]);
    }
}

/* gemm8_mxfp4x8_col over 16 rows: groups x and x + nb */
GM_INLINE void gemm8_pair_mxfp4x8_col(int64_t n, float *s, const block_mxfp4x8 *x, const block_q8_0 *y, int pass,
                                      int passes) {
    const int64_t nb = n / QK_MXFP4;
    const block_mxfp4x8 *x2 = x + nb;
    const pe_q8_0_scales *sc = gm_q8_0_scales(y, n);
    const __m512i grid = _mm512_broadcast_i32x4(_mm256_castsi256_si128(gr_mxfp4_grid16()));
    __m512 even[8], odd[8];
    for (int t = 0; t < 8; t++) even[t] = odd[t] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        gp_prefetch(x, 2 * sizeof *x, b / 2, nb / 2, pass, passes);
        gp_mxfp4_block(x + b, x2 + b, y + b, sc + b, grid, even);
        gp_mxfp4_block(x + b + 1, x2 + b + 1, y + b + 1, sc + b + 1, grid, odd);
    }
    if (b < nb) gp_mxfp4_block(x + b, x2 + b, y + b, sc + b, grid, even);
    for (int t = 0; t < 8; t++) even[t] = _mm512_add_ps(even[t], odd[t]);
    _mm512_storeu_ps(s, gp_fold8(even));
}

GR_DEFINE_GEMM8_BY_ONE(pair_mxfp4x8)

GR_DEFINE_GEMM8_BY_PAIRS(pair_q4_1x8, block_q8_1)
GR_DEFINE_GEMM8_BY_PAIRS(pair_q8_0x8, block_q8_0)
GR_DEFINE_GEMM8_BY_PAIRS(pair_q5_0x8, block_q8_0)
GR_DEFINE_GEMM8_BY_COLS_WITH(gemm8_pair_q4_Kx8, pair_q4_Kx8, block_q4_Kx8, )

/* The pair kernels, and how many activation rows each type's takes before
 * unpacked tiles win (rows8.cols).  One thread pair, products of 1536 x 576
 * to 12288 x 576 (4096 x 640, x 1024 for Q5_0, Q4_K), pairs against tiles:
 * Q4_1 and Q8_0 ahead at every batch up to 300 rows (75-84 multiply-adds/ns
 * a thread against 57-76); Q5_0 ahead at 64 rows (10%), behind from 128;
 * Q4_K ahead up to 128 rows, behind at 256.  SmolLM2's prompts of 64-150
 * tokens took 20-25% less time, of 256 and 384 7-10%, of 512 the same. */
#define GP_INSTALL_ALL(k)                                                      \
    do {                                                                       \
        (k)->type[PE_TYPE_Q4_1_X8].rows8.gemm8_pair = gemm8_pair_q4_1x8;       \
        (k)->type[PE_TYPE_Q4_1_X8].rows8.cols = 512;                           \
        (k)->type[PE_TYPE_Q8_0_X8].rows8.gemm8_pair = gemm8_pair_q8_0x8;       \
        (k)->type[PE_TYPE_Q8_0_X8].rows8.cols = 512;                           \
        (k)->type[PE_TYPE_Q5_0_X8].rows8.gemm8_pair = gemm8_pair_q5_0x8;       \
        (k)->type[PE_TYPE_Q5_0_X8].rows8.cols = 96;                            \
        (k)->type[PE_TYPE_Q4_K_X8].rows8.gemm8_pair = gemm8_pair_q4_Kx8;       \
        (k)->type[PE_TYPE_Q4_K_X8].rows8.cols = 128;                           \
        (k)->type[PE_TYPE_MXFP4_X8].rows8.gemm8_pair = gemm8_pair_mxfp4x8;     \
    } while (0)

#endif /* PE_X86_GEMM_ROWS16_H */
