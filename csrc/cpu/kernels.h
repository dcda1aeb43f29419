/* kernels.h - the per-ISA function table.
 *
 * Each instruction set fills the entries it implements, on top of the scalar
 * reference; the table is chosen once (pe_isa_select) and hot loops call
 * through it without testing CPU features. */
#ifndef PE_KERNELS_H
#define PE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "pe.h"

/* Dequantize n elements (n a multiple of the block size). */
typedef void (*pe_to_float_fn)(const void *x, float *y, int64_t n);
/* Quantize n floats into blocks. */
typedef void (*pe_from_float_fn)(const float *x, void *y, int64_t n);
/* Dot product of n elements: a row of a weight type with a row of its
 * vec_dot partner type (already quantized). */
typedef void (*pe_vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);

/* A tile of dot products over n elements: for i < nr weight rows (stride bw
 * bytes) and j < nc activation rows (stride ba bytes, already quantized to
 * the partner type), s[j * bs + i] = dot(w_i, a_j).  nr <= PE_GEMM_ROWS,
 * nc <= PE_GEMM_COLS.
 * Every element must be bit-identical to vec_dot(w_i, a_j): a row's result
 * may not depend on which other rows share its tile. */
#define PE_GEMM_ROWS 4
#define PE_GEMM_COLS 8
typedef void (*pe_gemm_fn)(int64_t n, float *s, size_t bs, const void *w, size_t bw,
                           const void *a, size_t ba, int nr, int nc);

/* Optional, for a prompt batch's tiles: a type may copy PE_PACK_ROWS weight
 * rows (of n elements, stride bw) into an interleaved layout once per tile
 * (pack16; with dst NULL it returns the bytes that takes) and multiply the
 * copy with up to PE_GEMM_COLS activation rows (gemm16: s[j * bs + i],
 * i < PE_PACK_ROWS, j < nc), each element bit-identical to vec_dot's. */
#define PE_PACK_ROWS 16
typedef size_t (*pe_pack16_fn)(int64_t n, const void *w, size_t bw, void *dst);
typedef void (*pe_gemm16_fn)(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc);
/* Optional, where 16 rows leave a kernel short of registers' worth of work:
 * gemm16 over two packs (rows 0-15 at packed0, 16-31 at packed1) at once,
 * any nc: s[j * bs + i], i < 2 * PE_PACK_ROWS, j < nc. */
typedef void (*pe_gemm32_fn)(int64_t n, float *s, size_t bs, const void *packed0, const void *packed1, const void *a,
                             size_t ba, int nc);

/* Optional, for decoding: PE_GEMM8_ROWS weight rows (stride bw) against
 * nc <= PE_GEMM8_MAX_COLS activation rows (stride ba), s[j * bs + i] =
 * dot(w_i, a_j), each bit-identical to vec_dot. */
#define PE_GEMM8_ROWS 8
#define PE_GEMM8_MAX_COLS 4
/* the floats after a Q8_1 row of n elements for a gemm8 with rows8.scales */
#define PE_Q8_1_SCALES_BYTES(n) ((size_t)(n) / 32 * 2 * sizeof(float))
/* what follows a Q8_0 row for a gemm8 with rows8.scales, from the first
 * 4-byte boundary after its blocks: per block its d as a float and the sums
 * of its codes 4 by 4 times the offset that the weight's codes carry in the
 * decoding kernel's integer product, negated (the start that takes the
 * offset back off) */
typedef struct {
    float   d;
    int32_t start4[8];   /* -8 x the sums: Q4_0 packed, codes taken as their nibbles */
    int32_t start8[8];   /* -128 x the sums: Q8_0 x8, codes stored + 128 */
    int32_t start5[8];   /* -16 x the sums: Q5_0 x8, codes taken as n + 16 f */
} pe_q8_0_scales;
#define PE_Q8_0_SCALES_AT(n) (((size_t)(n) / 32 * 34 + 3) / 4 * 4)
#define PE_Q8_0_SCALES_BYTES(n) (PE_Q8_0_SCALES_AT(n) - (size_t)(n) / 32 * 34 + (size_t)(n) / 32 * sizeof(pe_q8_0_scales))
typedef void (*pe_gemm8_fn)(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba,
                            int nc);

/* Interleaved types (rows by 8, see pe_type_rows8): unpack8 writes the 8
 * base-type rows (n elements, stride bw) of one group back out, for the
 * products gemm8 does not take; gemm8 reads a group (w; bw unused), each
 * result bit-identical to the base type's vec_dot. */
typedef void (*pe_unpack8_fn)(int64_t n, const void *group, void *rows, size_t bw);

/* A prompt batch's tiles over weights packed once per tile (pack16 and
 * gemm16 above), for the types whose products pay for it. */
typedef struct pe_packed_kernels {
    pe_pack16_fn pack16;   /* optional, with gemm16 */
    pe_gemm16_fn gemm16;
    pe_gemm32_fn gemm32;   /* optional, with gemm16 */
    int          scales;   /* gemm16 takes its Q8_0 activation rows followed by pe_q8_0_scales (its
                              groups' starts made once per row, not once per tile) */
} pe_packed_kernels;

/* The interleaved types' kernels (rows by 8, pe_type_rows8): the repack's
 * way back, and the decoding kernels that read the groups as they are. */
typedef struct pe_rows8_kernels {
    pe_unpack8_fn unpack8;     /* every interleaved type */
    pe_pack16_fn  pack16;      /* optional: the base type's packed.pack16 straight from 16 rows (two adjacent
                                  groups, the second at w + 8 bw), the same bytes */
    pe_gemm8_fn   gemm8;       /* optional */
    pe_gemm8_fn   gemm8_pair;  /* optional: gemm8 over two adjacent groups, 16 rows (the second group at
                                  w + 8 bw), same bits */
    int           cols;        /* the most activation rows gemm8 takes before unpacked tiles win (0: the
                                  default, ROWS8_DECODE_COLS) */
    int           scales;      /* gemm8 takes each activation row followed by its blocks' scales as floats:
                                  Q8_1 rows their d, then s (PE_Q8_1_SCALES_BYTES more per row), Q8_0 rows
                                  pe_q8_0_scales (PE_Q8_0_SCALES_BYTES) */
} pe_rows8_kernels;

/* What a type needs, as ggml's type traits: from_float to its vec_dot
 * partner (the partner type is a trait, pe_type_vec_dot_type), the dot
 * product, a GEMM tile, and the optional repacks. */
typedef struct pe_type_kernels {
    pe_to_float_fn    to_float;
    pe_from_float_fn  from_float;
    pe_vec_dot_fn     vec_dot;
    pe_gemm_fn        gemm;     /* optional; NULL -> vec_dot pair by pair */
    pe_packed_kernels packed;   /* optional */
    pe_rows8_kernels  rows8;    /* interleaved types only */
} pe_type_kernels;

/* Float loops shared by the ops (attention over an F16 cache, norms, ...).
 * Every table gives the same bits: each kernel has one order (cpu/vec.c). */
typedef struct pe_vec_kernels {
    /* the lanes of the products and sums: 16 on every ISA */
    int    lanes;
    /* attention's product of nh heads' probabilities p[h] with the same F16 V,
     * into out[h], in nacc accumulators of `lanes` (see vec.c); scratch holds
     * nh * 4 * lanes * hd floats */
    void  (*values_f16)(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v,
                        size_t stride, int64_t hd, int nacc, float *const *out, float *scratch);
    /* sum_i x[a][i] * f16(y[b][i]) for up to 4 queries (a GQA group's heads) and up to 4
     * rows, into out[4 * a + b], in nacc accumulators of `lanes`: 1 is a batch's tiled
     * path, 4 a lone token's row dot product */
    void  (*dot_tile_f32_f16)(int64_t n, const float *const *x, int nx, const uint16_t *const *y, int ny, int nacc,
                              float *out);
    /* the product of nh <= 4 heads' probabilities with a transposed F16 V
     * (row d: element d of every slot), values_f16's sums with nacc 1 */
    void  (*values_t_f16)(int64_t n, int nh, const float *const *p, const uint16_t *vt, size_t vt_stride, int64_t hd,
                          float *const *out);
    /* y[i] = f16(x[i] * scale), back in float */
    void  (*scale_round_f16)(int64_t n, float *y, const float *x, float scale);
    /* x[i] *= scale, returning the largest (NaN ignored, -inf if none) */
    float (*scale_max)(int64_t n, float *x, float scale);
    /* the largest x[i] (NaN ignored, -inf if none) */
    float (*max)(int64_t n, const float *x);
    /* the same, and *nan set to 1 when some x[i] is NaN (left as it is otherwise) */
    float (*max_nan)(int64_t n, const float *x, int *nan);
    /* y[i] = exp(x[i] - max), returning the sum in double */
    double (*exp_sum)(int64_t n, float *y, const float *x, float max);
    void  (*f32_to_f16)(int64_t n, const float *x, uint16_t *y);
    void  (*f16_to_f32)(int64_t n, const uint16_t *x, float *y);
    double (*sum_sq)(int64_t n, const float *x);                /* sum of float x^2, in double */
    void  (*silu_mul)(int64_t n, float *y, const float *g, const float *u);  /* silu(g)*u */
    void  (*gelu_mul)(int64_t n, float *y, const float *g, const float *u);  /* gelu_tanh(g)*u */
} pe_vec_kernels;

/* The rows of one head's piece of tokens for the chunked delta rule: token i's
 * q, k and v rows at q + i * q_step etc., its log decay and beta at g[i *
 * g_step], beta[i * beta_step]; its output row at out + i * out_step. */
typedef struct pe_delta_rows {
    const float *q, *k, *v, *g, *beta;
    float       *out;
    int64_t      q_step, k_step, v_step, g_step, beta_step, out_step;
    float        scale;
} pe_delta_rows;

/* the floats of scratch delta_chunk takes for pieces of up to L tokens */
static inline size_t pe_delta_chunk_floats(int64_t L, int64_t dk, int64_t dv) {
    return (size_t)(L * (5 * dk + 4 * dv) + 2 * dk * L + 3 * L * L + L);
}

/* The recurrent layers' loops (cpu/vec_ssm.c).  Every output element is one
 * chain of fused multiply-adds in a fixed order, the same on every table. */
typedef struct pe_ssm_kernels {
    /* C[m][n] = fma(A[m][l], B[l][n], C[m][n]) for l = 0..K-1 in order (m < M, n < N) */
    void (*gemm_acc)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float *C, int64_t ldc);
    /* y[i] = fma(a, x[i], y[i]) */
    void (*axpy)(int64_t n, float *y, float a, const float *x);
    /* one token of the gated delta rule on a head's state S [dk][dv]: S *= decay,
     * d = (v - S^T k) * beta, S += k d^T, out = S^T q */
    void (*delta_token)(int64_t dk, int64_t dv, float *S, const float *k, const float *q, const float *v,
                        float decay, float beta, float *out);
    /* one token of the selective scan on a head's state S [n][p]: S = S * dA + B xdt^T, y = S^T C */
    void (*scan_token)(int64_t p, int64_t n, float *S, const float *xdt, const float *B, const float *C, float dA,
                       float *y);
    /* the gated delta rule over a piece of 2 <= n <= PE_DELTA_MAX_CHUNK tokens of one head in
     * its chunked form (the piece's products as matrices), on S [dk][dv] */
    void (*delta_chunk)(int64_t n, int64_t dk, int64_t dv, float *S, const pe_delta_rows *rows, float *scratch);
    /* y[c] = sum_j w[j * d + c] * cols[j][c], j < K */
    void (*conv_token)(int64_t d, int K, const float *const *cols, const float *w, float *y);
} pe_ssm_kernels;

typedef struct pe_kernels {
    const char     *isa;
    pe_type_kernels type[PE_TYPE_COUNT];
    pe_vec_kernels  vec;
    pe_ssm_kernels  ssm;
} pe_kernels;

/* The table in use; never NULL after pe_init(). */
extern const pe_kernels *pe_kern;
/* The scalar reference table, always available. */
const pe_kernels *pe_kernels_ref(void);
void pe_init(void);

/* Fill functions, one per kernel family and ISA; each overrides entries of a
 * table already holding the reference (or a lower ISA's) kernels. */
void pe_fill_ref_float(pe_kernels *k);     /* quant/ref_float.c   F32 F16 BF16 */
void pe_fill_ref_legacy(pe_kernels *k);    /* quant/ref_legacy.c  Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 */
void pe_fill_ref_kquants(pe_kernels *k);   /* quant/ref_kquants.c Q2_K..Q6_K Q8_K IQ4_NL IQ4_XS MXFP4 */
void pe_fill_ref_rows8(pe_kernels *k);     /* quant/ref_rows8.c   the interleaved types (*_X8) */
void pe_fill_ref_iquants(pe_kernels *k);   /* quant/ref_iquants.c IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S */
void pe_fill_vec_scalar(pe_kernels *k);    /* cpu/vec.c compiled without SIMD flags */
void pe_fill_ssm_scalar(pe_kernels *k);    /* cpu/vec_ssm.c compiled without SIMD flags */
#if defined(PE_ARCH_X86)
void pe_fill_avx2_legacy(pe_kernels *k);   /* cpu/x86/avx2_legacy.c */
void pe_fill_avx2_kquants(pe_kernels *k);  /* cpu/x86/avx2_kquants.c */
void pe_fill_avx2_iq2(pe_kernels *k);      /* cpu/x86/avx2_iq2.c: IQ2_XXS IQ2_XS IQ2_S */
void pe_fill_avx2_iq13(pe_kernels *k);     /* cpu/x86/avx2_iq13.c: IQ3_XXS IQ3_S IQ1_S IQ1_M */
void pe_fill_avx2_iq_gemm(pe_kernels *k);  /* cpu/x86/avx2_iq_gemm.c: the lattice types' prompt tiles */
void pe_fill_avx2_gemm(pe_kernels *k);     /* cpu/x86/avx2_gemm.c: vec_dot + gemm */
void pe_fill_avx2_mxfp4(pe_kernels *k);    /* cpu/x86/avx2_mxfp4.c: vec_dot + gemm16 */
void pe_fill_vec_avx2(pe_kernels *k);      /* cpu/vec.c compiled with AVX2 flags */
void pe_fill_ssm_avx2(pe_kernels *k);      /* cpu/vec_ssm.c compiled with AVX2 flags */
void pe_fill_avxvnni_gemm(pe_kernels *k);  /* cpu/x86/avxvnni_gemm.c: avx2_gemm.c with vpdpbusd */
void pe_fill_avx512_legacy(pe_kernels *k); /* cpu/x86/avx512_legacy.c */
void pe_fill_avx512_gemm(pe_kernels *k);   /* cpu/x86/avx512_gemm.c: vec_dot + gemm */
void pe_fill_avx512_iq_gemm(pe_kernels *k);/* cpu/x86/avx512_iq_gemm.c: the lattice types' prompt tiles */
void pe_fill_avx512_mxfp4(pe_kernels *k);  /* cpu/x86/avx512_mxfp4.c: vec_dot + gemm16 */
void pe_fill_vec_avx512(pe_kernels *k);    /* cpu/vec.c compiled with AVX-512 flags */
void pe_fill_ssm_avx512(pe_kernels *k);    /* cpu/vec_ssm.c compiled with AVX-512 flags */
#endif
#if defined(PE_ARCH_ARM)
/* The NEON files are compiled twice: with the dot-product extension (the "neon"
 * table) and, for the arm64 CPUs without it (Cortex-A53/A72: Raspberry Pi 3 and 4),
 * without it (PE_NEON_NODOT: "neon_nodot").  Both give the same integer sums, so
 * the same bits; each build's fill functions get their own names. */
#if defined(PE_NEON_NODOT)
#define PE_NEON_NAME(name) name##_nodot
#else
#define PE_NEON_NAME(name) name
#endif
void pe_fill_neon_legacy(pe_kernels *k);   /* cpu/arm/neon_legacy.c */
void pe_fill_neon_kquants(pe_kernels *k);  /* cpu/arm/neon_kquants.c */
void pe_fill_neon_iquants(pe_kernels *k);  /* cpu/arm/neon_iquants.c: IQ1_S..IQ3_S */
void pe_fill_neon_iq_gemm(pe_kernels *k);  /* cpu/arm/neon_iq_gemm.c: the lattice types' gemm16 */
void pe_fill_neon_mxfp4(pe_kernels *k);    /* cpu/arm/neon_mxfp4.c: vec_dot + gemm16 */
void pe_fill_vec_neon(pe_kernels *k);      /* cpu/vec.c compiled for NEON */
void pe_fill_ssm_neon(pe_kernels *k);      /* cpu/vec_ssm.c compiled for NEON (cpu/arm/neon_vec_ssm.c) */
void pe_fill_neon_legacy_nodot(pe_kernels *k);
void pe_fill_neon_kquants_nodot(pe_kernels *k);
void pe_fill_neon_iquants_nodot(pe_kernels *k);
void pe_fill_neon_iq_gemm_nodot(pe_kernels *k);
void pe_fill_neon_mxfp4_nodot(pe_kernels *k);
void pe_fill_vec_neon_nodot(pe_kernels *k);
void pe_fill_ssm_neon_nodot(pe_kernels *k);
#endif

#endif /* PE_KERNELS_H */
