# Declarations of the native core's public header (csrc/include/pe.h).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

cdef extern from "pe.h" nogil:
    int64_t pe_type_block_size(int type)
    size_t pe_type_block_bytes(int type)
    const char *pe_type_name(int type)
    int pe_type_supported(int type)
    int pe_iq_grid_set(int grid, const uint8_t *values, size_t n)
    int pe_type_vec_dot_type(int type)
    size_t pe_row_bytes(int type, int64_t n)
    int pe_type_rows8(int type)
    int pe_repack_rows8(int type, const void *src, void *dst, int64_t n, int64_t nrows)
    int64_t pe_top_k(const float *x, int64_t n, int64_t k, const int64_t *skip, int64_t n_skip, float *val,
                     int64_t *pos)
    int64_t pe_best_outside(const float *x, int64_t n, const int64_t *skip, int64_t n_skip, int *nan)
    enum: PE_GREEDY_NAN, PE_GREEDY_POS_INF, PE_GREEDY_NONE
    int64_t pe_greedy_penalised(const float *x, int64_t n, const int64_t *ids, const float *counts, int64_t n_ids,
                                float repeat, float frequency, float presence, int *status)
    void pe_kv_mask(float *out, int64_t stride, const int32_t *positions, const uint64_t *seq_bits, int64_t n_tokens,
                    const int32_t *cell_pos, const uint64_t *cell_seq, int64_t n_kv, int32_t window,
                    int32_t chunk)
    const char *pe_last_error()

    const char *pe_isa_current()
    const char *pe_isa_best()
    int pe_isa_available(const char *name)
    int pe_isa_select(const char *name)

    int pe_quantize_row_ref(int type, const float *x, void *y, int64_t n)
    int pe_quantize_row(int type, const float *x, void *y, int64_t n)
    int pe_dequantize_row(int type, const void *x, float *y, int64_t n)
    int pe_dequantize_row_ref(int type, const void *x, float *y, int64_t n)
    int pe_vec_dot(int type, const void *w, const float *x, int64_t n, float *out)
    int pe_vec_dot_ref(int type, const void *w, const float *x, int64_t n, float *out)
    int pe_vec_dot_blocks(int type, const void *w, const void *a, int64_t n, float *out, int reference)
    int pe_attn_scores_f16(const float *x, int nx, const uint16_t *y, int ny, int64_t n, int nacc, float *out)
    int pe_attn_values_f16(const float *p, int nh, int64_t n, const uint16_t *v, const int32_t *cell, int64_t hd,
                           int nacc, float *out)
    int pe_attn_lanes()

    ctypedef struct pe_pool:
        pass
    pe_pool *pe_pool_new(int n_threads)
    void pe_pool_free(pe_pool *pool)
    int pe_pool_n_threads(const pe_pool *pool)
    int pe_physical_cores()
    int pe_backend_count()
    const char *pe_backend_name(int i)
    int pe_backend_devices(int i)

    ctypedef struct pe_graph:
        pass
    pe_graph *pe_graph_new()
    void pe_graph_free(pe_graph *g)
    int pe_graph_external(pe_graph *g, int type, int n_dims, const int64_t *ne,
                          void *data, size_t nbytes, const char *name)
    int pe_graph_view(pe_graph *g, int t, int n_dims, const int64_t *ne, const size_t *nb, size_t offset)
    int pe_graph_reshape(pe_graph *g, int t, int n_dims, const int64_t *ne)
    int pe_op_get_rows(pe_graph *g, int table, int ids)
    int pe_op_mul_mat(pe_graph *g, int w, int x)
    int pe_op_mul_mat_id(pe_graph *g, int w, int x, int ids)
    int pe_op_add(pe_graph *g, int a, int b)
    int pe_op_mul(pe_graph *g, int a, int b)
    int pe_op_scale(pe_graph *g, int a, float s)
    int pe_op_softcap(pe_graph *g, int a, float cap)
    int pe_op_rms_norm(pe_graph *g, int a, int weight, float eps)
    int pe_op_layer_norm(pe_graph *g, int a, int weight, float eps)
    int pe_op_unary(pe_graph *g, int a, int unary_op)
    int pe_op_glu(pe_graph *g, int gate, int up, int unary_op)
    int pe_op_softmax(pe_graph *g, int a)
    int pe_op_rope(pe_graph *g, int a, int pos, int freq_factors, int n_dims, int mode,
                   float freq_base, float freq_scale, float ext_factor, float attn_factor,
                   float beta_fast, float beta_slow, int n_ctx_orig)
    int pe_op_rope_multi(pe_graph *g, int a, int pos, int n_dims, const int *sections, int mode,
                         float freq_base, float freq_scale)
    int pe_op_set_rows(pe_graph *g, int cache, int src, int slots)
    int pe_op_attn(pe_graph *g, int q, int k, int v, int mask, int kv_len, int cell_pos,
                   int n_head_kv, float scale, float softcap)
    int pe_op_attn_alibi(pe_graph *g, int attn, float max_bias)
    int pe_op_topk(pe_graph *g, int a, int k)
    int pe_op_moe_weights(pe_graph *g, int logits, int ids, int normalize)
    int pe_op_weighted_sum(pe_graph *g, int a, int w)
    int pe_op_concat(pe_graph *g, int a, int b)
    int pe_op_moe_route(pe_graph *g, int logits, int bias, int k, int gating, int n_group, int n_group_used)
    int pe_op_moe_sigmoid_weights(pe_graph *g, int logits, int ids, int normalize)
    int pe_op_cont(pe_graph *g, int a)
    int pe_op_attn_sinks(pe_graph *g, int attn, int sinks)
    int pe_op_moe_softmax_chosen(pe_graph *g, int logits, int ids)
    int pe_op_add_id(pe_graph *g, int a, int b, int ids)
    int pe_op_swiglu_oai(pe_graph *g, int gate, int up, float alpha, float limit)
    int pe_op_l2_norm(pe_graph *g, int a, float eps)
    int pe_op_ssm_conv(pe_graph *g, int x, int w, int state, int seqs)
    int pe_op_ssm_scan(pe_graph *g, int x, int dt, int A, int B, int C, int D, int dt_bias, int state, int seqs)
    int pe_op_delta_net(pe_graph *g, int q, int k, int v, int gate, int beta, int state, int seqs, float scale,
                        int chunk)
    int pe_graph_set_output(pe_graph *g, int t)
    int pe_graph_bind_output(pe_graph *g, int t, void *data, size_t nbytes)
    int pe_graph_set_name(pe_graph *g, int t, const char *name)
    int pe_graph_compute(pe_graph *g, pe_pool *pool)
    int pe_graph_n_tensors(const pe_graph *g)
    int pe_tensor_type(const pe_graph *g, int t)
    int pe_tensor_n_dims(const pe_graph *g, int t)
    int64_t pe_tensor_ne(const pe_graph *g, int t, int dim)
    size_t pe_tensor_nb(const pe_graph *g, int t, int dim)
    void *pe_tensor_data(const pe_graph *g, int t)
    size_t pe_graph_arena_bytes(const pe_graph *g)
