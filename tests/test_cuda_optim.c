/* test_cuda_optim.c - the optimizer's CUDA ops against the CPU reference
 * and against each other, for each storage dtype of the working weights:
 * AdamW per tensor, over many segments in one launch, with the bf16 master
 * split in two halves (kernels/master_split.h), and from bf16 gradients
 * (--grad-dtype bf16: f32_to_bf16 and the bf16 sum of squares too); the
 * global norm's sum of squares, including its inf/nan test. The harness and
 * its tolerances are test_cuda_ops.c's (tests/cuda_check.c).
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 * ST_CUDA_OPS_DTYPE=fp32|bf16|fp16 runs one dtype only.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/master_split.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"

/* ---- AdamW (fp32 master weights and moments; the working copy in the
 * storage dtype) and the sum of squares */

static void test_adamw(int64_t n) {
  printf("adamw_update n=%lld\n", (long long)n);
  float *p0 = randn(n, 1), *gr = randn(n, 1), *m0 = randn(n, 0.1f), *v0 = randn(n, 0.1f);
  for (int64_t i = 0; i < n; i++) v0[i] *= v0[i];
  float *p = copy_of(p0, n), *m = copy_of(m0, n), *v = copy_of(v0, n);
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
  const int64_t t = 5;
  CPU->adamw_update(p, gr, ST_FP32, m, v, n, lr, b1, b2, eps, wd, gs, t, NULL);
  float *d_p = dev(NULL, n), *d_g = dev(gr, n), *d_m = dev(NULL, n), *d_v = dev(NULL, n);
  void *d_work = dev_st(NULL, n);
  float *junk = randn(n, 1);
  float *g[2][3];
  unsigned char *work[2];
  for (int k = 0; k < 2; k++) {
    upload(d_p, p0, n), upload(d_m, m0, n), upload(d_v, v0, n), upload_st(d_work, junk, n);
    GPU->adamw_update(d_p, d_g, ST_FP32, d_m, d_v, n, lr, b1, b2, eps, wd, gs, t, d_work);
    g[k][0] = back(d_p, n), g[k][1] = back(d_m, n), g[k][2] = back(d_v, n);
    work[k] = malloc((size_t)n * ES);
    GPU->to_host(work[k], d_work, (size_t)n * ES);
  }
  expect_close("adamw_update p", g[0][0], p, n, 1e-6, 1e-5);
  expect_close("adamw_update m", g[0][1], m, n, 1e-7, 1e-5);
  expect_close("adamw_update v", g[0][2], v, n, 1e-8, 1e-5);
  /* the working copy is exactly the new master weights rounded (nearest even) */
  unsigned char *want = malloc((size_t)n * ES);
  st_dtype_from_f32(DT, want, g[0][0], (size_t)n);
  expect_true("adamw_update work = rounded p, bit for bit", memcmp(want, work[0], n * ES) == 0);
  free(want);
  expect_identical("adamw_update p", g[0][0], g[1][0], n * 4);
  expect_identical("adamw_update m", g[0][1], g[1][1], n * 4);
  expect_identical("adamw_update v", g[0][2], g[1][2], n * 4);
  expect_identical("adamw_update work", work[0], work[1], n * ES);
  /* without a working copy: the same master weights */
  upload(d_p, p0, n), upload(d_m, m0, n), upload(d_v, v0, n);
  GPU->adamw_update(d_p, d_g, ST_FP32, d_m, d_v, n, lr, b1, b2, eps, wd, gs, t, NULL);
  float *pn = back(d_p, n);
  expect_true("adamw_update work NULL: same p", memcmp(pn, g[0][0], n * 4) == 0);
  free(pn);
  for (int k = 0; k < 2; k++) {
    free(work[k]);
    for (int j = 0; j < 3; j++) free(g[k][j]);
  }
  GPU->free(d_p), GPU->free(d_g), GPU->free(d_m), GPU->free(d_v), GPU->free(d_work);
  free(p0), free(gr), free(m0), free(v0), free(p), free(m), free(v), free(junk);
}

/* One launch over many tensors must equal one launch per tensor, bit for
 * bit: segments of mixed sizes (1 element to several blocks), decay on
 * every other one, the full ST_ADAMW_SEGS. */
static void test_adamw_segments(void) {
  enum { NS = ST_ADAMW_SEGS };
  int64_t seg_end[NS];
  float seg_wd[NS];
  int64_t n = 0;
  for (int k = 0; k < NS; k++) {
    n += k % 7 == 0 ? 1 : (k * 977) % 3001 + 1;
    seg_end[k] = n;
    seg_wd[k] = k % 2 ? 0.1f : 0.0f;
  }
  printf("adamw_update_segments: %d segments, n=%lld\n", NS, (long long)n);
  float *p0 = randn(n, 1), *gr = randn(n, 1), *m0 = randn(n, 0.1f), *v0 = randn(n, 0.1f);
  for (int64_t i = 0; i < n; i++) v0[i] *= v0[i];
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.7f;
  float *d_p = dev(p0, n), *d_g = dev(gr, n), *d_m = dev(m0, n), *d_v = dev(v0, n);
  void *d_work = dev_st(NULL, n);
  int64_t b = 0;
  for (int k = 0; k < NS; b = seg_end[k++])
    GPU->adamw_update(d_p + b, d_g + b, ST_FP32, d_m + b, d_v + b, seg_end[k] - b, lr, b1, b2, eps, seg_wd[k],
                      gs, 3, (char *)d_work + (size_t)b * ES);
  float *want[3] = {back(d_p, n), back(d_m, n), back(d_v, n)};
  unsigned char *want_w = malloc((size_t)n * ES);
  GPU->to_host(want_w, d_work, (size_t)n * ES);
  upload(d_p, p0, n), upload(d_m, m0, n), upload(d_v, v0, n);
  GPU->zero(d_work, (size_t)n * ES);
  GPU->adamw_update_segments(d_p, d_g, ST_FP32, d_m, d_v, n, seg_end, seg_wd, NS, lr, b1, b2, eps, gs, 3,
                             d_work);
  float *got[3] = {back(d_p, n), back(d_m, n), back(d_v, n)};
  unsigned char *got_w = malloc((size_t)n * ES);
  GPU->to_host(got_w, d_work, (size_t)n * ES);
  expect_identical("adamw_update_segments p", want[0], got[0], n * 4);
  expect_identical("adamw_update_segments m", want[1], got[1], n * 4);
  expect_identical("adamw_update_segments v", want[2], got[2], n * 4);
  expect_identical("adamw_update_segments work", want_w, got_w, n * ES);
  for (int j = 0; j < 3; j++) free(want[j]), free(got[j]);
  free(want_w), free(got_w);
  GPU->free(d_p), GPU->free(d_g), GPU->free(d_m), GPU->free(d_v), GPU->free(d_work);
  free(p0), free(gr), free(m0), free(v0);
}

/* The split master (kernels/master_split.h; bf16 only): over several steps
 * and all the segments above, the joined master must equal the fp32-master
 * kernel's bit for bit and the working weights be its high halves; the
 * CPU's split update agrees within float rounding (nvcc may contract into
 * FMAs; compared as the fp32 kernels are). Some masters start on exact
 * ties. */
static void test_adamw_segments_split(void) {
  if (!GPU->adamw_update_segments_split) {
    expect_true("adamw_update_segments_split: bf16 has it, the others not", DT != ST_BF16);
    return;
  }
  enum { NS = 37 };
  int64_t seg_end[NS];
  float seg_wd[NS];
  int64_t n = 0;
  for (int k = 0; k < NS; k++) {
    n += k % 5 == 0 ? 1 : (k * 977) % 3001 + 1;
    seg_end[k] = n;
    seg_wd[k] = k % 2 ? 0.1f : 0.0f;
  }
  printf("adamw_update_segments_split: %d segments, n=%lld\n", NS, (long long)n);
  float *p0 = randn(n, 1), *m0 = randn(n, 0.1f), *v0 = randn(n, 0.1f);
  for (int64_t i = 0; i < n; i++) v0[i] *= v0[i];
  for (int64_t i = 0; i < n; i += 5) { /* a tie: the rest exactly half a bf16 ulp */
    uint32_t b;
    memcpy(&b, &p0[i], 4);
    b = (b & 0xffff0000u) | 0x8000u;
    memcpy(&p0[i], &b, 4);
  }
  uint16_t *hi = malloc((size_t)n * 2);
  int16_t *lo = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) st_master_split(p0[i], &hi[i], &lo[i]);
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.7f;
  float *d_p = dev(p0, n), *d_m = dev(m0, n), *d_v = dev(v0, n), *d_g = dev(NULL, n);
  float *d_ms = dev(m0, n), *d_vs = dev(v0, n);
  uint16_t *d_hi = GPU->alloc((size_t)n * 2, "test");
  int16_t *d_lo = GPU->alloc((size_t)n * 2, "test");
  GPU->to_device(d_hi, hi, (size_t)n * 2);
  GPU->to_device(d_lo, lo, (size_t)n * 2);
  float *cm = copy_of(m0, n), *cv = copy_of(v0, n);
  uint16_t *chi = malloc((size_t)n * 2);
  int16_t *clo = malloc((size_t)n * 2);
  memcpy(chi, hi, (size_t)n * 2), memcpy(clo, lo, (size_t)n * 2);
  int same = 1, halves = 1;
  for (int t = 1; t <= 4; t++) {
    float *gr = randn(n, 1);
    upload(d_g, gr, n);
    GPU->adamw_update_segments(d_p, d_g, ST_FP32, d_m, d_v, n, seg_end, seg_wd, NS, lr, b1, b2, eps, gs, t,
                               NULL);
    GPU->adamw_update_segments_split(d_lo, d_g, ST_FP32, d_ms, d_vs, n, seg_end, seg_wd, NS, lr, b1, b2,
                                     eps, gs, t, d_hi);
    CPU->adamw_update_segments_split(clo, gr, ST_FP32, cm, cv, n, seg_end, seg_wd, NS, lr, b1, b2, eps, gs,
                                     t, chi);
    float *p = back(d_p, n);
    GPU->to_host(hi, d_hi, (size_t)n * 2);
    GPU->to_host(lo, d_lo, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
      const float j = st_master_join(hi[i], lo[i]);
      uint16_t h;
      int16_t r;
      st_master_split(p[i], &h, &r);
      same &= memcmp(&j, &p[i], 4) == 0;
      halves &= h == hi[i];
    }
    free(p), free(gr);
  }
  expect_true("adamw_update_segments_split: joined master = fp32 kernel's, bit for bit", same);
  expect_true("adamw_update_segments_split: working weights = its high halves", halves);
  /* after the same 4 steps: the moments equal the fp32 kernel's, and the
   * master is the CPU's within float rounding */
  float *m = back(d_m, n), *v = back(d_v, n), *ms = back(d_ms, n), *vs = back(d_vs, n);
  expect_identical("adamw_update_segments_split m = fp32 kernel's", m, ms, n * 4);
  expect_identical("adamw_update_segments_split v = fp32 kernel's", v, vs, n * 4);
  float *gj = malloc((size_t)n * 4), *cj = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++)
    gj[i] = st_master_join(hi[i], lo[i]), cj[i] = st_master_join(chi[i], clo[i]);
  expect_close("adamw_update_segments_split master vs CPU", gj, cj, n, 1e-6, 1e-5);
  /* lr 0 leaves every master as it is: the device's join and split give
   * back the halves they read, ties (planted now) included; the moments
   * take a fifth step, which is not compared */
  for (int64_t i = 0; i < n; i += 5) {
    if ((hi[i] & 0x7fffu) == 0) continue; /* below +-0 lies no tie but a NaN pattern */
    const float tie = st_master_join(hi[i], (int16_t)-32768);
    st_master_split(tie, &hi[i], &lo[i]);
  }
  GPU->to_device(d_hi, hi, (size_t)n * 2);
  GPU->to_device(d_lo, lo, (size_t)n * 2);
  uint16_t *hi0 = malloc((size_t)n * 2);
  int16_t *lo0 = malloc((size_t)n * 2);
  memcpy(hi0, hi, (size_t)n * 2), memcpy(lo0, lo, (size_t)n * 2);
  const float zero_wd[NS] = {0};
  GPU->adamw_update_segments_split(d_lo, d_g, ST_FP32, d_ms, d_vs, n, seg_end, zero_wd, NS, 0.0f, b1, b2,
                                   eps, gs, 5, d_hi);
  GPU->to_host(hi, d_hi, (size_t)n * 2);
  GPU->to_host(lo, d_lo, (size_t)n * 2);
  expect_true("adamw_update_segments_split: lr 0 keeps both halves, ties included",
              memcmp(hi, hi0, (size_t)n * 2) == 0 && memcmp(lo, lo0, (size_t)n * 2) == 0);
  free(hi0), free(lo0);
  free(m), free(v), free(ms), free(vs), free(gj), free(cj), free(cm), free(cv), free(chi),
      free(clo), free(hi), free(lo);
  GPU->free(d_p), GPU->free(d_m), GPU->free(d_v), GPU->free(d_g), GPU->free(d_ms),
      GPU->free(d_vs), GPU->free(d_hi), GPU->free(d_lo);
  free(p0), free(m0), free(v0);
}

static void test_sum_squares(int64_t n) {
  float *x = randn(n, 1);
  float *d_x = dev(x, n);
  double c = CPU->sum_squares(x, ST_FP32, n), g1 = GPU->sum_squares(d_x, ST_FP32, n),
         g2 = GPU->sum_squares(d_x, ST_FP32, n);
  double rel = fabs(g1 - c) / fmax(fabs(c), 1e-300);
  char what[64];
  snprintf(what, sizeof what, "sum_squares n=%lld", (long long)n);
  g_checks += 2;
  int ok = n == 0 ? g1 == 0.0 : rel <= 1e-12;
  printf("  %-40s cpu %.17g cuda %.17g rel %.2e (tol 1e-12)  %s; run twice: %s\n", what, c, g1,
         rel, ok ? "ok" : "FAIL", g1 == g2 ? "bit-identical" : "DIFFERENT  FAIL");
  if (!ok) g_failures++;
  if (g1 != g2) g_failures++;
  GPU->free(d_x);
  free(x);
}

/* --grad-dtype bf16 (kernels/ops.h): f32_to_bf16 against the host's
 * rounding (nearest even) bit for bit, on random values with planted ties
 * (odd and even), NaN, inf and a value that rounds to inf; sum_squares of
 * bf16 against the CPU's and non-finite on an inf; and AdamW from bf16
 * gradients equal to AdamW from fp32 gradients holding the same values,
 * bit for bit, in all three kernels (the split one where the table has it). */
static void test_bf16_grads(int64_t n) {
  printf("bf16 gradients n=%lld\n", (long long)n);
  float *x = randn(n, 1);
  for (int64_t i = 0; i < n; i += 11) { /* ties: the dropped half exactly 0x8000 */
    uint32_t b;
    memcpy(&b, &x[i], 4);
    b = (b & 0xffff0000u) | 0x8000u | ((uint32_t)(i & 1) << 16);
    memcpy(&x[i], &b, 4);
  }
  x[1] = NAN, x[2] = -INFINITY, x[3] = 3.4e38f; /* the last rounds to inf */
  uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
  st_dtype_from_f32(ST_BF16, want, x, (size_t)n);
  float *d_x = dev(x, n);
  uint16_t *d_h = GPU->alloc((size_t)n * 2, "test");
  GPU->f32_to_bf16(d_h, d_x, n);
  GPU->to_host(got, d_h, (size_t)n * 2);
  int same = 1;
  for (int64_t i = 0; i < n; i++) /* NaN: any quiet NaN */
    same &= got[i] == want[i] || (isnan(x[i]) && (got[i] & 0x7fc0u) == 0x7fc0u);
  expect_true("f32_to_bf16 = host rounding (nearest even), ties, NaN, inf", same);
  /* the rest finite, for the sum */
  x[1] = 0.5f, x[2] = -2.0f, x[3] = 1.0f;
  st_dtype_from_f32(ST_BF16, want, x, (size_t)n);
  GPU->to_device(d_h, want, (size_t)n * 2);
  float *w = malloc((size_t)n * 4);
  st_dtype_to_f32(ST_BF16, w, want, (size_t)n);
  const double c = CPU->sum_squares(want, ST_BF16, n), c32 = CPU->sum_squares(w, ST_FP32, n);
  const double g1 = GPU->sum_squares(d_h, ST_BF16, n), g2 = GPU->sum_squares(d_h, ST_BF16, n);
  expect_true("sum_squares bf16: the CPU's bf16 sum = its fp32 sum of the widened values",
              c == c32);
  expect_true("sum_squares bf16: GPU within 1e-12 of the CPU, run twice bit-identical",
              fabs(g1 - c) <= 1e-12 * c && g1 == g2);
  const uint16_t inf16 = 0x7f80;
  GPU->to_device(d_h + n / 2, &inf16, 2);
  expect_true("sum_squares bf16: an inf -> inf", isinf(GPU->sum_squares(d_h, ST_BF16, n)));
  GPU->to_device(d_h, want, (size_t)n * 2);
  /* AdamW: g16 = want (bf16), w its widened values in fp32 */
  float *p0 = randn(n, 1), *m0 = randn(n, 0.1f), *v0 = randn(n, 0.1f);
  for (int64_t i = 0; i < n; i++) v0[i] *= v0[i];
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.7f;
  float *d_w = dev(w, n);
  float *d_p = dev(p0, n), *d_m = dev(m0, n), *d_v = dev(v0, n);
  float *d_p2 = dev(p0, n), *d_m2 = dev(m0, n), *d_v2 = dev(v0, n);
  void *d_k = dev_st(NULL, n), *d_k2 = dev_st(NULL, n);
  GPU->adamw_update(d_p, d_w, ST_FP32, d_m, d_v, n, lr, b1, b2, eps, 0.1f, gs, 3, d_k);
  GPU->adamw_update(d_p2, d_h, ST_BF16, d_m2, d_v2, n, lr, b1, b2, eps, 0.1f, gs, 3, d_k2);
  const int64_t seg_end[3] = {n / 3, n / 2, n};
  const float seg_wd[3] = {0.1f, 0.0f, 0.1f};
  GPU->adamw_update_segments(d_p, d_w, ST_FP32, d_m, d_v, n, seg_end, seg_wd, 3, lr, b1, b2, eps,
                             gs, 4, d_k);
  GPU->adamw_update_segments(d_p2, d_h, ST_BF16, d_m2, d_v2, n, seg_end, seg_wd, 3, lr, b1, b2,
                             eps, gs, 4, d_k2);
  float *r[2][3] = {{back(d_p, n), back(d_m, n), back(d_v, n)},
                    {back(d_p2, n), back(d_m2, n), back(d_v2, n)}};
  expect_identical("adamw_update(_segments) from bf16 g: p", r[0][0], r[1][0], (size_t)n * 4);
  expect_identical("adamw_update(_segments) from bf16 g: m", r[0][1], r[1][1], (size_t)n * 4);
  expect_identical("adamw_update(_segments) from bf16 g: v", r[0][2], r[1][2], (size_t)n * 4);
  float *k1 = back_st(d_k, n), *k2 = back_st(d_k2, n);
  expect_identical("adamw_update(_segments) from bf16 g: work", k1, k2, (size_t)n * 4);
  if (GPU->adamw_update_segments_split) { /* the split master from the fp32 master above */
    uint16_t *hi = malloc((size_t)n * 2);
    int16_t *lo = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) st_master_split(r[0][0][i], &hi[i], &lo[i]);
    uint16_t *d_hi = GPU->alloc((size_t)n * 2, "test");
    int16_t *d_lo = GPU->alloc((size_t)n * 2, "test");
    GPU->to_device(d_hi, hi, (size_t)n * 2);
    GPU->to_device(d_lo, lo, (size_t)n * 2);
    GPU->adamw_update_segments(d_p, d_w, ST_FP32, d_m, d_v, n, seg_end, seg_wd, 3, lr, b1, b2,
                               eps, gs, 5, NULL);
    GPU->adamw_update_segments_split(d_lo, d_h, ST_BF16, d_m2, d_v2, n, seg_end, seg_wd, 3, lr,
                                     b1, b2, eps, gs, 5, d_hi);
    float *p = back(d_p, n);
    GPU->to_host(hi, d_hi, (size_t)n * 2);
    GPU->to_host(lo, d_lo, (size_t)n * 2);
    int joined = 1;
    for (int64_t i = 0; i < n; i++) {
      const float j = st_master_join(hi[i], lo[i]);
      joined &= memcmp(&j, &p[i], 4) == 0;
    }
    expect_true("adamw_update_segments_split from bf16 g: joined master = fp32 path's", joined);
    free(p), free(hi), free(lo);
    GPU->free(d_hi), GPU->free(d_lo);
  }
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 3; j++) free(r[k][j]);
  free(k1), free(k2), free(x), free(want), free(got), free(w), free(p0), free(m0), free(v0);
  GPU->free(d_x), GPU->free(d_h), GPU->free(d_w), GPU->free(d_p), GPU->free(d_m), GPU->free(d_v),
      GPU->free(d_p2), GPU->free(d_m2), GPU->free(d_v2), GPU->free(d_k), GPU->free(d_k2);
}

/* The loss scaler's overflow test: one inf or nan among n finite elements
 * must make the sum non-finite, wherever it sits. */
static void test_sum_squares_nonfinite(int64_t n) {
  float *x = randn(n, 1);
  float *d_x = dev(x, n);
  const int64_t where[] = {0, n / 2 + 1, n - 1};
  for (size_t k = 0; k < sizeof where / sizeof *where; k++) {
    char what[96];
    float bad = INFINITY;
    upload(d_x + where[k], &bad, 1);
    double s = GPU->sum_squares(d_x, ST_FP32, n);
    snprintf(what, sizeof what, "sum_squares inf at [%lld] -> inf", (long long)where[k]);
    expect_true(what, isinf(s));
    bad = NAN;
    upload(d_x + where[k], &bad, 1);
    s = GPU->sum_squares(d_x, ST_FP32, n);
    snprintf(what, sizeof what, "sum_squares nan at [%lld] -> nan", (long long)where[k]);
    expect_true(what, isnan(s));
    upload(d_x + where[k], x + where[k], 1);
  }
  float inf_nan[2] = {INFINITY, NAN};
  upload(d_x + 3, inf_nan, 2);
  expect_true("sum_squares inf and nan -> non-finite", !isfinite(GPU->sum_squares(d_x, ST_FP32, n)));
  GPU->free(d_x);
  free(x);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_optim", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_optim: cuda-fp32, cuda-bf16, cuda-fp16 against %s\n", CPU->name);
  printf("device: %s\n", name);
  const char *only = getenv("ST_CUDA_OPS_DTYPE");
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};
  printf("sum_squares\n");
  test_sum_squares(0);
  test_sum_squares(5);
  test_sum_squares(1000003);
  test_sum_squares_nonfinite(1000003);
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    if (only && *only && strcmp(only, st_dtype_name(dts[i])) != 0) continue;
    use_dtype(dts[i]);
    printf("== %s ==\n", GPU->name);
    test_adamw(10007);
    test_adamw_segments();
    test_adamw_segments_split();
    test_bf16_grads(100003);
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
