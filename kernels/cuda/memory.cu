/* memory.cu - device memory for the op table: buffers carved from the
 * trainer's arena (kernels/arena.h) or, without one, plain cudaMalloc'ed
 * buffers (never managed memory), zeroed on allocation, synchronous
 * copies; the backend's scratch buffer for partial sums; reserve and the
 * allocation count (kernels/ops.h). */
#include <stdio.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_cuda.h"

extern "C" {
#include "util/error.h"
}

static int64_t g_allocs;
static char g_last[128] = "none";

void cuda_note_alloc(const char *what, size_t bytes) {
  g_allocs++;
  snprintf(g_last, sizeof g_last, "%s of %zu bytes", what, bytes);
}

int64_t cuda_allocations(const char **last) {
  if (last) *last = g_last;
  return g_allocs;
}

static st_arena *g_arena;
static void *g_scratch;
static size_t g_scratch_bytes;

void cuda_use_arena(st_arena *arena) {
  /* Leaving an arena, which its owner frees next: forget the buffers
   * carved from it, so a later op makes its own instead of using freed
   * memory. */
  if (g_arena && g_arena != arena) {
    if (st_arena_owns(g_arena, g_scratch)) {
      g_scratch = NULL;
      g_scratch_bytes = 0;
    }
    cuda_matmul_leave_arena(g_arena);
    cuda_attention_leave_arena(g_arena);
  }
  g_arena = arena;
}

/* 1 while an arena is in use and not sealed: buffers are carved from it. */
static int cuda_arena_active(void) { return g_arena && !g_arena->sealed; }

int cuda_arena_owns(const void *p) { return g_arena && st_arena_owns(g_arena, p); }

void *cuda_buffer(size_t bytes, const char *category) {
  if (cuda_arena_active()) return st_arena_take(g_arena, bytes, category);
  void *p = NULL;
  cuda_note_alloc(category, bytes);
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError(); /* clear it: an out-of-memory is reported by the caller */
    return NULL;
  }
  return p;
}

void *cuda_alloc(size_t bytes, const char *category) {
  /* The arena's block was zeroed when it was made and is never reused. */
  if (cuda_arena_active()) return st_arena_take(g_arena, bytes, category);
  void *p = cuda_buffer(bytes, category);
  if (!p) return NULL;
  if (cudaMemset(p, 0, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(p);
    return NULL;
  }
  return p;
}

void cuda_free(void *p) {
  if (p && !st_arena_owns(g_arena, p)) ST_CUDA_CHECK(cudaFree(p));
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

/* Pinned host memory (--offload optimizer): page-locked, so copies from
 * and to it are DMA transfers that run asynchronously to the host. Not
 * from the arena (that is device memory); counted like any raw allocation. */
void *cuda_host_alloc(size_t bytes, const char *category) {
  void *p = NULL;
  cuda_note_alloc(category, bytes);
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError(); /* the caller reports it against the host plan */
    return NULL;
  }
  memset(p, 0, bytes ? bytes : 1);
  return p;
}

void cuda_host_free(void *p) {
  if (p) ST_CUDA_CHECK(cudaFreeHost(p));
}

/* The copy stream: non-blocking, so it does not wait for the legacy default
 * stream by itself; each copy instead waits for an event recorded on the
 * default stream when it is issued (what the compute stream wrote before
 * is then complete). One event per tag marks each tag's latest copy. Made
 * on the first copy: a stream and events are no device-memory allocation
 * the plan counts. */
static cudaStream_t g_copy_stream;
static cudaEvent_t g_copy_done[ST_COPY_TAGS], g_compute_mark;
static int g_copy_ready;

static void copy_stream_init(void) {
  if (g_copy_ready) return;
  ST_CUDA_CHECK(cudaStreamCreateWithFlags(&g_copy_stream, cudaStreamNonBlocking));
  ST_CUDA_CHECK(cudaEventCreateWithFlags(&g_compute_mark, cudaEventDisableTiming));
  for (int i = 0; i < ST_COPY_TAGS; i++)
    ST_CUDA_CHECK(cudaEventCreateWithFlags(&g_copy_done[i], cudaEventDisableTiming));
  g_copy_ready = 1;
}

static void copy_async(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, int tag) {
  copy_stream_init();
  if (tag < 0 || tag >= ST_COPY_TAGS) st_cuda_fail("copy tag out of range", __FILE__, __LINE__);
  ST_CUDA_CHECK(cudaEventRecord(g_compute_mark, 0));
  ST_CUDA_CHECK(cudaStreamWaitEvent(g_copy_stream, g_compute_mark, 0));
  if (bytes) ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g_copy_stream));
  ST_CUDA_CHECK(cudaEventRecord(g_copy_done[tag], g_copy_stream));
}

void cuda_to_host_async(void *host_dst, const void *src, size_t bytes, int tag) {
  copy_async(host_dst, src, bytes, cudaMemcpyDeviceToHost, tag);
}

void cuda_to_device_async(void *dst, const void *host_src, size_t bytes, int tag) {
  copy_async(dst, host_src, bytes, cudaMemcpyHostToDevice, tag);
}

void cuda_copy_wait(int tag) {
  if (!g_copy_ready) return; /* nothing was ever issued */
  if (tag < 0 || tag >= ST_COPY_TAGS) st_cuda_fail("copy tag out of range", __FILE__, __LINE__);
  ST_CUDA_CHECK(cudaEventSynchronize(g_copy_done[tag]));
}

/* cudaFree of the scratch unless the arena owns it; synchronises, so no op
 * still uses it. */
static void scratch_release(void) {
  if (g_scratch && !st_arena_owns(g_arena, g_scratch)) ST_CUDA_CHECK(cudaFree(g_scratch));
  g_scratch = NULL;
  g_scratch_bytes = 0;
}

void *cuda_scratch(size_t bytes) {
  if (bytes <= g_scratch_bytes) return g_scratch;
  size_t want = (size_t)st_scratch_grow(g_scratch_bytes, bytes);
  scratch_release();
  cuda_note_alloc("cuda_scratch growth", want);
  ST_CUDA_CHECK(cudaMalloc(&g_scratch, want));
  g_scratch_bytes = want;
  return g_scratch;
}

/* cuda_scratch at bytes now (the plan's size after one step), so the
 * step's requests all fit; from the arena when one is in use; -1 when the
 * memory is not there. */
static int scratch_reserve(size_t bytes) {
  if (bytes <= g_scratch_bytes) return 0;
  scratch_release();
  g_scratch = cuda_buffer(bytes, "cuda_scratch");
  if (!g_scratch) return -1;
  g_scratch_bytes = bytes;
  return 0;
}

int cuda_reserve(size_t workspace_bytes, size_t scratch_bytes) {
  if (cuda_matmul_reserve(workspace_bytes)) return -1;
  if (cuda_attention_reserve()) return -1;
  return scratch_reserve(scratch_bytes);
}

/* Not an allocation of the backend (nothing is carved from it and it is
 * never freed before exit), so it is not counted by cuda_note_alloc. */
static void *g_hold;

extern "C" int st_cuda_hold_above(uint64_t cap, uint64_t *held) {
  *held = 0;
  size_t f = 0, t = 0;
  if (g_hold) return st_error_set("internal: the GPU memory above the cap is already held");
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    (void)cudaGetLastError();
    return st_error_set("cannot read the GPU's memory to enforce --gpu-mem");
  }
  if (cap >= t) return 0;
  const uint64_t want = t - cap;
  if (f < want)
    return st_error_setc(ST_EXIT_MEMORY, "--enforce-gpu-mem: %.2f GiB of the GPU is already in "
                         "use (by this process's context and NCCL, or by other processes), more "
                         "than --gpu-mem %.2f GiB allows; raise --gpu-mem or free the GPU",
                         (double)(t - f) / (1 << 30), (double)cap / (1 << 30));
  if (cudaMalloc(&g_hold, want) != cudaSuccess) {
    (void)cudaGetLastError();
    g_hold = NULL;
    return st_error_setc(ST_EXIT_MEMORY, "--enforce-gpu-mem: could not hold %.2f GiB of the GPU",
                         (double)want / (1 << 30));
  }
  *held = want;
  return 0;
}
