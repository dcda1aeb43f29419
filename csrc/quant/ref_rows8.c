/* ref_rows8.c - Q4_1, Q4_0, IQ4_NL, Q4_K, Q8_0, Q5_0, MXFP4 and Q6_K weights
 * interleaved by 8 rows (block_q4_1x8, block_q4_0x8, block_iq4_nlx8,
 * block_q4_Kx8, block_q8_0x8, block_q5_0x8, block_mxfp4x8, block_q6_Kx8): the repacking
 * done at load and its inverse.
 *
 * Why a second layout: decoding reads every weight row once per token, and
 * the products as the file lays rows out take a row at a time: a scale per
 * row and block to gather, codes to unpack per row, 8 rows as 8 short
 * streams through memory.  Interleaved, block b of 8 rows is one run of
 * bytes: their scales convert in one instruction, and group t of their codes
 * is one 256-bit load whose integer product with the activation's group t
 * gives the 8 rows' sums in their own lanes; the float steps (llama.cpp's:
 * per lane for Q4_1, Q8_0 and Q5_0, per block for Q4_0 and IQ4_NL and per super-block for
 * Q4_K, the arithmetic of llama.cpp's own repacked copies) then run for 8 rows at once
 * (x86_gemm_rows8.h).
 * Products of more activation rows than decoding's unpack the rows back and
 * use the base type's kernels, so every result keeps its bits. */
#include <string.h>

#include "blocks.h"
#include "internal.h"

/* Every interleaved layout is a row block's pieces, lane by lane: its f16
 * fields (d, then m or dmin), bytes kept whole per row (Q5_0's fifth bits)
 * or like the codes (Q4_K's packed scales), then the codes by 4-byte group,
 * the 8 rows side by side. */
typedef struct {
    int halves;         /* leading f16 fields */
    int whole;          /* bytes after them, kept together per row (or by 4-byte group, with whole_by_word) */
    int whole_by_word;  /* the whole bytes go as the codes do, by 4-byte group (block_q4_Kx8's scales) */
    int codes;          /* code bytes, moved in 4-byte groups */
    int bits_by_lane;   /* the whole bytes are a 32-bit word of element bits, stored by lane (block_q5_0x8) */
    int unsigned_codes; /* signed byte codes stored + 128 (block_q8_0x8) */
} rows8_layout;

static const rows8_layout LAYOUT_Q4_0 = {1, 0, 0, QK4_0 / 2, 0, 0};
static const rows8_layout LAYOUT_Q4_1 = {2, 0, 0, QK4_1 / 2, 0, 0};
static const rows8_layout LAYOUT_Q4_K = {2, K_SCALE_SIZE, 1, QK_K / 2, 0, 0};
static const rows8_layout LAYOUT_IQ4_NL = {1, 0, 0, QK4_NL / 2, 0, 0};
static const rows8_layout LAYOUT_Q8_0 = {1, 0, 0, QK8_0, 0, 1};
static const rows8_layout LAYOUT_Q5_0 = {1, 4, 0, QK5_0 / 2, 1, 0};
static const rows8_layout LAYOUT_MXFP4 = {0, 1, 0, QK_MXFP4 / 2, 0, 0};

/* len code bytes +/- 128 (the same flip both ways) */
static void flip_codes(uint8_t *codes, size_t len) {
    for (size_t i = 0; i < len; i++) codes[i] ^= 0x80;
}

/* len bytes from a row's block into the group (to_group), or back */
static void copy_piece(uint8_t *row, uint8_t *lanes, size_t len, int to_group) {
    if (to_group) memcpy(lanes, row, len);
    else memcpy(row, lanes, len);
}

/* Row r's len bytes (a multiple of 4) from x into 4-byte groups of the 8
 * rows side by side at lanes, or back */
static void copy_words(uint8_t *x, uint8_t *lanes, size_t r, size_t len, int to_group) {
    for (size_t t = 0; t < len / 4; t++) copy_piece(x + 4 * t, lanes + (8 * t + r) * 4, 4, to_group);
}

/* The 8 rows' bit words and the 8 lanes' (bit 4r + e of lane t's word is
 * bit 4t + e of row r's): an 8 x 8 transpose of 4-bit pieces, its own
 * inverse; words as unaligned bytes. */
static void transpose_bit_words(uint8_t *dst, const uint8_t *src) {
    uint32_t in[8];
    memcpy(in, src, sizeof in);
    for (int t = 0; t < 8; t++) {
        uint32_t word = 0;
        for (int r = 0; r < 8; r++) word |= (in[r] >> (4 * t) & 0xFu) << (4 * r);
        memcpy(dst + 4 * t, &word, 4);
    }
}

/* nb blocks of 8 rows (stride bw) into a group, or back (the rows are only
 * read when to_group is set) */
static void move8(const rows8_layout *l, int64_t nb, uint8_t *rows, size_t bw, uint8_t *group, int to_group) {
    const size_t halves = (size_t)l->halves, whole = (size_t)l->whole, bb = 2 * halves + whole + (size_t)l->codes;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *g = group + (size_t)b * 8 * bb;
        uint8_t *wholes = g + 16 * halves, by_row[32];
        if (l->bits_by_lane && !to_group) {   /* the rows' words back from the lanes' */
            transpose_bit_words(by_row, wholes);
            wholes = by_row;
        }
        for (size_t r = 0; r < 8; r++) {
            uint8_t *x = rows + r * bw + (size_t)b * bb;
            for (size_t f = 0; f < halves; f++) copy_piece(x + 2 * f, g + 16 * f + 2 * r, 2, to_group);
            if (l->whole_by_word) copy_words(x + 2 * halves, wholes, r, whole, to_group);
            else copy_piece(x + 2 * halves, wholes + whole * r, whole, to_group);
            copy_words(x + 2 * halves + whole, g + 16 * halves + 8 * whole, r, (size_t)l->codes, to_group);
            if (l->unsigned_codes && !to_group) flip_codes(x + 2 * halves + whole, (size_t)l->codes);
        }
        if (l->unsigned_codes && to_group) flip_codes(g + 16 * halves + 8 * whole, 8 * (size_t)l->codes);
        if (l->bits_by_lane && to_group) {   /* the lanes' words from the rows' */
            memcpy(by_row, wholes, sizeof by_row);
            transpose_bit_words(wholes, by_row);
        }
    }
}

/* A file block's 256 codes (0..63, as stored: the offset of 32 stays in),
 * and back: element e = 128 h + 32 k + l takes the low or high nibble (k < 2
 * or not) of ql[64 h + 32 (k & 1) + l] and bits 2k, 2k + 1 of qh[32 h + l]. */
static void q6_K_codes(const block_q6_K *x, uint8_t code[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const uint8_t byte = x->ql[64 * h + 32 * (k & 1) + l];
                code[128 * h + 32 * k + l] =
                    (uint8_t)((k < 2 ? byte & 0xF : byte >> 4) | ((x->qh[32 * h + l] >> (2 * k)) & 3) << 4);
            }
}

static void q6_K_set_codes(block_q6_K *x, const uint8_t code[QK_K]) {
    memset(x->ql, 0, sizeof x->ql);
    memset(x->qh, 0, sizeof x->qh);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const uint8_t c = code[128 * h + 32 * k + l];
                x->ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((c & 0xF) << (k < 2 ? 0 : 4));
                x->qh[32 * h + l] |= (uint8_t)((c >> 4) << (2 * k));
            }
}

/* One row's super-block into lane r of a group (block_q6_Kx8), or back:
 * piece i of group t of half h holds chunk 4h + i's codes and two bits each
 * of chunk 4h + 3's */
static void move_q6_K_row(block_q6_K *x, block_q6_Kx8 *g, int r, int to_group) {
    uint8_t code[QK_K];
    if (to_group) {
        g->d[r] = x->d;
        for (int j = 0; j < QK_K / 16; j++) g->scales[j][r] = x->scales[j];
        q6_K_codes(x, code);
    } else {
        x->d = g->d[r];
        for (int j = 0; j < QK_K / 16; j++) x->scales[j] = g->scales[j][r];
        memset(code, 0, sizeof code);
    }
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 8; t++)
            for (int e = 0; e < 4; e++) {
                uint8_t *last = &code[32 * (4 * h + 3) + 4 * t + e];
                for (int i = 0; i < 3; i++) {
                    uint8_t *piece = &g->qs[h][t][i][r][e], *own = &code[32 * (4 * h + i) + 4 * t + e];
                    if (to_group) {
                        *piece = (uint8_t)(*own | ((*last >> (2 * i)) & 3) << 6);
                    } else {
                        *own = *piece & 63;
                        *last |= (uint8_t)((*piece >> 6) << (2 * i));
                    }
                }
            }
    if (!to_group) q6_K_set_codes(x, code);
}

/* nb super-blocks of 8 Q6_K rows into a group, or back (the layout argument
 * is move8's; Q6_K's is fixed) */
static void move8_q6_K(const rows8_layout *l, int64_t nb, uint8_t *rows, size_t bw, uint8_t *group, int to_group) {
    (void)l;
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < 8; r++)
            move_q6_K_row((block_q6_K *)(rows + (size_t)r * bw) + b, (block_q6_Kx8 *)group + b, r, to_group);
}

typedef void (*move8_fn)(const rows8_layout *l, int64_t nb, uint8_t *rows, size_t bw, uint8_t *group, int to_group);

/* How each base type's rows go into their groups: moved by a layout, or
 * re-cut (Q6_K) */
typedef struct {
    int base;
    const rows8_layout *layout;
    move8_fn move;
} rows8_kind;

static const rows8_kind KINDS[] = {
    {PE_TYPE_Q4_0, &LAYOUT_Q4_0, move8},   {PE_TYPE_Q4_1, &LAYOUT_Q4_1, move8},
    {PE_TYPE_Q4_K, &LAYOUT_Q4_K, move8},   {PE_TYPE_IQ4_NL, &LAYOUT_IQ4_NL, move8},
    {PE_TYPE_Q8_0, &LAYOUT_Q8_0, move8},   {PE_TYPE_Q5_0, &LAYOUT_Q5_0, move8},
    {PE_TYPE_MXFP4, &LAYOUT_MXFP4, move8}, {PE_TYPE_Q6_K, NULL, move8_q6_K},
};

static const rows8_kind *kind_of(int base) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (KINDS[i].base == base) return &KINDS[i];
    return NULL;
}

static void move_blocks(const rows8_kind *kind, int64_t n, uint8_t *rows, size_t bw, uint8_t *group, int to_group) {
    kind->move(kind->layout, n / pe_type_block_size(kind->base), rows, bw, group, to_group);
}

#define DEFINE_UNPACK8(NAME, TYPE)                                                   \
    static void unpack8_##NAME(int64_t n, const void *group, void *rows, size_t bw) { \
        move_blocks(kind_of(TYPE), n, rows, bw, (uint8_t *)group, 0);                \
    }
DEFINE_UNPACK8(q4_0, PE_TYPE_Q4_0)
DEFINE_UNPACK8(q4_1, PE_TYPE_Q4_1)
DEFINE_UNPACK8(q4_k, PE_TYPE_Q4_K)
DEFINE_UNPACK8(iq4_nl, PE_TYPE_IQ4_NL)
DEFINE_UNPACK8(q8_0, PE_TYPE_Q8_0)
DEFINE_UNPACK8(q5_0, PE_TYPE_Q5_0)
DEFINE_UNPACK8(mxfp4, PE_TYPE_MXFP4)
DEFINE_UNPACK8(q6_k, PE_TYPE_Q6_K)

int pe_repack_rows8(int type, const void *src, void *dst, int64_t n, int64_t nrows) {
    const int base = pe_type_rows8_base(type);
    const rows8_kind *kind = kind_of(base);
    if (!kind) return pe_fail("repack: %s is no interleaved type", pe_type_name(type));
    const size_t group = 8 * pe_row_bytes(base, n);
    if (n <= 0 || group == 0 || nrows <= 0 || nrows % 8)
        return pe_fail("repack: %lld x %lld is not whole blocks of 8 rows", (long long)nrows, (long long)n);
    for (int64_t g = 0; g < nrows / 8; g++)
        move_blocks(kind, n, (uint8_t *)src + (size_t)g * group, group / 8, (uint8_t *)dst + (size_t)g * group, 1);
    return 0;
}

/* Every table can read the layout back; the decoding kernels (gemm8) come
 * with the ISAs that have them, and only those interleave (pe_type_rows8). */
void pe_fill_ref_rows8(pe_kernels *k) {
    k->type[PE_TYPE_Q4_1_X8].rows8.unpack8 = unpack8_q4_1;
    k->type[PE_TYPE_Q4_0_X8].rows8.unpack8 = unpack8_q4_0;
    k->type[PE_TYPE_Q4_K_X8].rows8.unpack8 = unpack8_q4_k;
    k->type[PE_TYPE_IQ4_NL_X8].rows8.unpack8 = unpack8_iq4_nl;
    k->type[PE_TYPE_Q8_0_X8].rows8.unpack8 = unpack8_q8_0;
    k->type[PE_TYPE_Q5_0_X8].rows8.unpack8 = unpack8_q5_0;
    k->type[PE_TYPE_MXFP4_X8].rows8.unpack8 = unpack8_mxfp4;
    k->type[PE_TYPE_Q6_K_X8].rows8.unpack8 = unpack8_q6_k;
}
