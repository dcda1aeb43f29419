/* neon_mxfp4.c - NEON kernels of MXFP4 against Q8_0 (vec_dot and the prompt
 * tile), giving the x86 table's bits: ref_iq4.c's arithmetic, each block's
 * 8 integer lanes (elements 4t..4t+3) as two int32x4 from sdot (dot16),
 * multiply-added with da * dw into the even blocks' or the odd blocks'
 * accumulators (x86's 8 float lanes, held as two float32x4), the two added
 * and folded as x86_sum_ps8.  Activation codes of -128 are the one edge off
 * x86's bits, as for IQ4_NL (x86 moves the weight's sign onto them). */
#include "internal.h"
#include "kquants.h"

#if defined(__ARM_NEON)
#include <arm_neon.h>

#include "neon_common.h"

/* only the explicit fused multiply-adds (vfmaq) may fuse */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

static inline float f16(pe_f16 h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* acc += d * the block's lanes of levels (lo, hi: elements 0..15, 16..31)
 * and activation codes a */
static inline void fma_block(float32x4_t acc[2], int8x16_t lo, int8x16_t hi, const int8_t *a, float d) {
    const int32x4_t p0 = dot16(vdupq_n_s32(0), lo, vld1q_s8(a));
    const int32x4_t p1 = dot16(vdupq_n_s32(0), hi, vld1q_s8(a + 16));
    acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(p0), vdupq_n_f32(d));
    acc[1] = vfmaq_f32(acc[1], vcvtq_f32_s32(p1), vdupq_n_f32(d));
}

static inline void block_levels(const uint8_t *qs, int8x16_t grid, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(qs);
    *lo = vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0xF)));
    *hi = vqtbl1q_s8(grid, vshrq_n_u8(q, 4));
}

static inline float both_sets(const float32x4_t acc0[2], const float32x4_t acc1[2]) {
    return neon_sum8(vaddq_f32(acc0[0], acc1[0]), vaddq_f32(acc0[1], acc1[1]));
}

static void vec_dot_mxfp4(int64_t n, float *s, const void *vw, const void *va) {
    const block_mxfp4 *x = vw;
    const block_q8_0 *a = va;
    const int8x16_t grid = vld1q_s8(pe_mxfp4_values);
    float32x4_t acc0[2] = {vdupq_n_f32(0), vdupq_n_f32(0)}, acc1[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    const int64_t nb = n / QK_MXFP4;
    int8x16_t lo, hi;
    for (int64_t i = 0; i < nb; i++) {
        block_levels(x[i].qs, grid, &lo, &hi);
        const int second = i % 2 == 1 && i < nb - nb % 2;
        fma_block(second ? acc1 : acc0, lo, hi, a[i].qs, f16(a[i].d) * pe_mxfp4_scale(x[i].e));
    }
    *s = both_sets(acc0, acc1);
}

/* pe_mxfp4_pack16 (the reference's layout and values) with the lookups in registers */
static size_t pack16_mxfp4(int64_t n, const void *w, size_t bw, void *dst) {
    if (!dst) return pe_mxfp4_pack16(n, w, bw, dst);
    const int8x16_t grid = vld1q_s8(pe_mxfp4_values);
    for (int r = 0; r < PE_PACK_ROWS; r++) {
        const block_mxfp4 *x = (const block_mxfp4 *)((const uint8_t *)w + (size_t)r * bw);
        int8_t *levels = (int8_t *)pe_mxfp4_levels(dst, n, r);
        float *scales = (float *)pe_mxfp4_scales(dst, n, r);
        for (int64_t i = 0; i < n / QK_MXFP4; i++) {
            int8x16_t lo, hi;
            block_levels(x[i].qs, grid, &lo, &hi);
            vst1q_s8(levels + QK_MXFP4 * i, lo);
            vst1q_s8(levels + QK_MXFP4 * i + 16, hi);
            scales[i] = pe_mxfp4_scale(x[i].e);
        }
    }
    return pe_mxfp4_pack_bytes(n);
}

#define TILE_COLS 4   /* activation rows sharing a weight row's loads */

/* one packed row against up to TILE_COLS activation rows (a short group
 * repeats its last row and keeps only the valid results) */
static void row_tile(int64_t n, const int8_t *levels, const float *dw, const uint8_t *a, size_t ba, int nc,
                     float *s, size_t bs) {
    const block_q8_0 *col[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) col[c] = (const block_q8_0 *)(a + (size_t)(c < nc ? c : nc - 1) * ba);
    float32x4_t acc[TILE_COLS][2][2];
    for (int c = 0; c < TILE_COLS; c++)
        for (int h = 0; h < 2; h++) acc[c][h][0] = acc[c][h][1] = vdupq_n_f32(0);
    const int64_t nb = n / QK_MXFP4;
    for (int64_t i = 0; i < nb; i++) {
        const int8x16_t lo = vld1q_s8(levels + QK_MXFP4 * i), hi = vld1q_s8(levels + QK_MXFP4 * i + 16);
        const int second = i % 2 == 1 && i < nb - nb % 2;
        for (int c = 0; c < TILE_COLS; c++) fma_block(acc[c][second], lo, hi, col[c][i].qs, f16(col[c][i].d) * dw[i]);
    }
    for (int c = 0; c < nc; c++) s[(size_t)c * bs] = both_sets(acc[c][0], acc[c][1]);
}

static void gemm16_mxfp4(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int r = 0; r < PE_PACK_ROWS; r++)
        for (int j = 0; j < nc; j += TILE_COLS)
            row_tile(n, pe_mxfp4_levels(packed, n, r), pe_mxfp4_scales(packed, n, r), (const uint8_t *)a + (size_t)j * ba,
                     ba, nc - j < TILE_COLS ? nc - j : TILE_COLS, s + (size_t)j * bs + r, bs);
}

void PE_NEON_NAME(pe_fill_neon_mxfp4)(pe_kernels *k) {
    k->type[PE_TYPE_MXFP4].vec_dot = vec_dot_mxfp4;
    k->type[PE_TYPE_MXFP4].packed.pack16 = pack16_mxfp4;
    k->type[PE_TYPE_MXFP4].packed.gemm16 = gemm16_mxfp4;
}

#else /* no NEON: the reference kernels stay */

void PE_NEON_NAME(pe_fill_neon_mxfp4)(pe_kernels *k) { (void)k; }

#endif
