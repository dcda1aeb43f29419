/* x86_gemm_rows8.h - the decoding kernels of Q4_1, Q4_K, Q8_0, Q5_0, MXFP4
 * and Q6_K weights interleaved by 8 rows (block_q4_1x8, block_q4_Kx8,
 * block_q8_0x8, block_q5_0x8, block_mxfp4x8, block_q6_Kx8, ref_rows8.c),
 * written once for avx2_gemm.c (and avxvnni_gemm.c) and avx512_gemm.c after
 * x86_gemm.h.
 *
 * llama.cpp's Q4_1 product has per block eight integer lane sums (lane t:
 * elements 4t..4t+3), acc_t = fma(dw * da, sum_t, acc_t), and at the end
 * x86_sum_ps8(acc) + mins.  Here lane t of 8 rows is one vector: group t of
 * their codes (one load) against activation group t broadcast to every lane
 * gives row r's sum_t in lane r, then one fma per t serves 8 rows with their
 * own dw * da; the final fold adds the t vectors in x86_sum_ps8's order.
 * Every result is bit-identical to vec_dot, with no per-row scale gathers,
 * code unpacking or horizontal sums, and one memory stream per 8 rows.  Q8_0
 * and Q5_0 are Q4_1's scheme on signed codes; Q4_K, MXFP4 and Q6_K (below)
 * take their own row products' arithmetic the same way.  (Q4_0 and IQ4_NL have no kernel here:
 * their rows stay as the file has them, with the plain gemm8.) */
#ifndef PE_X86_GEMM_ROWS8_H
#define PE_X86_GEMM_ROWS8_H

/* lane r: start + the 4 products of row r's codes (lane r of `codes`,
 * unsigned, < 32: a pair of products stays inside 16 bits) with the
 * activation's 4 codes at a4 */
static inline __m256i gr_dot4(__m256i start, __m256i codes, const int8_t *a4) {
    return gm_dpbusd(start, codes, _mm256_set1_epi32((int)gm_u32(a4)));
}

/* the same for signed codes: their magnitudes (mag) against the activation
 * codes carrying the codes' signs */
static inline __m256i gr_dot4_signed(__m256i start, __m256i mag, __m256i codes, const int8_t *a4) {
    /* |codes| <= 128, |a| <= 127: a pair of products stays below 2^15 */
    return gm_dpbusd(start, mag, _mm256_sign_epi8(_mm256_set1_epi32((int)gm_u32(a4)), codes));
}

/* The codes of lane u of 8 rows from group u % 4: low nibbles, then high
 * (lane u is elements 4u..4u+3 of the block, against activation codes 4u..) */
static inline void gr_nibbles(const uint8_t qs[4][8][4], __m256i code[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        const __m256i q = gm_load256(qs[t]);
        code[t] = _mm256_and_si256(q, low4);
        code[t + 4] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    }
}

/* Lane vectors t = 0..7 of 8 rows added in x86_sum_ps8's order: t with t + 4,
 * then with t + 2, then the last two. */
static inline __m256 gr_fold8(const __m256 acc[8]) {
    __m256 h[4];
    for (int t = 0; t < 4; t++) h[t] = _mm256_add_ps(acc[t + 4], acc[t]);
    return _mm256_add_ps(_mm256_add_ps(h[0], h[2]), _mm256_add_ps(h[1], h[3]));
}

/* A group of rows is one run of bytes, and a thread's groups follow each
 * other (as the two groups of a pair kernel do): a step that reads len bytes
 * at offset `at` of the run asks for the len bytes GR_PREFETCH_RUN_BYTES
 * further on, into L1 (in a later group near the end of a run).  AVX-512, 2
 * threads streaming 566 MB of 2048 x 8192 or 8192 x 2048 Q4_K products
 * through the pair kernel, alternating runs: 24-27 and 32-34 GB/s with no
 * software prefetch, 40-44 and 35-43 with this; 24 KB ahead 35-40, 48 KB
 * 33-35; into L2 only 29-37; each group's stream on its own 12 blocks ahead
 * 36-38.  Q8_0 2048 x 8192: 31-33 GB/s with GR_PREFETCH_BLOCKS, 35-57 with
 * this (8192 x 2048 the same); Q5_0 34-37 against 37-41.  AVX2's 8-row Q4_K
 * and Q8_0 kernels stream at the same 35-43 GB/s either way.  (pe_prefetch:
 * GCC 12 left out the prefetches of an _mm_prefetch loop in these kernels.) */
#define GR_PREFETCH_RUN_BYTES (36 * 1024)
static inline void gr_prefetch_run(const void *run, size_t at, size_t len) {
    pe_prefetch((const char *)run + at + GR_PREFETCH_RUN_BYTES, len);
}

/* Two passes over a group (3-4 activation rows) pace their prefetches in
 * blocks: 3.5-6.5 KB for these types.  Against 12, paired runs of SmolLM2 and
 * Gemma-3 decode steps took 0-12% less at 4 activation rows; 48 gained
 * nothing more. */
#define GR_PREFETCH_BLOCKS 24

/* The prefetch at block b of pass `pass` of `passes` over a group of nb
 * blocks of `size` bytes at x.  One pass (1-2 activation rows) streams the
 * run (gr_prefetch_run).  Two passes (3-4 rows: the second rereads the group
 * from L1) ask for the blocks that follow at half the pace of the reads,
 * through both: asked for in the first pass alone, the next group's blocks
 * came in a burst the memory could not keep up with, and nothing was asked
 * for while the second pass computed.  Block nb + k (the next group's k-th)
 * is asked for nb + GR_PREFETCH_BLOCKS - k block times before the first
 * pass reads it. */
static inline void gr_prefetch(const void *x, size_t size, int64_t b, int64_t nb, int pass, int passes) {
    const uint8_t *base = (const uint8_t *)x;
    if (passes == 1) {
        gr_prefetch_run(x, (size_t)b * size, size);
        return;
    }
    const int64_t t = pass * nb + b;
    if (t & 1) return;
    pe_prefetch(base + (size_t)((nb + GR_PREFETCH_BLOCKS) / 2 + t / 2) * size, size);
}

/* 8 rows against activation rows y[0..nc) (nc <= 2: 16 accumulators and the
 * 8 code vectors fill the registers); each row's blocks are followed by
 * their scales d and s as floats (rows8.scales), broadcast from memory */
GM_INLINE void gemm8_q4_1x8_cols(int64_t n, float *s, size_t bs, const block_q4_1x8 *x,
                                 const block_q8_1 *const y[2], const int nc, int pass, int passes) {
    const int64_t nb = n / QK4_1;
    __m256 acc[2][8], mins[2];
    for (int j = 0; j < nc; j++) {
        mins[j] = _mm256_setzero_ps();
        for (int t = 0; t < 8; t++) acc[j][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        gr_prefetch(x, sizeof *x, b, nb, pass, passes);
        __m256i code[8];
        gr_nibbles(x[b].qs, code);
        const __m256 dw = _mm256_cvtph_ps(gm_load128(x[b].d)), mw = _mm256_cvtph_ps(gm_load128(x[b].m));
        for (int j = 0; j < nc; j++) {
            const block_q8_1 *a = y[j] + b;
            const float *da = (const float *)(y[j] + nb) + b, *sa = da + nb;
            const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ss(da));
            for (int t = 0; t < 8; t++) {
                const __m256i sum = gr_dot4(_mm256_setzero_si256(), code[t], a->qs + 4 * t);
                acc[j][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc[j][t]);
            }
            mins[j] = _mm256_add_ps(mins[j], _mm256_mul_ps(mw, _mm256_broadcast_ss(sa)));
        }
    }
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(s + (size_t)j * bs, _mm256_add_ps(gr_fold8(acc[j]), mins[j]));
}

/* gemm8 over a kernel taking the activation rows two at a time (NAME##_cols) */
#define GR_DEFINE_GEMM8_BY_PAIRS(NAME, AB)                                                                \
    static void gemm8_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a,    \
                             size_t ba, int nc) {                                                         \
        (void)bw;                                                                                         \
        for (int j = 0; j < nc; j += 2) {                                                                 \
            const AB *y[2] = {(const AB *)((const uint8_t *)a + (size_t)j * ba),                          \
                              (const AB *)((const uint8_t *)a + (size_t)(j + 1) * ba)};                   \
            if (nc - j >= 2)                                                                              \
                gemm8_##NAME##_cols(n, s + (size_t)j * bs, bs, w, y, 2, j / 2, (nc + 1) / 2);             \
            else                                                                                          \
                gemm8_##NAME##_cols(n, s + (size_t)j * bs, bs, w, y, 1, j / 2, (nc + 1) / 2);             \
        }                                                                                                 \
    }
GR_DEFINE_GEMM8_BY_PAIRS(q4_1x8, block_q8_1)

/* The start of a pass of the Q8_0 and Q5_0 kernels over activation rows
 * y[0..nc): each row's pe_q8_0_scales, and its lane accumulators zeroed. */
GM_INLINE void gr_q8_0_pass(int64_t n, const block_q8_0 *const y[2], const int nc, const pe_q8_0_scales *sc[2],
                            __m256 acc[2][8]) {
    for (int j = 0; j < nc; j++) {
        sc[j] = gm_q8_0_scales(y[j], n);
        for (int t = 0; t < 8; t++) acc[j][t] = _mm256_setzero_ps();
    }
}

/* Block b's float scales of 8 rows (dw) times each activation row's d. */
GM_INLINE void gr_block_d(__m256 dw, const pe_q8_0_scales *const sc[2], int64_t b, const int nc, __m256 d[2]) {
    for (int j = 0; j < nc; j++) d[j] = _mm256_mul_ps(dw, _mm256_broadcast_ss(&sc[j][b].d));
}

/* Each activation row's 8 results: its lane vectors folded, + 0 as vec_dot
 * adds its absent min term. */
GM_INLINE void gr_store_folds(float *s, size_t bs, const __m256 acc[2][8], const int nc) {
    for (int j = 0; j < nc; j++)
        _mm256_storeu_ps(s + (size_t)j * bs, _mm256_add_ps(gr_fold8(acc[j]), _mm256_setzero_ps()));
}

/* Q8_0 (the tied output projection of many small models), llama.cpp's lane
 * arithmetic as for Q4_1 without the min term: group t of 8 rows' codes
 * against the activation's group t.  The codes are stored + 128, unsigned
 * (block_q8_0x8): with vpdpbusd they go into it against the signed
 * activation as they are, and the +128 comes off through the start, -128 x
 * the activation's 4-element sums (pe_q8_0_scales, made once per activation
 * row; made here per group of rows, or taken off the weight side, they cost
 * 15-30% of the kernel); AVX2 multiplies the signed codes' magnitudes by the
 * activation carrying their signs.  Two activation rows per pass: their 16
 * accumulators stay in registers. */
GM_INLINE void gemm8_q8_0x8_cols(int64_t n, float *s, size_t bs, const block_q8_0x8 *x,
                                 const block_q8_0 *const y[2], const int nc, int pass, int passes) {
    const pe_q8_0_scales *sc[2];
    __m256 acc[2][8];
    gr_q8_0_pass(n, y, nc, sc, acc);
    for (int64_t b = 0; b < n / QK8_0; b++) {
        gr_prefetch(x, sizeof *x, b, n / QK8_0, pass, passes);
        const __m256 dw = _mm256_cvtph_ps(gm_load128(x[b].d));
        __m256 d[2];
        gr_block_d(dw, sc, b, nc, d);
        for (int t = 0; t < 8; t++) {
            const __m256i code = gm_load256(x[b].qs[t]);
#if defined(GM_DPBUSD)
            for (int j = 0; j < nc; j++) {
                const __m256i start = _mm256_set1_epi32(sc[j][b].start8[t]);
                const __m256i act = _mm256_set1_epi32((int)gm_u32(y[j][b].qs + 4 * t));
                acc[j][t] = _mm256_fmadd_ps(d[j], _mm256_cvtepi32_ps(gm_dpbusd(start, code, act)), acc[j][t]);
            }
#else
            const __m256i signed_code = _mm256_xor_si256(code, _mm256_set1_epi8((char)0x80));
            const __m256i mag = _mm256_abs_epi8(signed_code);
            for (int j = 0; j < nc; j++) {
                const __m256i sum = gr_dot4_signed(_mm256_setzero_si256(), mag, signed_code, y[j][b].qs + 4 * t);
                acc[j][t] = _mm256_fmadd_ps(d[j], _mm256_cvtepi32_ps(sum), acc[j][t]);
            }
#endif
        }
    }
    gr_store_folds(s, bs, acc, nc);
}
GR_DEFINE_GEMM8_BY_PAIRS(q8_0x8, block_q8_0)

/* Q5_0, llama.cpp's lane arithmetic as Q8_0's.  A code is n + 16 f - 16
 * (n its nibble, f its fifth bit): the integer product takes the unsigned
 * n + 16 f (< 32) against the activation, and the -16 comes off through the
 * start, -16 x the activation's 4-element sums (pe_q8_0_scales).  The fifth
 * bits are stored by lane (block_q5_0x8): each lane's word is the byte mask
 * of its codes, as a file row's qh is of its (gm_fifth_row).  They cost
 * enough that unpacked tiles win past 32 activation rows (rows8.cols; one
 * thread, 1024 x 1536, 48 rows: 1308 us here, ~1140 unpacked). */
GM_INLINE void gemm8_q5_0x8_cols(int64_t n, float *s, size_t bs, const block_q5_0x8 *x,
                                 const block_q8_0 *const y[2], const int nc, int pass, int passes) {
    const pe_q8_0_scales *sc[2];
    __m256 acc[2][8];
    gr_q8_0_pass(n, y, nc, sc, acc);
    for (int64_t b = 0; b < n / QK5_0; b++) {
        gr_prefetch(x, sizeof *x, b, n / QK5_0, pass, passes);
        __m256i code[8];
        gr_nibbles(x[b].qs, code);
        const __m256 dw = _mm256_cvtph_ps(gm_load128(x[b].d));
        __m256 d[2];
        gr_block_d(dw, sc, b, nc, d);
        for (int t = 0; t < 8; t++) {
            const __m256i u = gm_fifth_row(code[t], x[b].qh[t], 0);   /* n + 16 f */
            for (int j = 0; j < nc; j++) {
                const __m256i sum = gr_dot4(_mm256_set1_epi32(sc[j][b].start5[t]), u, y[j][b].qs + 4 * t);
                acc[j][t] = _mm256_fmadd_ps(d[j], _mm256_cvtepi32_ps(sum), acc[j][t]);
            }
        }
    }
    gr_store_folds(s, bs, acc, nc);
}
GR_DEFINE_GEMM8_BY_PAIRS(q5_0x8, block_q8_0)

/* pe_mxfp4_scale of 8 rows' exponents, lane by lane: (e - 1) << 23 as float
 * bits, the subnormals 2^-128 and 2^-127 for e 0 and 1 */
static inline __m256 gr_mxfp4_scales(const uint8_t e[8]) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(x, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), x);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), x)));
}

/* MXFP4's levels + 16 by code (pe_mxfp4_values), in both 128-bit halves:
 * unsigned, < 32, for the integer product */
static inline __m256i gr_mxfp4_grid16(void) {
    return _mm256_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4,
                            16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4);
}

/* One block of 8 MXFP4 rows against one activation row's block, into lane
 * accumulators acc[8] (one of the two sets of its vec_dot) */
GM_INLINE void gr_mxfp4_block(const block_mxfp4x8 *x, const block_q8_0 *y, const pe_q8_0_scales *sc, __m256i grid,
                              __m256 acc[8]) {
    __m256i code[8];
    gr_nibbles(x->qs, code);
    const __m256 d = _mm256_mul_ps(gr_mxfp4_scales(x->e), _mm256_broadcast_ss(&sc->d));
    for (int t = 0; t < 8; t++) {
        const __m256i level16 = _mm256_shuffle_epi8(grid, code[t]);
        const __m256i sum = gr_dot4(_mm256_set1_epi32(sc->start5[t]), level16, y->qs + 4 * t);
        acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc[t]);
    }
}

/* MXFP4 (block_mxfp4x8) in its vec_dot's arithmetic (ref_iq4.c): per block
 * the 8 exact integer lanes, acc = fma(dw * da, lanes, acc) into the set of
 * the block's parity (blocks 0, 2, ... and 1, 3, ...), the two sets added
 * lane by lane, then folded.  A code's level comes by table lookup as level
 * + 16 (gr_mxfp4_grid16), and the +16 comes off through the start, -16 x the
 * activation's 4-element sums (pe_q8_0_scales' start5).  One activation
 * row a pass: the two sets' 16 accumulators and 8 code vectors fill the
 * registers of AVX-512 (AVX2's 16 spill some; its kernel still takes 0.42-0.54
 * ms where the row kernel takes 0.68-0.78, gpt-oss's 4 experts of 2880 x 2880). */
GM_INLINE void gemm8_mxfp4x8_col(int64_t n, float *s, const block_mxfp4x8 *x, const block_q8_0 *y, int pass,
                                 int passes) {
    const int64_t nb = n / QK_MXFP4;
    const pe_q8_0_scales *sc = gm_q8_0_scales(y, n);
    const __m256i grid = gr_mxfp4_grid16();
    __m256 even[8], odd[8];
    for (int t = 0; t < 8; t++) even[t] = odd[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        gr_prefetch(x, 2 * sizeof *x, b / 2, nb / 2, pass, passes);
        gr_mxfp4_block(x + b, y + b, sc + b, grid, even);
        gr_mxfp4_block(x + b + 1, y + b + 1, sc + b + 1, grid, odd);
    }
    if (b < nb) gr_mxfp4_block(x + b, y + b, sc + b, grid, even);
    for (int t = 0; t < 8; t++) even[t] = _mm256_add_ps(even[t], odd[t]);
    _mm256_storeu_ps(s, gr_fold8(even));
}

/* gemm8 over a kernel taking the activation rows one at a time (NAME##_col),
 * prefetching at the pace of the kernels that take two */
#define GR_DEFINE_GEMM8_BY_ONE(NAME)                                                                      \
    static void gemm8_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a,    \
                             size_t ba, int nc) {                                                         \
        (void)bw;                                                                                         \
        for (int j = 0; j < nc; j++)                                                                      \
            gemm8_##NAME##_col(n, s + (size_t)j * bs, w, (const block_q8_0 *)((const uint8_t *)a + (size_t)j * ba), \
                               j / 2, (nc + 1) / 2);                                                      \
    }
GR_DEFINE_GEMM8_BY_ONE(mxfp4x8)

/* gemm8 (FN) over a kernel whose column count is a compile-time constant;
 * the arguments after the first extra one (left empty) follow the count */
#define GR_DEFINE_GEMM8_BY_COLS_WITH(FN, NAME, XB, ...)                                                   \
    static void FN(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba,   \
                   int nc) {                                                                              \
        (void)bw;                                                                                         \
        switch (nc) {                                                                                     \
        case 1: gemm8_##NAME##_n(n, s, bs, (const XB *)w, a, ba, 1 __VA_ARGS__); break;                   \
        case 2: gemm8_##NAME##_n(n, s, bs, (const XB *)w, a, ba, 2 __VA_ARGS__); break;                   \
        case 3: gemm8_##NAME##_n(n, s, bs, (const XB *)w, a, ba, 3 __VA_ARGS__); break;                   \
        default: gemm8_##NAME##_n(n, s, bs, (const XB *)w, a, ba, 4 __VA_ARGS__); break;                  \
        }                                                                                                 \
    }
#define GR_DEFINE_GEMM8_BY_COLS(NAME, XB) GR_DEFINE_GEMM8_BY_COLS_WITH(gemm8_##NAME, NAME, XB, )


/* The 6-bit scale (or, from word 1 instead of 0, min) of sub-block k of 8
 * rows, lane by lane from the words of their packed scales (block_q4_Kx8),
 * as pe_k4_scale_min unpacks one row's */
static inline __m256i gr_q4k_six_bits(int k, __m256i word01, __m256i word2, int high) {
    if (k < 4) return _mm256_and_si256(_mm256_srli_epi32(word01, 8 * k), _mm256_set1_epi32(63));
    const __m256i low = _mm256_and_si256(_mm256_srli_epi32(word2, 8 * (k - 4) + 4 * high), _mm256_set1_epi32(15));
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(word01, 8 * (k - 4) + 6), _mm256_set1_epi32(3));
    return _mm256_or_si256(low, _mm256_slli_epi32(top, 4));
}

/* Q4_K as llama.cpp's repacked product computes it (x86_gemm_kquants.h,
 * gmk_q4k_step): per super-block the integer sum, sum_k scale_k * (codes . a
 * over sub-block k), and the min term's, sum_k min_k * (a's sum over
 * sub-block k), each multiply-added into one float (d = dw * da, dmin =
 * dminw * da), the result 0 + (whole - mins), added per super-block (its
 * row product, GEMV).  Past 16 activation rows the
 * unpacked tiles, decoding a super-block once for many rows, win
 * (rows8.cols): one thread, a 1024 x 1536 product, this kernel against
 * unpacking: 4 rows 76 against 130 us, 8 151 / 175, 16 303 / 327, 24 ~440 /
 * ~420, 32 ~590 / ~515. */
GM_INLINE void gemm8_q4_Kx8_n(int64_t n, float *s, size_t bs, const block_q4_Kx8 *x, const uint8_t *a,
                              size_t ba, const int nc) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 whole[4], mins[4];
    for (int j = 0; j < nc; j++) whole[j] = mins[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        gr_prefetch_run(x, (size_t)b * sizeof *x, sizeof *x);
        const __m256i word0 = gm_load256(x[b].scales[0]), word1 = gm_load256(x[b].scales[1]);
        const __m256i word2 = gm_load256(x[b].scales[2]);
        const __m256 dw = _mm256_cvtph_ps(gm_load128(x[b].d)), dminw = _mm256_cvtph_ps(gm_load128(x[b].dmin));
        __m256 d[4], dmin[4];
        __m256i total[4], mins_total[4];
        for (int j = 0; j < nc; j++) {
            const __m256 da = _mm256_set1_ps(((const block_q8_K *)(a + (size_t)j * ba) + b)->d);
            d[j] = _mm256_mul_ps(dw, da);
            dmin[j] = _mm256_mul_ps(dminw, da);
            total[j] = mins_total[j] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) {   /* chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            __m256i lo[8], hi[8];
            for (int g = 0; g < 8; g++) {
                const __m256i q = gm_load256(x[b].qs[c][g]);
                lo[g] = _mm256_and_si256(q, low4);
                hi[g] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            }
            const __m256i scale_lo = gr_q4k_six_bits(2 * c, word0, word2, 0);
            const __m256i scale_hi = gr_q4k_six_bits(2 * c + 1, word0, word2, 0);
            const __m256i min_lo = gr_q4k_six_bits(2 * c, word1, word2, 1);
            const __m256i min_hi = gr_q4k_six_bits(2 * c + 1, word1, word2, 1);
            for (int j = 0; j < nc; j++) {
                const block_q8_K *y = (const block_q8_K *)(a + (size_t)j * ba) + b;
                const int8_t *q = y->qs + 64 * c;
                __m256i sum_lo = _mm256_setzero_si256(), sum_hi = _mm256_setzero_si256();
                for (int g = 0; g < 8; g++) {
                    sum_lo = gr_dot4(sum_lo, lo[g], q + 4 * g);
                    sum_hi = gr_dot4(sum_hi, hi[g], q + 32 + 4 * g);
                }
                const __m256i part = _mm256_add_epi32(_mm256_mullo_epi32(sum_lo, scale_lo),
                                                      _mm256_mullo_epi32(sum_hi, scale_hi));
                const int16_t *bs16 = y->bsums + 4 * c;   /* 16-element sums: 4 per 64 elements */
                const __m256i part_mins =
                    _mm256_add_epi32(_mm256_mullo_epi32(min_lo, _mm256_set1_epi32(bs16[0] + bs16[1])),
                                     _mm256_mullo_epi32(min_hi, _mm256_set1_epi32(bs16[2] + bs16[3])));
                total[j] = _mm256_add_epi32(total[j], part);
                mins_total[j] = _mm256_add_epi32(mins_total[j], part_mins);
            }
        }
        for (int j = 0; j < nc; j++) {
            whole[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[j]), d[j], whole[j]);
            mins[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins_total[j]), dmin[j], mins[j]);
        }
    }
    for (int j = 0; j < nc; j++)
        _mm256_storeu_ps(s + (size_t)j * bs, _mm256_add_ps(_mm256_setzero_ps(), _mm256_sub_ps(whole[j], mins[j])));
}

GR_DEFINE_GEMM8_BY_COLS(q4_Kx8, block_q4_Kx8)

/* Per lane: the 8 rows' sum over sub-blocks of scale x the activations' sum
 * (bsums), the codes' offset of 32 taken off as 32 times this: scales of
 * sub-blocks 2i, 2i + 1 as a 16-bit pair against the activations' pair */
GM_INLINE __m256i gr_q6k_offsets(const block_q6_Kx8 *x, const block_q8_K *y) {
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < QK_K / 32; i++) {
        const __m256i pair = gmk_q6k_x8_scale_pairs(x->scales + 2 * i);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pair, _mm256_set1_epi32((int)gm_u32(y->bsums + 2 * i))));
    }
    return _mm256_slli_epi32(sum, 5);
}

/* Q6_K (block_q6_Kx8) in its row product's arithmetic (ref_kquants.c's
 * vec_dot_q6_K): per super-block and row one exact integer, the unsigned
 * codes' (0..63) products scaled per 16-element sub-block less the offset
 * term, whole = fma(total, dw * da, whole), the result 0 + whole.  Two
 * groups of a sub-block add up in 16 bits (2 x 2 x 63 x 127 < 2^15) and
 * meet the scale in one madd.  Against the file's rows (gemm_pairs_q6_K) no
 * scale spreading, horizontal sums or scalar steps per row, where Q6_K had
 * streamed at 0.7x Q4_K's rate (a Q4_K_M file's tied output, attn_v and half
 * its ffn_down are Q6_K).  Zen 3 (AVX2), 4096 x 14336, one activation row:
 * 1 thread 3.58 -> 2.16 ms, 2 threads 1.78 -> 0.99; Llama-3.2-1B's
 * generation 31.7 -> 39.9 tokens/s. */
GM_INLINE void gemm8_q6_Kx8_n(int64_t n, float *s, size_t bs, const block_q6_Kx8 *x, const uint8_t *a,
                              size_t ba, const int nc) {
    __m256 whole[4];
    for (int j = 0; j < nc; j++) whole[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        gr_prefetch_run(x, (size_t)b * sizeof *x, sizeof *x);
        const block_q8_K *y[4];
        __m256i total[4];
        for (int j = 0; j < nc; j++) {
            y[j] = (const block_q8_K *)(a + (size_t)j * ba) + b;
            total[j] = _mm256_sub_epi32(_mm256_setzero_si256(), gr_q6k_offsets(x + b, y[j]));
        }
        for (int h = 0; h < 2; h++)
            for (int tp = 0; tp < 4; tp++) {   /* groups 2tp, 2tp + 1: sub-blocks 2k + tp / 2 of chunks k = 4h + i */
                __m256i code[2][4], sc[4];
                gmk_q6k_x8_codes(x[b].qs[h][2 * tp], code[0]);
                gmk_q6k_x8_codes(x[b].qs[h][2 * tp + 1], code[1]);
                for (int i = 0; i < 4; i++) sc[i] = gmk_q6k_x8_scale(x[b].scales[2 * (4 * h + i) + tp / 2]);
                for (int j = 0; j < nc; j++)
                    for (int i = 0; i < 4; i++) {
                        const int8_t *q = y[j]->qs + 32 * (4 * h + i) + 8 * tp;
                        const __m256i pair = _mm256_add_epi16(
                            _mm256_maddubs_epi16(code[0][i], _mm256_set1_epi32((int)gm_u32(q))),
                            _mm256_maddubs_epi16(code[1][i], _mm256_set1_epi32((int)gm_u32(q + 4))));
                        total[j] = _mm256_add_epi32(total[j], _mm256_madd_epi16(pair, sc[i]));
                    }
            }
        const __m256 dw = _mm256_cvtph_ps(gm_load128(x[b].d));
        for (int j = 0; j < nc; j++)
            whole[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[j]), _mm256_mul_ps(dw, _mm256_set1_ps(y[j]->d)), whole[j]);
    }
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(s + (size_t)j * bs, _mm256_add_ps(_mm256_setzero_ps(), whole[j]));
}

GR_DEFINE_GEMM8_BY_COLS(q6_Kx8, block_q6_Kx8)

/* Q4_K's limit (rows8.cols), measured as above on Zen 4 for AVX2.  AVX-VNNI's
 * (Intel's cores) keeps up with the unpacked tiles to ~64 rows: Intel VM, two
 * threads, a 1536 x 1024 product, 32 rows 382 against 512 us, 48 572 / 654,
 * 64 795 / 808 (640 x 2048 alike). */
#if defined(PE_GEMM_AVXVNNI)
#define GR_Q4_K_COLS 48
#else
#define GR_Q4_K_COLS 16
#endif
/* Q6_K's: Zen 3, two threads, 2048 x 8192, this kernel against the packed
 * tiles: 16 rows 2.19 against 3.03-3.74 ms, 24 3.29 / 3.96-5.44, 32 4.42 /
 * 4.31, 48 6.44 / 6.31 */
#define GR_Q6_K_COLS 32

#define GR_INSTALL_ALL(k)                                   \
    do {                                                    \
        (k)->type[PE_TYPE_Q4_1_X8].rows8.gemm8 = gemm8_q4_1x8; \
        (k)->type[PE_TYPE_Q4_1_X8].rows8.scales = 1;        \
        (k)->type[PE_TYPE_Q4_K_X8].rows8.gemm8 = gemm8_q4_Kx8; \
        (k)->type[PE_TYPE_Q4_K_X8].rows8.cols = GR_Q4_K_COLS; \
        (k)->type[PE_TYPE_Q8_0_X8].rows8.gemm8 = gemm8_q8_0x8; \
        (k)->type[PE_TYPE_Q8_0_X8].rows8.scales = 1;        \
        (k)->type[PE_TYPE_Q5_0_X8].rows8.gemm8 = gemm8_q5_0x8; \
        (k)->type[PE_TYPE_Q5_0_X8].rows8.scales = 1;        \
        (k)->type[PE_TYPE_Q5_0_X8].rows8.cols = 32;          \
        (k)->type[PE_TYPE_MXFP4_X8].rows8.gemm8 = gemm8_mxfp4x8; \
        (k)->type[PE_TYPE_MXFP4_X8].rows8.scales = 1;       \
        (k)->type[PE_TYPE_MXFP4_X8].rows8.cols = 32; \
        (k)->type[PE_TYPE_Q6_K_X8].rows8.gemm8 = gemm8_q6_Kx8; \
        (k)->type[PE_TYPE_Q6_K_X8].rows8.cols = GR_Q6_K_COLS; \
    } while (0)

#endif /* PE_X86_GEMM_ROWS8_H */
