/* memory.cu - device memory for the op table: plain cudaMalloc'ed buffers
 * (never managed memory), zeroed on allocation, synchronous copies; and the
 * backend's scratch buffer for partial sums. */
#include "kernels/cuda/cuda_ops.h"

void *cuda_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 1;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError(); /* clear it: an out-of-memory is reported by the caller */
    return NULL;
  }
  if (cudaMemset(p, 0, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(p);
    return NULL;
  }
  return p;
}

void cuda_free(void *p) {
  if (p) ST_CUDA_CHECK(cudaFree(p));
}

void cuda_zero(void *p, size_t bytes) {
  if (bytes) ST_CUDA_CHECK(cudaMemset(p, 0, bytes));
}

/* cudaMemcpy from pageable host memory returns once the host buffer may be
 * reused; later ops on the default stream see the data. */
void cuda_to_device(void *dst, const void *host_src, size_t bytes) {
  if (bytes) ST_CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

/* Waits for every op queued before it, then copies. */
void cuda_synchronize(void) { ST_CUDA_CHECK(cudaDeviceSynchronize()); }

void cuda_to_host(void *host_dst, const void *src, size_t bytes) {
  if (bytes) ST_CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void *g_scratch;
static size_t g_scratch_bytes;

void *cuda_scratch(size_t bytes) {
  if (bytes <= g_scratch_bytes) return g_scratch;
  size_t want = g_scratch_bytes * 2 > bytes ? g_scratch_bytes * 2 : bytes;
  if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
  if (g_scratch) ST_CUDA_CHECK(cudaFree(g_scratch)); /* synchronises: no op still uses it */
  g_scratch = NULL;
  g_scratch_bytes = 0;
  ST_CUDA_CHECK(cudaMalloc(&g_scratch, want));
  g_scratch_bytes = want;
  return g_scratch;
}
