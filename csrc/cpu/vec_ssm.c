/* vec_ssm.c - the float loops of the recurrent layers' ops (ops_ssm.c):
 * products accumulated over a row, the delta rule's and the selective scan's
 * step for one token, the short convolution.  Compiled once per instruction
 * set like vec.c (cpu/x86/avx2_vec_ssm.c etc. include it with other flags
 * and another PE_VEC_SUFFIX); the plain build is the scalar reference.
 *
 * Every build gives the same bits without folding lanes: each output element
 * is one chain of fused multiply-adds in a fixed order (over the reduced
 * index, ascending), and the vector code only runs neighbouring elements'
 * chains side by side.  The width of a vector changes which elements share a
 * register, never an element's arithmetic. */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "vec_math.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(PE_SSM_NEON)
#include <arm_neon.h>
#endif

/* a*b+c stays two roundings unless written as an fma */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#ifndef PE_VEC_SUFFIX
#define PE_VEC_SUFFIX scalar
#endif
#define PE_SSM_CAT2(a, b) a##_##b
#define PE_SSM_CAT(a, b) PE_SSM_CAT2(a, b)
#define PE_SSM_FILL PE_SSM_CAT(pe_fill_ssm, PE_VEC_SUFFIX)

/* vf: VN floats side by side, each lane its own element */
#if defined(__AVX512F__)
typedef __m512 vf;
#define VN 16
#define vf_load(p)       _mm512_loadu_ps(p)
#define vf_store(p, v)   _mm512_storeu_ps(p, v)
#define vf_set1(x)       _mm512_set1_ps(x)
#define vf_fma(a, b, c)  _mm512_fmadd_ps(a, b, c)
#define vf_mul(a, b)     _mm512_mul_ps(a, b)
#define vf_sub(a, b)     _mm512_sub_ps(a, b)
#define vf_zero()        _mm512_setzero_ps()
#elif defined(__AVX2__)
typedef __m256 vf;
#define VN 8
#define vf_load(p)       _mm256_loadu_ps(p)
#define vf_store(p, v)   _mm256_storeu_ps(p, v)
#define vf_set1(x)       _mm256_set1_ps(x)
#define vf_fma(a, b, c)  _mm256_fmadd_ps(a, b, c)
#define vf_mul(a, b)     _mm256_mul_ps(a, b)
#define vf_sub(a, b)     _mm256_sub_ps(a, b)
#define vf_zero()        _mm256_setzero_ps()
#elif defined(PE_SSM_NEON)
typedef float32x4_t vf;
#define VN 4
#define vf_load(p)       vld1q_f32(p)
#define vf_store(p, v)   vst1q_f32(p, v)
#define vf_set1(x)       vdupq_n_f32(x)
#define vf_fma(a, b, c)  vfmaq_f32(c, a, b)
#define vf_mul(a, b)     vmulq_f32(a, b)
#define vf_sub(a, b)     vsubq_f32(a, b)
#define vf_zero()        vdupq_n_f32(0.0f)
#else
typedef float vf;
#define VN 1
#define vf_load(p)       (*(p))
#define vf_store(p, v)   (*(p) = (v))
#define vf_set1(x)       (x)
#define vf_fma(a, b, c)  fmaf(a, b, c)
#define vf_mul(a, b)     ((a) * (b))
#define vf_sub(a, b)     ((a) - (b))
#define vf_zero()        0.0f
#endif

/* ---- C += A B ------------------------------------------------------------------
 * C[m][n] = fma(A[m][l], B[l][n], C[m][n]) for l = 0..K-1 in order: tiles of
 * MT rows by 2 vectors keep their sums in registers over the whole of K (as
 * many rows as the build's registers hold: a row of B is loaded once per
 * tile, so taller tiles read B fewer times). */
#if defined(__AVX512F__)
#define MT 8
#elif defined(__AVX2__) || defined(PE_SSM_NEON)
#define MT 6
#else
#define MT 4
#endif

static inline void gemm_tile(int64_t nr, int nv, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                             float *C, int64_t ldc) {
    vf acc[MT][2];
    for (int64_t r = 0; r < nr; r++)
        for (int j = 0; j < nv; j++) acc[r][j] = vf_load(C + r * ldc + j * VN);
    for (int64_t l = 0; l < K; l++) {
        vf b[2];
        for (int j = 0; j < nv; j++) b[j] = vf_load(B + l * ldb + j * VN);
        for (int64_t r = 0; r < nr; r++) {
            const vf a = vf_set1(A[r * lda + l]);
            for (int j = 0; j < nv; j++) acc[r][j] = vf_fma(a, b[j], acc[r][j]);
        }
    }
    for (int64_t r = 0; r < nr; r++)
        for (int j = 0; j < nv; j++) vf_store(C + r * ldc + j * VN, acc[r][j]);
}

/* the tiles of a column strip nv vectors wide: whole ones, then the rows left one by one */
static inline void gemm_strip(int nv, int64_t M, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                              float *C, int64_t ldc) {
    int64_t m = 0;
    for (; m + MT <= M; m += MT) gemm_tile(MT, nv, K, A + m * lda, lda, B, ldb, C + m * ldc, ldc);
    for (; m < M; m++) gemm_tile(1, nv, K, A + m * lda, lda, B, ldb, C + m * ldc, ldc);
}

static void gemm_acc(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float *C, int64_t ldc) {
    int64_t n = 0;
    for (; n + 2 * VN <= N; n += 2 * VN) gemm_strip(2, M, K, A, lda, B + n, ldb, C + n, ldc);
    for (; n + VN <= N; n += VN) gemm_strip(1, M, K, A, lda, B + n, ldb, C + n, ldc);
    for (; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            float c = C[m * ldc + n];
            for (int64_t l = 0; l < K; l++) c = fmaf(A[m * lda + l], B[l * ldb + n], c);
            C[m * ldc + n] = c;
        }
}

/* y[i] = fma(a, x[i], y[i]) */
static void axpy(int64_t n, float *y, float a, const float *x) {
    int64_t i = 0;
    const vf va = vf_set1(a);
    for (; i + VN <= n; i += VN) vf_store(y + i, vf_fma(va, vf_load(x + i), vf_load(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* ---- the delta rule, one token of one head ---------------------------------------
 * S [dk][dv] (row r: the state's products with key element r).  Column c:
 *   S[r][c] *= decay, kv = sum_r S[r][c] k[r]                  (r ascending)
 *   d = (v[c] - kv) * beta
 *   S[r][c] = fma(k[r], d, S[r][c]), out[c] = sum_r S[r][c] q[r]
 * Columns do not meet, so a block of them runs both passes while its sums
 * stay in registers. */

static inline void delta_cols(int nv, int64_t dk, int64_t dv, float *S, const float *k, const float *q,
                              const float *v, float decay, float beta, float *out) {
    vf kv[4], d[4];
    const vf vdecay = vf_set1(decay), vbeta = vf_set1(beta);
    for (int j = 0; j < nv; j++) kv[j] = vf_zero();
    for (int64_t r = 0; r < dk; r++) {
        const vf kr = vf_set1(k[r]);
        for (int j = 0; j < nv; j++) {
            const vf s = vf_mul(vf_load(S + r * dv + j * VN), vdecay);
            vf_store(S + r * dv + j * VN, s);
            kv[j] = vf_fma(s, kr, kv[j]);
        }
    }
    for (int j = 0; j < nv; j++) {
        d[j] = vf_mul(vf_sub(vf_load(v + j * VN), kv[j]), vbeta);
        kv[j] = vf_zero();   /* now the output's sums */
    }
    for (int64_t r = 0; r < dk; r++) {
        const vf kr = vf_set1(k[r]), qr = vf_set1(q[r]);
        for (int j = 0; j < nv; j++) {
            const vf s = vf_fma(kr, d[j], vf_load(S + r * dv + j * VN));
            vf_store(S + r * dv + j * VN, s);
            kv[j] = vf_fma(s, qr, kv[j]);
        }
    }
    for (int j = 0; j < nv; j++) vf_store(out + j * VN, kv[j]);
}

static void delta_token(int64_t dk, int64_t dv, float *S, const float *k, const float *q, const float *v,
                        float decay, float beta, float *out) {
    int64_t c = 0;
    for (; c + 4 * VN <= dv; c += 4 * VN) delta_cols(4, dk, dv, S + c, k, q, v + c, decay, beta, out + c);
    for (; c + VN <= dv; c += VN) delta_cols(1, dk, dv, S + c, k, q, v + c, decay, beta, out + c);
    for (; c < dv; c++) {
        float kv = 0.0f, o = 0.0f;
        for (int64_t r = 0; r < dk; r++) {
            S[r * dv + c] = S[r * dv + c] * decay;
            kv = fmaf(S[r * dv + c], k[r], kv);
        }
        const float d = (v[c] - kv) * beta;
        for (int64_t r = 0; r < dk; r++) {
            S[r * dv + c] = fmaf(k[r], d, S[r * dv + c]);
            o = fmaf(S[r * dv + c], q[r], o);
        }
        out[c] = o;
    }
}

/* ---- the delta rule, chunked ------------------------------------------------------
 * The in-piece products are lower triangular: they are taken by blocks of
 * TRI_ROWS rows, each over the columns up to its last row (a constant, so the
 * same terms on every table). */
#define TRI_ROWS 16

/* One piece of n tokens (2 <= n <= PE_DELTA_MAX_CHUNK) of one head, on its
 * state S [Dk][Dv].  With G_i the running sum of the log decays,
 * D_ij = exp(G_i - G_j), the piece's own products are matrices:
 *   A = -(beta_i k_i.k_j D_ij)_{j<i},  T = (I - A)^-1   (forward substitution)
 *   W = T (beta_i exp(G_i) k_i),       U = T (beta_i v_i)
 *   V = U - W S                        (the values the state does not yet hold)
 *   O = (exp(G_i) scale q_i) S + (scale q_i.k_j D_ij)_{j<=i} V
 *   S = exp(G_n) S + sum_i exp(G_n - G_i) k_i V_i^T */
static void delta_chunk(int64_t n, int64_t Dk, int64_t Dv, float *S, const pe_delta_rows *in, float *sc) {
    /* W then qg, and V then O: the products with S of both run as one (S read once) */
    float *qs = sc, *kk = qs + n * Dk, *kbg = kk + n * Dk, *W = kbg + n * Dk, *qg = W + n * Dk, *kT = qg + n * Dk;
    float *kd = kT + Dk * n, *vb = kd + Dk * n, *U = vb + n * Dv, *V = U + n * Dv, *O = V + n * Dv;
    float *KK = O + n * Dv, *QK = KK + n * n, *Tm = QK + n * n, *G = Tm + n * n;
    float beta[PE_DELTA_MAX_CHUNK], eG[PE_DELTA_MAX_CHUNK];
    for (int64_t i = 0; i < n; i++) {
        G[i] = (i ? G[i - 1] : 0.0f) + in->g[i * in->g_step];
        eG[i] = pe_expf(G[i]);
        beta[i] = in->beta[i * in->beta_step];
        const float *q = in->q + i * in->q_step, *k = in->k + i * in->k_step, *v = in->v + i * in->v_step;
        const float kscale = beta[i] * eG[i];
        for (int64_t r = 0; r < Dk; r++) {
            qs[i * Dk + r] = q[r] * in->scale;
            qg[i * Dk + r] = qs[i * Dk + r] * eG[i];
            kk[i * Dk + r] = k[r];
            kbg[i * Dk + r] = k[r] * kscale;
            kT[r * n + i] = k[r];
        }
        for (int64_t c2 = 0; c2 < Dv; c2++) vb[i * Dv + c2] = v[c2] * beta[i];
    }
    memset(KK, 0, (size_t)(2 * n * n) * sizeof(float));   /* KK and QK */
    for (int64_t m = 0; m < n; m += TRI_ROWS) {   /* the lower triangles (and the diagonal's blocks) */
        const int64_t rows = n - m < TRI_ROWS ? n - m : TRI_ROWS;
        gemm_acc(rows, m + rows, Dk, kk + m * Dk, Dk, kT, n, KK + m * n, n);
        gemm_acc(rows, m + rows, Dk, qs + m * Dk, Dk, kT, n, QK + m * n, n);
    }
    for (int64_t i = 0; i < n; i++) {
        float diff[PE_DELTA_MAX_CHUNK], decay[PE_DELTA_MAX_CHUNK];   /* exp(G_i - G_j), j <= i */
        for (int64_t j = 0; j <= i; j++) diff[j] = G[i] - G[j];
        pe_kern->vec.exp_sum(i + 1, decay, diff, 0.0f);
        for (int64_t j = 0; j < n; j++) {
            KK[i * n + j] = j < i ? -(beta[i] * KK[i * n + j]) * decay[j] : 0.0f;   /* A */
            QK[i * n + j] = j <= i ? QK[i * n + j] * decay[j] : 0.0f;
        }
    }
    /* T: row i = A_i + sum_{m<i} A_im T_m (rows m < i done; T_m is 0 from column m on) */
    for (int64_t i = 0; i < n; i++) {
        float *row = Tm + i * n;
        memcpy(row, KK + i * n, (size_t)n * sizeof(float));
        for (int64_t m = 1; m < i; m++) axpy(m, row, KK[i * n + m], Tm + m * n);
        row[i] = 1.0f;   /* T + I */
    }
    memset(W, 0, (size_t)(n * Dk) * sizeof(float));
    memset(U, 0, (size_t)(3 * n * Dv) * sizeof(float));   /* U, V, O */
    for (int64_t m = 0; m < n; m += TRI_ROWS) {   /* T is lower triangular: row i takes rows <= i */
        const int64_t rows = n - m < TRI_ROWS ? n - m : TRI_ROWS;
        gemm_acc(rows, Dk, m + rows, Tm + m * n, n, kbg, Dk, W + m * Dk, Dk);
        gemm_acc(rows, Dv, m + rows, Tm + m * n, n, vb, Dv, U + m * Dv, Dv);
    }
    gemm_acc(2 * n, Dv, Dk, W, Dk, S, Dv, V, Dv);   /* W S into V, qg S into O */
    for (int64_t e = 0; e < n * Dv; e++) V[e] = U[e] - V[e];
    for (int64_t m = 0; m < n; m += TRI_ROWS) {
        const int64_t rows = n - m < TRI_ROWS ? n - m : TRI_ROWS;
        gemm_acc(rows, Dv, m + rows, QK + m * n, n, V, Dv, O + m * Dv, Dv);
    }
    for (int64_t i = 0; i < n; i++) {
        const float keep = pe_expf(G[n - 1] - G[i]);
        for (int64_t r = 0; r < Dk; r++) kd[r * n + i] = kk[i * Dk + r] * keep;
    }
    for (int64_t e = 0; e < Dk * Dv; e++) S[e] = S[e] * eG[n - 1];
    gemm_acc(Dk, Dv, n, kd, n, V, Dv, S, Dv);
    for (int64_t i = 0; i < n; i++) memcpy(in->out + i * in->out_step, O + i * Dv, (size_t)Dv * sizeof(float));
}

/* ---- the selective scan, one token of one head -------------------------------------
 * S [n][p]: column p of the head's state.  S[i][p] = fma(B[i], xdt[p],
 * S[i][p] * dA), y[p] = sum_i S[i][p] C[i] (i ascending). */

static inline void scan_cols(int nv, int64_t p, int64_t n, float *S, const float *xdt, const float *B, const float *C,
                             float dA, float *y) {
    vf acc[4], x[4];
    const vf vdA = vf_set1(dA);
    for (int j = 0; j < nv; j++) { acc[j] = vf_zero(); x[j] = vf_load(xdt + j * VN); }
    for (int64_t i = 0; i < n; i++) {
        const vf b = vf_set1(B[i]), c = vf_set1(C[i]);
        for (int j = 0; j < nv; j++) {
            const vf s = vf_fma(b, x[j], vf_mul(vf_load(S + i * p + j * VN), vdA));
            vf_store(S + i * p + j * VN, s);
            acc[j] = vf_fma(s, c, acc[j]);
        }
    }
    for (int j = 0; j < nv; j++) vf_store(y + j * VN, acc[j]);
}

static void scan_token(int64_t p, int64_t n, float *S, const float *xdt, const float *B, const float *C, float dA,
                       float *y) {
    int64_t c = 0;
    for (; c + 4 * VN <= p; c += 4 * VN) scan_cols(4, p, n, S + c, xdt + c, B, C, dA, y + c);
    for (; c + VN <= p; c += VN) scan_cols(1, p, n, S + c, xdt + c, B, C, dA, y + c);
    for (; c < p; c++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            S[i * p + c] = fmaf(B[i], xdt[c], S[i * p + c] * dA);
            acc = fmaf(S[i * p + c], C[i], acc);
        }
        y[c] = acc;
    }
}

/* ---- the short convolution, one token --------------------------------------------
 * y[c] = sum_j w[j][c] cols[j][c] (j = 0..K-1 ascending, oldest column first). */
static void conv_token(int64_t d, int K, const float *const *cols, const float *w, float *y) {
    int64_t c = 0;
    for (; c + VN <= d; c += VN) {
        vf acc = vf_zero();
        for (int j = 0; j < K; j++) acc = vf_fma(vf_load(w + (int64_t)j * d + c), vf_load(cols[j] + c), acc);
        vf_store(y + c, acc);
    }
    for (; c < d; c++) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc = fmaf(w[(int64_t)j * d + c], cols[j][c], acc);
        y[c] = acc;
    }
}

void PE_SSM_FILL(pe_kernels *k) {
    k->ssm.gemm_acc = gemm_acc;
    k->ssm.axpy = axpy;
    k->ssm.delta_token = delta_token;
    k->ssm.delta_chunk = delta_chunk;
    k->ssm.scan_token = scan_token;
    k->ssm.conv_token = conv_token;
}
