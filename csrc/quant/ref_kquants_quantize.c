/* ref_kquants_quantize.c - the k-quants' reference quantizers (ggml's
 * quantize_row_q{2..6}_K_ref: no importance matrix).
 *
 * Models arrive quantized, so these serve tests and tools; they follow
 * ggml's search for sub-block scales step by step, float expression by float
 * expression, so a row quantizes to the bytes llama.cpp would write. */
#include <math.h>

#include "internal.h"
#include "kquants.h"

#define GROUP_MAX_EPS 1e-15f

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* the element of largest magnitude (the first one on ties) and that magnitude */
static float signed_absmax(int n, const float *x, float *amax_out) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    *amax_out = amax;
    return max;
}

/* Symmetric levels -nmax..nmax-1 (stored + nmax) weighted by x^2: the scale
 * -max/nmax, then 18 nearby scales, keeping the best weighted fit. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(pe_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(pe_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(pe_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block fit: start from -max/nmax, then up to five passes that move
 * single levels while the weighted fit improves. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(pe_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clampi(pe_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Levels 0..nmax with a scale and a min (x ~ scale * l - min): start from the
 * range, then try nstep + 1 scales around it, each with the least-squares
 * scale and min for its levels; the error is weighted, squared or absolute. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(pe_nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(pe_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* 2 bits per level, four levels per byte: element j + 32 k of each 128 in
 * bits 2k of byte j (Q2_K and Q3_K share it). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* ---- Q2_K ------------------------------------------------------------------ */

void pe_quantize_q2_K_ref(const float *x, void *vy, int64_t n) {
    block_q2_K *y = vy;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)pe_nearest_int(iscale * scales[j]);
            y[i].d = pe_f32_to_f16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = pe_f32_to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(pe_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = pe_f32_to_f16(max_min / q4scale);
        } else {
            y[i].dmin = pe_f32_to_f16(0.f);
        }
        /* re-pick the levels against the rounded scales */
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = pe_f16_to_f32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = pe_f16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clampi(pe_nearest_int((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

/* ---- Q3_K ------------------------------------------------------------------ */

/* store the 6-bit (biased) scale l of sub-block j in Q3_K's packing */
static void q3k_put_scale(uint8_t *scales, int j, int l) {
    if (j < 8) scales[j] = (uint8_t)(l & 0xF);
    else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

void pe_quantize_q3_K_ref(const float *x, void *vy, int64_t n) {
    block_q3_K *y = vy;
    int8_t L[QK_K], sc[16];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                const int8_t l = (int8_t)pe_nearest_int(iscale * scales[j]);
                q3k_put_scale(y[i].scales, j, clampi(l, -32, 31) + 32);
            }
            y[i].d = pe_f32_to_f16(1 / iscale);
        } else {
            y[i].d = pe_f32_to_f16(0.f);
        }
        pe_q3k_unpack(y[i].scales, sc);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = pe_f16_to_f32(y[i].d) * sc[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(pe_nearest_int(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* the third bit of element j goes to hmask[j % 32] bit j / 32 */
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
                L[j] -= 4;
            }
        }
        pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

/* ---- Q4_K / Q5_K ----------------------------------------------------------- */

/* Fit the eight sub-blocks of 32 (levels 0..nmax with a min), store the 6-bit
 * scales and mins with their super-block factors, and re-pick the levels
 * against the rounded scales into L. */
static void quantize_scaled_mins(const float *x, int nmax, float rmin, float rdelta, int nstep,
                                 uint8_t packed[K_SCALE_SIZE], pe_f16 *d_out, pe_f16 *dmin_out,
                                 uint8_t L[QK_K]) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, rdelta, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)pe_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)pe_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = pe_f32_to_f16(max_scale / 63.f);
    *dmin_out = pe_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        pe_k4_scale_min(j, packed, &sc, &m);
        const float d = pe_f16_to_f32(*d_out) * sc;
        if (!d) continue;
        const float dm = pe_f16_to_f32(*dmin_out) * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(pe_nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

void pe_quantize_q4_K_ref(const float *x, void *vy, int64_t n) {
    block_q4_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        quantize_scaled_mins(x, 15, -1.f, 0.1f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void pe_quantize_q5_K_ref(const float *x, void *vy, int64_t n) {
    block_q5_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        quantize_scaled_mins(x, 31, -0.5f, 0.1f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        /* the fifth bit of element e goes to qh[e % 32] bit e / 32 */
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int e = 0; e < QK_K; e++)
            if (L[e] > 15) {
                y[i].qh[e % 32] |= (uint8_t)(1 << (e / 32));
                L[e] -= 16;
            }
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

/* ---- Q6_K ------------------------------------------------------------------ */

void pe_quantize_q6_K_ref(const float *x, void *vy, int64_t n) {
    block_q6_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scales[ib]; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = pe_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const int l = pe_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(l < 127 ? l : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = pe_f16_to_f32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(pe_nearest_int(x[16 * j + l] / d), -32, 31) + 32);
        }
        /* low nibbles: elements l, l+32 of each 128 in ql[l], ql[l+32] low, l+64 and
         * l+96 in their high nibbles; top 2 bits of all four in qh[l] */
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *u = (const uint8_t *)L + j + l;
                ql[l] = (uint8_t)((u[0] & 0xF) | ((u[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((u[32] & 0xF) | ((u[96] & 0xF) << 4));
                qh[l] = (uint8_t)((u[0] >> 4) | ((u[32] >> 4) << 2) | ((u[64] >> 4) << 4) | ((u[96] >> 4) << 6));
            }
        }
    }
}
