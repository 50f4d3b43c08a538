/* gemm_dw.cu - a benchmark, not a test: the weight-gradient GEMM of the
 * linear layer (dw^T[C,OC] += inp[C,N] * dout[OC,N]^T, bf16 operands, fp32
 * accumulator in place, beta 1: kernels/cuda/matmul.cu's weight_grads) at
 * the model shapes, through cuBLASLt:
 *   - the heuristic's first algorithm (what the trainer runs): its tile id,
 *     stages id, split-k and reduction scheme;
 *   - the same algorithm with split-k forced to 2..8 (partials in fp32, the
 *     compute type), whether a rerun gives the same bits, and the largest
 *     difference from the first's result relative to |first| + 1e-3 (order
 *     of summation: near-zero elements make it large);
 *   - the fastest of up to 16 the heuristic offers (any summation order);
 *   - the BGRADB epilogue (the bias gradient, dout summed over its N rows,
 *     in the same GEMM) against a float64 column sum on the host;
 *   - the input-side GEMM dinp^T[C,N] = w[C,OC] * dout[OC,N] for scale.
 * Build and run on the GPU machine:
 *   nvcc -O2 -arch=sm_90 -o gemm_dw bench/gemm_dw.cu -lcublasLt && ./gemm_dw
 * Prints one line per shape and variant: ms (median of 20 after 3 warm-ups,
 * CUDA events; 10 for the candidates) and TFLOP/s at 2*C*OC*N operations.
 * docs/benchmarks.md, twenty-third session, has one H100's output. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)
#define LK(x)                                                                          \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cublasLtGetStatusString(s_));  \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = (size_t)32 << 20; /* the trainer's workspace */

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    p[i] = __float2bfloat16(((float)(x >> 40) / (float)(1 << 24)) - 0.5f);
  }
}
__global__ void fill_f32(float *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 7) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    p[i] = ((float)(x >> 40) / (float)(1 << 24)) - 0.5f;
  }
}

typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
} prob;

static prob make(int m, int n, int k, int ta, int tb, int lda, int ldb, int ldd,
                 cudaDataType_t cd) {
  prob p;
  LK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
  LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
  LK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
  LK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
  LK(cublasLtMatrixLayoutCreate(&p.ld, cd, m, n, ldd));
  return p;
}

static int heur(prob *p, cublasLtMatmulHeuristicResult_t *r, int want) {
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t w = WS;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w,
                                          sizeof w));
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                          &schemes, sizeof schemes));
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, want, r,
                                     &found) != CUBLAS_STATUS_SUCCESS)
    found = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  return found;
}

static uint32_t cfg(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
  uint32_t v = 0;
  size_t wr = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &wr) != CUBLAS_STATUS_SUCCESS)
    return 999;
  return v;
}

static float run_ms(prob *p, const cublasLtMatmulAlgo_t *algo, void *d, const void *a,
                    const void *b, float beta, int reps) {
  const float alpha = 1.0f;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float t[64];
  for (int i = 0; i < 3 + reps; i++) {
    CK(cudaEventRecord(e0));
    if (cublasLtMatmul(lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld, algo,
                       ws, WS, 0) != CUBLAS_STATUS_SUCCESS) {
      cudaEventDestroy(e0), cudaEventDestroy(e1);
      return -1.0f;
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    if (i >= 3) CK(cudaEventElapsedTime(&t[i - 3], e0, e1));
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  for (int i = 1; i < reps; i++) /* insertion sort for the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      float x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
    }
  return t[reps / 2];
}

/* One run from a fixed D into out: the result's bits for a comparison. */
static int result_of(prob *p, const cublasLtMatmulAlgo_t *algo, float *d, const float *d0,
                     size_t nd, const void *a, const void *b, float *host) {
  const float alpha = 1.0f, beta = 1.0f;
  CK(cudaMemcpy(d, d0, nd * 4, cudaMemcpyDeviceToDevice));
  if (cublasLtMatmul(lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld, algo,
                     ws, WS, 0) != CUBLAS_STATUS_SUCCESS)
    return -1;
  CK(cudaMemcpy(host, d, nd * 4, cudaMemcpyDeviceToHost));
  return 0;
}

int main(void) {
  struct {
    const char *model;
    int n, c, oc;
    const char *what;
  } shapes[] = {
      {"124m", 32768, 768, 2304, "qkv"},     {"124m", 32768, 768, 768, "attn proj"},
      {"124m", 32768, 768, 3072, "fc"},      {"124m", 32768, 3072, 768, "mlp proj"},
      {"350m", 16384, 1024, 3072, "qkv"},    {"350m", 16384, 1024, 1024, "attn proj"},
      {"350m", 16384, 1024, 4096, "fc"},     {"350m", 16384, 4096, 1024, "mlp proj"},
      {"774m", 8192, 1280, 3840, "qkv"},     {"774m", 8192, 1280, 1280, "attn proj"},
      {"774m", 8192, 1280, 5120, "fc"},      {"774m", 8192, 5120, 1280, "mlp proj"},
      {"1.5b", 8192, 1600, 4800, "qkv"},     {"1.5b", 8192, 1600, 1600, "attn proj"},
      {"1.5b", 8192, 1600, 6400, "fc"},      {"1.5b", 8192, 6400, 1600, "mlp proj"},
      {"llama1b", 8192, 2048, 3072, "qkv"},  {"llama1b", 8192, 2048, 2048, "o"},
      {"llama1b", 8192, 2048, 16384, "gate_up"}, {"llama1b", 8192, 8192, 2048, "down"},
  };
  const int ns = sizeof shapes / sizeof shapes[0];
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  LK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, WS));
  size_t maxin = 0, maxd = 0;
  for (int s = 0; s < ns; s++) {
    size_t a = (size_t)shapes[s].n * shapes[s].c, b = (size_t)shapes[s].n * shapes[s].oc;
    if (a > maxin) maxin = a;
    if (b > maxin) maxin = b;
    size_t d = (size_t)shapes[s].c * shapes[s].oc;
    if (d > maxd) maxd = d;
  }
  __nv_bfloat16 *inp, *dout, *w, *dinp;
  float *d, *d0;
  CK(cudaMalloc(&inp, maxin * 2));
  CK(cudaMalloc(&dout, maxin * 2));
  CK(cudaMalloc(&w, maxd * 2));
  CK(cudaMalloc(&dinp, maxin * 2));
  CK(cudaMalloc(&d, maxd * 4));
  CK(cudaMalloc(&d0, maxd * 4));
  fill_bf16<<<1024, 256>>>(inp, maxin, 1);
  fill_bf16<<<1024, 256>>>(dout, maxin, 2);
  fill_bf16<<<1024, 256>>>(w, maxd, 3);
  fill_f32<<<1024, 256>>>(d0, maxd, 4);
  CK(cudaDeviceSynchronize());
  float *h_ref = (float *)malloc(maxd * 4), *h_try = (float *)malloc(maxd * 4);
  printf("%-8s %-10s %6s %6s %6s | %-34s %8s %7s\n", "model", "weight", "N", "C", "OC",
         "variant", "ms", "TFLOP/s");
  for (int s = 0; s < ns; s++) {
    const int N = shapes[s].n, C = shapes[s].c, OC = shapes[s].oc;
    const double flop = 2.0 * N * C * OC;
    const size_t nd = (size_t)C * OC;
    /* dw^T[C,OC] += inp[C,N] * dout[OC,N]^T: m C, n OC, k N, (N, T) */
    prob p = make(C, OC, N, 0, 1, C, OC, C, CUDA_R_32F);
    cublasLtMatmulHeuristicResult_t r[16];
    int nr = heur(&p, r, 16);
    if (nr == 0) {
      printf("%-8s %-10s no algorithm\n", shapes[s].model, shapes[s].what);
      continue;
    }
    /* the heuristic's first asked for alone, as the trainer does */
    cublasLtMatmulHeuristicResult_t first;
    if (heur(&p, &first, 1) != 1) continue;
    CK(cudaMemcpy(d, d0, nd * 4, cudaMemcpyDeviceToDevice));
    float t1 = run_ms(&p, &first.algo, d, inp, dout, 1.0f, 20);
    result_of(&p, &first.algo, d, d0, nd, inp, dout, h_ref);
    printf("%-8s %-10s %6d %6d %6d | first: tile %u stages %u splitk %u red %u  %8.4f %7.1f\n",
           shapes[s].model, shapes[s].what, N, C, OC, cfg(&first.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
           cfg(&first.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           cfg(&first.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           cfg(&first.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), t1, flop / t1 / 1e9);
    /* split-k forced on the first */
    for (int sk = 2; sk <= 8; sk++) {
      cublasLtMatmulAlgo_t a = first.algo;
      uint32_t v = sk, red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof v) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                               sizeof red) != CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t chk;
      if (cublasLtMatmulAlgoCheck(lt, p.desc, p.la, p.lb, p.ld, p.ld, &a, &chk) !=
          CUBLAS_STATUS_SUCCESS) {
        printf("%-8s %-10s %6s %6s %6s | first, splitk %d: not supported\n", "", "", "", "", "",
               sk);
        continue;
      }
      if (chk.workspaceSize > WS) {
        printf("%-8s %-10s %6s %6s %6s | first, splitk %d: needs %zu B of workspace\n", "", "",
               "", "", "", sk, chk.workspaceSize);
        continue;
      }
      CK(cudaMemcpy(d, d0, nd * 4, cudaMemcpyDeviceToDevice));
      float t = run_ms(&p, &a, d, inp, dout, 1.0f, 20);
      int same = -1;
      if (t > 0 && result_of(&p, &a, d, d0, nd, inp, dout, h_try) == 0) {
        /* a second run of the same: run to run identical? */
        float *h2 = (float *)malloc(nd * 4);
        result_of(&p, &a, d, d0, nd, inp, dout, h2);
        same = memcmp(h_try, h2, nd * 4) == 0;
        free(h2);
      }
      double maxrel = 0;
      for (size_t i = 0; i < nd; i++) {
        double e = fabs((double)h_try[i] - h_ref[i]) / (fabs((double)h_ref[i]) + 1e-3);
        if (e > maxrel) maxrel = e;
      }
      printf("%-8s %-10s %6s %6s %6s | first, splitk %d (ws %zu MB, rerun %s, vs first %.1e) "
             "%8.4f %7.1f\n",
             "", "", "", "", "", sk, chk.workspaceSize >> 20, same == 1 ? "same" : "DIFFERS",
             maxrel, t, t > 0 ? flop / t / 1e9 : 0.0);
    }
    /* the fastest of the first 16, any order */
    float best = 1e9;
    int bi = -1;
    for (int i = 0; i < nr; i++) {
      CK(cudaMemcpy(d, d0, nd * 4, cudaMemcpyDeviceToDevice));
      float t = run_ms(&p, &r[i].algo, d, inp, dout, 1.0f, 10);
      if (t > 0 && t < best) best = t, bi = i;
    }
    if (bi >= 0)
      printf("%-8s %-10s %6s %6s %6s | best of %d: #%d tile %u splitk %u red %u %8.4f %7.1f\n", "",
             "", "", "", "", nr, bi, cfg(&r[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
             cfg(&r[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
             cfg(&r[bi].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), best, flop / best / 1e9);
    /* the bias gradient in the same GEMM: cuBLASLt's BGRADB epilogue reduces
     * op(B) over k, which here is dbias[OC] = sum over the N rows of dout */
    {
      prob e = make(C, OC, N, 0, 1, C, OC, C, CUDA_R_32F);
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BGRADB;
      LK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      cudaDataType_t bt = CUDA_R_32F;
      cublasStatus_t bs = cublasLtMatmulDescSetAttribute(
          e.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
      float *db;
      CK(cudaMalloc(&db, (size_t)OC * 4));
      LK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db,
                                        sizeof db));
      cublasLtMatmulHeuristicResult_t ef;
      if (heur(&e, &ef, 1) != 1) {
        printf("%-8s %-10s %6s %6s %6s | BGRADB: no algorithm (bias type set: %s)\n", "", "", "",
               "", "", bs == CUBLAS_STATUS_SUCCESS ? "yes" : "no");
      } else {
        CK(cudaMemcpy(d, d0, nd * 4, cudaMemcpyDeviceToDevice));
        float t = run_ms(&e, &ef.algo, d, inp, dout, 1.0f, 20);
        result_of(&e, &ef.algo, d, d0, nd, inp, dout, h_try);
        int same_d = memcmp(h_try, h_ref, nd * 4) == 0;
        float *hb = (float *)malloc((size_t)OC * 4);
        CK(cudaMemcpy(hb, db, (size_t)OC * 4, cudaMemcpyDeviceToHost));
        __nv_bfloat16 *hd = (__nv_bfloat16 *)malloc((size_t)N * OC * 2);
        CK(cudaMemcpy(hd, dout, (size_t)N * OC * 2, cudaMemcpyDeviceToHost));
        double maxe = 0;
        for (int o = 0; o < OC; o++) {
          double acc = 0, mag = 0;
          for (int r0 = 0; r0 < N; r0++) {
            double x = __bfloat162float(hd[(size_t)r0 * OC + o]);
            acc += x, mag += fabs(x);
          }
          double er = fabs(acc - hb[o]) / (mag + 1e-30);
          if (er > maxe) maxe = er;
        }
        printf("%-8s %-10s %6s %6s %6s | BGRADB: tile %u splitk %u, D %s first's, dbias err "
               "%.1e %8.4f %7.1f\n",
               "", "", "", "", "", cfg(&ef.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
               cfg(&ef.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), same_d ? "==" : "!=", maxe, t,
               flop / t / 1e9);
        free(hb), free(hd);
      }
      cudaFree(db);
    }
    /* dinp^T[C,N] = w[C,OC] * dout[OC,N] (N, N), bf16 out, for scale */
    prob q = make(C, N, OC, 0, 0, C, OC, C, CUDA_R_16BF);
    cublasLtMatmulHeuristicResult_t qf;
    if (heur(&q, &qf, 1) == 1) {
      const float t = run_ms(&q, &qf.algo, dinp, w, dout, 0.0f, 20);
      printf("%-8s %-10s %6s %6s %6s | dinp, heuristic's first %17s %8.4f %7.1f\n", "", "", "",
             "", "", "", t, flop / t / 1e9);
    }
  }
  printf("done\n");
  return 0;
}
