/* matmul.cu - the linear layer out = inp @ w^T + bias through cuBLASLt, in
 * fp32 with CUBLAS_COMPUTE_32F (plain FFMA, not TF32), so results stay close
 * to the CPU reference. Backward: dinp += dout @ w and dw += dout^T @ inp are
 * GEMMs with beta = 1; dbias += colsum(dout) is a two-pass column sum.
 *
 * cuBLAS is column-major. A row-major [R, K] matrix is a column-major
 * [K, R] one, so with w [OC, C], inp [N, C] and out [N, OC] row-major:
 *   forward:  out^T[OC,N] = (w as [C,OC])^T  * (inp as [C,N])       (T, N)
 *   dinp:    dinp^T[C,N]  = (w as [C,OC])    * (dout as [OC,N])     (N, N)
 *   dw:        dw^T[C,OC] = (inp as [C,N])   * (dout as [OC,N])^T   (N, T)
 * The forward adds the bias with cuBLASLt's bias epilogue (a vector over the
 * rows of out^T, i.e. over OC) when the heuristic offers it.
 *
 * The handle and a 32 MiB workspace are made on the first matmul, on the
 * device current then (st_cuda_bind_device runs before any op).
 */
#include <cublasLt.h>

#include "kernels/cuda/cuda_ops.h"

#define ST_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    cublasStatus_t st_s_ = (call);                                                    \
    if (st_s_ != CUBLAS_STATUS_SUCCESS)                                               \
      st_cuda_fail(cublasLtGetStatusString(st_s_), __FILE__, __LINE__);               \
  } while (0)

static cublasLtHandle_t g_lt;
static void *g_workspace;
static const size_t k_workspace_bytes = (size_t)32 << 20;

static void lt_init(void) {
  if (g_lt) return;
  ST_CUBLAS_CHECK(cublasLtCreate(&g_lt));
  ST_CUDA_CHECK(cudaMalloc(&g_workspace, k_workspace_bytes));
}

/* Largest power of two (<= 256) dividing the address: the heuristic must only
 * offer kernels that work with the real alignment (views into the flat
 * parameter vector can sit at any float offset). */
static uint32_t alignment_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 4 && (a % al) != 0) al >>= 1;
  return al;
}

/* D[m,n] = op(A)[m,k] op(B)[k,n] (+ bias[m]) + beta * D, column-major, with
 * op = transpose when ta/tb. A is stored [m,k] (or [k,m] when ta) with
 * leading dim lda; likewise B. Returns 0, or -1 when cuBLASLt offers no
 * algorithm (only asked with a bias: the caller then adds it itself). */
static int lt_matmul(float *d, const float *a, const float *b, const float *bias, int m, int n,
                     int k, int ta, int tb, int lda, int ldb, int ldd, float beta) {
  lt_init();
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulPreference_t pref;
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                 sizeof opa));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                 sizeof opb));
  if (bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi));
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof bias));
  }
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = k_workspace_bytes;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  uint32_t al_a = alignment_of(a), al_b = alignment_of(b), al_d = alignment_of(d);
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
  int rc = 0;
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (!bias) {
      st_cuda_fail("cuBLASLt offers no fp32 algorithm for this matmul", __FILE__, __LINE__);
    }
    rc = -1;
  } else {
    const float alpha = 1.0f;
    ST_CUBLAS_CHECK(cublasLtMatmul(g_lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                                   &heur.algo, g_workspace, k_workspace_bytes, 0));
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
  return rc;
}

/* out[n, o] += bias[o]: used only when the bias epilogue is not offered. */
__global__ void add_bias_kernel(float *out, const float *bias, int OC, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] += bias[i % OC];
}

/* dbias column sums, pass 1: block (band of 32 columns, chunk of rows); lane
 * y sums rows y, y+8, ... of the chunk, then the lanes are added in order. */
__global__ void bias_backward_part_kernel(float *part, const float *dout, int N, int OC,
                                          int rows_per_chunk) {
  __shared__ float s[ST_COLSUM_LANES][ST_COLSUM_BAND];
  const int tx = threadIdx.x, ty = threadIdx.y, chunk = blockIdx.y;
  const int o = blockIdx.x * ST_COLSUM_BAND + tx;
  const int r0 = chunk * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc = 0.0f;
  if (o < OC)
    for (int r = r0 + ty; r < r1; r += ST_COLSUM_LANES) acc += dout[(int64_t)r * OC + o];
  s[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && o < OC) {
    float t = 0.0f;
    for (int y = 0; y < ST_COLSUM_LANES; y++) t += s[y][tx];
    part[(int64_t)chunk * OC + o] = t;
  }
}

/* Pass 2: dbias[o] += partials in chunk order. */
__global__ void bias_backward_reduce_kernel(float *dbias, const float *part, int OC, int chunks) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = dbias[o];
  for (int k = 0; k < chunks; k++) acc += part[(int64_t)k * OC + o];
  dbias[o] = acc;
}

void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                         int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  if (C == 0) { /* an empty sum: out = bias (or 0) */
    cuda_zero(out, (size_t)N * OC * sizeof(float));
  } else if (lt_matmul(out, w, inp, bias, OC, N, C, 1, 0, C, C, OC, 0.0f) == 0) {
    return;
  } else {
    lt_matmul(out, w, inp, NULL, OC, N, C, 1, 0, C, C, OC, 0.0f);
  }
  if (bias) {
    int64_t n = (int64_t)N * OC;
    add_bias_kernel<<<st_blocks_capped(n, 256), 256>>>(out, bias, OC, n);
    ST_CUDA_LAUNCHED();
  }
}

void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC) {
  if (N == 0 || C == 0 || OC == 0) return;
  /* dinp^T[C,N] += w[C,OC] * dout[OC,N] */
  lt_matmul(dinp, w, dout, NULL, C, N, OC, 0, 0, C, OC, C, 1.0f);
  /* dw^T[C,OC] += inp[C,N] * (dout[OC,N])^T */
  lt_matmul(dw, inp, dout, NULL, C, OC, N, 0, 1, C, OC, C, 1.0f);
  if (dbias) {
    const int rows = st_colsum_rows_per_chunk(N), chunks = st_colsum_chunks(N);
    float *part = (float *)cuda_scratch((size_t)chunks * OC * sizeof(float));
    dim3 grid(st_blocks(OC, ST_COLSUM_BAND), chunks), block(ST_COLSUM_BAND, ST_COLSUM_LANES);
    bias_backward_part_kernel<<<grid, block>>>(part, dout, N, OC, rows);
    ST_CUDA_LAUNCHED();
    bias_backward_reduce_kernel<<<st_blocks(OC, 256), 256>>>(dbias, part, OC, chunks);
    ST_CUDA_LAUNCHED();
  }
}
