/* pe.h - the one public header of pyengine's native core.
 *
 * Tensors use GGML's conventions so GGUF weights can be used in place:
 * ne[0] is the innermost dimension (a row), nb[i] is the byte stride of dim i,
 * type ids are GGML's, and quantized rows are arrays of blocks.
 *
 * A graph is built once by Python (pe_graph_* constructors return tensor ids),
 * then computed any number of times over a persistent thread pool.  Inputs that
 * change between runs (token ids, positions, cache slots, mask, KV length) live
 * in caller-owned buffers registered as external tensors.
 *
 * Every function that can fail on input returns a negative value (or NULL) and
 * leaves a message in pe_last_error(); nothing here aborts the process.
 */
#ifndef PE_H
#define PE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- types (GGML numbering) ------------------------------------------- */

typedef enum pe_type {
    PE_TYPE_F32     = 0,
    PE_TYPE_F16     = 1,
    PE_TYPE_Q4_0    = 2,
    PE_TYPE_Q4_1    = 3,
    PE_TYPE_Q5_0    = 6,
    PE_TYPE_Q5_1    = 7,
    PE_TYPE_Q8_0    = 8,
    PE_TYPE_Q8_1    = 9,
    PE_TYPE_Q2_K    = 10,
    PE_TYPE_Q3_K    = 11,
    PE_TYPE_Q4_K    = 12,
    PE_TYPE_Q5_K    = 13,
    PE_TYPE_Q6_K    = 14,
    PE_TYPE_Q8_K    = 15,
    PE_TYPE_IQ2_XXS = 16,
    PE_TYPE_IQ2_XS  = 17,
    PE_TYPE_IQ3_XXS = 18,
    PE_TYPE_IQ1_S   = 19,
    PE_TYPE_IQ4_NL  = 20,
    PE_TYPE_IQ3_S   = 21,
    PE_TYPE_IQ2_S   = 22,
    PE_TYPE_IQ4_XS  = 23,
    PE_TYPE_I8      = 24,
    PE_TYPE_I16     = 25,
    PE_TYPE_I32     = 26,
    PE_TYPE_IQ1_M   = 29,
    PE_TYPE_BF16    = 30,
    PE_TYPE_MXFP4   = 39,
    /* internal: weights the engine interleaved at load, never in a file (ids
     * past GGML's, whose numbering runs on) */
    PE_TYPE_Q4_1_X8 = 64,
    PE_TYPE_Q4_0_X8 = 65,
    PE_TYPE_Q4_K_X8 = 66,
    PE_TYPE_IQ4_NL_X8 = 67,
    PE_TYPE_Q8_0_X8 = 68,
    PE_TYPE_Q5_0_X8 = 69,
    PE_TYPE_MXFP4_X8 = 70,
    PE_TYPE_Q6_K_X8 = 71,
    PE_TYPE_COUNT   = 72
} pe_type;

/* The lattice grids of the IQ1/IQ2/IQ3 types (one small vector of levels per
 * index: 8 bytes for IQ2's and IQ1's, 4 for IQ3's).  They are part of the GGUF
 * format; the Python shell hands them over at import (from the gguf package),
 * and a type whose grid has not been set is not supported.  Returns 0, or -1
 * for an unknown grid or a wrong size. */
typedef enum pe_iq_grid {
    PE_IQ_GRID_2XXS,   /* 256 x 8 */
    PE_IQ_GRID_2XS,    /* 512 x 8 */
    PE_IQ_GRID_2S,     /* 1024 x 8 */
    PE_IQ_GRID_3XXS,   /* 256 x 4 */
    PE_IQ_GRID_3S,     /* 512 x 4 */
    PE_IQ_GRID_1S,     /* 2048 x 8, signed (-1, 0, 1): IQ1_S and IQ1_M */
    PE_IQ_GRID_COUNT
} pe_iq_grid;
int         pe_iq_grid_set(int grid, const uint8_t *values, size_t n);

/* Block size (elements per block) and bytes per block; 0 for unknown types. */
int64_t     pe_type_block_size(int type);
size_t      pe_type_block_bytes(int type);
const char *pe_type_name(int type);
/* 1 when the type has kernels (can be a weight), 0 otherwise. */
int         pe_type_supported(int type);
/* The type activations are quantized to before a dot product with `type`. */
int         pe_type_vec_dot_type(int type);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block size. */
size_t      pe_row_bytes(int type, int64_t n);
/* The interleaved type (rows by 8, the same bytes) that the current ISA
 * decodes `type` faster in, or -1.  Its products equal the base type's, bit
 * for bit. */
int         pe_type_rows8(int type);
/* Interleave nrows (a multiple of 8) rows of n elements of the interleaved
 * type's base into dst (the same number of bytes). */
int         pe_repack_rows8(int type, const void *src, void *dst, int64_t n, int64_t nrows);

/* ---- errors ------------------------------------------------------------ */

const char *pe_last_error(void);

/* ---- instruction sets ---------------------------------------------------- */

/* Names: "scalar", "avx2", "avxvnni", "avx512", "neon_nodot", "neon".
 * pe_isa_best() is what the CPU supports; pe_isa_select() forces a lower one (returns -1 if unavailable). */
const char *pe_isa_current(void);
const char *pe_isa_best(void);
int         pe_isa_available(const char *name);
int         pe_isa_select(const char *name);

/* ---- row kernels (exposed for tests and the KV cache) -------------------- */

/* Reference (scalar) quantization of n floats into blocks of `type`. */
int pe_quantize_row_ref(int type, const float *x, void *y, int64_t n);
/* Dequantize n elements with the current ISA's kernel (or the reference). */
int pe_dequantize_row(int type, const void *x, float *y, int64_t n);
int pe_dequantize_row_ref(int type, const void *x, float *y, int64_t n);
/* Quantize a row to the type's dot partner and take the dot product with a
 * row of `type`, with the current ISA's kernels (or the reference ones). */
int pe_vec_dot(int type, const void *w, const float *x, int64_t n, float *out);
int pe_vec_dot_ref(int type, const void *w, const float *x, int64_t n, float *out);
/* The dot product of a weight row with an activation row already quantized
 * to the type's partner (raw blocks), current ISA or reference kernels. */
int pe_vec_dot_blocks(int type, const void *w, const void *a, int64_t n, float *out, int reference);
/* Attention's F16 score products as the current ISA computes them: the
 * queries x[nx][n] (values F16 can hold) against the F16 rows y[ny][n],
 * out[a * ny + b], in nacc accumulators (1: what attention takes for every
 * token; 4 is kept for the kernels' own tests); nx, ny <= 4. */
int pe_attn_scores_f16(const float *x, int nx, const uint16_t *y, int ny, int64_t n, int nacc, float *out);
/* Attention's product of probabilities with an F16 V as the current ISA
 * computes it: p[nh][n] against the rows v[n][hd] of cells cell[n] (-1:
 * none), out[nh][hd], in nacc accumulators (1: attention's); nh <= 4.
 * pe_attn_lanes: the lanes every ISA's attention kernels accumulate in (LANES in vec.c). */
int pe_attn_values_f16(const float *p, int nh, int64_t n, const uint16_t *v, const int32_t *cell, int64_t hd, int nacc,
                       float *out);
int pe_attn_lanes(void);
/* Quantize a row with the current ISA's activation quantizer. */
int pe_quantize_row(int type, const float *x, void *y, int64_t n);

/* ---- KV cache ------------------------------------------------------------- */

/* Attention mask rows of a batch over a cache's first n_kv cells: out[t * stride
 * + c] = 0 where token t (at positions[t], of the sequence whose bit is
 * seq_bits[t]) may attend cell c (the cell's sequence set cell_seq[c] holds
 * that bit, its position cell_pos[c] is <= the token's and, with window > 0,
 * within window positions of it; with chunk > 0, in the token's own chunk of
 * chunk positions: at or after its position rounded down to a multiple of
 * chunk), -inf elsewhere. */
void pe_kv_mask(float *out, int64_t stride, const int32_t *positions, const uint64_t *seq_bits, int64_t n_tokens,
                const int32_t *cell_pos, const uint64_t *cell_seq, int64_t n_kv, int32_t window, int32_t chunk);

/* ---- sampling ----------------------------------------------------------------- */

/* The positions of the k largest of x[0..n), leaving out those listed in skip
 * (ascending), largest first, ties to the lower position, into pos (their
 * values into val; both k long); NaN entries are passed over.  Returns how
 * many were found (fewer than k when fewer are left). */
int64_t pe_top_k(const float *x, int64_t n, int64_t k, const int64_t *skip, int64_t n_skip, float *val,
                 int64_t *pos);

/* The position of the largest of x[0..n) outside the ascending positions
 * skip[0..n_skip) (NaN passed over), ties to the lower position, or -1 when
 * none is left; *nan is set to whether any x (skipped or not) is NaN. */
int64_t pe_best_outside(const float *x, int64_t n, const int64_t *skip, int64_t n_skip, int *nan);

/* Greedy sampling under repetition penalties: the id of the largest logit
 * once the ids (ascending, each < n) seen counts[i] times are penalised
 * (divided by repeat when positive, else multiplied; then less
 * counts[i] * frequency + presence), ties to the lower id.  *status is 0,
 * or says why there is no pick: a NaN in x, a +inf logit, or none above
 * -inf.  -1 also when the penalties leave nothing above -inf. */
enum { PE_GREEDY_NAN = 1, PE_GREEDY_POS_INF = 2, PE_GREEDY_NONE = 3 };
int64_t pe_greedy_penalised(const float *x, int64_t n, const int64_t *ids, const float *counts, int64_t n_ids,
                            float repeat, float frequency, float presence, int *status);

/* ---- thread pool ----------------------------------------------------------- */

typedef struct pe_pool pe_pool;
pe_pool *pe_pool_new(int n_threads);
void     pe_pool_free(pe_pool *pool);
int      pe_pool_n_threads(const pe_pool *pool);
int      pe_physical_cores(void);

/* ---- backends (device discovery) ------------------------------------------ */

/* The backends this build computes with (the CPU's first, always there), by
 * index: the name ("cpu"), and how many devices it finds (-1 with
 * pe_last_error() when it cannot start). */
int         pe_backend_count(void);
const char *pe_backend_name(int i);
int         pe_backend_devices(int i);

/* ---- graph ----------------------------------------------------------------- */

typedef struct pe_graph pe_graph;

/* ggml's numbers; MROPE, IMROPE and VISION take 4 positions a token (pe_op_rope_multi) */
enum pe_rope_mode { PE_ROPE_NORMAL = 0, PE_ROPE_NEOX = 2, PE_ROPE_MROPE = 8, PE_ROPE_VISION = 24,
                    PE_ROPE_IMROPE = 40 };
static inline int pe_rope_is_multi(int mode) {
    return mode == PE_ROPE_MROPE || mode == PE_ROPE_IMROPE || mode == PE_ROPE_VISION;
}
enum pe_unary_op  { PE_UNARY_SILU = 0, PE_UNARY_GELU = 1, PE_UNARY_GELU_ERF = 2, PE_UNARY_RELU = 3,
                    PE_UNARY_SIGMOID = 4, PE_UNARY_SOFTPLUS = 5 };   /* the last two: recurrent layers' gates */

pe_graph *pe_graph_new(void);
void      pe_graph_free(pe_graph *g);

/* Leaves: caller-owned memory (weights in the mmap, inputs, KV caches). The
 * buffer must outlive the graph; nbytes is checked against the shape. */
int pe_graph_external(pe_graph *g, int type, int n_dims, const int64_t *ne,
                      void *data, size_t nbytes, const char *name);
/* An output (pe_graph_set_output; computed, contiguous, not a view) written
 * straight into caller memory of exactly its size, from the next compute on,
 * instead of the graph's own; the buffer must outlive the binding.  NULL
 * takes the output back into the graph's memory. */
int pe_graph_bind_output(pe_graph *g, int t, void *data, size_t nbytes);
/* A view of t with its own shape and strides, starting `offset` bytes in. */
int pe_graph_view(pe_graph *g, int t, int n_dims, const int64_t *ne,
                  const size_t *nb, size_t offset);
int pe_graph_reshape(pe_graph *g, int t, int n_dims, const int64_t *ne);

/* Ops: each returns the id of a new F32 tensor (unless noted) or -1. */
int pe_op_get_rows(pe_graph *g, int table, int ids);                   /* [K,V] x i32[T] -> [K,T] */
/* [K,N] x [K,M] -> [N,M]; each row of the result is the same bits whatever
 * else shares the batch. */
int pe_op_mul_mat(pe_graph *g, int w, int x);
int pe_op_mul_mat_id(pe_graph *g, int w, int x, int ids);              /* [K,N,E] x [K,(U|1),T] x i32[U,T] -> [N,U,T] */
int pe_op_add(pe_graph *g, int a, int b);                              /* b broadcast over a */
int pe_op_mul(pe_graph *g, int a, int b);
int pe_op_scale(pe_graph *g, int a, float s);
int pe_op_softcap(pe_graph *g, int a, float cap);                      /* cap * tanh(a / cap) */
int pe_op_rms_norm(pe_graph *g, int a, int weight, float eps);         /* weight may be -1 */
int pe_op_layer_norm(pe_graph *g, int a, int weight, float eps);       /* (a - mean) / rms, times weight (may be -1) */
int pe_op_unary(pe_graph *g, int a, int unary_op);
int pe_op_glu(pe_graph *g, int gate, int up, int unary_op);            /* act(gate) * up */
int pe_op_softmax(pe_graph *g, int a);                                 /* over rows */
int pe_op_rope(pe_graph *g, int a, int pos, int freq_factors, int n_dims, int mode,
               float freq_base, float freq_scale, float ext_factor, float attn_factor,
               float beta_fast, float beta_slow, int n_ctx_orig);
/* Multi-section rope (mode PE_ROPE_MROPE, PE_ROPE_IMROPE or PE_ROPE_VISION): pos
 * is i32 [4, T] (each token's 4 position streams together), sections[4] the
 * pairs each stream turns (IMROPE: its streams take turns pair by pair, Qwen3-VL);
 * vision's n_dims is half the rotated width (ggml's count). */
int pe_op_rope_multi(pe_graph *g, int a, int pos, int n_dims, const int *sections, int mode,
                     float freq_base, float freq_scale);
/* Write rows of src ([D,T] f32) into rows slots[T] of cache ([D,C], F16/F32/Q8_0).
 * Returns a view of the cache that later ops take as input (ordering). */
int pe_op_set_rows(pe_graph *g, int cache, int src, int slots);
/* Attention of q [Dh,H,T] against the first kv_len[0] cells of caches k,v
 * [Dh*Hkv, C] with an additive mask [C,T] (0 or -inf); GQA by H/Hkv; every
 * token in one arithmetic, whatever else shares the batch.  cell_pos (I32
 * [C] or -1): each cell's position; the visible cells are taken in position
 * order (without it: cell order).  V's rows may hold heads of another width
 * Dv ([Dv*Hkv, C], e.g. a prefix view of the K rows, as MLA's latent is); the
 * result is then [Dv*H, T]. */
int pe_op_attn(pe_graph *g, int q, int k, int v, int mask, int kv_len, int cell_pos, int n_head_kv, float scale,
               float softcap);
/* Attention sinks on an attention node made by pe_op_attn: sinks (F32 [H])
 * holds one learned logit per query head that joins every query's softmax
 * denominator (exp(sink - max) added to the sum, the max taken over the
 * scaled scores and the sink) without a value of its own.  Returns attn, or -1. */
int pe_op_attn_sinks(pe_graph *g, int attn, int sinks);
/* ALiBi on attention node `attn` (returns it): head h's scaled scores get slope_h
 * times the mask's value (which then holds -|distance| at the visible cells, as
 * llama.cpp's does), slope_h from max_bias as ggml's soft_max computes it. */
int pe_op_attn_alibi(pe_graph *g, int attn, float max_bias);
int pe_op_topk(pe_graph *g, int a, int k);                             /* i32 [k,T]: indices of largest */
/* Weights of the chosen experts: softmax over all logits, picked by ids,
 * optionally renormalised to sum 1 -> [k,T]. */
int pe_op_moe_weights(pe_graph *g, int logits, int ids, int normalize);
int pe_op_weighted_sum(pe_graph *g, int a, int w);                      /* [N,U,T] x [U,T] -> [N,T] */
/* Weights of the chosen experts as a softmax over their own logits only
 * (gpt-oss's routing): [k,T] from logits [E,T] and ids [k,T]. */
int pe_op_moe_softmax_chosen(pe_graph *g, int logits, int ids);
/* a [N,U,T] plus row ids[u,t] of b [N,E] for every (u,t): a bias per chosen expert. */
int pe_op_add_id(pe_graph *g, int a, int b, int ids);
/* gpt-oss's gated unit: g = min(gate, limit), u = clamp(up, -limit, limit),
 * g * sigmoid(alpha * g) * (u + 1). */
/* [Na+Nb, ...]: each row of a (F32, up to 3-D, strided) followed by the same row
 * of b; a and b agree in every dimension but the first.  Returns the node, or -1. */
int pe_op_concat(pe_graph *g, int a, int b);
/* DeepSeek's expert choice, I32 [k,T]: each token's router logits (F32 [E,T])
 * gated (gating 0: softmax over the row, 1: sigmoid), plus bias (F32 [E], or -1)
 * for choosing only; with n_group > 1 the E experts form n_group groups of
 * which the n_group_used whose two best scores sum highest are kept (the first
 * group wins a tie); then the k best experts of those, best first (the lower
 * id wins a tie).  Returns the node, or -1. */
int pe_op_moe_route(pe_graph *g, int logits, int bias, int k, int gating, int n_group, int n_group_used);
/* [k,T] sigmoid of each chosen logit (ids from pe_op_moe_route), divided by
 * their sum (floored at 2^-14, as llama.cpp) when normalize. */
int pe_op_moe_sigmoid_weights(pe_graph *g, int logits, int ids, int normalize);
int pe_op_swiglu_oai(pe_graph *g, int gate, int up, float alpha, float limit);
int pe_op_cont(pe_graph *g, int a);                                    /* contiguous F32 copy */

/* ---- recurrent layers ------------------------------------------------------
 *
 * x / max(|x|, eps) over each row (the L2 norm of q and k before the delta rule). */
int pe_op_l2_norm(pe_graph *g, int a, float eps);

/* The recurrent ops read and write per-sequence states kept in a float
 * buffer the caller owns, like a KV cache: `state` is an external F32
 * [E, R] tensor, one row of E floats per state slot.  `seqs` is an I32
 * [PE_SEQ_FIELDS, S] tensor with one column per sequence of the batch:
 *   {first token, token count, row read, row written, position of the first token}
 * The batch's tokens (the last dim of the inputs) are grouped by sequence:
 * a sequence's tokens are contiguous and in position order.  A sequence
 * starts from state row `row read` and leaves its new state in row `row
 * written` (the same row, or another one: a checkpoint keeps the old one);
 * a row written may not be read by another sequence of the batch.  Tokens
 * no sequence names are left out (their outputs are 0).  Each sequence's
 * result depends only on its own tokens, state and positions: not on the
 * other sequences, the thread count or the instruction set. */
enum { PE_SEQ_FIRST = 0, PE_SEQ_COUNT = 1, PE_SEQ_ROW_IN = 2, PE_SEQ_ROW_OUT = 3, PE_SEQ_POS = 4, PE_SEQ_FIELDS = 5 };

/* Causal depthwise convolution over a rolling window (Mamba's conv1d, LFM2's
 * short convolution): x [d, T] (rows may be strided), kernel w [K, d] (GGUF's
 * ssm_conv1d: K taps per channel, oldest first), state rows of (K-1) * d
 * floats: the last K-1 inputs, oldest first, d channels each.  y[:, t] =
 * sum_j w[j, :] * xx[:, t + j] over xx = the state's K-1 columns then the
 * sequence's inputs; the new state is xx's last K-1 columns.  -> [d, T]
 * (no bias, no activation: the model adds them). */
int pe_op_ssm_conv(pe_graph *g, int x, int w, int state, int seqs);

/* Mamba-2's selective scan: x [P, H, T] (P values per head), dt [H, T] (before
 * its bias and softplus), A [H] (the decay, -exp(A_log)), B and C [N, G, T]
 * (head h takes group h / (H / G)), D [H] or -1 (the skip), dt_bias [H] or
 * -1; state rows of H * N * P floats (per head N rows of P).  Per token:
 * dt' = softplus(dt + dt_bias), S = S * exp(dt' A) + B (x dt')^T,
 * y = S^T C + D x.  -> [P, H, T] (the z gate and the norm are the model's). */
int pe_op_ssm_scan(pe_graph *g, int x, int dt, int A, int B, int C, int D, int dt_bias, int state, int seqs);

/* The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5): q, k [Dk, Hk,
 * T], v [Dv, H, T] (value head h takes q/k head h % Hk, GGUF's tiled order),
 * g [H, T] the log decay (<= 0, exp'd here), beta [H, T] (already through
 * its sigmoid); state rows of H * Dk * Dv floats (per head Dk rows of Dv).
 * Per token: S = exp(g) S, S += k (beta (v - S^T k))^T, o = S^T (scale q).
 * chunk = 0: token by token.  chunk > 0 (at most PE_DELTA_MAX_CHUNK): a
 * sequence's tokens are cut where their position is a multiple of chunk,
 * and each piece of two or more tokens runs the chunked form (the WY /
 * UT-transform of flash-linear-attention: the in-piece products as
 * matrices), a piece of one token the token form.  The two forms agree to
 * rounding, not in bits.  The pieces depend only on the positions: a
 * sequence fed in several batches gets the bits it gets fed whole when
 * each batch after its first starts at a multiple of chunk.  -> [Dv, H, T]. */
#define PE_DELTA_MAX_CHUNK 128
int pe_op_delta_net(pe_graph *g, int q, int k, int v, int gate, int beta, int state, int seqs, float scale, int chunk);

/* Mark a tensor whose value Python reads after compute (kept alive). */
int pe_graph_set_output(pe_graph *g, int t);
int pe_graph_set_name(pe_graph *g, int t, const char *name);

/* Plan memory (first call) and run every op in order.  0 on success. */
int pe_graph_compute(pe_graph *g, pe_pool *pool);

/* Introspection for Python. */
int         pe_graph_n_tensors(const pe_graph *g);
int         pe_tensor_type(const pe_graph *g, int t);
int         pe_tensor_n_dims(const pe_graph *g, int t);
int64_t     pe_tensor_ne(const pe_graph *g, int t, int dim);
size_t      pe_tensor_nb(const pe_graph *g, int t, int dim);
void       *pe_tensor_data(const pe_graph *g, int t);     /* NULL before planning */
size_t      pe_graph_arena_bytes(const pe_graph *g);

#ifdef __cplusplus
}
#endif
#endif /* PE_H */
