/* ops_table.cu - the CUDA backend's op tables, one per storage dtype (see
 * kernels/ops.h), device discovery and binding, and the fatal-error path of
 * every CUDA call. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_cuda.h"
#include "kernels/cuda/timeline.h"

extern "C" {
#include "util/envparse.h"
#include "util/error.h"
}

void st_cuda_fail(const char *what, const char *file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  fprintf(stderr, "shardtrain: CUDA error on device %d at %s:%d: %s\n", dev, file, line, what);
  fflush(stderr);
  exit(ST_EXIT_ERROR);
}

void st_cuda_oom(const char *call, const char *what, const char *file, int line) {
  char detail[512];
  snprintf(detail, sizeof detail, "%s at %s:%d returned \"%s\"", call, file, line, what);
  st_oom_fatal("unplanned", 0, detail);
}

static void cuda_timeline_mark(const char *label, int tag) { st_timeline_mark(label, tag, NULL); }

/* The table of storage type S: the S instantiation of every op. */
template <typename S>
static st_ops make_table(const char *name, st_dtype dt) {
  st_ops t = {};
  t.name = name;
  t.dtype = dt;
  t.alloc = cuda_alloc;
  t.free = cuda_free;
  t.use_arena = cuda_use_arena;
  t.zero = cuda_zero;
  t.to_device = cuda_to_device;
  t.to_host = cuda_to_host;
  t.synchronize = cuda_synchronize;
  t.host_alloc = cuda_host_alloc;
  t.host_free = cuda_host_free;
  t.to_host_async = cuda_to_host_async;
  t.to_device_async = cuda_to_device_async;
  t.copy_wait = cuda_copy_wait;
  t.reserve = cuda_reserve;
  t.allocations = cuda_allocations;
  t.timeline_mark = cuda_timeline_mark;
  t.timeline_step_end = st_timeline_step_end;
  t.encoder_forward = cuda_encoder_forward<S>;
  t.encoder_backward = cuda_encoder_backward<S>;
  t.layernorm_forward = cuda_layernorm_forward<S>;
  t.layernorm_backward = cuda_layernorm_backward<S>;
  t.rmsnorm_forward = cuda_rmsnorm_forward<S>;
  t.rmsnorm_backward = cuda_rmsnorm_backward<S>;
  t.rope_forward = cuda_rope_forward<S>;
  t.rope_backward = cuda_rope_backward<S>;
  t.matmul_forward = cuda_matmul_forward<S>;
  t.matmul_residual_forward = cuda_matmul_residual_forward<S>;
  t.matmul_backward = cuda_matmul_backward<S>;
  t.matmul_backward_input = cuda_matmul_backward_input<S>;
  t.nf4_dequantize = cuda_nf4_dequantize<S>;
  t.nf4_quantize = cuda_nf4_quantize<S>;
  t.matmul_gelu_forward = cuda_matmul_gelu_forward<S>;
  t.matmul_backward_gelu = cuda_matmul_backward_gelu<S>;
  t.attention_state_floats = cuda_attention_state_floats;
  t.attention_forward = cuda_attention_forward<S>;
  t.attention_backward = cuda_attention_backward<S>;
  t.attention_decode = cuda_attention_decode<S>;
  t.gelu_forward = cuda_gelu_forward<S>;
  t.gelu_backward = cuda_gelu_backward<S>;
  t.swiglu_forward = cuda_swiglu_forward<S>;
  t.swiglu_backward = cuda_swiglu_backward<S>;
  t.residual_forward = cuda_residual_forward<S>;
  t.accumulate_f32 = cuda_accumulate_f32;
  t.f32_to_bf16 = cuda_f32_to_bf16;
  t.lora_add_cols = cuda_lora_add_cols<S>;
  t.lora_take_cols = cuda_lora_take_cols<S>;
  t.dropout = cuda_dropout<S>;
  t.softmax_crossentropy = cuda_softmax_crossentropy<S>;
  t.adamw_update = cuda_adamw_update<S>;
  t.adamw_update_segments = cuda_adamw_update_segments<S>;
  /* the split master is bf16's alone: fp16 is not the top half of fp32 */
  t.adamw_update_segments_split = dt == ST_BF16 ? cuda_adamw_update_segments_split : NULL;
  t.sum_squares = cuda_sum_squares;
  return t;
}

/* Filled at load time (namespace-scope initialisers, not function-local
 * statics, so no C++ runtime support is needed when C programs link this). */
static const st_ops k_cuda_fp32 = make_table<float>("cuda-fp32", ST_FP32);
static const st_ops k_cuda_bf16 = make_table<__nv_bfloat16>("cuda-bf16", ST_BF16);
static const st_ops k_cuda_fp16 = make_table<__half>("cuda-fp16", ST_FP16);

extern "C" const st_ops *st_ops_cuda(st_dtype dt) {
  switch (dt) {
  case ST_BF16: return &k_cuda_bf16;
  case ST_FP16: return &k_cuda_fp16;
  case ST_FP32: break;
  }
  return &k_cuda_fp32;
}

extern "C" int st_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver, no device, or a driver too old */
    return 0;
  }
  return n;
}

extern "C" int st_cuda_bind_device(int local_rank, char *name, size_t cap) {
  int n = st_cuda_device_count();
  if (n == 0) {
    char vis[96];
    st_envparse_cuda_visible(getenv("CUDA_VISIBLE_DEVICES"), vis, sizeof vis);
    return st_error_set("no CUDA device is visible (CUDA_VISIBLE_DEVICES %s); check nvidia-smi "
                        "and the job's GPU request, or use --device cpu", vis);
  }
  if (local_rank < 0) local_rank = 0;
  int dev = local_rank % n;
  cudaError_t e = cudaSetDevice(dev);
  cudaDeviceProp prop;
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
  if (e == cudaSuccess) e = cudaFree(0); /* create the context now, not inside the first op */
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return st_error_set("cannot use CUDA device %d of %d (node-local rank %d): %s; check "
                        "nvidia-smi for a device in exclusive mode or in error",
                        dev, n, local_rank, cudaGetErrorString(e));
  }
  if (name && cap) snprintf(name, cap, "%s", prop.name);
  return dev;
}

extern "C" int st_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}
