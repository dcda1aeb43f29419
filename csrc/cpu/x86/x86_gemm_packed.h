/* x86_gemm_packed.h - prompt tiles on 16 packed weight rows: Q4_K and Q6_K,
 * and at the end the legacy types Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
 * (include x86_gemm_kquants.h's pieces first; see pack16 in kernels.h).
 *
 * A prompt tile's 16 weight rows are copied once into lanes: group g (4
 * bytes) of a 32-element chunk of row r sits at [chunk][g][r], so one load
 * holds that group of every row, and an integer dot product against the
 * activation group broadcast to all lanes gives the rows' sums in their own
 * lanes: no shuffles, no horizontal sums.  AVX-512 takes the 16 rows in one
 * vector with vpdpbusd; AVX2 takes 8 at a time with maddubs (16-bit sums of
 * up to 8 Q4_K groups or 2 Q6_K groups cannot overflow) and madd, AVX-VNNI
 * with its vpdpbusd.  The integer totals are exact however they are
 * grouped, and the float steps are those of gmk_q4k_step / gmk_q6_step,
 * per pair, in the lanes, so a result equals vec_dot's bit for bit. */
#ifndef PE_X86_GEMM_PACKED_H
#define PE_X86_GEMM_PACKED_H

/* ---- layouts ------------------------------------------------------------------------------ */

/* Q4_K: codes by chunk c (sub-blocks 2c low nibbles, 2c + 1 high) and
 * group; scales unpacked; the mins of sub-blocks 2c, 2c + 1 as one 16-bit
 * pair (for madd against the activations' pair of sub-block sums); d and
 * dmin as floats. */
typedef struct {
    uint32_t qs[4][8][16];
    int32_t  sc[8][16];
    int32_t  mn[4][16];    /* m[2c] | m[2c + 1] << 16 */
    float    d[16], dmin[16];
} gmk_q4k_x16;

/* Q6_K: codes decoded (0..63) by chunk k and group t (sub-block 2k + t / 4);
 * the scale of each 16-element sub-block twice, as a 16-bit pair (AVX2's
 * madd of a group's two 16-bit product sums; AVX-512 takes the upper copy
 * as a 32-bit multiplier); and -32 x the scales of sub-blocks 2i, 2i + 1 as
 * a 16-bit pair, whose multiply-add with the activations' pair of sub-block
 * sums takes the codes' offset of 32 off. */
typedef struct {
    uint32_t q[8][8][16];
    int32_t  sc2[16][16];  /* scale j | scale j << 16 */
    int32_t  off[8][16];   /* -32 scale 2i | -32 scale 2i + 1 << 16 */
    float    d[16];
} gmk_q6k_x16;

static inline int32_t gmk_pair16(int lo, int hi) {
    return (int32_t)((uint32_t)(uint16_t)(int16_t)lo | (uint32_t)(uint16_t)(int16_t)hi << 16);
}

static size_t gmk_q4k_pack16(int64_t n, const void *w, size_t bw, void *dst) {
    const int64_t nsb = n / QK_K;
    if (!dst) return (size_t)nsb * sizeof(gmk_q4k_x16);
    gmk_q4k_x16 *out = dst;
    for (int64_t ib = 0; ib < nsb; ib++)
        for (int r = 0; r < 16; r++) {
            const block_q4_K *x = (const block_q4_K *)((const uint8_t *)w + (size_t)r * bw) + ib;
            for (int c = 0; c < 4; c++)
                for (int g = 0; g < 8; g++) out[ib].qs[c][g][r] = gm_u32(x->qs + 32 * c + 4 * g);
            uint8_t sc[8], mn[8];
            for (int j = 0; j < 8; j++) {
                pe_k4_scale_min(j, x->scales, &sc[j], &mn[j]);
                out[ib].sc[j][r] = sc[j];
            }
            for (int c = 0; c < 4; c++) out[ib].mn[c][r] = gmk_pair16(mn[2 * c], mn[2 * c + 1]);
            out[ib].d[r] = f16(x->d);
            out[ib].dmin[r] = f16(x->dmin);
        }
    return (size_t)nsb * sizeof(gmk_q4k_x16);
}

/* gmk_q4k_pack16's copy of 16 rows held interleaved (two groups of
 * block_q4_Kx8, the second at w + 8 bw), without writing them out as rows
 * first: a group's 4-byte code groups already sit 8 rows side by side, and
 * its packed scales by 4-byte word, so the 6-bit scales and mins come out
 * of 8 rows at once by shifts (pe_k4_scale_min's bits). */
static size_t gmk_q4k_pack16_x8(int64_t n, const void *w, size_t bw, void *dst) {
    const int64_t nsb = n / QK_K;
    if (!dst) return (size_t)nsb * sizeof(gmk_q4k_x16);
    gmk_q4k_x16 *out = dst;
    const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3);
    for (int64_t ib = 0; ib < nsb; ib++)
        for (int h = 0; h < 2; h++) {
            const block_q4_Kx8 *x = (const block_q4_Kx8 *)((const uint8_t *)w + (size_t)h * 8 * bw) + ib;
            for (int c = 0; c < 4; c++)
                for (int g = 0; g < 8; g++)
                    _mm256_storeu_si256((__m256i *)(out[ib].qs[c][g] + 8 * h), gm_load256(x->qs[c][g]));
            /* word v of each row: bytes 4v .. 4v + 3 of its 12 scale bytes */
            const __m256i w0 = gm_load256(x->scales[0]), w1 = gm_load256(x->scales[1]), w2 = gm_load256(x->scales[2]);
            __m256i sc[8], mn[8];
            for (int j = 0; j < 4; j++) {
                const __m256i lo = _mm256_srli_epi32(w0, 8 * j), mid = _mm256_srli_epi32(w1, 8 * j);
                const __m256i hi = _mm256_srli_epi32(w2, 8 * j);
                sc[j] = _mm256_and_si256(lo, m6);
                mn[j] = _mm256_and_si256(mid, m6);
                sc[j + 4] = _mm256_or_si256(_mm256_and_si256(hi, m4),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(lo, 6), m2), 4));
                mn[j + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(hi, 4), m4),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(mid, 6), m2), 4));
            }
            for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(out[ib].sc[j] + 8 * h), sc[j]);
            for (int c = 0; c < 4; c++)
                _mm256_storeu_si256((__m256i *)(out[ib].mn[c] + 8 * h),
                                    _mm256_or_si256(mn[2 * c], _mm256_slli_epi32(mn[2 * c + 1], 16)));
            _mm256_storeu_ps(out[ib].d + 8 * h, _mm256_cvtph_ps(gm_load128(x->d)));
            _mm256_storeu_ps(out[ib].dmin + 8 * h, _mm256_cvtph_ps(gm_load128(x->dmin)));
        }
    return (size_t)nsb * sizeof(gmk_q4k_x16);
}

/* r[i] = row i of an 8 x 8 matrix of 32-bit elements in, column i out */
static inline void gmk_transpose8x8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);       /* rows 2i, 2i + 1: columns 0 1 | 4 5 */
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);   /* columns 2 3 | 6 7 */
    }
    for (int i = 0; i < 2; i++) {   /* rows 4i .. 4i + 3: column c | c + 4 in u[4i + c] */
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        r[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

/* The 16 rows decoded first, then each chunk's groups of 8 rows moved into
 * lanes by an 8 x 8 transpose of 4-byte groups (a prompt tile packs its rows
 * anew for every 256 columns: group by group this took half as long as the
 * tile's products at Llama-3.1-8B's ffn_down). */
static size_t gmk_q6k_pack16(int64_t n, const void *w, size_t bw, void *dst) {
    const int64_t nsb = n / QK_K;
    if (!dst) return (size_t)nsb * sizeof(gmk_q6k_x16);
    gmk_q6k_x16 *out = dst;
    for (int64_t ib = 0; ib < nsb; ib++) {
        __m256i codes[8][16];   /* [chunk][row] */
        for (int r = 0; r < 16; r++) {
            const block_q6_K *x = (const block_q6_K *)((const uint8_t *)w + (size_t)r * bw) + ib;
            gmk_block b;
            gmk_q6_decode(x, &b);
            for (int k = 0; k < 8; k++) codes[k][r] = b.codes[k];
            for (int j = 0; j < 16; j++) out[ib].sc2[j][r] = gmk_pair16(x->scales[j], x->scales[j]);
            for (int i = 0; i < 8; i++) out[ib].off[i][r] = gmk_pair16(-32 * x->scales[2 * i], -32 * x->scales[2 * i + 1]);
            out[ib].d[r] = f16(x->d);
        }
        for (int k = 0; k < 8; k++)
            for (int h = 0; h < 2; h++) {
                __m256i *rows = codes[k] + 8 * h;
                gmk_transpose8x8(rows);
                for (int t = 0; t < 8; t++) _mm256_storeu_si256((__m256i *)(out[ib].q[k][t] + 8 * h), rows[t]);
            }
    }
    return (size_t)nsb * sizeof(gmk_q6k_x16);
}

/* Group t of chunks 4h .. 4h + 3 of 8 Q6_K rows (block_q6_Kx8's three
 * pieces): each piece's low 6 bits, and the top two bits of the three
 * gathered into the fourth chunk's codes (16-bit shifts of masked bytes: no
 * bit crosses into the next byte). */
static inline void gmk_q6k_x8_codes(const uint8_t pieces[3][8][4], __m256i code[4]) {
    const __m256i low6 = _mm256_set1_epi8(63), top2 = _mm256_set1_epi8((char)0xC0);
    __m256i p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = gm_load256(pieces[i]);
        code[i] = _mm256_and_si256(p[i], low6);
    }
    code[3] = _mm256_or_si256(_mm256_or_si256(_mm256_srli_epi16(_mm256_and_si256(p[0], top2), 6),
                                              _mm256_srli_epi16(_mm256_and_si256(p[1], top2), 4)),
                              _mm256_srli_epi16(_mm256_and_si256(p[2], top2), 2));
}

/* A sub-block's scales of 8 rows, each row's in both 16-bit halves of its
 * lane (the madd operand of a pair sum) */
static inline __m256i gmk_q6k_x8_scale(const int8_t scales[8]) {
    const __m128i x = _mm_loadl_epi64((const __m128i *)scales);
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, x));
}

/* The scales of sub-blocks 2i, 2i + 1 of 8 rows as a 16-bit pair per lane
 * (scales[0] and scales[1]: theirs) */
static inline __m256i gmk_q6k_x8_scale_pairs(const int8_t scales[2][8]) {
    const __m128i two = gm_load128(scales);
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(two, _mm_srli_si128(two, 8)));
}

/* gmk_q6k_pack16's copy of 16 rows held interleaved (two groups of
 * block_q6_Kx8, the second at w + 8 bw): a group's codes come out 8 rows
 * side by side, as the pack lays them, and its scales by sub-block. */
static size_t gmk_q6k_pack16_x8(int64_t n, const void *w, size_t bw, void *dst) {
    const int64_t nsb = n / QK_K;
    if (!dst) return (size_t)nsb * sizeof(gmk_q6k_x16);
    gmk_q6k_x16 *out = dst;
    for (int64_t ib = 0; ib < nsb; ib++)
        for (int g = 0; g < 2; g++) {
            const block_q6_Kx8 *x = (const block_q6_Kx8 *)((const uint8_t *)w + (size_t)g * 8 * bw) + ib;
            for (int h = 0; h < 2; h++)
                for (int t = 0; t < 8; t++) {
                    __m256i code[4];
                    gmk_q6k_x8_codes(x->qs[h][t], code);
                    for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(out[ib].q[4 * h + i][t] + 8 * g), code[i]);
                }
            for (int j = 0; j < QK_K / 16; j++)
                _mm256_storeu_si256((__m256i *)(out[ib].sc2[j] + 8 * g), gmk_q6k_x8_scale(x->scales[j]));
            for (int i = 0; i < QK_K / 32; i++) {
                const __m256i pair = gmk_q6k_x8_scale_pairs(x->scales + 2 * i);
                _mm256_storeu_si256((__m256i *)(out[ib].off[i] + 8 * g),
                                    _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(pair, 5)));
            }
            _mm256_storeu_ps(out[ib].d + 8 * g, _mm256_cvtph_ps(gm_load128(x->d)));
        }
    return (size_t)nsb * sizeof(gmk_q6k_x16);
}

/* the activations' sums over sub-blocks 2c and 2c + 1, as one 16-bit pair
 * per chunk c */
static inline void gmk_bsum_pairs(const block_q8_K *a, int32_t out[4]) {
    /* four sums of two by madd, then packed to 16 bits in order (each below
     * 2 x 16 x 127: no saturation) */
    const __m128i ones = _mm_set1_epi16(1);
    const __m128i lo = _mm_madd_epi16(gm_load128(a->bsums), ones), hi = _mm_madd_epi16(gm_load128(a->bsums + 8), ones);
    _mm_storeu_si128((__m128i *)out, _mm_packs_epi32(lo, hi));
}

/* ---- column kernels: 16 packed rows against up to 4 activation rows y[0..3] ------------ */

#if defined(PE_GEMM_VNNI)
/* Q4_K, per super-block as gmk_q4k_step */
static void gmk_q4k_x16_cols(const gmk_q4k_x16 *w, int64_t nsb, float *s, size_t bs, const block_q8_K *const y[4],
                             int nc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 whole[4], whole_mins[4];
    for (int j = 0; j < 4; j++) whole[j] = whole_mins[j] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const gmk_q4k_x16 *p = w + ib;
        const __m512 dw = _mm512_loadu_ps(p->d), dmw = _mm512_loadu_ps(p->dmin);
        int32_t bp[4][4];
        __m512i sb_tot[4], sb_mins[4];
        for (int j = 0; j < 4; j++) {
            gmk_bsum_pairs(y[j] + ib, bp[j]);
            sb_tot[j] = sb_mins[j] = _mm512_setzero_si512();
        }
        for (int c = 0; c < 4; c++) {
            __m512i lo[4], hi[4];
            for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                const __m512i bits = _mm512_loadu_si512(p->qs[c][g]);
                const __m512i wl = _mm512_and_si512(bits, m4), wh = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
                for (int j = 0; j < 4; j++) {
                    const int8_t *a = y[j][ib].qs + 64 * c + 4 * g;
                    lo[j] = _mm512_dpbusd_epi32(lo[j], wl, _mm512_set1_epi32((int)gm_u32(a)));
                    hi[j] = _mm512_dpbusd_epi32(hi[j], wh, _mm512_set1_epi32((int)gm_u32(a + 32)));
                }
            }
            const __m512i sc_lo = _mm512_loadu_si512(p->sc[2 * c]), sc_hi = _mm512_loadu_si512(p->sc[2 * c + 1]);
            const __m512i mn = _mm512_loadu_si512(p->mn[c]);
            for (int j = 0; j < 4; j++) {
                const __m512i tot = _mm512_add_epi32(_mm512_mullo_epi32(lo[j], sc_lo), _mm512_mullo_epi32(hi[j], sc_hi));
                const __m512i mins = _mm512_madd_epi16(mn, _mm512_set1_epi32(bp[j][c]));
                sb_tot[j] = _mm512_add_epi32(sb_tot[j], tot);
                sb_mins[j] = _mm512_add_epi32(sb_mins[j], mins);
            }
        }
        for (int j = 0; j < 4; j++) {
            const __m512 da = _mm512_set1_ps(y[j][ib].d);
            whole[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_tot[j]), _mm512_mul_ps(dw, da), whole[j]);
            whole_mins[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_mins[j]), _mm512_mul_ps(dmw, da), whole_mins[j]);
        }
    }
    for (int j = 0; j < nc; j++) _mm512_storeu_ps(s + (size_t)j * bs, _mm512_sub_ps(whole[j], whole_mins[j]));
}

/* Q4_K over two packs of 16 rows (32 rows, w0 and w1) against up to
 * GMK_X32_COLS activation rows, each as gmk_q4k_x16_cols: every broadcast
 * activation group serves two weight vectors, so the loads and broadcasts
 * per vpdpbusd are half those of 16 rows (one thread, 3072-element rows, 240
 * columns in cache: 610 -> 775 GOP/s; four columns would want more than 32
 * registers, and gcc spills them). */
#define GMK_X32_COLS 3
static void gmk_q4k_x32_cols(const gmk_q4k_x16 *w0, const gmk_q4k_x16 *w1, int64_t nsb, float *s, size_t bs,
                             const block_q8_K *const y[GMK_X32_COLS], int nc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 whole[2][GMK_X32_COLS], whole_mins[2][GMK_X32_COLS];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < GMK_X32_COLS; j++) whole[h][j] = whole_mins[h][j] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const gmk_q4k_x16 *p[2] = {w0 + ib, w1 + ib};
        int32_t bp[GMK_X32_COLS][4];
        __m512i sb_tot[2][GMK_X32_COLS], sb_mins[2][GMK_X32_COLS];
        for (int j = 0; j < GMK_X32_COLS; j++) {
            gmk_bsum_pairs(y[j] + ib, bp[j]);
            for (int h = 0; h < 2; h++) sb_tot[h][j] = sb_mins[h][j] = _mm512_setzero_si512();
        }
        for (int c = 0; c < 4; c++) {
            __m512i lo[2][GMK_X32_COLS], hi[2][GMK_X32_COLS];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < GMK_X32_COLS; j++) lo[h][j] = hi[h][j] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                __m512i wl[2], wh[2];
                for (int h = 0; h < 2; h++) {
                    const __m512i bits = _mm512_loadu_si512(p[h]->qs[c][g]);
                    wl[h] = _mm512_and_si512(bits, m4);
                    wh[h] = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
                }
                for (int j = 0; j < GMK_X32_COLS; j++) {
                    const int8_t *a = y[j][ib].qs + 64 * c + 4 * g;
                    const __m512i al = _mm512_set1_epi32((int)gm_u32(a)), ah = _mm512_set1_epi32((int)gm_u32(a + 32));
                    for (int h = 0; h < 2; h++) {
                        lo[h][j] = _mm512_dpbusd_epi32(lo[h][j], wl[h], al);
                        hi[h][j] = _mm512_dpbusd_epi32(hi[h][j], wh[h], ah);
                    }
                }
            }
            for (int h = 0; h < 2; h++) {
                const __m512i sc_lo = _mm512_loadu_si512(p[h]->sc[2 * c]), sc_hi = _mm512_loadu_si512(p[h]->sc[2 * c + 1]);
                const __m512i mn = _mm512_loadu_si512(p[h]->mn[c]);
                for (int j = 0; j < GMK_X32_COLS; j++) {
                    const __m512i tot = _mm512_add_epi32(_mm512_mullo_epi32(lo[h][j], sc_lo),
                                                         _mm512_mullo_epi32(hi[h][j], sc_hi));
                    sb_tot[h][j] = _mm512_add_epi32(sb_tot[h][j], tot);
                    sb_mins[h][j] = _mm512_add_epi32(sb_mins[h][j], _mm512_madd_epi16(mn, _mm512_set1_epi32(bp[j][c])));
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m512 dw = _mm512_loadu_ps(p[h]->d), dmw = _mm512_loadu_ps(p[h]->dmin);
            for (int j = 0; j < GMK_X32_COLS; j++) {
                const __m512 da = _mm512_set1_ps(y[j][ib].d);
                whole[h][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_tot[h][j]), _mm512_mul_ps(dw, da), whole[h][j]);
                whole_mins[h][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_mins[h][j]), _mm512_mul_ps(dmw, da), whole_mins[h][j]);
            }
        }
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < nc; j++)
            _mm512_storeu_ps(s + (size_t)j * bs + 16 * h, _mm512_sub_ps(whole[h][j], whole_mins[h][j]));
}

/* the activations' sums over sub-blocks 2i and 2i + 1, as one 16-bit pair */
static inline __m512i gmk_bsum_pair512(const block_q8_K *a, int i) {
    return _mm512_set1_epi32(gmk_pair16(a->bsums[2 * i], a->bsums[2 * i + 1]));
}

/* Q6_K as its row product (gmk_q6_step): per super-block one exact integer
 * per row and column, sub-block by sub-block (vpdpbusd over its 4 groups,
 * times its scale) and the codes' offset by vpdpwssd; whole = fma(total,
 * dw * da, whole).  `packs` (1 or 2, known at compile time) packs of 16
 * rows, w[h], against 4 activation rows: each broadcast activation group
 * serves every pack (8192 x 3072 x 240, one thread, two packs: 405 GOP/s
 * with a float lane per group, as the rows' product had it, 620-660 so). */
PE_ALWAYS_INLINE void gmk_q6k_packs_cols(const gmk_q6k_x16 *const w[2], const int packs, int64_t nsb, float *s,
                                         size_t bs, const block_q8_K *const y[4], int nc) {
    __m512 whole[2][4];
    for (int h = 0; h < packs; h++)
        for (int j = 0; j < 4; j++) whole[h][j] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const gmk_q6k_x16 *p[2] = {w[0] + ib, w[packs - 1] + ib};
        __m512i tot[2][4];
        for (int h = 0; h < packs; h++)
            for (int j = 0; j < 4; j++) tot[h][j] = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++)
            for (int h = 0; h < packs; h++) {
                const __m512i off = _mm512_loadu_si512(p[h]->off[i]);
                for (int j = 0; j < 4; j++) tot[h][j] = _mm512_dpwssd_epi32(tot[h][j], off, gmk_bsum_pair512(y[j] + ib, i));
            }
        for (int sb = 0; sb < 16; sb++) {
            const int k = sb / 2, t0 = 4 * (sb % 2);
            __m512i sum[2][4];
            for (int h = 0; h < packs; h++)
                for (int j = 0; j < 4; j++) sum[h][j] = _mm512_setzero_si512();
            for (int t = t0; t < t0 + 4; t++) {
                __m512i codes[2];
                for (int h = 0; h < packs; h++) codes[h] = _mm512_loadu_si512(p[h]->q[k][t]);
                for (int j = 0; j < 4; j++) {
                    const __m512i act = _mm512_set1_epi32((int)gm_u32(y[j][ib].qs + 32 * k + 4 * t));
                    for (int h = 0; h < packs; h++) sum[h][j] = _mm512_dpbusd_epi32(sum[h][j], codes[h], act);
                }
            }
            for (int h = 0; h < packs; h++) {
                const __m512i sc = _mm512_srai_epi32(_mm512_loadu_si512(p[h]->sc2[sb]), 16);
                for (int j = 0; j < 4; j++) tot[h][j] = _mm512_add_epi32(tot[h][j], _mm512_mullo_epi32(sum[h][j], sc));
            }
        }
        for (int h = 0; h < packs; h++) {
            const __m512 dw = _mm512_loadu_ps(p[h]->d);
            for (int j = 0; j < 4; j++)
                whole[h][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[h][j]), _mm512_mul_ps(dw, _mm512_set1_ps(y[j][ib].d)),
                                              whole[h][j]);
        }
    }
    for (int h = 0; h < packs; h++)
        for (int j = 0; j < nc; j++) _mm512_storeu_ps(s + (size_t)j * bs + 16 * h, _mm512_add_ps(whole[h][j], _mm512_setzero_ps()));
}

static void gmk_q6k_x16_cols(const gmk_q6k_x16 *w, int64_t nsb, float *s, size_t bs, const block_q8_K *const y[4],
                             int nc) {
    const gmk_q6k_x16 *const packs[2] = {w, w};
    gmk_q6k_packs_cols(packs, 1, nsb, s, bs, y, nc);
}

static void gmk_q6k_x32_cols(const gmk_q6k_x16 *w0, const gmk_q6k_x16 *w1, int64_t nsb, float *s, size_t bs,
                             const block_q8_K *const y[4], int nc) {
    const gmk_q6k_x16 *const packs[2] = {w0, w1};
    gmk_q6k_packs_cols(packs, 2, nsb, s, bs, y, nc);
}
#else
/* AVX2: rows 8h .. 8h + 7 against nc <= 4 columns in one pass (each load
 * and nibble split of the codes serves the nc columns; 8 accumulators and
 * the codes fill the 16 registers) */
GM_INLINE void gmk_q4k_x8_cols(const gmk_q4k_x16 *w, int64_t nsb, int h, float *s, size_t bs,
                               const block_q8_K *const y[4], const int nc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 whole[4], whole_mins[4];
    for (int j = 0; j < nc; j++) whole[j] = whole_mins[j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const gmk_q4k_x16 *p = w + ib;
        int32_t bp[4][4];
        __m256i sb_tot[4], sb_mins[4];
        for (int j = 0; j < nc; j++) {
            gmk_bsum_pairs(y[j] + ib, bp[j]);
            sb_tot[j] = sb_mins[j] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) {
            __m256i lo[4], hi[4];   /* 16-bit pair sums of up to 8 groups: below 2^15 */
            for (int j = 0; j < nc; j++) lo[j] = hi[j] = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i bits = gm_load256(p->qs[c][g] + 8 * h);
                const __m256i wl = _mm256_and_si256(bits, m4), wh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                for (int j = 0; j < nc; j++) {
                    const int8_t *a = y[j][ib].qs + 64 * c + 4 * g;
                    lo[j] = gm_dot_acc(lo[j], wl, _mm256_set1_epi32((int)gm_u32(a)));
                    hi[j] = gm_dot_acc(hi[j], wh, _mm256_set1_epi32((int)gm_u32(a + 32)));
                    GM_IN_REG(lo[j]);
                    GM_IN_REG(hi[j]);
                }
            }
            const __m256i sc_lo = gm_scale_operand(gm_load256(p->sc[2 * c] + 8 * h));
            const __m256i sc_hi = gm_scale_operand(gm_load256(p->sc[2 * c + 1] + 8 * h));
            const __m256i mn = gm_load256(p->mn[c] + 8 * h);
            for (int j = 0; j < nc; j++) {
                const __m256i tot = _mm256_add_epi32(gm_scaled_total(lo[j], sc_lo), gm_scaled_total(hi[j], sc_hi));
                const __m256i mins = _mm256_madd_epi16(mn, _mm256_set1_epi32(bp[j][c]));
                sb_tot[j] = _mm256_add_epi32(sb_tot[j], tot);
                sb_mins[j] = _mm256_add_epi32(sb_mins[j], mins);
            }
        }
        const __m256 dw = _mm256_loadu_ps(p->d + 8 * h), dmw = _mm256_loadu_ps(p->dmin + 8 * h);
        for (int j = 0; j < nc; j++) {
            const __m256 da = _mm256_set1_ps(y[j][ib].d);
            whole[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb_tot[j]), _mm256_mul_ps(dw, da), whole[j]);
            whole_mins[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb_mins[j]), _mm256_mul_ps(dmw, da), whole_mins[j]);
        }
    }
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(s + (size_t)j * bs + 8 * h, _mm256_sub_ps(whole[j], whole_mins[j]));
}

static void gmk_q4k_x16_cols(const gmk_q4k_x16 *w, int64_t nsb, float *s, size_t bs, const block_q8_K *const y[4],
                             int nc) {
    for (int h = 0; h < 2; h++) switch (nc) {
        case 1: gmk_q4k_x8_cols(w, nsb, h, s, bs, y, 1); break;
        case 2: gmk_q4k_x8_cols(w, nsb, h, s, bs, y, 2); break;
        case 3: gmk_q4k_x8_cols(w, nsb, h, s, bs, y, 3); break;
        default: gmk_q4k_x8_cols(w, nsb, h, s, bs, y, 4); break;
        }
}

/* Q6_K as the AVX-512 kernel above: rows 8h .. 8h + 7 against nc <= 4
 * columns in one pass (each load of the codes serves them all); a group's
 * two 16-bit product sums (codes below 64: below 2^15, and so the sums of
 * two groups) times the sub-block's scale by madd */
GM_INLINE void gmk_q6k_x8_cols(const gmk_q6k_x16 *w, int64_t nsb, int h, float *s, size_t bs,
                               const block_q8_K *const y[4], const int nc) {
    __m256 whole[4];
    for (int j = 0; j < nc; j++) whole[j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const gmk_q6k_x16 *p = w + ib;
        __m256i tot[4];
        for (int j = 0; j < nc; j++) tot[j] = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {   /* each offset pair loaded once for the columns */
            const __m256i off = gm_load256(p->off[i] + 8 * h);
            for (int j = 0; j < nc; j++)
                tot[j] = _mm256_add_epi32(tot[j], _mm256_madd_epi16(off, _mm256_set1_epi32(gmk_pair16(
                                                                          y[j][ib].bsums[2 * i], y[j][ib].bsums[2 * i + 1]))));
        }
        for (int sb = 0; sb < 16; sb++) {
            const int k = sb / 2, t0 = 4 * (sb % 2);
            const __m256i sc2 = gm_load256(p->sc2[sb] + 8 * h);
            for (int t = t0; t < t0 + 4; t += 2) {
                const __m256i q0 = gm_load256(p->q[k][t] + 8 * h), q1 = gm_load256(p->q[k][t + 1] + 8 * h);
                for (int j = 0; j < nc; j++) {
                    const int8_t *a = y[j][ib].qs + 32 * k + 4 * t;
                    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(q0, _mm256_set1_epi32((int)gm_u32(a))),
                                                           _mm256_maddubs_epi16(q1, _mm256_set1_epi32((int)gm_u32(a + 4))));
                    tot[j] = _mm256_add_epi32(tot[j], _mm256_madd_epi16(pairs, sc2));
                    GM_IN_REG(tot[j]);
                }
            }
        }
        const __m256 d = _mm256_loadu_ps(p->d + 8 * h);
        for (int j = 0; j < nc; j++)
            whole[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[j]), _mm256_mul_ps(d, _mm256_set1_ps(y[j][ib].d)), whole[j]);
    }
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(s + (size_t)j * bs + 8 * h, _mm256_add_ps(whole[j], _mm256_setzero_ps()));
}

static void gmk_q6k_x16_cols(const gmk_q6k_x16 *w, int64_t nsb, float *s, size_t bs, const block_q8_K *const y[4],
                             int nc) {
    for (int h = 0; h < 2; h++) switch (nc) {
        case 1: gmk_q6k_x8_cols(w, nsb, h, s, bs, y, 1); break;
        case 2: gmk_q6k_x8_cols(w, nsb, h, s, bs, y, 2); break;
        case 3: gmk_q6k_x8_cols(w, nsb, h, s, bs, y, 3); break;
        default: gmk_q6k_x8_cols(w, nsb, h, s, bs, y, 4); break;
        }
}
#endif

/* ---- gemm16 ------------------------------------------------------------------------------- */

/* columns j0 .. j0 + count - 1 (the last repeated past nc) */
static inline void gmk_cols(const void *a, size_t ba, int j0, int nc, int count, const block_q8_K **y) {
    for (int j = 0; j < count; j++)
        y[j] = (const block_q8_K *)((const uint8_t *)a + (size_t)(j0 + j < nc ? j0 + j : nc - 1) * ba);
}

static void gmk_q6k_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int j0 = 0; j0 < nc; j0 += 4) {
        const block_q8_K *y[4];
        gmk_cols(a, ba, j0, nc, 4, y);
        gmk_q6k_x16_cols(packed, n / QK_K, s + (size_t)j0 * bs, bs, y, nc - j0 < 4 ? nc - j0 : 4);
    }
}

static void gmk_q4k_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int j0 = 0; j0 < nc; j0 += 4) {
        const block_q8_K *y[4];
        gmk_cols(a, ba, j0, nc, 4, y);
        gmk_q4k_x16_cols(packed, n / QK_K, s + (size_t)j0 * bs, bs, y, nc - j0 < 4 ? nc - j0 : 4);
    }
}

#if defined(PE_GEMM_VNNI)
static void gmk_q4k_gemm32(int64_t n, float *s, size_t bs, const void *packed0, const void *packed1, const void *a,
                           size_t ba, int nc) {
    for (int j0 = 0; j0 < nc; j0 += GMK_X32_COLS) {
        const block_q8_K *y[GMK_X32_COLS];
        gmk_cols(a, ba, j0, nc, GMK_X32_COLS, y);
        gmk_q4k_x32_cols(packed0, packed1, n / QK_K, s + (size_t)j0 * bs, bs, y,
                         nc - j0 < GMK_X32_COLS ? nc - j0 : GMK_X32_COLS);
    }
}
static void gmk_q6k_gemm32(int64_t n, float *s, size_t bs, const void *packed0, const void *packed1, const void *a,
                           size_t ba, int nc) {
    for (int j0 = 0; j0 < nc; j0 += 4) {
        const block_q8_K *y[4];
        gmk_cols(a, ba, j0, nc, 4, y);
        gmk_q6k_x32_cols(packed0, packed1, n / QK_K, s + (size_t)j0 * bs, bs, y, nc - j0 < 4 ? nc - j0 : 4);
    }
}
#define GMK_GEMM32_INSTALL(k)                                     \
    do {                                                          \
        (k)->type[PE_TYPE_Q4_K].packed.gemm32 = gmk_q4k_gemm32; \
        (k)->type[PE_TYPE_Q6_K].packed.gemm32 = gmk_q6k_gemm32; \
    } while (0)
#else
#define GMK_GEMM32_INSTALL(k) ((void)(k))
#endif

/* ---- legacy types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 ------------------------------------------------- */

/* A 32-element block of 16 rows: group t (elements 4t..4t+3, the lane t of
 * the legacy arithmetic) of row r at q[t][r], as unsigned codes (Q5_0 and
 * Q8_0 shifted up by 16 and 128; the shift comes off through the dot
 * product's start, -shift * the activations' group sum); d and the _1
 * types' m as floats.  Per pair the lanes are the legacy kernels' (x86_gemm.h)
 * float for float: acc_t = fma(dw * da, sum_t, acc_t), the mins chain
 * m = m + mw * sa, then the halves' sum of the 8 lanes plus m; here a
 * vector holds one lane of many rows, so the scale is one multiply per
 * column and the lanes' sum is seven vector adds. */
typedef struct {
    uint32_t q[8][16];
    float    d[16], m[16];
} gml_x16;

#define GML_DEFINE_PACK16(NAME, WB, ROW, SHIFT, WITH_MIN)                                                  \
    static size_t gml_##NAME##_pack16(int64_t n, const void *w, size_t bw, void *dst) {                  \
        const int64_t nb = n / 32;                                                                        \
        if (!dst) return (size_t)nb * sizeof(gml_x16);                                                    \
        gml_x16 *out = dst;                                                                               \
        for (int64_t ib = 0; ib < nb; ib++)                                                               \
            for (int r = 0; r < 16; r++) {                                                                \
                const WB *b = (const WB *)((const uint8_t *)w + (size_t)r * bw) + ib;                     \
                uint32_t codes[8];                                                                        \
                _mm256_storeu_si256((__m256i *)codes, _mm256_add_epi8(ROW(b), _mm256_set1_epi8((char)(SHIFT > 0 ? SHIFT : 0)))); \
                for (int t = 0; t < 8; t++) out[ib].q[t][r] = codes[t];                                   \
                out[ib].d[r] = gm_f16(&b->d);                                                             \
                out[ib].m[r] = WITH_MIN ? gm_f16((const uint8_t *)b + 2) : 0.0f;                          \
            }                                                                                             \
        return (size_t)nb * sizeof(gml_x16);                                                              \
    }

/* the shift of codes that stay signed (AVX2's Q8_0) */
#define GML_SIGNED (-1)

/* The starts of block ib's groups (-shift x each 4-code group's sum) in an
 * activation row of nb Q8_0 blocks, from the pe_q8_0_scales after it (the
 * product quantized it with them: packed.scales) for the shifts that have
 * them, 8 (Q4_0), 16 (Q5_0) and 128 (Q8_0); zeros for unshifted codes.  Summed in
 * the kernel instead, per block and 16 weight rows, they cost a fifth of
 * Gemma-3's prompt products. */
static const int32_t gml_no_start[8];
static inline const int32_t *gml_starts(const uint8_t *row, int64_t nb, int64_t ib, int shift) {
    if (shift <= 0) return gml_no_start;
    const pe_q8_0_scales *sc = gm_q8_0_scales(row, nb * 32) + ib;
    return shift == 8 ? sc->start4 : shift == 16 ? sc->start5 : sc->start8;
}

/* an activation block's d and (q8_1) s: the block is d, [s], then 32 codes */
static inline float gml_da(const uint8_t *y) { return gm_f16(y); }
static inline float gml_sa(const uint8_t *y) { return gm_f16(y + 2); }

#if defined(PE_GEMM_VNNI)
/* AVX-512: the 16 rows in one vector, against nc <= 2 activation rows */
GM_INLINE void gml_x16_cols(const gml_x16 *w, int64_t nb, float *s, size_t bs, const uint8_t *const a[2],
                            size_t ab, const int nc, int shift, int with_min) {
    __m512 acc[2][8], mins[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int j = 0; j < 2; j++)
        for (int t = 0; t < 8; t++) acc[j][t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const gml_x16 *p = w + ib;
        const __m512 dw = _mm512_loadu_ps(p->d);
        const uint8_t *y[2];
        const int32_t *start[2];
        __m512 scale[2];
        for (int j = 0; j < nc; j++) {
            y[j] = a[j] + (size_t)ib * ab;
            start[j] = gml_starts(a[j], nb, ib, shift);
            scale[j] = _mm512_mul_ps(dw, _mm512_set1_ps(gml_da(y[j])));
            if (with_min)
                mins[j] = _mm512_add_ps(mins[j], _mm512_mul_ps(_mm512_loadu_ps(p->m), _mm512_set1_ps(gml_sa(y[j]))));
        }
        for (int t = 0; t < 8; t++) {   /* each group's codes loaded once for the columns */
            const __m512i codes = _mm512_loadu_si512(p->q[t]);
            for (int j = 0; j < nc; j++) {
                const __m512i lanes = _mm512_dpbusd_epi32(_mm512_set1_epi32(start[j][t]), codes,
                                                          _mm512_set1_epi32((int)gm_u32(y[j] + ab - 32 + 4 * t)));
                acc[j][t] = _mm512_fmadd_ps(scale[j], _mm512_cvtepi32_ps(lanes), acc[j][t]);
            }
        }
    }
    for (int j = 0; j < nc; j++) {
        __m512 *l = acc[j];   /* the halves' order of x86_sum_ps8, lane by lane */
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                                         _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])));
        _mm512_storeu_ps(s + (size_t)j * bs, with_min ? _mm512_add_ps(sum, mins[j]) : sum);
    }
}
#define GML_COLS 2
#else
/* AVX2: rows 8h .. 8h + 7 against one activation row; maddubs takes the
 * unsigned codes, below 32: 16-bit pair sums below 2^15.  Q8_0's codes
 * shifted up would overflow them: without vpdpbusd they stay signed (shift
 * GML_SIGNED) and go in as |w| against the activations signed like w
 * (|w| <= 128); AVX-VNNI takes them shifted, as AVX-512 does. */
GM_INLINE void gml_x8_col(const gml_x16 *w, int64_t nb, int h, float *s, const uint8_t *a, size_t ab,
                          int shift, int with_min) {
    __m256 acc[8], mins = _mm256_setzero_ps();
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const gml_x16 *p = w + ib;
        const uint8_t *y = a + (size_t)ib * ab;
        const int32_t *start = gml_starts(a, nb, ib, shift);
        const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(p->d + 8 * h), _mm256_set1_ps(gml_da(y)));
        if (with_min)
            mins = _mm256_add_ps(mins, _mm256_mul_ps(_mm256_loadu_ps(p->m + 8 * h), _mm256_set1_ps(gml_sa(y))));
        for (int t = 0; t < 8; t++) {
            const __m256i codes = gm_load256(p->q[t] + 8 * h), act = _mm256_set1_epi32((int)gm_u32(y + ab - 32 + 4 * t));
            const __m256i lanes = shift == GML_SIGNED
                                      ? gm_dpbusd(_mm256_setzero_si256(), _mm256_abs_epi8(codes), _mm256_sign_epi8(act, codes))
                                      : gm_dpbusd(shift > 0 ? _mm256_set1_epi32(start[t]) : _mm256_setzero_si256(), codes, act);
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                                     _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
    _mm256_storeu_ps(s + 8 * h, with_min ? _mm256_add_ps(sum, mins) : sum);
}

GM_INLINE void gml_x16_cols(const gml_x16 *w, int64_t nb, float *s, size_t bs, const uint8_t *const a[1],
                            size_t ab, const int nc, int shift, int with_min) {
    (void)bs, (void)nc;
    for (int h = 0; h < 2; h++) gml_x8_col(w, nb, h, s, a[0], ab, shift, with_min);
}
#define GML_COLS 1
#endif

/* columns in passes of GML_COLS, each count a constant so that the
 * accumulators stay in registers */
#define GML_DEFINE_GEMM16(NAME, AB, SHIFT, WITH_MIN)                                                       \
    static void gml_##NAME##_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a,    \
                                    size_t ba, int nc) {                                                  \
        for (int j0 = 0; j0 < nc; j0 += GML_COLS) {                                                       \
            const uint8_t *y[GML_COLS];                                                                   \
            for (int j = 0; j < GML_COLS; j++)                                                            \
                y[j] = (const uint8_t *)a + (size_t)(j0 + j < nc ? j0 + j : nc - 1) * ba;                  \
            float *sj = s + (size_t)j0 * bs;                                                              \
            if (nc - j0 >= GML_COLS)                                                                      \
                gml_x16_cols(packed, n / 32, sj, bs, y, sizeof(AB), GML_COLS, SHIFT, WITH_MIN);           \
            else                                                                                          \
                gml_x16_cols(packed, n / 32, sj, bs, y, sizeof(AB), 1, SHIFT, WITH_MIN);                  \
        }                                                                                                 \
    }

#define GML_DEFINE(NAME, WB, AB, ROW, SHIFT, WITH_MIN) \
    GML_DEFINE_PACK16(NAME, WB, ROW, SHIFT, WITH_MIN)  \
    GML_DEFINE_GEMM16(NAME, AB, SHIFT, WITH_MIN)

GML_DEFINE(q4_0, block_q4_0, block_q8_0, gm_row_q4_0, 8, 0)
GML_DEFINE(q4_1, block_q4_1, block_q8_1, gm_row_q4_1, 0, 1)
GML_DEFINE(q5_0, block_q5_0, block_q8_0, gm_row_q5_0, 16, 0)
GML_DEFINE(q5_1, block_q5_1, block_q8_1, gm_row_q5_1, 0, 1)
#if defined(GM_DPBUSD)
#define GML_Q8_0_SHIFT 128
#else
#define GML_Q8_0_SHIFT GML_SIGNED
#endif
GML_DEFINE(q8_0, block_q8_0, block_q8_0, gm_row_q8_0, GML_Q8_0_SHIFT, 0)

#define GML_INSTALL_ONE(k, TYPE, NAME)                      \
    do {                                                    \
        (k)->type[TYPE].packed.pack16 = gml_##NAME##_pack16; \
        (k)->type[TYPE].packed.gemm16 = gml_##NAME##_gemm16; \
    } while (0)
/* the types whose gemm16 adds starts (a shift above 0) read them after each activation row */
#define GML_PACK16_INSTALL(k)                               \
    do {                                                    \
        GML_INSTALL_ONE(k, PE_TYPE_Q4_0, q4_0);             \
        GML_INSTALL_ONE(k, PE_TYPE_Q4_1, q4_1);             \
        GML_INSTALL_ONE(k, PE_TYPE_Q5_0, q5_0);             \
        GML_INSTALL_ONE(k, PE_TYPE_Q5_1, q5_1);             \
        GML_INSTALL_ONE(k, PE_TYPE_Q8_0, q8_0);             \
        (k)->type[PE_TYPE_Q4_0].packed.scales = 1;          \
        (k)->type[PE_TYPE_Q5_0].packed.scales = 1;          \
        (k)->type[PE_TYPE_Q8_0].packed.scales = GML_Q8_0_SHIFT > 0; \
    } while (0)

#define GMK_PACK16_INSTALL(k)                                \
    do {                                                     \
        (k)->type[PE_TYPE_Q4_K].packed.pack16 = gmk_q4k_pack16; \
        (k)->type[PE_TYPE_Q4_K].packed.gemm16 = gmk_q4k_gemm16; \
        (k)->type[PE_TYPE_Q4_K_X8].rows8.pack16 = gmk_q4k_pack16_x8; \
        (k)->type[PE_TYPE_Q6_K].packed.pack16 = gmk_q6k_pack16; \
        (k)->type[PE_TYPE_Q6_K].packed.gemm16 = gmk_q6k_gemm16; \
        (k)->type[PE_TYPE_Q6_K_X8].rows8.pack16 = gmk_q6k_pack16_x8; \
        GMK_GEMM32_INSTALL(k);                               \
        GML_PACK16_INSTALL(k);                               \
    } while (0)

#endif /* PE_X86_GEMM_PACKED_H */
