/* bench_cuda_context.c - where a one-GPU run's device memory outside the
 * memory plan goes: the "CUDA context" line of `shardtrain plan` (1117 MiB,
 * fitted as nvidia-smi's peak less the arena; docs/memory.md) split into the
 * steps a training process takes. A benchmark, not a test (not in ctest).
 *
 *   build-gpu/tests/bench_cuda_context [STEP ...]
 *
 * Steps, in the order given (default: all, in this order):
 *   context    cudaSetDevice + cudaFree(0): the primary context
 *   cublaslt   cublasLtCreate
 *   gemm       a first bf16 matmul through the CUDA op table (cuBLASLt loads its kernels)
 *   ops        a first LayerNorm, GELU and cross-entropy-sized softmax pass (our kernels)
 *   cudnn      cudnnCreate
 *   sdpa       cuDNN's attention selected, forward and backward once at
 *              B=4, T=1024, 12 heads of 64, bf16 (its workspace freed again)
 *   release    ours selected instead (--attention auto settling on ours):
 *              cuDNN's plans and handle destroyed, and the cudnn step's handle
 *   nccl       ncclCommInitRank over one rank (what train does on one GPU)
 *   nccl_coll  a first all-reduce, reduce, broadcast and all-gather on it
 * After each step: the device's used memory (cudaMemGetInfo: total - free)
 * and the step's increase, MiB, with every buffer the step allocated
 * already freed, so the increase is what the libraries keep. nvidia-smi's
 * figure before the program starts is the baseline the first step is
 * measured against; pass it as ST_BASELINE_MIB (the device script reads it
 * with nvidia-smi --query-gpu=memory.used) or the context step shows total
 * used. One JSON line per step on stdout.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "util/error.h"

static double used_mib(void) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (double)(tot - fr) / (1 << 20);
}

static void *dalloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    fprintf(stderr, "bench_cuda_context: cudaMalloc of %zu bytes failed\n", bytes);
    exit(1);
  }
  cudaMemset(p, 0, bytes);
  return p;
}

static int fail(const char *step, const char *why) {
  fprintf(stderr, "bench_cuda_context: step %s failed: %s\n", step, why);
  return 1;
}

static cublasLtHandle_t g_lt;
static cudnnHandle_t g_dnn;
static ncclComm_t g_nccl;

static int run_step(const char *s) {
  const st_ops *G = st_ops_cuda(ST_BF16);
  if (strcmp(s, "context") == 0) {
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess)
      return fail(s, "no CUDA device");
  } else if (strcmp(s, "cublaslt") == 0) {
    if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) return fail(s, "cublasLtCreate");
  } else if (strcmp(s, "gemm") == 0) {
    const int N = 4096, C = 768, OC = 3072;
    void *a = dalloc((size_t)N * C * 2), *w = dalloc((size_t)OC * C * 2);
    void *o = dalloc((size_t)N * OC * 2);
    G->matmul_forward(o, a, w, NULL, N, C, OC);
    G->synchronize();
    cudaFree(a), cudaFree(w), cudaFree(o);
  } else if (strcmp(s, "ops") == 0) {
    const int N = 4096, C = 768;
    void *x = dalloc((size_t)N * C * 2), *y = dalloc((size_t)N * C * 2);
    void *wb = dalloc((size_t)C * 2 * 2);
    float *mean = dalloc((size_t)N * 4), *rstd = dalloc((size_t)N * 4);
    G->layernorm_forward(y, mean, rstd, x, wb, (char *)wb + C * 2, N, C);
    G->gelu_forward(x, y, (int64_t)N * C);
    G->synchronize();
    cudaFree(x), cudaFree(y), cudaFree(wb), cudaFree(mean), cudaFree(rstd);
  } else if (strcmp(s, "cudnn") == 0) {
    if (cudnnCreate(&g_dnn) != CUDNN_STATUS_SUCCESS) return fail(s, "cudnnCreate");
  } else if (strcmp(s, "sdpa") == 0) {
    const int B = 4, T = 1024, C = 768, NH = 12;
    st_attention_choice ch;
    if (st_cuda_attention_select(ST_ATTENTION_CUDNN, ST_BF16, B, T, C, NH, &ch))
      return fail(s, st_error_msg());
    if (G->reserve(0, 0)) return fail(s, st_error_msg());
    const int64_t att = G->attention_state_floats(B, T, NH);
    void *qkv = dalloc((size_t)B * T * 3 * C * 2), *dqkv = dalloc((size_t)B * T * 3 * C * 2);
    void *out = dalloc((size_t)B * T * C * 2), *dout = dalloc((size_t)B * T * C * 2);
    float *st = dalloc((size_t)att * 4), *dst = dalloc((size_t)att * 4);
    G->attention_forward(out, st, qkv, B, T, C, NH, NH);
    G->attention_backward(dqkv, dst, dout, qkv, out, st, B, T, C, NH, NH);
    G->synchronize();
    cudaFree(qkv), cudaFree(dqkv), cudaFree(out), cudaFree(dout), cudaFree(st), cudaFree(dst);
    /* the workspace stays (the table owns it): reported separately */
    printf("{\"step\": \"sdpa_workspace\", \"mib\": %.1f}\n",
           (double)ch.workspace_bytes / (1 << 20));
  } else if (strcmp(s, "release") == 0) {
    st_attention_choice ch;
    if (st_cuda_attention_select(ST_ATTENTION_FLASH, ST_BF16, 4, 1024, 768, 12, &ch))
      return fail(s, st_error_msg());
    if (g_dnn) cudnnDestroy(g_dnn);
    g_dnn = NULL;
  } else if (strcmp(s, "nccl") == 0) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return fail(s, "ncclGetUniqueId");
    if (ncclCommInitRank(&g_nccl, 1, id, 0) != ncclSuccess) return fail(s, "ncclCommInitRank");
  } else if (strcmp(s, "nccl_coll") == 0) {
    if (!g_nccl) return fail(s, "needs the nccl step first");
    const size_t n = 1 << 20;
    float *a = dalloc(n * 4), *b = dalloc(n * 4);
    int ok = ncclAllReduce(a, a, n, ncclFloat, ncclSum, g_nccl, 0) == ncclSuccess;
    ok &= ncclReduce(a, b, n, ncclFloat, ncclSum, 0, g_nccl, 0) == ncclSuccess;
    ok &= ncclBroadcast(b, b, n, ncclFloat, 0, g_nccl, 0) == ncclSuccess;
    ok &= ncclAllGather(a, b, n, ncclFloat, g_nccl, 0) == ncclSuccess;
    ok &= cudaStreamSynchronize(0) == cudaSuccess;
    cudaFree(a), cudaFree(b);
    if (!ok) return fail(s, "a collective failed");
  } else {
    fprintf(stderr, "bench_cuda_context: unknown step '%s' (context cublaslt gemm ops cudnn "
            "sdpa release nccl nccl_coll)\n", s);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const char *all[] = {"context", "cublaslt", "gemm", "ops", "cudnn", "sdpa", "release",
                              "nccl", "nccl_coll"};
  const char **steps = argc > 1 ? (const char **)argv + 1 : all;
  const int n = argc > 1 ? argc - 1 : (int)(sizeof all / sizeof all[0]);
  if (st_cuda_device_count() < 1) {
    fprintf(stderr, "bench_cuda_context: no CUDA device is visible\n");
    return 77;
  }
  const char *base = getenv("ST_BASELINE_MIB");
  double before = base && base[0] ? atof(base) : 0;
  for (int i = 0; i < n; i++) {
    if (i == 0 && strcmp(steps[0], "context") != 0 && run_step("context")) return 1;
    int r = run_step(steps[i]);
    if (r) return r;
    cudaDeviceSynchronize();
    const double now = used_mib();
    printf("{\"step\": \"%s\", \"used_mib\": %.1f, \"increase_mib\": %.1f}\n", steps[i], now,
           now - before);
    fflush(stdout);
    before = now;
  }
  if (g_nccl) ncclCommDestroy(g_nccl);
  if (g_dnn) cudnnDestroy(g_dnn);
  if (g_lt) cublasLtDestroy(g_lt);
  return 0;
}
