/* blocks.h - GGUF block layouts (bit-exact with the file format) and the
 * half-precision conversions every kernel shares. */
#ifndef PE_BLOCKS_H
#define PE_BLOCKS_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t pe_f16;   /* IEEE half, stored as bits */
typedef uint16_t pe_bf16;  /* bfloat16, stored as bits */

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K  256
#define K_SCALE_SIZE 12
#define QK4_NL 32
#define QK_MXFP4 32

typedef struct { pe_f16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { pe_f16 d; pe_f16 m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { pe_f16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { pe_f16 d; pe_f16 m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { pe_f16 d; int8_t qs[QK8_0]; } block_q8_0;
/* q8_1: d and s = d * sum(qs), the dot partner of q4_1 / q5_1 */
typedef struct { pe_f16 d; pe_f16 s; int8_t qs[QK8_1]; } block_q8_1;

typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; pe_f16 d; pe_f16 dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; pe_f16 d; } block_q3_K;
typedef struct { pe_f16 d; pe_f16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { pe_f16 d; pe_f16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; pe_f16 d; } block_q6_K;
/* q8_K: float scale and per-16 sums, the dot partner of the k-quants */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

/* IQ2 / IQ3 / IQ1: 8 (IQ3: 4) weights per index into a lattice grid
 * (iquants.h), sign bits apart; super-blocks of 256 in sub-blocks of 32 */
typedef struct { pe_f16 d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { pe_f16 d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
typedef struct { pe_f16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
typedef struct { pe_f16 d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
typedef struct {
    pe_f16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64];
} block_iq3_s;
typedef struct { pe_f16 d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
/* IQ1_M keeps its f16 super-block scale in the top nibbles of the four
 * 16-bit words of `scales` */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;

typedef struct { pe_f16 d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
/* MXFP4 (OCP microscaling): 32 E2M1 codes sharing one E8M0 exponent e.  The
 * codes index pe_mxfp4_values (E2M1's levels doubled, so integers), the
 * block's scale is then half of E8M0's 2^(e - 127): see pe_mxfp4_scale.
 * Codes as IQ4_NL's: element j in the low nibble of qs[j], j + 16 in its
 * high one. */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
typedef struct { pe_f16 d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;

/* Q4_1 rows interleaved by 8 (PE_TYPE_Q4_1_X8, made at load, never in a
 * file): block b of rows 8g..8g+7 as their scales, then each 4-byte group t
 * of the rows' codes side by side, so one 256-bit load holds group t of all
 * 8 rows.  A group of 8 rows takes the bytes of 8 Q4_1 rows. */
typedef struct { pe_f16 d[8]; pe_f16 m[8]; uint8_t qs[4][8][4]; } block_q4_1x8;
/* Q4_0 likewise (PE_TYPE_Q4_0_X8) */
typedef struct { pe_f16 d[8]; uint8_t qs[4][8][4]; } block_q4_0x8;
/* Q8_0 likewise (PE_TYPE_Q8_0_X8): 4-byte group t of the codes (elements
 * 4t..4t+3) of the 8 rows side by side, each code stored + 128, unsigned
 * (the unsigned operand of vpdpbusd) */
typedef struct { pe_f16 d[8]; uint8_t qs[8][8][4]; } block_q8_0x8;
/* Q5_0 likewise (PE_TYPE_Q5_0_X8), its fifth bits by lane: bit 4r + e of
 * qh[t] is element 4t + e's of row r (the file's qh[r] bit 4t + e), one bit
 * per byte of lane t's 8 x 4 codes */
typedef struct { pe_f16 d[8]; uint32_t qh[8]; uint8_t qs[4][8][4]; } block_q5_0x8;
/* IQ4_NL likewise (PE_TYPE_IQ4_NL_X8): its blocks are Q4_0's shape */
typedef block_q4_0x8 block_iq4_nlx8;
/* MXFP4 likewise (PE_TYPE_MXFP4_X8): the 8 rows' exponents, then their codes
 * by 4-byte group as Q4_0's */
typedef struct { uint8_t e[8]; uint8_t qs[4][8][4]; } block_mxfp4x8;
/* Q4_K likewise (PE_TYPE_Q4_K_X8): 4-byte word w of the rows' packed
 * scales (bytes 4w..4w+3) side by side, so that one load holds a word of
 * every row, and 4-byte group g of 32-byte chunk c of the codes side by
 * side */
typedef struct { pe_f16 d[8], dmin[8]; uint8_t scales[K_SCALE_SIZE / 4][8][4]; uint8_t qs[4][8][8][4]; } block_q4_Kx8;
/* Q6_K likewise (PE_TYPE_Q6_K_X8), its codes re-cut: the 8 rows' d, their
 * scales by sub-block, then the 6-bit codes (0..63, the file's less nothing)
 * by half h, 4-element group t of a 32-element chunk and piece i: byte 4r + e
 * of qs[h][t][i] holds code e of group t of chunk 4h + i of row r in its low
 * 6 bits and bits 2i, 2i + 1 of chunk 4h + 3's code in its top two.  Three
 * loads and masks then give four chunks' code vectors of 8 rows (the file's
 * split in 4 + 2 bits would take twice the shifts and masks). */
typedef struct { pe_f16 d[8]; int8_t scales[QK_K / 16][8]; uint8_t qs[2][8][3][8][4]; } block_q6_Kx8;

static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "q4_0 size");
static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "q4_1 size");
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "q5_0 size");
static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "q5_1 size");
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "q8_0 size");
static_assert(sizeof(block_q8_1) == 4 + QK8_1, "q8_1 size");
static_assert(sizeof(block_q2_K) == QK_K / 16 + QK_K / 4 + 4, "q2_K size");
static_assert(sizeof(block_q3_K) == QK_K / 8 + QK_K / 4 + 12 + 2, "q3_K size");
static_assert(sizeof(block_q4_K) == 4 + K_SCALE_SIZE + QK_K / 2, "q4_K size");
static_assert(sizeof(block_q5_K) == 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2, "q5_K size");
static_assert(sizeof(block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "q6_K size");
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "q8_K size");
static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "iq4_nl size");
static_assert(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "mxfp4 size");
static_assert(sizeof(block_mxfp4x8) == 8 * sizeof(block_mxfp4), "mxfp4x8 size");
static_assert(sizeof(block_iq4_xs) == 4 + QK_K / 64 + QK_K / 2, "iq4_xs size");
static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs size");
static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs size");
static_assert(sizeof(block_iq2_s) == 82, "iq2_s size");
static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs size");
static_assert(sizeof(block_iq3_s) == 110, "iq3_s size");
static_assert(sizeof(block_iq1_s) == 50, "iq1_s size");
static_assert(sizeof(block_iq1_m) == 56, "iq1_m size");
static_assert(sizeof(block_q4_1x8) == 8 * sizeof(block_q4_1), "q4_1x8 size");
static_assert(sizeof(block_q4_0x8) == 8 * sizeof(block_q4_0), "q4_0x8 size");
static_assert(sizeof(block_q4_Kx8) == 8 * sizeof(block_q4_K), "q4_Kx8 size");
static_assert(sizeof(block_q6_Kx8) == 8 * sizeof(block_q6_K), "q6_Kx8 size");
static_assert(sizeof(block_iq4_nlx8) == 8 * sizeof(block_iq4_nl), "iq4_nlx8 size");
static_assert(sizeof(block_q8_0x8) == 8 * sizeof(block_q8_0), "q8_0x8 size");
static_assert(sizeof(block_q5_0x8) == 8 * sizeof(block_q5_0), "q5_0x8 size");

/* The non-linear 4-bit grid of IQ4_NL / IQ4_XS. */
extern const int8_t pe_iq4nl_values[16];
/* E2M1's 16 values doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
 * (code 8 is -0, here 0) */
extern const int8_t pe_mxfp4_values[16];

/* ---- half precision ------------------------------------------------------ */

static inline float pe_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t pe_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Exact IEEE half -> float for every input (normals, subnormals, inf, nan). */
static inline float pe_f16_to_f32(pe_f16 h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp  = (h >> 10) & 0x1f;
    const uint32_t man  = h & 0x3ff;
    if (exp == 0x1f) return pe_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0)    return pe_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
    /* subnormal or zero: man * 2^-24 */
    const float mag = (float)man * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
}

/* float -> IEEE half, round to nearest even (the F16C instruction's result). */
static inline pe_f16 pe_f32_to_f16(float f) {
    const uint32_t x    = pe_f32_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t ax   = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (pe_f16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (pe_f16)(sign | 0x7c00);          /* overflow -> inf */
    if (ax < 0x38800000u) {                                          /* subnormal half */
        /* add 0.5 (as float) to push the bits into place with rounding */
        const float v = pe_bits_to_f32(ax) + 0.5f;
        return (pe_f16)(sign | (pe_f32_to_bits(v) - 0x3f000000u));
    }
    const uint32_t odd = (ax >> 13) & 1;
    return (pe_f16)(sign | ((ax + 0xc8000fffu + odd) >> 13));
}

/* MXFP4's block scale 2^(e - 128) (E8M0's 2^(e - 127) halved for the doubled
 * levels), exact for every e: e 0 and 1 give the subnormals 2^-128 and
 * 2^-127, and 255 (E8M0's NaN) gives 2^127 as in ggml. */
static inline float pe_mxfp4_scale(uint8_t e) {
    return pe_bits_to_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static inline float pe_bf16_to_f32(pe_bf16 h) { return pe_bits_to_f32((uint32_t)h << 16); }

/* float -> bfloat16, round to nearest even; NaN stays NaN. */
static inline pe_bf16 pe_f32_to_bf16(float f) {
    const uint32_t u = pe_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pe_bf16)((u >> 16) | 64);
    return (pe_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif /* PE_BLOCKS_H */
