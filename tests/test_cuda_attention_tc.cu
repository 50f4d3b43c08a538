/* test_cuda_attention_tc.cu - the tensor-core flash attention
 * (kernels/cuda/attention_tc.cu, and on a Hopper GPU the warpgroup-MMA
 * kernels of attention_wgmma.cu it calls there: on Hopper both families are
 * checked, wgmma with its pipelined and its plain backward, the latter
 * also with 2 warpgroups a block, each named) against a float64 CPU reference,
 * run-to-run bit-identity, and timings at GPT-2 124M shapes and longer
 * sequences.
 *
 * For each shape and for bf16 and fp16: random qkv, dout and an initial dqkv
 * are drawn in fp32 and rounded to the dtype; the reference runs causal
 * attention forward and backward in float64 on the ROUNDED values (O(T^2),
 * straightforward softmax), so only the kernels' own rounding is measured:
 * P and dS rounded to the dtype before their products, fp32 accumulation,
 * out and dqkv rounded when stored, D taken from the stored (rounded) out.
 * Tolerances, |gpu - ref| <= atol + rtol |ref| element by element:
 *   out   bf16: 1e-2 + 1e-2|ref|        fp16: 2e-3 + 2e-3|ref|
 *   lse   1e-3 absolute (fp32 statistics of exact bf16/fp16 products)
 *   dqkv  (q, k and v parts separately, G = max |reference gradient| of the
 *         part, ref = the reference gradient: dqkv is overwritten)
 *         bf16: 2e-2 G + 1e-2|ref|   fp16: 2e-3 G + 2e-3|ref|, plus 1e-6
 *         absolute for parts whose exact gradient is 0 (uniform rows: fp32
 *         accumulation leaves ~6e-8 there)
 * (unit roundoff: bf16 3.9e-3, fp16 4.9e-4; the relative term covers the
 * final rounding of the gradient, the G term the rounded P and dS
 * operands and D taken from the rounded out, which cancels against dP for
 * the dominant keys of peaked rows: there bf16 errors reach ~1.5 u G. A
 * wrong index or a lost tile gives errors of order G.)
 * dqkv starts nonzero (0.5 N(0,1)) so a kernel that adds to it instead of
 * overwriting it fails; 64 guard bytes
 * after out, lse and dqkv must stay untouched; forward and backward run
 * twice from the same state and must give bit-identical bytes.
 *
 * Timings: B x T of 32 x 1024, 4 x 4096 and 1 x 8192 at C=768 NH=12, and
 * 2 x 4096 at hs = 128 (C=2048 NH=16), each family, cudaEvents, FLOPs
 * 4*B*NH*T*T*hs/2 for forward (causal) and 2.5x that for backward. No
 * timing assertions.
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_wgmma.h"

#define CK(call)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "FATAL: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
              cudaGetErrorString(e_));                                                   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define GUARD 64 /* bytes after each output buffer that nothing may write */

static int g_checks, g_failures;

/* ---- random numbers (splitmix64, Box-Muller) */
static uint64_t g_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform01(void) { return ((next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float normal(void) {
  return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}

/* ---- storage conversions on the host (round to nearest even, as the device) */
static float round_to(st_dtype dt, float x) {
  return dt == ST_BF16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
}
static void to_storage(st_dtype dt, uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (dt == ST_BF16) {
      const __nv_bfloat16_raw r = __float2bfloat16_rn(src[i]);
      dst[i] = r.x;
    } else {
      const __half_raw r = __float2half_rn(src[i]);
      dst[i] = r.x;
    }
  }
}
static void from_storage(st_dtype dt, float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (dt == ST_BF16) {
      __nv_bfloat16_raw r;
      r.x = src[i];
      dst[i] = __bfloat162float(__nv_bfloat16(r));
    } else {
      __half_raw r;
      r.x = src[i];
      dst[i] = __half2float(__half(r));
    }
  }
}

/* n random values scale*N(0,1), rounded to dt (kept as fp32). */
static float *rand_rounded(st_dtype dt, size_t n, float scale) {
  float *x = (float *)malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = round_to(dt, scale * normal());
  return x;
}

/* ---- float64 reference: causal attention forward and backward. dqkv
 * receives the gradient (+=, from zero), out and lse are written. */
static void reference(const float *qkv, const float *dout, int B, int T, int C, int NH,
                      double *out, double *lse, double *dqkv) {
  const int hs = C / NH, C3 = 3 * C;
  const double scale = 1.0 / sqrt((double)hs);
  double *q = (double *)malloc((size_t)T * hs * sizeof(double));
  double *k = (double *)malloc((size_t)T * hs * sizeof(double));
  double *v = (double *)malloc((size_t)T * hs * sizeof(double));
  double *dO = (double *)malloc((size_t)T * hs * sizeof(double));
  double *dk = (double *)malloc((size_t)T * hs * sizeof(double));
  double *dv = (double *)malloc((size_t)T * hs * sizeof(double));
  double *s = (double *)malloc((size_t)T * sizeof(double));
  double *dp = (double *)malloc((size_t)T * sizeof(double));
  double *acc = (double *)malloc((size_t)hs * sizeof(double));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) {
          const float *row = qkv + ((size_t)b * T + t) * C3 + h * hs + d;
          q[(size_t)t * hs + d] = row[0];
          k[(size_t)t * hs + d] = row[C];
          v[(size_t)t * hs + d] = row[2 * C];
          dO[(size_t)t * hs + d] = dout[((size_t)b * T + t) * C + h * hs + d];
          dk[(size_t)t * hs + d] = 0.0, dv[(size_t)t * hs + d] = 0.0;
        }
      for (int i = 0; i < T; i++) {
        const double *qi = q + (size_t)i * hs, *doi = dO + (size_t)i * hs;
        double m = -INFINITY;
        for (int j = 0; j <= i; j++) {
          double dot = 0.0;
          for (int d = 0; d < hs; d++) dot += qi[d] * k[(size_t)j * hs + d];
          s[j] = dot * scale;
          if (s[j] > m) m = s[j];
        }
        double l = 0.0;
        for (int j = 0; j <= i; j++) l += exp(s[j] - m);
        const double L = m + log(l);
        lse[((size_t)b * NH + h) * T + i] = L;
        for (int d = 0; d < hs; d++) acc[d] = 0.0;
        double D = 0.0;
        for (int j = 0; j <= i; j++) {
          s[j] = exp(s[j] - L); /* P */
          double dot = 0.0;
          for (int d = 0; d < hs; d++) {
            acc[d] += s[j] * v[(size_t)j * hs + d];
            dot += doi[d] * v[(size_t)j * hs + d];
          }
          dp[j] = dot;
          D += s[j] * dot;
        }
        for (int d = 0; d < hs; d++) out[((size_t)b * T + i) * C + h * hs + d] = acc[d];
        for (int d = 0; d < hs; d++) acc[d] = 0.0;
        for (int j = 0; j <= i; j++) {
          const double ds = s[j] * (dp[j] - D) * scale;
          for (int d = 0; d < hs; d++) {
            acc[d] += ds * k[(size_t)j * hs + d];
            dk[(size_t)j * hs + d] += ds * qi[d];
            dv[(size_t)j * hs + d] += s[j] * doi[d];
          }
        }
        for (int d = 0; d < hs; d++) dqkv[((size_t)b * T + i) * C3 + h * hs + d] += acc[d];
      }
      for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) {
          double *row = dqkv + ((size_t)b * T + t) * C3 + h * hs + d;
          row[C] += dk[(size_t)t * hs + d];
          row[2 * C] += dv[(size_t)t * hs + d];
        }
    }
  free(q), free(k), free(v), free(dO), free(dk), free(dv), free(s), free(dp), free(acc);
}

/* ---- checks */

/* Elements i = r*stride + off + c for r < rows, c < cols; bound atol + rtol|ref|. */
static void expect_close(const char *what, const float *gpu, const double *ref, int64_t rows,
                         int64_t stride, int64_t off, int64_t cols, double atol, double rtol) {
  double worst = 0.0, worst_ratio = 0.0;
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * stride + off + c;
      const double d = fabs((double)gpu[i] - ref[i]), bound = atol + rtol * fabs(ref[i]);
      if (!(d <= bound)) { /* NaN fails too */
        if (first < 0) first = i;
        bad++;
      }
      if (!(d <= worst)) worst = d;
      if (!(d / bound <= worst_ratio)) worst_ratio = d / bound;
    }
  g_checks++;
  printf("    %-10s max|d| %.3e  max |d|/tol %.3f  (tol %.1e + %.0e|ref|)  %s\n", what, worst,
         worst_ratio, atol, rtol, bad ? "FAIL" : "ok");
  if (bad) {
    g_failures++;
    printf("      %lld elements out of tolerance; first [%lld]: gpu %.7g ref %.7g\n", (long long)bad,
           (long long)first, gpu[first], ref[first]);
  }
}

static void expect_true(const char *what, int ok) {
  g_checks++;
  printf("    %-46s %s\n", what, ok ? "ok" : "FAIL");
  if (!ok) g_failures++;
}

static int guard_intact(const void *dev_base, size_t bytes) {
  unsigned char g[GUARD];
  CK(cudaMemcpy(g, (const unsigned char *)dev_base + bytes, GUARD, cudaMemcpyDeviceToHost));
  for (int i = 0; i < GUARD; i++)
    if (g[i] != 0xA5) return 0;
  return 1;
}

static void *dev_alloc_guarded(size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes + GUARD));
  CK(cudaMemset(p, 0xA5, bytes + GUARD));
  return p;
}

/* ---- one shape, one dtype */

/* Kernel configurations: 0-5 the wgmma family (Hopper; one forward) with
 * the pipelined backward (head size 64; the plain one at 128), its dQ on a
 * second stream beside dK/dV (the default), the same with the blocks head
 * after head (groups of one head) rather than the default's order (every
 * head in one group at B x NH <= 32, which the small cases here are), the
 * same with 4 tile buffers rather than 3 and groups of 5 heads (the last
 * group 5 to 9), dQ after dK/dV on one stream, the plain backward,
 * and the plain backward with 2 warpgroups a block; 6 the mma.sync family
 * (everywhere). Configurations 1 and 2 must give configuration 0's bits
 * exactly (block order and buffering move no arithmetic). */
#define N_CONF 7
static int g_conf = N_CONF - 1;

static void use_conf(int k) {
  g_conf = k;
  cuda_attention_tc_use_wgmma(k < 6);
  cuda_attention_wgmma_set_grid(k == 1 ? 1 : k == 2 ? 5 : -2);
  cuda_attention_wgmma_set_stages(k == 2 ? 4 : 3);
  cuda_attention_wgmma_set_groups(k == 5 ? 2 : 1);
  cuda_attention_wgmma_set_pipeline(k <= 3);
  cuda_attention_wgmma_set_streams(k != 3);
}

/* the kernels the calls run now, for the printed lines */
static const char *family(int B, int C, int NH, st_dtype dt) {
  static const char *names[6] = {"wgmma, pipelined backward, dQ beside dK/dV",
                                 "wgmma, pipelined backward, dQ beside dK/dV, head after head",
                                 "wgmma, pipelined backward, dQ beside dK/dV, 4 tile buffers, groups of 5 heads",
                                 "wgmma, pipelined backward, one stream",
                                 "wgmma, plain backward",
                                 "wgmma, plain backward, 2 warpgroups a block"};
  if (!cuda_attention_tc_runs_wgmma(B, C, NH, dt)) return "mma.sync";
  return names[g_conf];
}

/* the first configuration this GPU runs: 0 on Hopper, else mma.sync's */
static int g_first_conf = N_CONF - 1;

static void test_case(st_dtype dt, int B, int T, int C, int NH, float qk_scale) {
  const int hs = C / NH;
  printf("  %s B=%d T=%d C=%d NH=%d hs=%d%s\n", st_dtype_name(dt), B, T, C, NH, hs,
         qk_scale != 1.0f ? " (q, k scaled up: peaked softmax)" : "");
  const size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T;
  float *qkv = rand_rounded(dt, n3, 1.0f);
  for (size_t i = 0; i < n3; i++)
    if ((i % (3 * (size_t)C)) < 2 * (size_t)C) qkv[i] = round_to(dt, qkv[i] * qk_scale);
  float *dout = rand_rounded(dt, n1, 1.0f);
  float *dinit = rand_rounded(dt, n3, 0.5f);

  double *rout = (double *)malloc(n1 * sizeof(double));
  double *rlse = (double *)malloc(nl * sizeof(double));
  double *rgrad = (double *)calloc(n3, sizeof(double));
  reference(qkv, dout, B, T, C, NH, rout, rlse, rgrad);

  /* configuration 0's results, for configurations 1 and 2 to match bit for bit */
  uint16_t *out0 = NULL, *g0 = NULL;
  float *lse0 = NULL;
  /* each kernel configuration this GPU runs, against one reference */
  for (int conf = g_first_conf; conf < N_CONF; conf++) {
    use_conf(conf);
    printf("    [%s]\n", family(B, C, NH, dt));
    uint16_t *h16 = (uint16_t *)malloc(n3 * sizeof(uint16_t));
    void *d_qkv = NULL, *d_dout = NULL;
    float *d_scratch = NULL;
    CK(cudaMalloc(&d_qkv, n3 * 2));
    CK(cudaMalloc(&d_dout, n1 * 2));
    CK(cudaMalloc((void **)&d_scratch, nl * sizeof(float)));
    void *d_out = dev_alloc_guarded(n1 * 2), *d_dqkv = dev_alloc_guarded(n3 * 2);
    float *d_lse = (float *)dev_alloc_guarded(nl * sizeof(float));
    to_storage(dt, h16, qkv, n3);
    CK(cudaMemcpy(d_qkv, h16, n3 * 2, cudaMemcpyHostToDevice));
    to_storage(dt, h16, dout, n1);
    CK(cudaMemcpy(d_dout, h16, n1 * 2, cudaMemcpyHostToDevice));

    /* forward, twice */
    uint16_t *out16[2];
    float *lse32[2];
    for (int r = 0; r < 2; r++) {
      cuda_attention_tc_forward(d_out, d_lse, d_qkv, B, T, C, NH, NH, dt);
      CK(cudaDeviceSynchronize());
      out16[r] = (uint16_t *)malloc(n1 * 2);
      lse32[r] = (float *)malloc(nl * sizeof(float));
      CK(cudaMemcpy(out16[r], d_out, n1 * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(lse32[r], d_lse, nl * sizeof(float), cudaMemcpyDeviceToHost));
    }
    float *outf = (float *)malloc(n1 * sizeof(float));
    from_storage(dt, outf, out16[0], n1);
    const int bf = dt == ST_BF16;
    expect_close("out", outf, rout, (int64_t)n1, 1, 0, 1, bf ? 1e-2 : 2e-3, bf ? 1e-2 : 2e-3);
    expect_close("lse", lse32[0], rlse, (int64_t)nl, 1, 0, 1, 1e-3, 0.0);
    expect_true("forward run twice: bit-identical out and lse",
                !memcmp(out16[0], out16[1], n1 * 2) &&
                    !memcmp(lse32[0], lse32[1], nl * sizeof(float)));
    expect_true("forward wrote nothing past out and lse",
                guard_intact(d_out, n1 * 2) && guard_intact(d_lse, nl * sizeof(float)));

    /* backward, twice from the same initial dqkv */
    uint16_t *g16[2];
    uint16_t *init16 = (uint16_t *)malloc(n3 * 2);
    to_storage(dt, init16, dinit, n3);
    for (int r = 0; r < 2; r++) {
      CK(cudaMemcpy(d_dqkv, init16, n3 * 2, cudaMemcpyHostToDevice));
      CK(cudaMemset(d_scratch, 0xFF, nl * sizeof(float))); /* NaNs: D must be recomputed */
      cuda_attention_tc_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NH, dt);
      CK(cudaDeviceSynchronize());
      g16[r] = (uint16_t *)malloc(n3 * 2);
      CK(cudaMemcpy(g16[r], d_dqkv, n3 * 2, cudaMemcpyDeviceToHost));
    }
    float *gf = (float *)malloc(n3 * sizeof(float));
    from_storage(dt, gf, g16[0], n3);
    double *rtot = (double *)malloc(n3 * sizeof(double));
    static const char *names[3] = {"dq (=)", "dk (=)", "dv (=)"};
    for (int part = 0; part < 3; part++) {
      double G = 0.0;
      for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < C; c++) {
          const size_t i = r * 3 * C + (size_t)part * C + c;
          if (fabs(rgrad[i]) > G) G = fabs(rgrad[i]);
        }
      for (size_t i = 0; i < n3; i++) rtot[i] = rgrad[i];
      expect_close(names[part], gf, rtot, (int64_t)B * T, 3 * (int64_t)C, (int64_t)part * C, C,
                   (bf ? 2e-2 : 2e-3) * G + 1e-6, bf ? 1e-2 : 2e-3);
    }
    expect_true("backward run twice: bit-identical dqkv", !memcmp(g16[0], g16[1], n3 * 2));
    expect_true("backward wrote nothing past dqkv", guard_intact(d_dqkv, n3 * 2));
    if ((conf == 1 || conf == 2) && out0)
      expect_true(conf == 1 ? "head after head: the default's out, lse and dqkv bit for bit"
                            : "4 tile buffers, groups of 5 heads: the default's out, lse and dqkv bit for bit",
                  !memcmp(out16[0], out0, n1 * 2) && !memcmp(lse32[0], lse0, nl * sizeof(float)) &&
                      !memcmp(g16[0], g0, n3 * 2));
    if (conf == 0) {
      out0 = out16[0], lse0 = lse32[0], g0 = g16[0];
      out16[0] = NULL, lse32[0] = NULL, g16[0] = NULL; /* kept; freed after the loop */
    }

    void *bufs[] = {d_qkv, d_dout, d_scratch, d_out, d_dqkv, d_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CK(cudaFree(bufs[i]));
    for (int r = 0; r < 2; r++) free(out16[r]), free(lse32[r]), free(g16[r]);
    free(h16), free(outf), free(init16), free(gf), free(rtot);
  }
  free(out0), free(lse0), free(g0);
  free(qkv), free(dout), free(dinit), free(rout), free(rlse), free(rgrad);
}

/* ---- timings at GPT-2 124M shapes */

static void bench(st_dtype dt, int B, int T, int C, int NH) {
  const int hs = C / NH, reps = 10;
  const size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T;
  const double flop = 4.0 * B * NH * (double)T * T * hs / 2.0;
  uint16_t *h = (uint16_t *)malloc(n3 * 2);
  float *x = rand_rounded(dt, 1 << 20, 1.0f);
  uint16_t *x16 = (uint16_t *)malloc((1 << 20) * 2);
  to_storage(dt, x16, x, 1 << 20);
  for (size_t i = 0; i < n3; i++) h[i] = x16[(i * 2654435761u) & ((1 << 20) - 1)];
  void *d_qkv, *d_out, *d_dout, *d_dqkv;
  float *d_lse, *d_scratch;
  CK(cudaMalloc(&d_qkv, n3 * 2));
  CK(cudaMalloc(&d_dqkv, n3 * 2));
  CK(cudaMalloc(&d_out, n1 * 2));
  CK(cudaMalloc(&d_dout, n1 * 2));
  CK(cudaMalloc((void **)&d_lse, nl * sizeof(float)));
  CK(cudaMalloc((void **)&d_scratch, nl * sizeof(float)));
  CK(cudaMemcpy(d_qkv, h, n3 * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_dout, h + 7, n1 * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(d_dqkv, 0, n3 * 2));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float ms = 0.0f;

  cuda_attention_tc_forward(d_out, d_lse, d_qkv, B, T, C, NH, NH, dt); /* warm-up */
  CK(cudaEventRecord(e0));
  for (int r = 0; r < reps; r++) cuda_attention_tc_forward(d_out, d_lse, d_qkv, B, T, C, NH, NH, dt);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= reps;
  printf("  [%s] %s forward   B=%d T=%d C=%d NH=%d: %8.3f ms  %6.1f TFLOP/s\n",
         family(B, C, NH, dt), st_dtype_name(dt), B, T, C, NH, ms, flop / ms * 1e-9);

  cuda_attention_tc_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NH, dt);
  CK(cudaEventRecord(e0));
  for (int r = 0; r < reps; r++)
    cuda_attention_tc_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NH, dt);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= reps;
  printf("  [%s] %s backward  B=%d T=%d C=%d NH=%d: %8.3f ms  %6.1f TFLOP/s\n",
         family(B, C, NH, dt), st_dtype_name(dt), B, T, C, NH, ms, 2.5 * flop / ms * 1e-9);

  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  void *bufs[] = {d_qkv, d_dqkv, d_out, d_dout, d_lse, d_scratch};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CK(cudaFree(bufs[i]));
  free(h), free(x), free(x16);
}

int main(int argc, char **argv) {
  /* --checks-only: no timings (for compute-sanitizer); --timings-only: no
   * checks, and only the default configuration's timings (which follow
   * ST_ATTENTION_GRID: a benchmark's A/B of block orders) */
  const int timings = !(argc > 1 && strcmp(argv[1], "--checks-only") == 0);
  const int checks = !(argc > 1 && strcmp(argv[1], "--timings-only") == 0);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("test_cuda_attention_tc: device %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  printf("supported predicate\n");
  expect_true("hs 32, 64, 128 in bf16 and fp16",
              cuda_attention_tc_supported(96, 3, ST_BF16) && cuda_attention_tc_supported(768, 12, ST_BF16) &&
                  cuda_attention_tc_supported(256, 2, ST_BF16) && cuda_attention_tc_supported(768, 12, ST_FP16));
  expect_true("not fp32, hs 48, or C % NH != 0",
              !cuda_attention_tc_supported(768, 12, ST_FP32) && !cuda_attention_tc_supported(144, 3, ST_BF16) &&
                  !cuda_attention_tc_supported(100, 3, ST_BF16));

  struct {
    int B, T, C, NH;
    float qk;
  } cases[] = {
      {2, 13, 128, 2, 1.0f},   /* shorter than any tile */
      {1, 1, 128, 2, 1.0f},    /* a single row */
      {1, 64, 128, 2, 1.0f},   /* exactly one backward tile, half a forward tile */
      {1, 65, 128, 2, 1.0f},   {1, 127, 128, 2, 1.0f}, {1, 129, 128, 2, 1.0f},
      {1, 200, 128, 2, 1.0f},  /* several tiles, the last partial */
      {3, 100, 192, 3, 1.0f},  /* NH = 3, B = 3 */
      {1, 257, 192, 3, 3.0f},  /* scores with std ~9: online rescaling does real work */
      {2, 77, 96, 3, 1.0f},    /* hs = 32 */
      {1, 300, 256, 2, 1.0f},  /* hs = 128 */
      {2, 130, 256, 2, 2.0f},  /* hs = 128, peaked */
      {1, 333, 512, 8, 2.0f},  /* hs = 64, 8 heads, peaked, the last tile partial */
      {4, 200, 512, 8, 1.0f},  /* 32 heads: configuration 2's groups of 5, the last of 7 */
      {2, 1024, 768, 12, 1.0f} /* GPT-2 124M head layout */
  };
  const st_dtype dts[2] = {ST_BF16, ST_FP16};
  /* Hopper runs both families: wgmma (the default there) and mma.sync (what
   * ST_ATTENTION_WGMMA=0 and every other GPU run) */
  const int hopper = cuda_attention_tc_runs_wgmma(1, 768, 12, ST_BF16);
  if (!hopper)
    printf("wgmma kernels: not run (they need compute capability 9.0 and ST_ATTENTION_WGMMA "
           "not 0; this device is sm_%d%d)\n", prop.major, prop.minor);
  g_first_conf = hopper ? 0 : N_CONF - 1;
  for (size_t c = 0; checks && c < sizeof cases / sizeof *cases; c++)
    for (int d = 0; d < 2; d++) {
      if (!cuda_attention_tc_supported(cases[c].C, cases[c].NH, dts[d])) continue;
      test_case(dts[d], cases[c].B, cases[c].T, cases[c].C, cases[c].NH, cases[c].qk);
    }

  if (timings) printf("timings (no assertions)\n");
  struct {
    int B, T, C, NH;
  } shapes[] = {{32, 1024, 768, 12}, {16, 2048, 768, 12}, {4, 4096, 768, 12}, {1, 8192, 768, 12},
                {4, 8192, 768, 12},  {2, 4096, 2048, 16}};
  for (size_t c = 0; timings && c < sizeof shapes / sizeof *shapes; c++)
    for (int conf = g_first_conf; conf < (checks ? N_CONF : g_first_conf + 1); conf++) {
      use_conf(conf);
      bench(ST_BF16, shapes[c].B, shapes[c].T, shapes[c].C, shapes[c].NH);
      if (c == 0) bench(ST_FP16, shapes[c].B, shapes[c].T, shapes[c].C, shapes[c].NH);
    }

  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
