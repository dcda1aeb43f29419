/* ref_iq4.c - scalar reference kernels of the non-linear 4-bit types:
 * IQ4_NL (blocks of 32, dot partner Q8_0), IQ4_XS (super-blocks of 256
 * with 6-bit sub-block scales, dot partner Q8_K) and MXFP4 (blocks of 32
 * with a power-of-two scale, dot partner Q8_0).  Each 4-bit index picks a
 * level of a fixed 16-entry grid. */
#include <math.h>

#include "internal.h"
#include "kquants.h"
#include "ref_lanes.h"

/* The reference must not depend on compile flags: keep a*b+c two roundings
 * (fmaf() where the canonical arithmetic fuses). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

const int8_t pe_iq4nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

const int8_t pe_mxfp4_values[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

#define GROUP_MAX_EPS 1e-15f

/* ---- dequantize and dot ------------------------------------------------------ */

/* 16 bytes of indices: element j in the low nibble of byte j, element j + 16
 * in its high nibble */
static void dequantize_32(const uint8_t *qs, const int8_t grid[16], float d, float *y) {
    for (int j = 0; j < 16; j++) {
        y[j] = d * grid[qs[j] & 0xF];
        y[j + 16] = d * grid[qs[j] >> 4];
    }
}

/* the 32 levels of a block in element order */
static void levels_32(const uint8_t *qs, const int8_t grid[16], int8_t w[32]) {
    for (int j = 0; j < 16; j++) {
        w[j] = grid[qs[j] & 0xF];
        w[j + 16] = grid[qs[j] >> 4];
    }
}

/* lane t = the products of elements 4t..4t+3 of a block of 32 levels, times scale */
static void level_lanes_32(const int8_t *w, const int8_t *a, int scale, int32_t lanes[REF_LANES]) {
    for (int t = 0; t < REF_LANES; t++) {
        const int e = 4 * t;
        lanes[t] = scale * (w[e] * a[e] + w[e + 1] * a[e + 1] + w[e + 2] * a[e + 2] + w[e + 3] * a[e + 3]);
    }
}

static void lanes_32(const uint8_t *qs, const int8_t grid[16], const int8_t *a, int scale, int32_t lanes[REF_LANES]) {
    int8_t w[32];
    levels_32(qs, grid, w);
    level_lanes_32(w, a, scale, lanes);
}

static void dequantize_iq4_nl(const void *vx, float *y, int64_t n) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < n / QK4_NL; i++, y += QK4_NL) dequantize_32(x[i].qs, pe_iq4nl_values, pe_f16_to_f32(x[i].d), y);
}

/* Two sets of lanes, the blocks taken in pairs (the first of each pair into
 * acc[0], the second into acc[1], a last odd block into acc[0]), each
 * acc = fma(da * dw, lanes, acc); the result the two added lane by lane,
 * then folded by halves. */
static void vec_dot_iq4_nl(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_nl *x = vw;
    const block_q8_0 *a = va;
    const int64_t nb = n / QK4_NL;
    float acc[2][REF_LANES] = {{0}};
    for (int64_t i = 0; i < nb; i++) {
        int32_t lanes[REF_LANES];
        lanes_32(x[i].qs, pe_iq4nl_values, a[i].qs, 1, lanes);
        const int set = (i % 2 == 1 && i < nb - nb % 2) ? 1 : 0;
        lanes_fma(acc[set], pe_f16_to_f32(a[i].d) * pe_f16_to_f32(x[i].d), lanes);
    }
    float v[REF_LANES];
    for (int t = 0; t < REF_LANES; t++) v[t] = acc[0][t] + acc[1][t];
    *s = lanes_sum_halves(v);
}

static void dequantize_iq4_xs(const void *vx, float *y, int64_t n) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32)
            dequantize_32(x[i].qs + 16 * ib, pe_iq4nl_values, d * pe_iq4xs_scale(&x[i], ib), y);
    }
}

/* per super-block, lanes summed over the sub-blocks (each scaled),
 * acc = fma(da * d, lanes, acc), folded by halves */
static void vec_dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_xs *x = vw;
    const block_q8_K *a = va;
    float acc[REF_LANES] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t lanes[REF_LANES] = {0};
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int32_t sub[REF_LANES];
            lanes_32(x[i].qs + 16 * ib, pe_iq4nl_values, a[i].qs + 32 * ib, pe_iq4xs_scale(&x[i], ib), sub);
            for (int t = 0; t < REF_LANES; t++) lanes[t] += sub[t];
        }
        lanes_fma(acc, a[i].d * pe_f16_to_f32(x[i].d), lanes);
    }
    *s = lanes_sum_halves(acc);
}

/* MXFP4: IQ4_NL's blocks with another grid and a power-of-two scale */
static void dequantize_mxfp4(const void *vx, float *y, int64_t n) {
    const block_mxfp4 *x = vx;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, y += QK_MXFP4)
        dequantize_32(x[i].qs, pe_mxfp4_values, pe_mxfp4_scale(x[i].e), y);
}

/* The sets of lanes of vec_dot_iq4_nl: blocks in pairs, the first of each
 * pair into acc[0], the second into acc[1] (a last odd block into acc[0]),
 * acc = fma(da * dw, lanes, acc), the sum of the two folded by halves.  The
 * weight's levels come from `levels` (n of them) or, when that is NULL, from
 * the blocks x; its scales from `scales` or x.  (da * dw is exact: dw is a
 * power of two, short of the ends of float's range.) */
static float mxfp4_dot(int64_t n, const block_mxfp4 *x, const int8_t *levels, const float *scales,
                       const block_q8_0 *a) {
    const int64_t nb = n / QK_MXFP4;
    float acc[2][REF_LANES] = {{0}};
    for (int64_t i = 0; i < nb; i++) {
        int8_t w[QK_MXFP4];
        if (levels) memcpy(w, levels + QK_MXFP4 * i, QK_MXFP4);
        else levels_32(x[i].qs, pe_mxfp4_values, w);
        int32_t lanes[REF_LANES];
        level_lanes_32(w, a[i].qs, 1, lanes);
        const int set = (i % 2 == 1 && i < nb - nb % 2) ? 1 : 0;
        lanes_fma(acc[set], pe_f16_to_f32(a[i].d) * (scales ? scales[i] : pe_mxfp4_scale(x[i].e)), lanes);
    }
    float v[REF_LANES];
    for (int t = 0; t < REF_LANES; t++) v[t] = acc[0][t] + acc[1][t];
    return lanes_sum_halves(v);
}

static void vec_dot_mxfp4(int64_t n, float *s, const void *vw, const void *va) {
    *s = mxfp4_dot(n, vw, NULL, NULL, va);
}

size_t pe_mxfp4_pack16(int64_t n, const void *w, size_t bw, void *dst) {
    const size_t bytes = pe_mxfp4_pack_bytes(n);
    if (!dst) return bytes;
    for (int r = 0; r < PE_PACK_ROWS; r++) {
        const block_mxfp4 *x = (const block_mxfp4 *)((const uint8_t *)w + (size_t)r * bw);
        int8_t *levels = (int8_t *)pe_mxfp4_levels(dst, n, r);
        float *scales = (float *)pe_mxfp4_scales(dst, n, r);
        for (int64_t i = 0; i < n / QK_MXFP4; i++) {
            levels_32(x[i].qs, pe_mxfp4_values, levels + QK_MXFP4 * i);
            scales[i] = pe_mxfp4_scale(x[i].e);
        }
    }
    return bytes;
}

/* each of the 16 packed rows against each activation row: vec_dot's operations */
static void gemm16_mxfp4(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int j = 0; j < nc; j++)
        for (int r = 0; r < PE_PACK_ROWS; r++)
            s[(size_t)j * bs + r] = mxfp4_dot(n, NULL, pe_mxfp4_levels(packed, n, r), pe_mxfp4_scales(packed, n, r),
                                              (const block_q8_0 *)((const uint8_t *)a + (size_t)j * ba));
}

/* ---- quantize (ggml's quantize_row_iq4_{nl,xs}_ref) --------------------------- */

/* The grid index nearest to v: the grid is sorted, so v takes level i once it
 * reaches the midpoint of levels i-1 and i; doubling v keeps the test exact. */
static int nearest_level(float v) {
    const float v2 = v + v;
    int idx = 0;
    for (int step = 8; step > 0; step >>= 1) {
        const int j = idx + step;
        if (v2 >= (float)(pe_iq4nl_values[j - 1] + pe_iq4nl_values[j])) idx = j;
    }
    return idx;
}

/* Best scale of one block of 32 (weights x^2): start from max / grid[0] (or
 * its negative when ntry > 0), refit by least squares, then try 2 ntry + 1
 * further starting scales. L gets the levels of the first fit. */
static float fit_block(const float *xb, int ntry, uint8_t *Lb) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(xb[j]);
        if (ax > amax) { amax = ax; max = xb[j]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int j = 0; j < 32; j++) Lb[j] = (uint8_t)nearest_level(0.f);
        return 0.f;
    }
    const float v0 = pe_iq4nl_values[0];
    float d = ntry > 0 ? -max / v0 : max / v0;
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const int l = nearest_level(id * xb[j]);
        Lb[j] = (uint8_t)l;
        const float q = pe_iq4nl_values[l], w = xb[j] * xb[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; itry++) {
        id = (itry + v0) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = pe_iq4nl_values[nearest_level(id * xb[j])], w = xb[j] * xb[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void pack_indices(const uint8_t *L, uint8_t *qs, int n) {
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++) qs[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* ggml's reference for IQ4_NL does no scale search (ntry = -1) and keeps the
 * levels of the first fit. */
static void quantize_iq4_nl(const float *x, void *vy, int64_t n) {
    block_iq4_nl *y = vy;
    uint8_t L[QK4_NL];
    for (int64_t i = 0; i < n / QK4_NL; i++, x += QK4_NL) {
        y[i].d = pe_f32_to_f16(fit_block(x, -1, L));
        pack_indices(L, y[i].qs, QK4_NL);
    }
}

/* IQ4_XS: fit each block of 32 with 7 tries each side, quantize the eight
 * scales to 6 bits against -max_scale / 32, and re-pick every level against
 * its block's quantized scale. */
static void quantize_iq4_xs(const float *x, void *vy, int64_t n) {
    block_iq4_xs *y = vy;
    uint8_t L[QK_K];
    float scales[QK_K / 32];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            scales[ib] = fit_block(x + 32 * ib, 7, L + 32 * ib);
            if (fabsf(scales[ib]) > amax_scale) { amax_scale = fabsf(scales[ib]); max_scale = scales[ib]; }
        }
        const float d = -max_scale / 32;
        const float id = d ? 1 / d : 0.f;
        y[i].d = pe_f32_to_f16(d);
        y[i].scales_h = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int l = pe_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)nearest_level(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) y[i].scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        pack_indices(L, y[i].qs, QK_K);
    }
}

/* MXFP4 (ggml's quantize_row_mxfp4_ref): E8M0's scale the largest power of
 * two at or below amax, over 4, so that amax lands in [4, 8) of E2M1's
 * values (the top one, 6, clips the rest of that range); each value the
 * level nearest it (the first of two as near).  A block holding an infinity
 * takes the largest exponent (ggml's cast would be undefined). */
static int nearest_mxfp4_level(float x, float d) {
    int best = 0;
    float best_err = fabsf(pe_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(pe_mxfp4_values[i] * d - x);
        if (err < best_err) { best = i; best_err = err; }
    }
    return best;
}

static void quantize_mxfp4(const float *x, void *vy, int64_t n) {
    block_mxfp4 *y = vy;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0;
        for (int j = 0; j < QK_MXFP4; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float e = amax > 0 ? floorf(log2f(amax)) - 2 + 127 : 0;
        y[i].e = (uint8_t)(e < 0 ? 0 : e > 255 ? 255 : e);
        const float d = pe_mxfp4_scale(y[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(nearest_mxfp4_level(x[j], d) | nearest_mxfp4_level(x[j + QK_MXFP4 / 2], d) << 4);
    }
}

void pe_fill_ref_iq4(pe_kernels *k) {
    k->type[PE_TYPE_IQ4_NL] = (pe_type_kernels){dequantize_iq4_nl, quantize_iq4_nl, vec_dot_iq4_nl};
    k->type[PE_TYPE_IQ4_XS] = (pe_type_kernels){dequantize_iq4_xs, quantize_iq4_xs, vec_dot_iq4_xs};
    k->type[PE_TYPE_MXFP4] = (pe_type_kernels){dequantize_mxfp4, quantize_mxfp4, vec_dot_mxfp4, .packed.pack16 = pe_mxfp4_pack16,
                                               .packed.gemm16 = gemm16_mxfp4};
}
