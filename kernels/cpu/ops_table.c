/* ops_table.c - the CPU backend's op table (see kernels/ops.h). */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

/* Host memory: the "device" of the CPU backend. Raw allocations are
 * counted, so the trainer's check that nothing allocates after setup runs
 * on the CPU too; with an arena in use (the trainer's), alloc carves from
 * it, so CI exercises the same arena as CUDA. */
static int64_t g_allocs;
static char g_last[96] = "none";
static st_arena *g_arena;

static void *cpu_alloc(size_t bytes, const char *category) {
  if (g_arena && !g_arena->sealed) return st_arena_take(g_arena, bytes, category);
  g_allocs++;
  snprintf(g_last, sizeof g_last, "alloc of %zu bytes", bytes);
  void *p = NULL;
  const size_t n = bytes ? bytes : 1;
  if (posix_memalign(&p, ST_ARENA_ALIGN, n) != 0) return NULL;
  memset(p, 0, n);
  return p;
}
static void cpu_use_arena(st_arena *arena) { g_arena = arena; }
static int cpu_reserve(size_t workspace_bytes, size_t scratch_bytes) { return 0; }
static int64_t cpu_allocations(const char **last) {
  if (last) *last = g_last;
  return g_allocs;
}
static void cpu_free(void *p) {
  if (!st_arena_owns(g_arena, p)) free(p);
}
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
  if (dst != src) memcpy(dst, src, bytes);
}

static void cpu_synchronize(void) {}

/* The CPU's host memory is its backend memory: an aligned allocation of
 * its own (never the arena's), and copies made at once. */
static void *cpu_host_alloc(size_t bytes, const char *category) {
  g_allocs++;
  snprintf(g_last, sizeof g_last, "host alloc of %zu bytes (%s)", bytes, category);
  void *p = NULL;
  const size_t n = bytes ? bytes : 1;
  if (posix_memalign(&p, ST_ARENA_ALIGN, n) != 0) return NULL;
  memset(p, 0, n);
  return p;
}
static void cpu_host_free(void *p) { free(p); }
static void cpu_copy_async(void *dst, const void *src, size_t bytes, int tag) {
  (void)tag;
  cpu_copy(dst, src, bytes);
}
static void cpu_copy_wait(int tag) { (void)tag; }

static const st_ops k_cpu_ops = {
    .name = "cpu-fp32",
    .dtype = ST_FP32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .use_arena = cpu_use_arena,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .to_host_async = cpu_copy_async,
    .to_device_async = cpu_copy_async,
    .copy_wait = cpu_copy_wait,
    .reserve = cpu_reserve,
    .allocations = cpu_allocations,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_residual_forward = cpu_matmul_residual_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_backward_input = cpu_matmul_backward_input,
    .nf4_dequantize = cpu_nf4_dequantize,
    .nf4_quantize = cpu_nf4_quantize,
    .matmul_gelu_forward = cpu_matmul_gelu_forward,
    .matmul_backward_gelu = cpu_matmul_backward_gelu,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_decode = cpu_attention_decode,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .residual_forward = cpu_residual_forward,
    .lora_add_cols = cpu_lora_add_cols,
    .lora_take_cols = cpu_lora_take_cols,
    .dropout = cpu_dropout,
    .accumulate_f32 = cpu_accumulate_f32,
    .f32_to_bf16 = cpu_f32_to_bf16,
    .softmax_crossentropy = cpu_softmax_crossentropy,
    .adamw_update = cpu_adamw_update,
    .adamw_update_segments_split = cpu_adamw_update_segments_split,
    .sum_squares = cpu_sum_squares,
};

const st_ops *st_ops_cpu(void) { return &k_cpu_ops; }
