/* iquants.h - what the IQ1 / IQ2 / IQ3 kernels share, scalar and SIMD
 * alike: the lattice grids (set through pe_iq_grid_set, from the gguf
 * package), the sign patterns of IQ2_XXS / IQ2_XS / IQ3_XXS and the unpacking
 * of IQ1_M's scales.  Private to csrc/quant and the per-ISA IQ files.
 *
 * Every product here is exact in integers up to one float multiply-add per
 * sub-block group (as llama.cpp's generic code), so a SIMD twin that forms
 * the same integer sums gives the scalar reference's bits. */
#ifndef PE_IQUANTS_H
#define PE_IQUANTS_H

#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kernels.h"

/* Grid entries: 8 levels (4 for IQ3's) per index, row-major. */
extern uint8_t pe_iq2xxs_grid[256 * 8];   /* levels 8, 25, 43 */
extern uint8_t pe_iq2xs_grid[512 * 8];
extern uint8_t pe_iq2s_grid[1024 * 8];
extern uint8_t pe_iq3xxs_grid[256 * 4];   /* levels 4, 12, ..., 62 */
extern uint8_t pe_iq3s_grid[512 * 4];     /* levels 1, 3, ..., 15 */
extern int8_t  pe_iq1s_grid[2048 * 8];    /* levels -1, 0, 1 */

/* IQ2_XXS / IQ2_XS / IQ3_XXS store 7 sign bits per 8 weights; the eighth
 * makes the count of minus signs even.  Bit j of pe_iq2_signs[i] is the sign
 * of weight j (1: negative). */
extern uint8_t pe_iq2_signs[128];
/* The same signs as bytes, the operand of x86's sign_epi8: byte j of entry i is
 * -1 where bit j of pe_iq2_signs[i] is set, else +1 (never 0, which would zero
 * the weight). */
extern uint64_t pe_iq2_sign_bytes[128];

#define PE_IQ1_DELTA 0.125f   /* IQ1_S / IQ1_M: levels are grid +- this */

/* IQ1_M: the super-block scale, an f16 spread over the top nibbles of the
 * four 16-bit scale words */
static inline pe_f16 pe_iq1m_scale(const block_iq1_m *b) {
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof sc);
    return (pe_f16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

/* IQ1_M: the odd multiplier (2 s + 1) of the 16 weights h (0, 1) of sub-block ib */
static inline int pe_iq1m_sub_scale(const block_iq1_m *b, int ib, int h) {
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof sc);
    return 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) + 1;
}

/* A prompt tile's PE_PACK_ROWS weight rows of a lattice type, expanded once
 * (pack16) for all its activation rows (gemm16): a header, then per
 * super-block the rows' pe_lattice_rows.  A super-block's exact integers are
 *   sumi   = sum over pairs p of mult[p]  * (level[2p] q[2p] + level[2p+1] q[2p+1])
 *   shifts = sum over pairs p of shift[p] * (q[2p] + q[2p+1])
 * (q the activation codes): mult is the odd scale of the pair's 16 (IQ1_S,
 * IQ2_XXS, IQ3: of its 32), shift that scale times the sign of IQ1's 1/8
 * shift (0 for the other types); each row's result is
 *   factor * sum over super-blocks of d * da * ((float)sumi + 0.125f * (float)shifts),
 * the very float operations of the type's vec_dot (adding 0 changes no bits). */
typedef struct {
    int8_t  level[QK_K];
    int16_t mult[QK_K / 2];
    int16_t shift[QK_K / 2];
    float   d;
} pe_lattice_row;
typedef struct {
    float factor;
    int   has_shifts;   /* IQ1: the shifts are not all 0 */
} pe_lattice_pack;
#define PE_LATTICE_HEADER 64   /* the rows start here, 64-byte aligned */

static inline const pe_lattice_row *pe_lattice_rows(const void *packed) {
    return (const pe_lattice_row *)((const uint8_t *)packed + PE_LATTICE_HEADER);
}

/* gemm16 of the lattice types around a super-block's integers (`sums`: the
 * scalar one in ref_iquants.c, SIMD ones per ISA): the float part, shared so
 * that every ISA performs the same operations as vec_dot */
typedef void (*pe_lattice_sums_fn)(const pe_lattice_row *w, const int8_t *q, int has_shifts, int32_t *sumi,
                                   int32_t *shifts);

static inline int pe_lattice_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba,
                                    int nc, pe_lattice_sums_fn sums) {
    const pe_lattice_pack *head = packed;
    const pe_lattice_row *rows = pe_lattice_rows(packed);
    for (int j = 0; j < nc; j++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)a + (size_t)j * ba);
        float sum[PE_PACK_ROWS] = {0};
        for (int64_t b = 0; b < n / QK_K; b++)
            for (int r = 0; r < PE_PACK_ROWS; r++) {
                int32_t sumi, shifts;
                const pe_lattice_row *w = &rows[b * PE_PACK_ROWS + r];
                sums(w, y[b].qs, head->has_shifts, &sumi, &shifts);
                sum[r] += w->d * y[b].d * ((float)sumi + PE_IQ1_DELTA * (float)shifts);
            }
        for (int r = 0; r < PE_PACK_ROWS; r++) s[(size_t)j * bs + r] = head->factor * sum[r];
    }
    return 1;   /* every path: the lattice types have one arithmetic */
}

/* 1 once the type's grid is set (always 1 for the other types) */
int pe_iq_type_ready(int type);

#endif /* PE_IQUANTS_H */
