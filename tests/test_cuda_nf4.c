/* test_cuda_nf4.c - NF4 on the GPU (kernels/cuda/nf4.cu, kernels/nf4_matmul.c
 * on the CUDA tables) against the host reference (kernels/cpu/nf4.c, which
 * test_nf4 holds to bitsandbytes), for the fp32, bf16 and fp16 tables.
 *
 * Exact (bit for bit), no tolerance:
 *  - nf4_dequantize = st_nf4_dequantize rounded to the storage dtype, on the
 *    16-element vector path (n % 16 == 0, aligned destination) and the
 *    element path (odd n, a destination one element past alignment);
 *  - nf4_quantize of a storage-dtype tensor = st_nf4_quantize of the same
 *    values widened to fp32: codes, absmax codes, absmax2 and the offset
 *    (a double sum in the same order), including an all-zero block, a
 *    short last block and many second-level groups; non-finite input -1;
 *  - the NF4 matmul (forward y = x W^T + b, backward dx = dy W) = the same
 *    table's matmul_forward / matmul_backward_input on the dequantised
 *    weight uploaded from the host, and matmul_backward_input's dinp = the
 *    full matmul_backward's dinp: one GEMM, one cuBLASLt plan.
 * Against the CPU's fp32 arithmetic on the same dequantised weight, the
 * tolerance of test_cuda_ops' matmul: 1e-4 + 1e-4 |cpu| plus the output's
 * rounding in the storage dtype (expect_close_st).
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/nf4.h"
#include "kernels/nf4_matmul.h"
#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"

/* A host NF4 tensor and its copy in device memory (one block each). */
typedef struct {
  st_nf4 h, d;
  void *hmem, *dmem;
  st_nf4_sizes sz;
} pair;

static void pair_make(pair *p, int64_t rows, int64_t cols) {
  p->sz = st_nf4_size(rows, cols);
  const size_t b = p->sz.bytes ? p->sz.bytes : 256;
  p->hmem = aligned_alloc(256, b);
  memset(p->hmem, 0, b);
  p->dmem = GPU->alloc(b, "weights");
  st_nf4_carve(&p->h, rows, cols, p->hmem);
  st_nf4_carve(&p->d, rows, cols, p->dmem);
}
static void pair_upload(pair *p) {
  GPU->to_device(p->dmem, p->hmem, p->sz.bytes);
  p->d.offset = p->h.offset;
}
static void pair_free(pair *p) {
  free(p->hmem);
  GPU->free(p->dmem);
}

static void expect_same_bits(const char *what, const void *gpu, const void *cpu, size_t bytes) {
  g_checks++;
  if (memcmp(gpu, cpu, bytes) == 0) {
    printf("  %-48s %8zu bytes: bit-identical to the CPU  ok\n", what, bytes);
    return;
  }
  const unsigned char *x = gpu, *y = cpu;
  size_t i = 0;
  while (x[i] == y[i]) i++;
  printf("  %-48s %8zu bytes: DIFFERENT, first at byte %zu (gpu %02x cpu %02x)  FAIL\n", what,
         bytes, i, x[i], y[i]);
  g_failures++;
}

/* The storage-dtype bytes of fp32 values. */
static void *to_st(const float *x, int64_t n) {
  void *b = malloc((size_t)(n ? n : 1) * ES);
  st_dtype_from_f32(DT, b, x, (size_t)n);
  return b;
}

static void test_dequantize(int64_t rows, int64_t cols, int misalign) {
  const int64_t n = rows * cols;
  printf("nf4_dequantize [%lld, %lld]%s\n", (long long)rows, (long long)cols,
         misalign ? " (destination one element past alignment)" : "");
  float *w = randn(n, 0.02f);
  pair p;
  pair_make(&p, rows, cols);
  expect_true("host quantise", st_nf4_quantize(&p.h, w) == 0);
  pair_upload(&p);
  float *ref = malloc((size_t)n * 4);
  st_nf4_dequantize(&p.h, ref);
  void *ref_st = to_st(ref, n);
  void *D = GPU->alloc((size_t)(n + 1) * ES, "activations");
  void *d = at(D, misalign ? 1 : 0);
  GPU->nf4_dequantize(d, &p.d);
  void *got = malloc((size_t)n * ES);
  GPU->to_host(got, d, (size_t)n * ES);
  expect_same_bits("dequantised weight", got, ref_st, (size_t)n * ES);
  free(w), free(ref), free(ref_st), free(got);
  GPU->free(D);
  pair_free(&p);
}

static void test_quantize(int64_t rows, int64_t cols, int zero_block, int nonfinite) {
  const int64_t n = rows * cols;
  printf("nf4_quantize [%lld, %lld]%s%s\n", (long long)rows, (long long)cols,
         zero_block ? " (an all-zero block, a block 1000x the rest)" : "",
         nonfinite ? " (a NaN)" : "");
  float *w = randn_st(n, 0.02f); /* rounded to the storage dtype: both see the same values */
  if (zero_block && n >= 256) {
    memset(w + 64, 0, 64 * sizeof(float));
    for (int i = 128; i < 192; i++) w[i] *= 1000.0f;
    round_st(w, n);
  }
  if (nonfinite) w[n / 2] = NAN;
  pair p;
  pair_make(&p, rows, cols);
  const int hrc = st_nf4_quantize(&p.h, w);
  void *d_src = dev_st(w, n);
  void *ws = GPU->alloc(st_nf4_quantize_scratch_bytes(rows, cols), "activations");
  const int drc = GPU->nf4_quantize(&p.d, d_src, ws);
  expect_true(nonfinite ? "both refuse a NaN (-1)" : "both return 0",
              nonfinite ? (hrc == -1 && drc == -1) : (hrc == 0 && drc == 0));
  if (!nonfinite) {
    unsigned char *got = malloc(p.sz.bytes);
    GPU->to_host(got, p.dmem, p.sz.bytes);
    const size_t oc = (size_t)((uint8_t *)p.h.absmax_codes - (uint8_t *)p.hmem);
    const size_t oa = (size_t)((uint8_t *)p.h.absmax2 - (uint8_t *)p.hmem);
    expect_same_bits("4-bit codes", got, p.hmem, p.sz.code_bytes);
    expect_same_bits("absmax codes", got + oc, (uint8_t *)p.hmem + oc, p.sz.absmax_code_bytes);
    expect_same_bits("absmax2", got + oa, (uint8_t *)p.hmem + oa, p.sz.absmax2_bytes);
    expect_same_bits("offset", &p.d.offset, &p.h.offset, sizeof(float));
    free(got);
  }
  free(w);
  GPU->free(d_src);
  GPU->free(ws);
  pair_free(&p);
}

static void test_matmul(int N, int C, int OC, int bias) {
  printf("nf4 matmul N=%d C=%d OC=%d%s\n", N, C, OC, bias ? " bias" : "");
  const int64_t NC = (int64_t)N * C, NO = (int64_t)N * OC, OCC = (int64_t)OC * C;
  float *w = randn(OCC, 0.05f), *x = randn_st(NC, 1), *dy = randn_st(NO, 1);
  float *bv = randn_st(OC, 0.1f);
  pair p;
  pair_make(&p, OC, C);
  st_nf4_quantize(&p.h, w);
  pair_upload(&p);
  float *wd = malloc((size_t)OCC * 4);
  st_nf4_dequantize(&p.h, wd);
  round_st(wd, OCC); /* the weight the GEMM sees */
  void *d_x = dev_st(x, NC), *d_dy = dev_st(dy, NO), *d_b = dev_st(bv, OC);
  void *d_wd = dev_st(wd, OCC);
  void *d_y0 = dev_st(NULL, NO), *d_y1 = dev_st(NULL, NO);
  void *d_dx0 = dev_st(NULL, NC), *d_dx1 = dev_st(NULL, NC), *d_dx2 = dev_st(NULL, NC);
  float *d_dw = dev(NULL, OCC);
  void *scratch = GPU->alloc(st_nf4_scratch_bytes(OC, C, DT), "activations");

  GPU->matmul_forward(d_y0, d_x, d_wd, bias ? d_b : NULL, N, C, OC);
  st_nf4_matmul_forward(GPU, d_y1, d_x, &p.d, bias ? d_b : NULL, scratch, N);
  float *y0 = back_st(d_y0, NO), *y1 = back_st(d_y1, NO);
  expect_same_bits("forward = GEMM on the dequantised weight", y1, y0, (size_t)NO * 4);
  float *y_cpu = malloc((size_t)NO * 4);
  CPU->matmul_forward(y_cpu, x, wd, bias ? bv : NULL, N, C, OC);
  expect_close_st("forward against the CPU", y1, y_cpu, NO, 1e-4, 1e-4);

  GPU->matmul_backward(d_dx0, d_dw, NULL, d_dy, d_x, d_wd, N, C, OC);
  GPU->matmul_backward_input(d_dx1, d_dy, d_wd, N, C, OC);
  GPU->zero(scratch, st_nf4_scratch_bytes(OC, C, DT)); /* backward dequantises again */
  st_nf4_matmul_backward(GPU, d_dx2, d_dy, &p.d, scratch, N);
  float *dx0 = back_st(d_dx0, NC), *dx1 = back_st(d_dx1, NC), *dx2 = back_st(d_dx2, NC);
  expect_same_bits("matmul_backward_input = matmul_backward's dinp", dx1, dx0, (size_t)NC * 4);
  expect_same_bits("backward = GEMM on the dequantised weight", dx2, dx0, (size_t)NC * 4);
  float *dx_cpu = malloc((size_t)NC * 4);
  CPU->matmul_backward_input(dx_cpu, dy, wd, N, C, OC);
  expect_close_st("backward against the CPU", dx2, dx_cpu, NC, 1e-4, 1e-4);

  free(w), free(x), free(dy), free(bv), free(wd), free(y0), free(y1), free(y_cpu);
  free(dx0), free(dx1), free(dx2), free(dx_cpu);
  GPU->free(d_x), GPU->free(d_dy), GPU->free(d_b), GPU->free(d_wd), GPU->free(d_y0);
  GPU->free(d_y1), GPU->free(d_dx0), GPU->free(d_dx1), GPU->free(d_dx2), GPU->free(d_dw);
  GPU->free(scratch);
  pair_free(&p);
}

/* Dequantisation bandwidth at an 8B model's largest projection (reported,
 * not checked: the number goes in the closing note). */
static void bench_dequantize(int64_t rows, int64_t cols) {
  pair p;
  pair_make(&p, rows, cols);
  void *ws = GPU->alloc(st_nf4_scratch_bytes(rows, cols, DT), "activations");
  const int64_t n = rows * cols;
  float *w = randn(n, 0.02f);
  void *d_src = dev_st(w, n);
  GPU->nf4_quantize(&p.d, d_src, ws);
  GPU->synchronize();
  const int reps = 20;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < reps; i++) GPU->nf4_dequantize(ws, &p.d);
  GPU->synchronize();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double s = ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec)) / reps;
  const double bytes = (double)p.sz.payload + (double)n * (double)ES;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  GPU->nf4_quantize(&p.d, d_src, ws);
  GPU->synchronize();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double sq = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  printf("  [%lld, %lld] %s: dequantise %.3f ms (%.0f GB/s read+written), quantise %.3f ms\n",
         (long long)rows, (long long)cols, st_dtype_name(DT), s * 1e3, bytes / s * 1e-9,
         sq * 1e3);
  free(w);
  GPU->free(d_src);
  GPU->free(ws);
  pair_free(&p);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_nf4", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_nf4: NF4 on %s against %s\n", name, CPU->name);
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    use_dtype(dts[i]);
    printf("== %s\n", GPU->name);
    test_dequantize(384, 256, 0); /* vector path */
    test_dequantize(64, 100, 0);  /* n % 64 != 0 per row, 6400 % 16 == 0: vector path */
    test_dequantize(384, 256, 1); /* element path: misaligned destination */
    test_dequantize(37, 41, 0);   /* element path: odd n, a short last block */
    test_dequantize(3, 5, 0);
    test_quantize(384, 256, 1, 0);
    test_quantize(37, 41, 0, 0);
    test_quantize(1, 1, 0, 0);
    test_quantize(1024, 1100, 0, 0); /* 17600 blocks: 69 second-level groups */
    test_quantize(64, 64, 0, 1);
    test_matmul(37, 96, 200, 1);
    test_matmul(64, 256, 768, 0);
    test_matmul(5, 72, 40, 1);
  }
  use_dtype(ST_BF16);
  bench_dequantize(14336, 4096);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
