/* cuda_check.c - the CUDA tests' shared harness (see cuda_check.h). */
#include "tests/cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops_cuda.h"
#include "util/error.h"

const st_ops *CPU, *GPU;
st_dtype DT;     /* GPU->dtype */
size_t ES;       /* bytes per storage element */
double U, UA;    /* rounding of a storage-dtype output: unit roundoff, absolute floor */
st_rng g_rng;
int g_checks, g_failures;

void use_dtype(st_dtype dt) {
  GPU = st_ops_cuda(dt);
  DT = dt;
  ES = st_dtype_size(dt);
  U = dt == ST_BF16 ? ldexp(1, -8) : dt == ST_FP16 ? ldexp(1, -11) : 0;
  UA = dt == ST_FP16 ? ldexp(1, -25) : 0;
}

/* ---- host and device buffers. fp32 tensors: dev/upload/back; storage-dtype
 * tensors: dev_st/upload_st/back_st, which convert on the host. */

float *randn(int64_t n, float scale) {
  float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = scale * st_rng_normal(&g_rng);
  return x;
}
/* x rounded to the storage dtype, in place (the CPU reference's inputs). */
void round_st(float *x, int64_t n) {
  if (DT == ST_FP32 || n == 0) return;
  void *t = malloc((size_t)n * ES);
  st_dtype_from_f32(DT, t, x, (size_t)n);
  st_dtype_to_f32(DT, x, t, (size_t)n);
  free(t);
}
/* Random values already representable in the storage dtype. */
float *randn_st(int64_t n, float scale) {
  float *x = randn(n, scale);
  round_st(x, n);
  return x;
}
float *copy_of(const float *x, int64_t n) {
  float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}
float *rounded_copy(const float *x, int64_t n) {
  float *y = copy_of(x, n);
  round_st(y, n);
  return y;
}
int *rand_ints(int64_t n, int hi) {
  int *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = (int)(st_rng_next(&g_rng) % (uint64_t)hi);
  return x;
}
void *dev_bytes(const void *h, size_t bytes) {
  void *d = GPU->alloc(bytes, "test");
  if (!d) {
    fprintf(stderr, "FATAL: cannot allocate %zu bytes of device memory\n", bytes);
    exit(1);
  }
  if (h) GPU->to_device(d, h, bytes);
  return d;
}
float *dev(const float *h, int64_t n) { return dev_bytes(h, (size_t)n * sizeof(float)); }
void upload(float *d, const float *h, int64_t n) {
  GPU->to_device(d, h, (size_t)n * sizeof(float));
}
float *back(const float *d, int64_t n) {
  float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
  GPU->to_host(h, d, (size_t)n * sizeof(float));
  return h;
}
void upload_st(void *d, const float *h, int64_t n) {
  void *t = malloc((size_t)(n ? n : 1) * ES);
  st_dtype_from_f32(DT, t, h, (size_t)n);
  GPU->to_device(d, t, (size_t)n * ES);
  free(t);
}
void *dev_st(const float *h, int64_t n) {
  void *d = dev_bytes(NULL, (size_t)n * ES);
  if (h) upload_st(d, h, n);
  return d;
}
float *back_st(const void *d, int64_t n) {
  void *t = malloc((size_t)(n ? n : 1) * ES);
  float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
  GPU->to_host(t, d, (size_t)n * ES);
  st_dtype_to_f32(DT, h, t, (size_t)n);
  free(t);
  return h;
}
/* Element i of a storage-dtype buffer. */
void *at(void *base, int64_t i) { return (char *)base + i * (int64_t)ES; }
double maxabs(const float *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}
double maxabs_diff(const float *x, const float *y, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - y[i]));
  return m;
}

/* ---- checks */

/* terms, when not NULL, widens element i's bound by terms[i % period]: see
 * expect_close_sum. */
void expect_close_terms(const char *what, const float *cuda, const float *cpu, int64_t n,
                               double atol, double rtol, const float *terms, int64_t period,
                               double tscale) {
  double worst = 0, worst_rel = 0;
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)cuda[i] - cpu[i]);
    double extra = terms ? tscale * fabs(terms[i % period]) : 0.0;
    if (!(d <= atol + extra + rtol * fabs(cpu[i]))) { /* NaN fails too */
      if (first_bad < 0) first_bad = i;
      bad++;
    }
    if (!(d <= worst)) worst = d;
    if (fabs(cpu[i]) > 1e-3 && d / fabs(cpu[i]) > worst_rel) worst_rel = d / fabs(cpu[i]);
  }
  g_checks++;
  printf("  %-40s n=%-8lld max|d|=%.2e max rel=%.2e  (tol %.1e + %.1e|cpu|)  %s\n", what,
         (long long)n, worst, worst_rel, atol, rtol, bad ? "FAIL" : "ok");
  if (bad) {
    g_failures++;
    printf("    %lld elements out of tolerance; first [%lld]: cuda %.9g cpu %.9g\n",
           (long long)bad, (long long)first_bad, cuda[first_bad], cpu[first_bad]);
  }
}

void expect_close(const char *what, const float *cuda, const float *cpu, int64_t n,
                         double atol, double rtol) {
  expect_close_terms(what, cuda, cpu, n, atol, rtol, NULL, 1, 0);
}

/* A storage-dtype output: the fp32 bound plus the output's rounding. */
void expect_close_st(const char *what, const float *cuda, const float *cpu, int64_t n,
                            double atol, double rtol) {
  expect_close(what, cuda, cpu, n, atol * (1 + U) + UA, rtol + U);
}

/* A storage-dtype output that is a sum r = p + t of a GEMM product p and a
 * second term t (the bias epilogue): cuBLASLt may round p to the dtype before adding t, so besides the
 * output's rounding u|r| there is u|p| <= u(|r| + |t|). Observed on an H200:
 * without this, elements where p and t nearly cancel fail by a few ulps of p.
 * terms[i % period] is t for output element i. */
void expect_close_sum(const char *what, const float *cuda, const float *cpu, int64_t n,
                             double atol, double rtol, const float *terms, int64_t period) {
  if (DT == ST_FP32) {
    expect_close(what, cuda, cpu, n, atol, rtol);
    return;
  }
  expect_close_terms(what, cuda, cpu, n, atol * (1 + U) + UA, rtol + 2 * U, terms, period, U);
}

/* A storage-dtype output of an op whose fp32 arithmetic matches the CPU's
 * exactly: it must be the CPU result rounded to the dtype. */
void expect_exact_st(const char *what, const float *cuda, const float *cpu, int64_t n) {
  float *r = rounded_copy(cpu, n);
  expect_close(what, cuda, r, n, 0, 0);
  free(r);
}

void expect_identical(const char *what, const void *a, const void *b, size_t bytes) {
  g_checks++;
  if (memcmp(a, b, bytes) == 0) {
    printf("  %-40s bit-identical\n", what);
    return;
  }
  const unsigned char *x = a, *y = b;
  size_t i = 0;
  while (x[i] == y[i]) i++;
  printf("  %-40s DIFFERENT (first differing byte %zu)  FAIL\n", what, i);
  g_failures++;
}

void expect_true(const char *what, int ok) {
  g_checks++;
  printf("  %-40s %s\n", what, ok ? "ok" : "FAIL");
  if (!ok) g_failures++;
}

int cuda_check_start(const char *name, char *device, size_t cap) {
  if (st_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device visible (%s needs a GPU)\n", name);
    return 77;
  }
  int devi = st_cuda_bind_device(0, device, cap);
  if (devi < 0) {
    printf("FAIL: st_cuda_bind_device: %s\n", st_error_msg());
    return 1;
  }
  CPU = st_ops_cpu();
  use_dtype(ST_FP32);
  st_rng_seed(&g_rng, 20240601);
  return 0;
}
