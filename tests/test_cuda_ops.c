/* test_cuda_ops.c - every CUDA op against the CPU reference, for each
 * storage dtype (fp32, bf16, fp16), and run-to-run bit-identity. The whole
 * model is test_cuda_model.c; the optimizer's ops (AdamW, the norm's sum of
 * squares, bf16 gradients) test_cuda_optim.c; timings are bench_cuda_ops.c. Shared harness:
 * cuda_check.c.
 *
 * For each op: random inputs at sizes that are not multiples of the warp
 * size (N=37, C=72, OC=200, T=13, 45, 77, 130 and 300, NH=3, V=200, Vp=256) and at GPT-2
 * widths (C=768, hs=64, V=50257); the CPU op and the CUDA op run on the same
 * inputs (gradient buffers start from the same random values, so the
 * accumulate-into semantics are checked too), results are copied back and
 * compared element by element with
 *     |cuda - cpu| <= atol + rtol * |cpu|,
 * atol and rtol printed on each line. Each CUDA op also runs twice from the
 * same starting state and must give bit-identical results.
 *
 * fp32 bounds by kind: exact (0) where the CUDA op does the same float
 * operations in the same order (embedding, residual add, accumulate);
 * 1e-8..2e-6 absolute + 1e-5..1e-4 relative for elementwise ops that go
 * through tanhf/expf/sqrtf (GPU and libm differ by an ulp or two); 1e-5..1e-4
 * absolute + 1e-4 relative for sums taken in another order (layernorm,
 * attention, matmuls with C <= 300, and with C = 768 at the init weight
 * scale).
 *
 * bf16 and fp16: the random fp32 inputs of every storage-dtype tensor are
 * rounded to the dtype (st_dtype_from_f32, nearest even), and the CPU
 * reference runs in fp32 on exactly those rounded values, so the only
 * differences are the fp32 ones above plus the rounding of storage-dtype
 * outputs, which is at most u |value| with the unit roundoff u = 2^-8 (bf16,
 * 8 significant bits) or 2^-11 (fp16, 11 bits), plus 2^-25 absolute for
 * fp16's subnormals (spacing 2^-24). Storage-dtype outputs therefore get
 *     atol (1 + u) + [fp16: 2^-25]  +  (rtol + u) |cpu|,
 * and exact ops must equal the CPU result rounded to the dtype bit for bit.
 * fp32 outputs (dw, dbias, LayerNorm mean/rstd, losses, encoder gradients,
 * Adam state) keep the fp32 bounds, with two documented extras:
 *  - matmul dw of bf16/fp16 GEMMs: tensor cores add each k-step's products
 *    in fp32 but not with IEEE round-to-nearest (Fasi et al. 2021 measured
 *    truncation), so dw also gets 2^-17 max|dw| absolute;
 *  - attention dq/dk: the backward takes D = rowsum(dO * O) from forward's
 *    output, stored rounded, so D is off by up to u sum|dO O|; that error
 *    enters dq and dk through dS = P (dP - D), bounded here by
 *    4u max|gradient added| absolute.
 *
 *  - matmul dw and dbias (fp32 sums of K = N products plus the old value,
 *    accumulated): the classical forward error bound of a sum, which grows
 *    with the reduction length instead of a fixed 1e-4 (see gamma_k below).
 *    A fixed tolerance failed once on 1 element of 2.36M at N = 512.
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 * ST_CUDA_OPS_DTYPE=fp32|bf16|fp16 runs one dtype only;
 * ST_CUDA_OPS_SMALL=1 leaves out the GPT-2-width cases (for compute-sanitizer).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"

/* ---- memory functions */

static void test_memory(void) {
  printf("memory\n");
  const int64_t n = 1003;
  float *d = GPU->alloc((size_t)n * sizeof(float), "test");
  float *h = back(d, n);
  int zero = 1;
  for (int64_t i = 0; i < n; i++) zero &= h[i] == 0.0f;
  expect_true("alloc returns zeroed memory", zero);
  float *x = randn(n, 1);
  upload(d, x, n);
  free(h);
  h = back(d, n);
  expect_true("to_device then to_host round trip", memcmp(h, x, (size_t)n * sizeof *x) == 0);
  GPU->zero(d + 10, 100 * sizeof(float));
  free(h);
  h = back(d, n);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) ok &= (i >= 10 && i < 110) ? h[i] == 0.0f : h[i] == x[i];
  expect_true("zero clears exactly the range asked", ok);
  void *z = GPU->alloc(0, "test");
  expect_true("alloc(0) gives a pointer", z != NULL);
  GPU->free(z);
  GPU->free(NULL);
  GPU->free(d);
  free(h);
  free(x);
}

/* ---- encoder */

static void test_encoder(int B, int T, int C, int V) {
  printf("encoder B=%d T=%d C=%d V=%d\n", B, T, C, V);
  const int64_t BT = (int64_t)B * T, BTC = BT * C;
  int *inp = rand_ints(BT, V);
  float *wte = randn_st((int64_t)V * C, 1), *wpe = randn_st((int64_t)T * C, 1);
  float *out = malloc((size_t)BTC * sizeof(float));
  CPU->encoder_forward(out, inp, wte, wpe, B, T, C);
  int *d_inp = dev_bytes(inp, (size_t)BT * sizeof(int));
  void *d_wte = dev_st(wte, (int64_t)V * C), *d_wpe = dev_st(wpe, (int64_t)T * C);
  void *d_out = dev_st(NULL, BTC);
  GPU->encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C);
  float *g1 = back_st(d_out, BTC);
  GPU->encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C);
  float *g2 = back_st(d_out, BTC);
  expect_exact_st("encoder_forward out", g1, out, BTC);
  expect_identical("encoder_forward out", g1, g2, (size_t)BTC * 4);
  free(g1), free(g2);

  /* gradients are fp32: the same additions of the same (rounded) values */
  float *dout = randn_st(BTC, 1), *dwte0 = randn((int64_t)V * C, 1), *dwpe0 = randn((int64_t)T * C, 1);
  float *dwte = copy_of(dwte0, (int64_t)V * C), *dwpe = copy_of(dwpe0, (int64_t)T * C);
  CPU->encoder_backward(dwte, dwpe, dout, inp, B, T, C, NULL, 0);
  void *d_dout = dev_st(dout, BTC);
  float *d_dwte = dev(NULL, (int64_t)V * C), *d_dwpe = dev(NULL, (int64_t)T * C);
  /* the sort path (scratch of 16 B*T + 1 MiB: the positions and cub's
   * storage, poisoned), then the scan path: scratch NULL, and too small */
  const size_t sbytes = (size_t)BT * 16 + ((size_t)1 << 20);
  float *d_scratch = dev(NULL, (int64_t)(sbytes / 4));
  const char *path[3] = {"sort", "no scratch", "scratch too small"};
  for (int q = 0; q < 3; q++) {
    float *r[2][2];
    for (int k = 0; k < 2; k++) {
      upload(d_dwte, dwte0, (int64_t)V * C);
      upload(d_dwpe, dwpe0, (int64_t)T * C);
      float *poison = randn((int64_t)(sbytes / 4), 7 + k);
      upload(d_scratch, poison, (int64_t)(sbytes / 4));
      free(poison);
      GPU->encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C, q == 1 ? NULL : d_scratch,
                            q == 2 ? (size_t)BT * 4 : sbytes);
      r[k][0] = back(d_dwte, (int64_t)V * C);
      r[k][1] = back(d_dwpe, (int64_t)T * C);
    }
    printf("  encoder_backward, %s\n", path[q]);
    expect_close("encoder_backward dwte (+=)", r[0][0], dwte, (int64_t)V * C, 0, 0);
    expect_close("encoder_backward dwpe (+=)", r[0][1], dwpe, (int64_t)T * C, 0, 0);
    expect_identical("encoder_backward dwte", r[0][0], r[1][0], (size_t)V * C * 4);
    expect_identical("encoder_backward dwpe", r[0][1], r[1][1], (size_t)T * C * 4);
    for (int k = 0; k < 2; k++) free(r[k][0]), free(r[k][1]);
  }
  GPU->free(d_inp), GPU->free(d_wte), GPU->free(d_wpe), GPU->free(d_out), GPU->free(d_dout);
  GPU->free(d_dwte), GPU->free(d_dwpe), GPU->free(d_scratch);
  free(inp), free(wte), free(wpe), free(out), free(dout), free(dwte0), free(dwpe0), free(dwte),
      free(dwpe);
}

/* ---- layernorm */

static void test_layernorm(int N, int C) {
  printf("layernorm N=%d C=%d\n", N, C);
  const int64_t NC = (int64_t)N * C;
  float *x = randn(NC, 2), *w = randn(C, 0.2f), *b = randn_st(C, 0.2f);
  for (int64_t i = 0; i < NC; i++) x[i] += 0.5f;
  for (int c = 0; c < C; c++) w[c] += 1.0f;
  round_st(x, NC);
  round_st(w, C);
  float *out = malloc(NC * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
  CPU->layernorm_forward(out, mean, rstd, x, w, b, N, C);
  void *d_x = dev_st(x, NC), *d_w = dev_st(w, C), *d_b = dev_st(b, C), *d_out = dev_st(NULL, NC);
  float *d_mean = dev(NULL, N), *d_rstd = dev(NULL, N);
  float *g[2][3];
  for (int k = 0; k < 2; k++) {
    GPU->layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    g[k][0] = back_st(d_out, NC), g[k][1] = back(d_mean, N), g[k][2] = back(d_rstd, N);
  }
  expect_close_st("layernorm_forward out", g[0][0], out, NC, 1e-5, 1e-5);
  expect_close("layernorm_forward mean", g[0][1], mean, N, 1e-6, 1e-5);
  expect_close("layernorm_forward rstd", g[0][2], rstd, N, 1e-6, 1e-5);
  expect_identical("layernorm_forward out/mean/rstd", g[0][0], g[1][0], NC * 4);
  expect_identical("layernorm_forward mean", g[0][1], g[1][1], N * 4);
  expect_identical("layernorm_forward rstd", g[0][2], g[1][2], N * 4);
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 3; j++) free(g[k][j]);

  float *dout = randn_st(NC, 1), *dinp0 = randn_st(NC, 1), *dw0 = randn(C, 1), *db0 = randn(C, 1);
  float *dinp = copy_of(dinp0, NC), *dw = copy_of(dw0, C), *db = copy_of(db0, C);
  CPU->layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, N, C);
  /* the CUDA backward gets the CPU's mean/rstd, so only the backward is compared */
  upload(d_mean, mean, N);
  upload(d_rstd, rstd, N);
  void *d_dout = dev_st(dout, NC), *d_dinp = dev_st(NULL, NC);
  float *d_dw = dev(NULL, C), *d_db = dev(NULL, C);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dinp, dinp0, NC), upload(d_dw, dw0, C), upload(d_db, db0, C);
    GPU->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
    g[k][0] = back_st(d_dinp, NC), g[k][1] = back(d_dw, C), g[k][2] = back(d_db, C);
  }
  expect_close_st("layernorm_backward dinp (+=)", g[0][0], dinp, NC, 1e-5, 1e-4);
  expect_close("layernorm_backward dw (+=)", g[0][1], dw, C, 1e-4, 1e-4);
  expect_close("layernorm_backward db (+=)", g[0][2], db, C, 1e-4, 1e-4);
  expect_identical("layernorm_backward dinp", g[0][0], g[1][0], NC * 4);
  expect_identical("layernorm_backward dw", g[0][1], g[1][1], C * 4);
  expect_identical("layernorm_backward db", g[0][2], g[1][2], C * 4);
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 3; j++) free(g[k][j]);
  GPU->free(d_x), GPU->free(d_w), GPU->free(d_b), GPU->free(d_out), GPU->free(d_mean);
  GPU->free(d_rstd), GPU->free(d_dout), GPU->free(d_dinp), GPU->free(d_dw), GPU->free(d_db);
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp0);
  free(dw0), free(db0), free(dinp), free(dw), free(db);
}

/* ---- the error bound of the fp32 weight-gradient sums.
 * Higham, "Accuracy and Stability of Numerical Algorithms" (2nd ed., 2002),
 * Section 3.1, eq. (3.4)-(3.5): a sum of K terms (here products a_i b_i, each
 * rounded, or fused in an FMA) computed in any order in IEEE arithmetic
 * with unit roundoff u satisfies
 *     |fl(s) - s| <= gamma_K * sum_i |a_i b_i|,   gamma_K = K u / (1 - K u).
 * The order is free, so cuBLASLt's blocking and split-K and the CPU's loops
 * are all covered; the CPU and the GPU each make such an error, so
 *     |cuda - cpu| <= 2 gamma_K sum_i |a_i b_i|.
 * dw += dout^T @ inp adds N products to the old dw (beta = 1): K = N + 1, the
 * old value one of the terms; dbias += colsum(dout) likewise. The magnitudes
 * are themselves summed in fp32, a sum of non-negative terms that is off by
 * at most a factor (1 + gamma_K), hence the 1 / (1 - gamma_K). */
static double gamma_k(int64_t K) {
  const double u = ldexp(1.0, -24); /* fp32: 24 significant bits */
  return (double)K * u / (1 - (double)K * u);
}
static double sum_bound_scale(int64_t K) { return 2 * gamma_k(K) / (1 - gamma_k(K)); }

/* The magnitudes of the weight-side sums of matmul_backward (dout[N, OC],
 * inp[N, C], the old dw0[OC, C] and db0[OC]), from the CPU op on absolute
 * values: mag_w = |dw0| + |dout|^T @ |inp|, mag_b = |db0| + colsum|dout|.
 * Caller frees both. */
static void weight_grad_magnitudes(const float *dout, const float *inp, const float *dw0,
                                   const float *db0, int N, int C, int OC, float **mag_w,
                                   float **mag_b) {
  const int64_t NO = (int64_t)N * OC, NC = (int64_t)N * C, OCC = (int64_t)OC * C;
  float *ad = malloc(NO * 4), *ai = malloc(NC * 4), *zw = calloc((size_t)OCC, 4);
  float *dinp = malloc(NC * 4);
  *mag_w = malloc(OCC * 4), *mag_b = malloc((size_t)OC * 4);
  for (int64_t i = 0; i < NO; i++) ad[i] = fabsf(dout[i]);
  for (int64_t i = 0; i < NC; i++) ai[i] = fabsf(inp[i]);
  for (int64_t i = 0; i < OCC; i++) (*mag_w)[i] = dw0 ? fabsf(dw0[i]) : 0.0f;
  for (int i = 0; i < OC; i++) (*mag_b)[i] = db0 ? fabsf(db0[i]) : 0.0f;
  CPU->matmul_backward(dinp, *mag_w, *mag_b, ad, ai, zw, N, C, OC);
  free(ad), free(ai), free(zw), free(dinp);
}

/* ---- matmul. bias: 0 none, 1 with bias. misalign: every device pointer sits
 * one element past an aligned address (views into the flat parameter vector
 * can be anywhere), which cuBLASLt must be told about; storage-dtype
 * pointers are then only 2-byte aligned in bf16/fp16. */

static void test_matmul(int N, int C, int OC, int bias, int misalign, float wscale,
                        double atol, double rtol) {
  printf("matmul N=%d C=%d OC=%d%s%s\n", N, C, OC, bias ? " bias" : " no-bias",
         misalign ? " (pointers one element past alignment)" : "");
  const int64_t NC = (int64_t)N * C, NO = (int64_t)N * OC, OCC = (int64_t)OC * C;
  const int off = misalign ? 1 : 0;
  float *x = randn_st(NC, 1), *w = randn_st(OCC, wscale), *bv = randn_st(OC, 1);
  float *out = malloc(NO * 4);
  CPU->matmul_forward(out, x, w, bias ? bv : NULL, N, C, OC);
  void *D_x = dev_st(NULL, NC + 1), *D_w = dev_st(NULL, OCC + 1), *D_b = dev_st(NULL, OC + 1);
  void *D_out = dev_st(NULL, NO + 1);
  void *d_x = at(D_x, off), *d_w = at(D_w, off), *d_b = at(D_b, off), *d_out = at(D_out, off);
  upload_st(d_x, x, NC), upload_st(d_w, w, OCC), upload_st(d_b, bv, OC);
  float *g[2][3];
  for (int k = 0; k < 2; k++) {
    GPU->matmul_forward(d_out, d_x, d_w, bias ? d_b : NULL, N, C, OC);
    g[k][0] = back_st(d_out, NO);
  }
  if (bias) expect_close_sum("matmul_forward out", g[0][0], out, NO, atol, rtol, bv, OC);
  else expect_close_st("matmul_forward out", g[0][0], out, NO, atol, rtol);
  expect_identical("matmul_forward out", g[0][0], g[1][0], NO * 4);
  free(g[0][0]), free(g[1][0]);

  float *dout = randn_st(NO, 1), *dinp0 = randn_st(NC, 1), *dw0 = randn(OCC, 1), *db0 = randn(OC, 1);
  float *dinp = copy_of(dinp0, NC), *dw = copy_of(dw0, OCC), *db = copy_of(db0, OC);
  CPU->matmul_backward(dinp, dw, bias ? db : NULL, dout, x, w, N, C, OC);
  void *D_dout = dev_st(NULL, NO + 1), *D_dinp = dev_st(NULL, NC + 1);
  float *D_dw = dev(NULL, OCC + 1), *D_db = dev(NULL, OC + 1);
  void *d_dout = at(D_dout, off), *d_dinp = at(D_dinp, off);
  float *d_dw = D_dw + off, *d_db = D_db + off;
  upload_st(d_dout, dout, NO);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dinp, dinp0, NC), upload(d_dw, dw0, OCC), upload(d_db, db0, OC);
    GPU->matmul_backward(d_dinp, d_dw, bias ? d_db : NULL, d_dout, d_x, d_w, N, C, OC);
    g[k][0] = back_st(d_dinp, NC), g[k][1] = back(d_dw, OCC), g[k][2] = back(d_db, OC);
  }
  expect_close_st("matmul_backward dinp (=)", g[0][0], dinp, NC, atol, rtol);
  /* fp32 output of a tensor-core GEMM: see the header; the sums' bound
   * grows with K = N + 1 (gamma_k) */
  const double dw_extra = DT == ST_FP32 ? 0 : ldexp(maxabs(dw, OCC), -17);
  float *mag_w, *mag_b;
  weight_grad_magnitudes(dout, x, dw0, db0, N, C, OC, &mag_w, &mag_b);
  const double ks = sum_bound_scale((int64_t)N + 1);
  expect_close_terms("matmul_backward dw (+=, fp32)", g[0][1], dw, OCC, dw_extra, 0, mag_w, OCC,
                     ks);
  if (bias)
    expect_close_terms("matmul_backward dbias (+=, fp32)", g[0][2], db, OC, 0, 0, mag_b, OC, ks);
  else expect_true("matmul_backward dbias NULL: untouched", memcmp(g[0][2], db0, OC * 4) == 0);
  free(mag_w), free(mag_b);
  expect_identical("matmul_backward dinp", g[0][0], g[1][0], NC * 4);
  expect_identical("matmul_backward dw", g[0][1], g[1][1], OCC * 4);
  if (bias) expect_identical("matmul_backward dbias", g[0][2], g[1][2], OC * 4);
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 3; j++) free(g[k][j]);
  GPU->free(D_x), GPU->free(D_w), GPU->free(D_b), GPU->free(D_out), GPU->free(D_dout);
  GPU->free(D_dinp), GPU->free(D_dw), GPU->free(D_db);
  free(x), free(w), free(bv), free(out), free(dout), free(dinp0), free(dw0), free(db0);
  free(dinp), free(dw), free(db);
}

/* ---- a projection into the residual stream, out = res + x w^T (+ b),
 * against the CPU's matmul then residual add. CUDA adds res and the bias in
 * cuBLASLt's epilogue and rounds once, so the bound is expect_close_sum's
 * with the added term t = res + bias of each element. */
static void test_matmul_residual(int N, int C, int OC, int bias) {
  printf("matmul+residual N=%d C=%d OC=%d bias=%d\n", N, C, OC, bias);
  const int64_t NC = (int64_t)N * C, NO = (int64_t)N * OC, OCC = (int64_t)OC * C;
  float *x = randn_st(NC, 1), *w = randn_st(OCC, 0.05f), *bv = randn_st(OC, 1);
  float *res = randn_st(NO, 1), *out = malloc(NO * 4), *terms = malloc(NO * 4);
  CPU->matmul_residual_forward(out, x, w, bias ? bv : NULL, res, N, C, OC);
  for (int64_t i = 0; i < NO; i++) terms[i] = fabsf(res[i]) + (bias ? fabsf(bv[i % OC]) : 0.0f);
  void *d_x = dev_st(x, NC), *d_w = dev_st(w, OCC), *d_b = dev_st(bv, OC);
  void *d_res = dev_st(res, NO), *d_out = dev_st(NULL, NO);
  float *g[2];
  for (int k = 0; k < 2; k++) {
    GPU->matmul_residual_forward(d_out, d_x, d_w, bias ? d_b : NULL, d_res, N, C, OC);
    g[k] = back_st(d_out, NO);
  }
  expect_close_sum("matmul_residual_forward out", g[0], out, NO, 1e-4, 1e-4, terms, NO);
  expect_identical("matmul_residual_forward", g[0], g[1], NO * 4);
  float *res_after = back_st(d_res, NO);
  expect_true("matmul_residual_forward: res unchanged", memcmp(res_after, res, NO * 4) == 0);
  GPU->free(d_x), GPU->free(d_w), GPU->free(d_b), GPU->free(d_res), GPU->free(d_out);
  free(x), free(w), free(bv), free(res), free(out), free(terms), free(g[0]), free(g[1]);
  free(res_after);
}

/* ---- the MLP's fused GEMM + GELU pair against the CPU's composition
 * (matmul then GELU). The bf16/fp16 tables fuse GELU into cuBLASLt's
 * epilogue: pre (the GELU input) is the GEMM result rounded once, like a
 * plain matmul_forward, and out = gelu of the unrounded value, so out is
 * held to the GELU's own bound (|gelu'| <= 1.13) on top of pre's. */
static void test_matmul_gelu(int N, int C, int OC) {
  printf("matmul+gelu N=%d C=%d OC=%d\n", N, C, OC);
  const int64_t NC = (int64_t)N * C, NO = (int64_t)N * OC, OCC = (int64_t)OC * C;
  float *x = randn_st(NC, 1), *w = randn_st(OCC, 0.05f), *bv = randn_st(OC, 1);
  float *pre = malloc(NO * 4), *out = malloc(NO * 4);
  CPU->matmul_gelu_forward(out, pre, x, w, bv, N, C, OC);
  void *d_x = dev_st(x, NC), *d_w = dev_st(w, OCC), *d_b = dev_st(bv, OC);
  void *d_pre = dev_st(NULL, NO), *d_out = dev_st(NULL, NO);
  float *g[2][2];
  for (int k = 0; k < 2; k++) {
    GPU->matmul_gelu_forward(d_out, d_pre, d_x, d_w, d_b, N, C, OC);
    g[k][0] = back_st(d_pre, NO), g[k][1] = back_st(d_out, NO);
  }
  expect_close_sum("matmul_gelu_forward pre", g[0][0], pre, NO, 1e-4, 1e-4, bv, OC);
  expect_close_sum("matmul_gelu_forward out", g[0][1], out, NO, 2e-4 + 1.2 * U * maxabs(pre, NO),
                   1e-4, bv, OC);
  expect_identical("matmul_gelu_forward", g[0][1], g[1][1], NO * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  /* backward of the next layer (in = OC features, the GELU output), whose
   * dinp goes through gelu'(pre) */
  const int OC2 = C; /* project back to C */
  float *w2 = randn_st((int64_t)OC2 * OC, 0.05f), *dout = randn_st((int64_t)N * OC2, 1);
  float *dinp = malloc(NO * 4), *dw = calloc((size_t)OC2 * OC, 4), *db = calloc(OC2, 4);
  /* backward's inputs live in the storage dtype: round the CPU's copies */
  round_st(out, NO), round_st(pre, NO);
  CPU->matmul_backward_gelu(dinp, dw, db, dout, out, w2, pre, N, OC, OC2);
  void *d_w2 = dev_st(w2, (int64_t)OC2 * OC), *d_dout = dev_st(dout, (int64_t)N * OC2);
  void *d_dinp = dev_st(NULL, NO);
  float *d_dw = dev(NULL, (int64_t)OC2 * OC), *d_db = dev(NULL, OC2);
  upload_st(d_out, out, NO), upload_st(d_pre, pre, NO);
  GPU->matmul_backward_gelu(d_dinp, d_dw, d_db, d_dout, d_out, d_w2, d_pre, N, OC, OC2);
  float *gd = back_st(d_dinp, NO), *gw = back(d_dw, (int64_t)OC2 * OC), *gb = back(d_db, OC2);
  /* dinp = (dout @ w2) * gelu'(pre): the product is rounded at most once
   * before the factor (<= 1.13) is applied, then once more when stored */
  float *prod = malloc(NO * 4), *dw_unused = calloc((size_t)OC2 * OC, 4);
  CPU->matmul_backward(prod, dw_unused, NULL, dout, out, w2, N, OC, OC2);
  free(dw_unused);
  expect_close_terms("matmul_backward_gelu dinp (=)", gd, dinp, NO, 1e-4 * (1 + U) + UA,
                     1e-4 + U, prod, NO, DT == ST_FP32 ? 0 : 1.2 * U);
  /* dw and dbias: sums of K = N + 1 terms (dw, db start at 0), held to the
   * bound that grows with K (gamma_k), plus the tensor-core extra */
  const double dw_extra = DT == ST_FP32 ? 0 : ldexp(maxabs(dw, (int64_t)OC2 * OC), -17);
  float *mag_w, *mag_b;
  weight_grad_magnitudes(dout, out, NULL, NULL, N, OC, OC2, &mag_w, &mag_b);
  const double ks = sum_bound_scale((int64_t)N + 1);
  expect_close_terms("matmul_backward_gelu dw (+=, fp32)", gw, dw, (int64_t)OC2 * OC, dw_extra, 0,
                     mag_w, (int64_t)OC2 * OC, ks);
  expect_close_terms("matmul_backward_gelu dbias (+=, fp32)", gb, db, OC2, 0, 0, mag_b, OC2, ks);
  free(mag_w), free(mag_b);
  free(gd), free(gw), free(gb), free(prod), free(dinp), free(dw), free(db), free(w2), free(dout);
  free(x), free(w), free(bv), free(pre), free(out);
  GPU->free(d_x), GPU->free(d_w), GPU->free(d_b), GPU->free(d_pre), GPU->free(d_out);
  GPU->free(d_w2), GPU->free(d_dout), GPU->free(d_dinp), GPU->free(d_dw), GPU->free(d_db);
}

/* ---- attention */

static void test_attention(int B, int T, int C, int NH) {
  printf("attention B=%d T=%d C=%d NH=%d (hs=%d)\n", B, T, C, NH, C / NH);
  /* each backend keeps its own state (the CPU the softmax [B,NH,T,T], CUDA
   * per-row statistics); only out and dqkv are compared */
  const int64_t BTC = (int64_t)B * T * C, BT3C = 3 * BTC;
  const int64_t ATT = CPU->attention_state_floats(B, T, NH);
  const int64_t GATT = GPU->attention_state_floats(B, T, NH);
  float *qkv = randn_st(BT3C, 1);
  float *out = malloc(BTC * 4), *att = malloc(ATT * 4);
  CPU->attention_forward(out, att, qkv, B, T, C, NH, NH);
  void *d_qkv = dev_st(qkv, BT3C), *d_out = dev_st(NULL, BTC);
  float *d_att = dev(NULL, GATT);
  float *g[2][2];
  for (int k = 0; k < 2; k++) {
    GPU->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, NH);
    g[k][0] = back_st(d_out, BTC), g[k][1] = back(d_att, GATT);
  }
  /* The tensor-core kernels (bf16/fp16) round P to the dtype before P V, as
   * FlashAttention-2 does: out moves by up to u sum_j P_j |v_j| <= u max|v|. */
  const double p_round = DT == ST_FP32 ? 0 : U * maxabs(qkv, BT3C);
  expect_close_st("attention_forward out", g[0][0], out, BTC, 1e-5 + p_round, 1e-4);
  expect_identical("attention_forward out", g[0][0], g[1][0], BTC * 4);
  expect_identical("attention_forward state", g[0][1], g[1][1], GATT * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  float *dout = randn_st(BTC, 1), *dqkv0 = randn_st(BT3C, 1), *dqkv = copy_of(dqkv0, BT3C);
  float *datt = malloc(ATT * 4);
  CPU->attention_backward(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NH);
  /* the CUDA backward uses the output and state of the CUDA forward, left in
   * d_out and d_att */
  void *d_dout = dev_st(dout, BTC), *d_dqkv = dev_st(NULL, BT3C);
  float *d_datt = dev(NULL, GATT);
  float *junk = randn(GATT, 1); /* datt is scratch: start it dirty */
  upload(d_datt, junk, GATT);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dqkv, dqkv0, BT3C);
    GPU->attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_out, d_att, B, T, C, NH, NH);
    g[k][0] = back_st(d_dqkv, BT3C);
  }
  /* D from the rounded output: see the header */
  const double d_extra = 4 * U * maxabs_diff(dqkv, dqkv0, BT3C);
  expect_close_st("attention_backward dqkv (=)", g[0][0], dqkv, BT3C, 1e-5 + d_extra, 1e-4);
  expect_identical("attention_backward dqkv", g[0][0], g[1][0], BT3C * 4);
  free(g[0][0]), free(g[1][0]);
  GPU->free(d_qkv), GPU->free(d_out), GPU->free(d_att), GPU->free(d_dout), GPU->free(d_dqkv);
  GPU->free(d_datt);
  free(qkv), free(out), free(att), free(dout), free(dqkv0), free(dqkv), free(datt), free(junk);
}

/* ---- gelu, residual, accumulate_f32 */

static void test_elementwise(int64_t n) {
  printf("gelu, residual, accumulate_f32 n=%lld\n", (long long)n);
  float *x = randn_st(n, 3), *y = randn_st(n, 1), *out = malloc(n * 4);
  CPU->gelu_forward(out, x, n);
  void *d_x = dev_st(x, n), *d_y = dev_st(y, n), *d_out = dev_st(NULL, n);
  float *g[2];
  for (int k = 0; k < 2; k++) {
    GPU->gelu_forward(d_out, d_x, n);
    g[k] = back_st(d_out, n);
  }
  expect_close_st("gelu_forward out", g[0], out, n, 2e-6, 1e-5);
  expect_identical("gelu_forward out", g[0], g[1], n * 4);
  free(g[0]), free(g[1]);

  float *dout = randn_st(n, 1), *dinp0 = randn_st(n, 1), *dinp = copy_of(dinp0, n);
  CPU->gelu_backward(dinp, x, dout, n);
  void *d_dout = dev_st(dout, n), *d_dinp = dev_st(NULL, n);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dinp, dinp0, n);
    GPU->gelu_backward(d_dinp, d_x, d_dout, n);
    g[k] = back_st(d_dinp, n);
  }
  expect_close_st("gelu_backward dinp (=)", g[0], dinp, n, 2e-6, 1e-5);
  expect_identical("gelu_backward dinp", g[0], g[1], n * 4);
  free(g[0]), free(g[1]);

  CPU->residual_forward(out, x, y, n);
  for (int k = 0; k < 2; k++) {
    GPU->residual_forward(d_out, d_x, d_y, n);
    g[k] = back_st(d_out, n);
  }
  expect_exact_st("residual_forward out", g[0], out, n);
  expect_identical("residual_forward out", g[0], g[1], n * 4);
  free(g[0]), free(g[1]);
  /* pointers one element past alignment: the kernels' unvectorised path */
  GPU->residual_forward(at(d_out, 1), at(d_x, 1), at(d_y, 1), n - 1);
  g[0] = back_st(d_out, n);
  expect_exact_st("residual_forward out (unaligned)", g[0] + 1, out + 1, n - 1);
  free(g[0]);

  /* accumulate_f32: fp32 whatever the dtype, the CPU's single add */
  float *a = randn(n, 1), *s = randn(n, 1), *acc = copy_of(a, n);
  CPU->accumulate_f32(acc, s, n);
  float *d_a = dev(NULL, n), *d_s = dev(s, n);
  for (int k = 0; k < 2; k++) {
    upload(d_a, a, n);
    GPU->accumulate_f32(d_a, d_s, n);
    g[k] = back(d_a, n);
  }
  expect_close("accumulate_f32 dst (+=)", g[0], acc, n, 0, 0);
  expect_identical("accumulate_f32 dst", g[0], g[1], n * 4);
  free(g[0]), free(g[1]);
  upload(d_a, a, n);
  GPU->accumulate_f32(d_a + 1, d_s + 1, n - 1);
  g[0] = back(d_a, n);
  expect_close("accumulate_f32 dst (unaligned)", g[0] + 1, acc + 1, n - 1, 0, 0);
  free(g[0]);
  GPU->free(d_x), GPU->free(d_y), GPU->free(d_out), GPU->free(d_dout), GPU->free(d_dinp);
  GPU->free(d_a), GPU->free(d_s);
  free(x), free(y), free(out), free(dout), free(dinp0), free(dinp), free(a), free(s), free(acc);
}

/* ---- softmax + cross-entropy: separate buffers, in place, and loss only */

static void test_crossentropy(int N, int V, int Vp) {
  printf("softmax_crossentropy N=%d V=%d Vp=%d\n", N, V, Vp);
  const int64_t NV = (int64_t)N * Vp;
  float *logits = randn_st(NV, 3);
  for (int n = 0; n < N; n++) /* padding that would win the softmax if it took part */
    for (int v = V; v < Vp; v++) logits[(int64_t)n * Vp + v] = 50.0f;
  int *tgt = rand_ints(N, V);
  const float dloss = 1.0f / N;
  float *loss = malloc(N * 4), *dl = randn(NV, 1);
  CPU->softmax_crossentropy(loss, dl, logits, tgt, dloss, N, V, Vp);
  int *d_tgt = dev_bytes(tgt, (size_t)N * sizeof(int));
  void *d_logits = dev_st(logits, NV), *d_dl = dev_st(NULL, NV);
  float *d_loss = dev(NULL, N);
  float *junk = randn(NV, 1);
  float *g[2][2];
  for (int k = 0; k < 2; k++) {
    upload_st(d_dl, junk, NV);
    GPU->softmax_crossentropy(d_loss, d_dl, d_logits, d_tgt, dloss, N, V, Vp);
    g[k][0] = back(d_loss, N), g[k][1] = back_st(d_dl, NV);
  }
  expect_close("softmax_crossentropy loss (fp32)", g[0][0], loss, N, 1e-5, 1e-5);
  expect_close_st("softmax_crossentropy dlogits (pad = 0)", g[0][1], dl, NV, 1e-7, 1e-4);
  expect_identical("softmax_crossentropy loss", g[0][0], g[1][0], N * 4);
  expect_identical("softmax_crossentropy dlogits", g[0][1], g[1][1], NV * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  /* in place: logits and dlogits are one buffer, as in rank/model/model.c */
  float *inplace = copy_of(logits, NV);
  CPU->softmax_crossentropy(loss, inplace, inplace, tgt, dloss, N, V, Vp);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dl, logits, NV);
    GPU->softmax_crossentropy(d_loss, d_dl, d_dl, d_tgt, dloss, N, V, Vp);
    g[k][0] = back(d_loss, N), g[k][1] = back_st(d_dl, NV);
  }
  expect_close("softmax_crossentropy in place: loss", g[0][0], loss, N, 1e-5, 1e-5);
  expect_close_st("softmax_crossentropy in place: dlogits", g[0][1], inplace, NV, 1e-7, 1e-4);
  expect_identical("softmax_crossentropy in place", g[0][1], g[1][1], NV * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  /* loss only (dlogits NULL): logits untouched */
  GPU->softmax_crossentropy(d_loss, NULL, d_logits, d_tgt, dloss, N, V, Vp);
  g[0][0] = back(d_loss, N), g[0][1] = back_st(d_logits, NV);
  expect_close("softmax_crossentropy loss only", g[0][0], loss, N, 1e-5, 1e-5);
  expect_true("softmax_crossentropy loss only: logits kept", memcmp(g[0][1], logits, NV * 4) == 0);
  free(g[0][0]), free(g[0][1]);
  GPU->free(d_tgt), GPU->free(d_logits), GPU->free(d_loss), GPU->free(d_dl);
  free(logits), free(tgt), free(loss), free(dl), free(junk), free(inplace);
}

/* Every op test on the table of the current dtype. */
static void test_ops(int big) {
  printf("== %s ==\n", GPU->name);
  expect_true("table dtype", GPU->dtype == DT && strstr(GPU->name, st_dtype_name(DT)) != NULL);
  test_encoder(3, 13, 72, 200);
  test_encoder(4, 300, 37, 7); /* many repeats of each token, > 256 positions */
  test_encoder(8, 1024, 64, 3); /* runs of ~2,700 positions: the sort path's long walks */
  test_encoder(2, 100, 64, 12); /* runs of ~17: both sides of ENC_LONG_RUN (16) */
  if (big) test_encoder(2, 256, 768, 50257); /* GPT-2 width and vocabulary */
  test_layernorm(37, 72);
  test_layernorm(300, 200); /* several row chunks in the dw/db partials */
  test_layernorm(37, 75);   /* C not a multiple of 8 (or 4): unvectorised rows */
  if (big) test_layernorm(512, 768);
  test_matmul(37, 72, 200, 1, 0, 1.0f, 1e-4, 1e-4);
  test_matmul(37, 72, 200, 1, 1, 1.0f, 1e-4, 1e-4);
  test_matmul(37, 288, 72, 1, 1, 1.0f, 1e-4, 1e-4);
  test_matmul(37, 72, 256, 0, 0, 1.0f, 1e-4, 1e-4); /* LM head: no bias */
  test_matmul(300, 200, 97, 1, 0, 1.0f, 1e-4, 1e-4);
  /* GPT-2 widths, weights at the init scale: sums of 768 / 512 terms */
  if (big) test_matmul(512, 768, 2304, 1, 0, 0.02f, 1e-4, 1e-4);
  test_matmul_residual(37, 72, 72, 1);
  test_matmul_residual(37, 288, 72, 1);  /* GPT-2's MLP projection shape */
  test_matmul_residual(300, 200, 96, 0); /* the Llama family: no bias */
  if (big) test_matmul_residual(512, 3072, 768, 1);
  test_matmul_gelu(64, 72, 288);
  if (big) test_matmul_gelu(512, 768, 3072); /* GPT-2's MLP */
  test_attention(2, 13, 72, 3);
  test_attention(2, 45, 72, 3); /* rows longer than a warp */
  test_attention(2, 77, 12, 3);   /* hs=4; T not a multiple of the 64-row tile */
  test_attention(1, 300, 128, 2); /* hs=64, T=300: 5 tiles, the last partial */
  test_attention(1, 130, 256, 2); /* hs=128 */
  if (big) test_attention(1, 256, 768, 12);
  test_elementwise(37 * 200 + 3);
  /* rows not in whole 16-byte packs (203), and Llama 2's and Llama 3's
   * vocabularies beside GPT-2's */
  test_crossentropy(37, 200, 256);
  test_crossentropy(5, 200, 203);
  if (big) test_crossentropy(16, 50257, 50304);
  if (big) test_crossentropy(9, 32000, 32000);
  if (big) test_crossentropy(3, 128256, 128256);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_ops", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_ops: cuda-fp32, cuda-bf16, cuda-fp16 (%d visible) against %s\n",
         st_cuda_device_count(), CPU->name);
  printf("device: %s\n", name);
  const char *small_env = getenv("ST_CUDA_OPS_SMALL");
  const int big = !(small_env && small_env[0] == '1');
  const char *only = getenv("ST_CUDA_OPS_DTYPE");
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};

  test_memory();
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    if (only && *only && strcmp(only, st_dtype_name(dts[i])) != 0) continue;
    use_dtype(dts[i]);
    test_ops(big);
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
