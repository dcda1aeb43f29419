/* ref_iquants.c - scalar reference kernels of the lattice types IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (super-blocks of 256, dot
 * partner Q8_K), and the grids they index.  Each group of 8 weights (4 for
 * IQ3's) is an entry of a fixed grid of levels, with sign bits apart (IQ1:
 * levels -1, 0, 1 shifted by +-1/8); sub-blocks of 32 carry an odd integer
 * scale.  A dot product sums each sub-block exactly in integers, scales it,
 * and multiplies a super-block's sum by d * da once, as llama.cpp's generic
 * code does; dequantizing follows gguf's reference (the tests' oracle). */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "iquants.h"

/* The reference must not depend on compile flags: keep a*b+c two roundings
 * (fmaf() where the canonical arithmetic fuses). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

uint8_t pe_iq2xxs_grid[256 * 8];
uint8_t pe_iq2xs_grid[512 * 8];
uint8_t pe_iq2s_grid[1024 * 8];
uint8_t pe_iq3xxs_grid[256 * 4];
uint8_t pe_iq3s_grid[512 * 4];
int8_t  pe_iq1s_grid[2048 * 8];
uint8_t pe_iq2_signs[128];
uint64_t pe_iq2_sign_bytes[128];

static struct { void *table; size_t bytes; } const grids[PE_IQ_GRID_COUNT] = {
    [PE_IQ_GRID_2XXS] = {pe_iq2xxs_grid, sizeof pe_iq2xxs_grid},
    [PE_IQ_GRID_2XS]  = {pe_iq2xs_grid, sizeof pe_iq2xs_grid},
    [PE_IQ_GRID_2S]   = {pe_iq2s_grid, sizeof pe_iq2s_grid},
    [PE_IQ_GRID_3XXS] = {pe_iq3xxs_grid, sizeof pe_iq3xxs_grid},
    [PE_IQ_GRID_3S]   = {pe_iq3s_grid, sizeof pe_iq3s_grid},
    [PE_IQ_GRID_1S]   = {pe_iq1s_grid, sizeof pe_iq1s_grid},
};
static bool grid_set[PE_IQ_GRID_COUNT];

int pe_iq_grid_set(int grid, const uint8_t *values, size_t n) {
    if (grid < 0 || grid >= PE_IQ_GRID_COUNT) return pe_fail("unknown IQ grid %d", grid);
    if (!values || n != grids[grid].bytes)
        return pe_fail("IQ grid %d takes %zu bytes, not %zu", grid, grids[grid].bytes, n);
    memcpy(grids[grid].table, values, n);
    grid_set[grid] = true;
    return 0;
}

int pe_iq_type_ready(int type) {
    switch (type) {
    case PE_TYPE_IQ2_XXS: return grid_set[PE_IQ_GRID_2XXS];
    case PE_TYPE_IQ2_XS:  return grid_set[PE_IQ_GRID_2XS];
    case PE_TYPE_IQ2_S:   return grid_set[PE_IQ_GRID_2S];
    case PE_TYPE_IQ3_XXS: return grid_set[PE_IQ_GRID_3XXS];
    case PE_TYPE_IQ3_S:   return grid_set[PE_IQ_GRID_3S];
    case PE_TYPE_IQ1_S:
    case PE_TYPE_IQ1_M:   return grid_set[PE_IQ_GRID_1S];
    default:              return 1;
    }
}

/* ---- shared pieces ------------------------------------------------------------- */

/* 8 grid levels with signs (bit j of `signs` set: weight j negative) */
static void signed_levels(const uint8_t *level, unsigned signs, int8_t out[8]) {
    for (int j = 0; j < 8; j++) out[j] = (int8_t)((signs >> j & 1) ? -level[j] : level[j]);
}

/* the sum of 8 signed levels times 8 activation codes */
static int dot8(const uint8_t *level, unsigned signs, const int8_t *a) {
    int8_t w[8];
    signed_levels(level, signs, w);
    int sum = 0;
    for (int j = 0; j < 8; j++) sum += w[j] * a[j];
    return sum;
}

static void put8(const uint8_t *level, unsigned signs, float scale, float *y) {
    int8_t w[8];
    signed_levels(level, signs, w);
    for (int j = 0; j < 8; j++) y[j] = scale * w[j];
}

/* The IQ2 / IQ3 dot products: per super-block the exact integer sum of its
 * sub-blocks' products times their odd scales (block_sum, from the block and
 * its 256 activation codes), times d * da; the float sum times `factor`
 * (the scales' common fraction). */
typedef int32_t (*block_sum_fn)(const void *block, const int8_t *q8);

static float lattice_dot(int64_t n, const void *vw, size_t block_bytes, const block_q8_K *a, block_sum_fn block_sum,
                         float factor) {
    const uint8_t *x = vw;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++, x += block_bytes) {
        pe_f16 d;   /* the first field of each of these blocks */
        memcpy(&d, x, sizeof d);
        sum += pe_f16_to_f32(d) * a[i].d * (float)block_sum(x, a[i].qs);
    }
    return factor * sum;
}

/* ---- IQ2_XXS: per sub-block two 32-bit words: 4 grid indices (bytes), then
 * 4 x 7 sign bits and a 4-bit scale ------------------------------------------------ */

static void iq2_xxs_words(const block_iq2_xxs *b, int ib, uint8_t idx[4], uint32_t *aux) {
    memcpy(idx, b->qs + 4 * ib, 4);
    memcpy(aux, b->qs + 4 * ib + 2, 4);
}

static void dequantize_iq2_xxs(const void *vx, float *y, int64_t n) {
    const block_iq2_xxs *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint8_t idx[4];
            uint32_t aux;
            iq2_xxs_words(&x[i], ib, idx, &aux);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8)
                put8(pe_iq2xxs_grid + 8 * idx[l], pe_iq2_signs[aux >> 7 * l & 127], db, y);
        }
    }
}

static int32_t block_sum_iq2_xxs(const void *block, const int8_t *q8) {
    int32_t bsum = 0;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        uint8_t idx[4];
        uint32_t aux;
        iq2_xxs_words(block, ib, idx, &aux);
        int sumi = 0;
        for (int l = 0; l < 4; l++, q8 += 8) sumi += dot8(pe_iq2xxs_grid + 8 * idx[l], pe_iq2_signs[aux >> 7 * l & 127], q8);
        bsum += sumi * (int32_t)(2 * (aux >> 28) + 1);
    }
    return bsum;
}

static void vec_dot_iq2_xxs(int64_t n, float *s, const void *vw, const void *va) {
    *s = lattice_dot(n, vw, sizeof(block_iq2_xxs), va, block_sum_iq2_xxs, 0.125f);
}

/* ---- IQ2_XS: 16-bit words, 9 bits of grid index and 7 of signs; a 4-bit
 * scale per 16 weights ---------------------------------------------------------------- */

static void dequantize_iq2_xs(const void *vx, float *y, int64_t n) {
    const block_iq2_xs *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++)
            for (int l = 0; l < 4; l++, y += 8) {
                const uint16_t q = x[i].qs[4 * ib + l];
                const float db = d * (0.5f + (float)(x[i].scales[ib] >> 4 * (l / 2) & 15)) * 0.25f;
                put8(pe_iq2xs_grid + 8 * (q & 511), pe_iq2_signs[q >> 9], db, y);
            }
    }
}

static int32_t block_sum_iq2_xs(const void *block, const int8_t *q8) {
    const block_iq2_xs *x = block;
    int32_t bsum = 0;
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int h = 0; h < 2; h++) {
            int sumi = 0;
            for (int l = 2 * h; l < 2 * h + 2; l++, q8 += 8) {
                const uint16_t q = x->qs[4 * ib + l];
                sumi += dot8(pe_iq2xs_grid + 8 * (q & 511), pe_iq2_signs[q >> 9], q8);
            }
            bsum += sumi * (2 * (x->scales[ib] >> 4 * h & 15) + 1);
        }
    return bsum;
}

static void vec_dot_iq2_xs(int64_t n, float *s, const void *vw, const void *va) {
    *s = lattice_dot(n, vw, sizeof(block_iq2_xs), va, block_sum_iq2_xs, 0.125f);
}

/* ---- IQ2_S: 10-bit grid indices (8 low bits in qs, 2 in qh), 8 explicit
 * sign bits per 8 weights (the second half of qs), a 4-bit scale per 16 --------------- */

static unsigned iq2_s_index(const block_iq2_s *b, int ib, int l) {
    return b->qs[4 * ib + l] | ((unsigned)b->qh[ib] << (8 - 2 * l) & 0x300);
}

static void dequantize_iq2_s(const void *vx, float *y, int64_t n) {
    const block_iq2_s *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        const uint8_t *signs = x[i].qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ib++)
            for (int l = 0; l < 4; l++, y += 8) {
                const float db = d * (0.5f + (float)(x[i].scales[ib] >> 4 * (l / 2) & 15)) * 0.25f;
                put8(pe_iq2s_grid + 8 * iq2_s_index(&x[i], ib, l), signs[4 * ib + l], db, y);
            }
    }
}

static int32_t block_sum_iq2_s(const void *block, const int8_t *q8) {
    const block_iq2_s *x = block;
    const uint8_t *signs = x->qs + QK_K / 8;
    int32_t bsum = 0;
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int h = 0; h < 2; h++) {
            int sumi = 0;
            for (int l = 2 * h; l < 2 * h + 2; l++, q8 += 8)
                sumi += dot8(pe_iq2s_grid + 8 * iq2_s_index(x, ib, l), signs[4 * ib + l], q8);
            bsum += sumi * (2 * (x->scales[ib] >> 4 * h & 15) + 1);
        }
    return bsum;
}

static void vec_dot_iq2_s(int64_t n, float *s, const void *vw, const void *va) {
    *s = lattice_dot(n, vw, sizeof(block_iq2_s), va, block_sum_iq2_s, 0.125f);
}

/* ---- IQ3_XXS: a byte of grid index per 4 weights (the first 64 bytes), then
 * per sub-block a 32-bit word of 4 x 7 sign bits and a 4-bit scale --------------------- */

static uint32_t iq3_xxs_word(const block_iq3_xxs *b, int ib) {
    uint32_t aux;
    memcpy(&aux, b->qs + QK_K / 4 + 4 * ib, sizeof aux);
    return aux;
}

/* the 8 levels of grid indices q[0], q[1] */
static void iq3_levels(const uint8_t *grid, unsigned q0, unsigned q1, uint8_t level[8]) {
    memcpy(level, grid + 4 * q0, 4);
    memcpy(level + 4, grid + 4 * q1, 4);
}

static void dequantize_iq3_xxs(const void *vx, float *y, int64_t n) {
    const block_iq3_xxs *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        const uint8_t *q3 = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t aux = iq3_xxs_word(&x[i], ib);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8, q3 += 2) {
                uint8_t level[8];
                iq3_levels(pe_iq3xxs_grid, q3[0], q3[1], level);
                put8(level, pe_iq2_signs[aux >> 7 * l & 127], db, y);
            }
        }
    }
}

static int32_t block_sum_iq3_xxs(const void *block, const int8_t *q8) {
    const uint8_t *q3 = ((const block_iq3_xxs *)block)->qs;
    int32_t bsum = 0;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint32_t aux = iq3_xxs_word(block, ib);
        int sumi = 0;
        for (int l = 0; l < 4; l++, q8 += 8, q3 += 2) {
            uint8_t level[8];
            iq3_levels(pe_iq3xxs_grid, q3[0], q3[1], level);
            sumi += dot8(level, pe_iq2_signs[aux >> 7 * l & 127], q8);
        }
        bsum += sumi * (int32_t)(2 * (aux >> 28) + 1);
    }
    return bsum;
}

static void vec_dot_iq3_xxs(int64_t n, float *s, const void *vw, const void *va) {
    *s = lattice_dot(n, vw, sizeof(block_iq3_xxs), va, block_sum_iq3_xxs, 0.25f);
}

/* ---- IQ3_S: 9-bit grid indices per 4 weights (8 bits in qs, the ninth in
 * qh), 8 explicit sign bits per 8 weights, a 4-bit scale per sub-block --------------------- */

static void iq3_s_levels(const block_iq3_s *b, int ib, int l, uint8_t level[8]) {
    const uint8_t *qs = b->qs + 8 * ib + 2 * l;
    const unsigned high = b->qh[ib];
    iq3_levels(pe_iq3s_grid, qs[0] | (high << (8 - 2 * l) & 256), qs[1] | (high << (7 - 2 * l) & 256), level);
}

static int iq3_s_scale(const block_iq3_s *b, int ib) { return 2 * (b->scales[ib / 2] >> 4 * (ib % 2) & 15) + 1; }

static void dequantize_iq3_s(const void *vx, float *y, int64_t n) {
    const block_iq3_s *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float db = d * (float)iq3_s_scale(&x[i], ib);
            for (int l = 0; l < 4; l++, y += 8) {
                uint8_t level[8];
                iq3_s_levels(&x[i], ib, l, level);
                put8(level, x[i].signs[4 * ib + l], db, y);
            }
        }
    }
}

static int32_t block_sum_iq3_s(const void *block, const int8_t *q8) {
    const block_iq3_s *x = block;
    int32_t bsum = 0;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int sumi = 0;
        for (int l = 0; l < 4; l++, q8 += 8) {
            uint8_t level[8];
            iq3_s_levels(x, ib, l, level);
            sumi += dot8(level, x->signs[4 * ib + l], q8);
        }
        bsum += sumi * iq3_s_scale(x, ib);
    }
    return bsum;
}

static void vec_dot_iq3_s(int64_t n, float *s, const void *vw, const void *va) {
    *s = lattice_dot(n, vw, sizeof(block_iq3_s), va, block_sum_iq3_s, 1.0f);
}

/* ---- IQ1_S: 11-bit indices into a grid of -1 / 0 / 1 (8 bits in qs, 3 in
 * qh), per sub-block a 3-bit scale and the sign of a shift of 1/8 ------------------------- */

static unsigned iq1_s_index(const block_iq1_s *b, int ib, int l) {
    return b->qs[4 * ib + l] | ((unsigned)b->qh[ib] >> 3 * l & 7) << 8;
}

static void dequantize_iq1_s(const void *vx, float *y, int64_t n) {
    const block_iq1_s *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (float)(2 * (x[i].qh[ib] >> 12 & 7) + 1);
            const float delta = x[i].qh[ib] & 0x8000 ? -PE_IQ1_DELTA : PE_IQ1_DELTA;
            for (int l = 0; l < 4; l++, y += 8) {
                const int8_t *g = pe_iq1s_grid + 8 * iq1_s_index(&x[i], ib, l);
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)g[j] + delta);
            }
        }
    }
}

/* the sum of 8 grid levels times 8 activation codes */
static int dot8_iq1(const int8_t *g, const int8_t *a) {
    int sum = 0;
    for (int j = 0; j < 8; j++) sum += g[j] * a[j];
    return sum;
}

static void vec_dot_iq1_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int8_t *q8 = a[i].qs;
        int32_t sumi = 0, shifts = 0;   /* the grid's products; the shifts' (x 8) */
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int ls = 2 * (x[i].qh[ib] >> 12 & 7) + 1;
            const int sign = x[i].qh[ib] & 0x8000 ? -1 : 1;
            int lsum = 0;
            for (int l = 0; l < 4; l++, q8 += 8) lsum += dot8_iq1(pe_iq1s_grid + 8 * iq1_s_index(&x[i], ib, l), q8);
            sumi += ls * lsum;
            shifts += ls * sign * (a[i].bsums[2 * ib] + a[i].bsums[2 * ib + 1]);
        }
        sum += pe_f16_to_f32(x[i].d) * a[i].d * ((float)sumi + PE_IQ1_DELTA * (float)shifts);
    }
    *s = sum;
}

/* ---- IQ1_M: IQ1_S's grid; a 3-bit scale per 16 weights and the shift's sign
 * per 8, the super-block scale spread over the scales' top nibbles ---------------------- */

/* group l (0..3) of sub-block ib: its grid index and shift sign */
static unsigned iq1_m_index(const block_iq1_m *b, int ib, int l, int *sign) {
    const unsigned high = b->qh[2 * ib + l / 2] >> 4 * (l % 2);
    *sign = high & 8 ? -1 : 1;
    return b->qs[4 * ib + l] | (high & 7) << 8;
}

static void dequantize_iq1_m(const void *vx, float *y, int64_t n) {
    const block_iq1_m *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(pe_iq1m_scale(&x[i]));
        for (int ib = 0; ib < QK_K / 32; ib++)
            for (int l = 0; l < 4; l++, y += 8) {
                int sign;
                const int8_t *g = pe_iq1s_grid + 8 * iq1_m_index(&x[i], ib, l, &sign);
                const float dl = d * (float)pe_iq1m_sub_scale(&x[i], ib, l / 2);
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)g[j] + (float)sign * PE_IQ1_DELTA);
            }
    }
}

static void vec_dot_iq1_m(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_m *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int8_t *q8 = a[i].qs;
        int32_t sumi = 0, shifts = 0;
        for (int ib = 0; ib < QK_K / 32; ib++)
            for (int l = 0; l < 4; l++, q8 += 8) {
                int sign;
                const int ls = pe_iq1m_sub_scale(&x[i], ib, l / 2);
                sumi += ls * dot8_iq1(pe_iq1s_grid + 8 * iq1_m_index(&x[i], ib, l, &sign), q8);
                int codes = 0;
                for (int j = 0; j < 8; j++) codes += q8[j];
                shifts += ls * sign * codes;
            }
        sum += pe_f16_to_f32(pe_iq1m_scale(&x[i])) * a[i].d * ((float)sumi + PE_IQ1_DELTA * (float)shifts);
    }
    *s = sum;
}

/* ---- prompt tiles: rows expanded once (pack16), then integer products ------------------------ */

/* 8 weights from element k0 of a row: their signed levels, the odd scale of
 * their 16 (or 32) and the signed scale of their shift (IQ1; 0 elsewhere) */
static void put_group(pe_lattice_row *w, int k0, const int8_t level[8], int mult, int shift) {
    memcpy(w->level + k0, level, 8);
    for (int p = k0 / 2; p < k0 / 2 + 4; p++) {
        w->mult[p] = (int16_t)mult;
        w->shift[p] = (int16_t)shift;
    }
}

static void put_signed(pe_lattice_row *w, int k0, const uint8_t *level, unsigned signs, int mult) {
    int8_t v[8];
    signed_levels(level, signs, v);
    put_group(w, k0, v, mult, 0);
}

static void expand_iq2_xxs(const void *block, pe_lattice_row *w) {
    w->d = pe_f16_to_f32(((const block_iq2_xxs *)block)->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        uint8_t idx[4];
        uint32_t aux;
        iq2_xxs_words(block, ib, idx, &aux);
        for (int l = 0; l < 4; l++)
            put_signed(w, 32 * ib + 8 * l, pe_iq2xxs_grid + 8 * idx[l], pe_iq2_signs[aux >> 7 * l & 127],
                       (int)(2 * (aux >> 28) + 1));
    }
}

static void expand_iq2_xs(const void *block, pe_lattice_row *w) {
    const block_iq2_xs *x = block;
    w->d = pe_f16_to_f32(x->d);
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int l = 0; l < 4; l++) {
            const uint16_t q = x->qs[4 * ib + l];
            put_signed(w, 32 * ib + 8 * l, pe_iq2xs_grid + 8 * (q & 511), pe_iq2_signs[q >> 9],
                       2 * (x->scales[ib] >> 4 * (l / 2) & 15) + 1);
        }
}

static void expand_iq2_s(const void *block, pe_lattice_row *w) {
    const block_iq2_s *x = block;
    w->d = pe_f16_to_f32(x->d);
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int l = 0; l < 4; l++)
            put_signed(w, 32 * ib + 8 * l, pe_iq2s_grid + 8 * iq2_s_index(x, ib, l), x->qs[QK_K / 8 + 4 * ib + l],
                       2 * (x->scales[ib] >> 4 * (l / 2) & 15) + 1);
}

static void expand_iq3_xxs(const void *block, pe_lattice_row *w) {
    const block_iq3_xxs *x = block;
    w->d = pe_f16_to_f32(x->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint32_t aux = iq3_xxs_word(x, ib);
        for (int l = 0; l < 4; l++) {
            uint8_t level[8];
            iq3_levels(pe_iq3xxs_grid, x->qs[8 * ib + 2 * l], x->qs[8 * ib + 2 * l + 1], level);
            put_signed(w, 32 * ib + 8 * l, level, pe_iq2_signs[aux >> 7 * l & 127], (int)(2 * (aux >> 28) + 1));
        }
    }
}

static void expand_iq3_s(const void *block, pe_lattice_row *w) {
    const block_iq3_s *x = block;
    w->d = pe_f16_to_f32(x->d);
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int l = 0; l < 4; l++) {
            uint8_t level[8];
            iq3_s_levels(x, ib, l, level);
            put_signed(w, 32 * ib + 8 * l, level, x->signs[4 * ib + l], iq3_s_scale(x, ib));
        }
}

static void expand_iq1_s(const void *block, pe_lattice_row *w) {
    const block_iq1_s *x = block;
    w->d = pe_f16_to_f32(x->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int mult = 2 * (x->qh[ib] >> 12 & 7) + 1, sign = x->qh[ib] & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; l++) put_group(w, 32 * ib + 8 * l, pe_iq1s_grid + 8 * iq1_s_index(x, ib, l), mult, sign * mult);
    }
}

static void expand_iq1_m(const void *block, pe_lattice_row *w) {
    const block_iq1_m *x = block;
    w->d = pe_f16_to_f32(pe_iq1m_scale(x));
    for (int ib = 0; ib < QK_K / 32; ib++)
        for (int l = 0; l < 4; l++) {
            int sign;
            const unsigned index = iq1_m_index(x, ib, l, &sign);
            const int mult = pe_iq1m_sub_scale(x, ib, l / 2);
            put_group(w, 32 * ib + 8 * l, pe_iq1s_grid + 8 * index, mult, sign * mult);
        }
}

typedef void (*expand_fn)(const void *block, pe_lattice_row *w);

static size_t lattice_pack16(int64_t n, const void *w, size_t bw, void *dst, size_t block_bytes, expand_fn expand,
                             float factor, int has_shifts) {
    const size_t bytes = PE_LATTICE_HEADER + (size_t)(n / QK_K) * PE_PACK_ROWS * sizeof(pe_lattice_row);
    if (!dst) return bytes;
    *(pe_lattice_pack *)dst = (pe_lattice_pack){factor, has_shifts};
    pe_lattice_row *rows = (pe_lattice_row *)((uint8_t *)dst + PE_LATTICE_HEADER);
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int r = 0; r < PE_PACK_ROWS; r++)
            expand((const uint8_t *)w + (size_t)r * bw + (size_t)b * block_bytes, &rows[b * PE_PACK_ROWS + r]);
    return bytes;
}

#define DEFINE_PACK16(NAME, FACTOR, SHIFTS)                                                                   \
    static size_t pack16_##NAME(int64_t n, const void *w, size_t bw, void *dst) {                             \
        return lattice_pack16(n, w, bw, dst, sizeof(block_##NAME), expand_##NAME, FACTOR, SHIFTS);            \
    }
DEFINE_PACK16(iq2_xxs, 0.125f, 0)
DEFINE_PACK16(iq2_xs, 0.125f, 0)
DEFINE_PACK16(iq2_s, 0.125f, 0)
DEFINE_PACK16(iq3_xxs, 0.25f, 0)
DEFINE_PACK16(iq3_s, 1.0f, 0)
DEFINE_PACK16(iq1_s, 1.0f, 1)
DEFINE_PACK16(iq1_m, 1.0f, 1)

static void lattice_sums(const pe_lattice_row *w, const int8_t *q, int has_shifts, int32_t *sumi, int32_t *shifts) {
    int32_t products = 0, shifted = 0;
    for (int p = 0; p < QK_K / 2; p++) {
        products += w->mult[p] * (w->level[2 * p] * q[2 * p] + w->level[2 * p + 1] * q[2 * p + 1]);
        shifted += w->shift[p] * (q[2 * p] + q[2 * p + 1]);
    }
    *sumi = products;
    *shifts = has_shifts ? shifted : 0;
}

static void lattice_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    pe_lattice_gemm16(n, s, bs, packed, a, ba, nc, lattice_sums);
}

void pe_fill_ref_iquants(pe_kernels *k) {
    for (unsigned i = 0; i < 128; i++) {   /* the eighth sign makes the count even */
        unsigned odd = i ^ i >> 4;
        odd ^= odd >> 2;
        odd ^= odd >> 1;
        pe_iq2_signs[i] = (uint8_t)(i | (odd & 1) << 7);
        pe_iq2_sign_bytes[i] = 0;
        for (int j = 0; j < 8; j++)
            pe_iq2_sign_bytes[i] |= (uint64_t)(pe_iq2_signs[i] >> j & 1 ? 0xFF : 0x01) << 8 * j;
    }
    k->type[PE_TYPE_IQ2_XXS] = (pe_type_kernels){dequantize_iq2_xxs, NULL, vec_dot_iq2_xxs};
    k->type[PE_TYPE_IQ2_XS]  = (pe_type_kernels){dequantize_iq2_xs, NULL, vec_dot_iq2_xs};
    k->type[PE_TYPE_IQ2_S]   = (pe_type_kernels){dequantize_iq2_s, NULL, vec_dot_iq2_s};
    k->type[PE_TYPE_IQ3_XXS] = (pe_type_kernels){dequantize_iq3_xxs, NULL, vec_dot_iq3_xxs};
    k->type[PE_TYPE_IQ3_S]   = (pe_type_kernels){dequantize_iq3_s, NULL, vec_dot_iq3_s};
    k->type[PE_TYPE_IQ1_S]   = (pe_type_kernels){dequantize_iq1_s, NULL, vec_dot_iq1_s};
    k->type[PE_TYPE_IQ1_M]   = (pe_type_kernels){dequantize_iq1_m, NULL, vec_dot_iq1_m};
    const struct { int type; pe_pack16_fn pack16; } packs[] = {
        {PE_TYPE_IQ2_XXS, pack16_iq2_xxs}, {PE_TYPE_IQ2_XS, pack16_iq2_xs}, {PE_TYPE_IQ2_S, pack16_iq2_s},
        {PE_TYPE_IQ3_XXS, pack16_iq3_xxs}, {PE_TYPE_IQ3_S, pack16_iq3_s}, {PE_TYPE_IQ1_S, pack16_iq1_s},
        {PE_TYPE_IQ1_M, pack16_iq1_m},
    };
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++) {
        k->type[packs[i].type].packed.pack16 = packs[i].pack16;
        k->type[packs[i].type].packed.gemm16 = lattice_gemm16;
    }
}
