/* types.c - the type-traits table: block geometry and dot partners. */
#include <stddef.h>

#include "blocks.h"
#include "graph.h"

typedef struct pe_type_traits {
    const char *name;
    int64_t     block_size;
    size_t      block_bytes;
    int         vec_dot_type;  /* activations are quantized to this type */
    int         weight;        /* usable as a weight (has a dot product) */
    int         rows8_base;    /* an interleaved type (rows by 8): the type it holds; 0 otherwise */
} pe_type_traits;

static const pe_type_traits traits[PE_TYPE_COUNT] = {
    [PE_TYPE_F32]    = {"F32",    1,      4,                    PE_TYPE_F32,  1},
    [PE_TYPE_F16]    = {"F16",    1,      2,                    PE_TYPE_F16,  1},
    [PE_TYPE_BF16]   = {"BF16",   1,      2,                    PE_TYPE_BF16, 1},
    [PE_TYPE_Q4_0]   = {"Q4_0",   QK4_0,  sizeof(block_q4_0),   PE_TYPE_Q8_0, 1},
    [PE_TYPE_Q4_1]   = {"Q4_1",   QK4_1,  sizeof(block_q4_1),   PE_TYPE_Q8_1, 1},
    [PE_TYPE_Q5_0]   = {"Q5_0",   QK5_0,  sizeof(block_q5_0),   PE_TYPE_Q8_0, 1},
    [PE_TYPE_Q5_1]   = {"Q5_1",   QK5_1,  sizeof(block_q5_1),   PE_TYPE_Q8_1, 1},
    [PE_TYPE_Q8_0]   = {"Q8_0",   QK8_0,  sizeof(block_q8_0),   PE_TYPE_Q8_0, 1},
    [PE_TYPE_Q8_1]   = {"Q8_1",   QK8_1,  sizeof(block_q8_1),   PE_TYPE_Q8_1, 0},
    [PE_TYPE_Q2_K]   = {"Q2_K",   QK_K,   sizeof(block_q2_K),   PE_TYPE_Q8_K, 1},
    [PE_TYPE_Q3_K]   = {"Q3_K",   QK_K,   sizeof(block_q3_K),   PE_TYPE_Q8_K, 1},
    [PE_TYPE_Q4_K]   = {"Q4_K",   QK_K,   sizeof(block_q4_K),   PE_TYPE_Q8_K, 1},
    [PE_TYPE_Q5_K]   = {"Q5_K",   QK_K,   sizeof(block_q5_K),   PE_TYPE_Q8_K, 1},
    [PE_TYPE_Q6_K]   = {"Q6_K",   QK_K,   sizeof(block_q6_K),   PE_TYPE_Q8_K, 1},
    [PE_TYPE_Q8_K]   = {"Q8_K",   QK_K,   sizeof(block_q8_K),   PE_TYPE_Q8_K, 0},
    [PE_TYPE_IQ4_NL] = {"IQ4_NL", QK4_NL, sizeof(block_iq4_nl), PE_TYPE_Q8_0, 1},
    [PE_TYPE_IQ4_XS] = {"IQ4_XS", QK_K,   sizeof(block_iq4_xs), PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs), PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ2_XS] = {"IQ2_XS", QK_K,   sizeof(block_iq2_xs), PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ2_S]  = {"IQ2_S",  QK_K,   sizeof(block_iq2_s),  PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, sizeof(block_iq3_xxs), PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ3_S]  = {"IQ3_S",  QK_K,   sizeof(block_iq3_s),  PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ1_S]  = {"IQ1_S",  QK_K,   sizeof(block_iq1_s),  PE_TYPE_Q8_K, 1},
    [PE_TYPE_IQ1_M]  = {"IQ1_M",  QK_K,   sizeof(block_iq1_m),  PE_TYPE_Q8_K, 1},
    [PE_TYPE_MXFP4]  = {"MXFP4",  QK_MXFP4, sizeof(block_mxfp4), PE_TYPE_Q8_0, 1},
    [PE_TYPE_I8]     = {"I8",     1,      1,                    -1,           0},
    [PE_TYPE_I16]    = {"I16",    1,      2,                    -1,           0},
    [PE_TYPE_I32]    = {"I32",    1,      4,                    -1,           0},
    [PE_TYPE_Q4_1_X8] = {"Q4_1x8", QK4_1, sizeof(block_q4_1),   PE_TYPE_Q8_1, 0, PE_TYPE_Q4_1},
    [PE_TYPE_Q4_0_X8] = {"Q4_0x8", QK4_0, sizeof(block_q4_0),   PE_TYPE_Q8_0, 0, PE_TYPE_Q4_0},
    [PE_TYPE_Q4_K_X8] = {"Q4_Kx8", QK_K,  sizeof(block_q4_K),   PE_TYPE_Q8_K, 0, PE_TYPE_Q4_K},
    [PE_TYPE_IQ4_NL_X8] = {"IQ4_NLx8", QK4_NL, sizeof(block_iq4_nl), PE_TYPE_Q8_0, 0, PE_TYPE_IQ4_NL},
    [PE_TYPE_Q8_0_X8] = {"Q8_0x8", QK8_0, sizeof(block_q8_0),   PE_TYPE_Q8_0, 0, PE_TYPE_Q8_0},
    [PE_TYPE_Q5_0_X8] = {"Q5_0x8", QK5_0, sizeof(block_q5_0),   PE_TYPE_Q8_0, 0, PE_TYPE_Q5_0},
    [PE_TYPE_MXFP4_X8] = {"MXFP4x8", QK_MXFP4, sizeof(block_mxfp4), PE_TYPE_Q8_0, 0, PE_TYPE_MXFP4},
    [PE_TYPE_Q6_K_X8] = {"Q6_Kx8", QK_K,  sizeof(block_q6_K),   PE_TYPE_Q8_K, 0, PE_TYPE_Q6_K},
};

static const pe_type_traits *traits_of(int type) {
    if (type < 0 || type >= PE_TYPE_COUNT || traits[type].name == NULL) return NULL;
    return &traits[type];
}

int64_t pe_type_block_size(int type) {
    const pe_type_traits *t = traits_of(type);
    return t ? t->block_size : 0;
}

size_t pe_type_block_bytes(int type) {
    const pe_type_traits *t = traits_of(type);
    return t ? t->block_bytes : 0;
}

const char *pe_type_name(int type) {
    const pe_type_traits *t = traits_of(type);
    return t ? t->name : "unknown";
}

int pe_type_vec_dot_type(int type) {
    const pe_type_traits *t = traits_of(type);
    return t ? t->vec_dot_type : -1;
}

int pe_type_is_weight(int type) {
    const pe_type_traits *t = traits_of(type);
    return t && t->weight;
}

int pe_type_rows8_base(int type) {
    const pe_type_traits *t = traits_of(type);
    return t && t->rows8_base ? t->rows8_base : -1;
}

size_t pe_row_bytes(int type, int64_t n) {
    const pe_type_traits *t = traits_of(type);
    if (!t || n < 0 || n % t->block_size != 0) return 0;
    return (size_t)(n / t->block_size) * t->block_bytes;
}
