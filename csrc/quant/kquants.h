/* kquants.h - what the k-quant and IQ4 kernels share, scalar and SIMD alike:
 * the rounding ggml's quantizers use and the unpacking of packed sub-block
 * scales.  Private to csrc/quant and the per-ISA k-quant files. */
#ifndef PE_KQUANTS_H
#define PE_KQUANTS_H

#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kernels.h"

/* Keep a product a rounded float: compilers fuse a * b + c into one FMA,
 * which rounds once where ggml's x86 build rounds twice. */
#if defined(__GNUC__) && defined(__aarch64__)
#define PE_NO_FUSE(v) __asm__("" : "+w"(v))
#elif defined(__GNUC__) && defined(__x86_64__)
#define PE_NO_FUSE(v) __asm__("" : "+x"(v))
#else
#define PE_NO_FUSE(v) ((void)0)
#endif

/* Round to nearest, ties to even, by the float "magic number" trick: adding
 * 1.5 * 2^23 leaves the integer in the low mantissa bits.  Exact for
 * |x| <= 2^22; the SIMD twins give the same low byte for every input, inf
 * and nan included (NEON by the same trick, x86 by cvtps). */
static inline int pe_nearest_int(float x) {
    PE_NO_FUSE(x);
    const float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes.
 * Bytes 0..3 hold scales 0..3 (low 6 bits) and bytes 4..7 mins 0..3; bytes
 * 8..11 hold the low nibbles of scales / mins 4..7, whose top 2 bits sit in
 * the top bits of bytes 0..3 (scales) and 4..7 (mins). */
static inline void pe_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q3_K: sixteen 6-bit signed scales (stored + 32) in 12 bytes: the low
 * nibbles of scales 0..7 and 8..15 in bytes 0..7 (low, high nibble), the
 * top 2 bits in bytes 8..11 (scale j at bits 2*(j/4) of byte 8 + j%4). */
static inline void pe_q3k_unpack(const uint8_t *q, int8_t sc[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (q[j] & 0xF) : (q[j - 8] >> 4);
        const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* The same two unpackings, word-wise for the SIMD kernels.
 * Q4_K / Q5_K: sc[0..7] and mn[0..7] as bytes (two words each). */
static inline void pe_k4_unpack_words(const uint8_t *q, uint32_t sc[2], uint32_t mn[2]) {
    uint32_t u[3];
    memcpy(u, q, 12);
    sc[0] = u[0] & 0x3f3f3f3fu;
    mn[0] = u[1] & 0x3f3f3f3fu;
    sc[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    mn[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
}

/* Q3_K: the sixteen scales as bytes, still biased by +32 (0..63). */
static inline void pe_q3k_unpack_words(const uint8_t *q, uint32_t sc[4]) {
    uint32_t u[3];
    memcpy(u, q, 12);
    sc[0] = (u[0] & 0x0f0f0f0fu) | (((u[2] >> 0) & 0x03030303u) << 4);
    sc[1] = (u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4);
    sc[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4);
    sc[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4);
}

/* IQ4_XS: the 6-bit scale of sub-block ib (0..7), minus its bias of 32. */
static inline int pe_iq4xs_scale(const block_iq4_xs *b, int ib) {
    const int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int hi = (b->scales_h >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* MXFP4's prompt tile (pack16): PE_PACK_ROWS rows expanded once into their
 * levels (int8, pe_mxfp4_values, in element order: row r's n at
 * pe_mxfp4_levels(packed, n, r)), then every row's block scales as floats
 * (pe_mxfp4_scales), so that gemm16 forms vec_dot's integer lanes with no
 * nibble lookups and then takes vec_dot's float steps. */
static inline size_t pe_mxfp4_pack_bytes(int64_t n) {
    return (size_t)PE_PACK_ROWS * (size_t)n + (size_t)PE_PACK_ROWS * (size_t)(n / QK_MXFP4) * sizeof(float);
}
static inline const int8_t *pe_mxfp4_levels(const void *packed, int64_t n, int r) {
    return (const int8_t *)packed + (size_t)r * (size_t)n;
}
static inline const float *pe_mxfp4_scales(const void *packed, int64_t n, int r) {
    return (const float *)((const int8_t *)packed + (size_t)PE_PACK_ROWS * (size_t)n) + (size_t)r * (size_t)(n / QK_MXFP4);
}
size_t pe_mxfp4_pack16(int64_t n, const void *w, size_t bw, void *dst);   /* ref_iq4.c, every ISA's */

/* Reference kernels other files fill or call. */
void pe_fill_ref_iq4(pe_kernels *k);                               /* ref_iq4.c */
void pe_quantize_q2_K_ref(const float *x, void *y, int64_t n);     /* ref_kquants_quantize.c */
void pe_quantize_q3_K_ref(const float *x, void *y, int64_t n);
void pe_quantize_q4_K_ref(const float *x, void *y, int64_t n);
void pe_quantize_q5_K_ref(const float *x, void *y, int64_t n);
void pe_quantize_q6_K_ref(const float *x, void *y, int64_t n);

#endif /* PE_KQUANTS_H */
