/* test_cuda_attention_cudnn.c - cuDNN's fused flash attention
 * (kernels/cuda/attention_cudnn.c, reached through the CUDA op table after
 * st_cuda_attention_select) against a float64 CPU reference and against our
 * tensor-core flash kernels, run-to-run bit-identity of its backward, and
 * timings at GPT-2 124M shapes and at head size 128 (harness: cuda_check.c).
 *
 * Shapes: NH=12, hs=64 (C=768), (B,T) = (2,64), (3,256), (4,1024), bf16 and
 * fp16. qkv and dout are random N(0,1) values representable in the dtype;
 * the reference runs causal attention forward and backward in float64 on
 * those values (D from the reference out). Tolerances (those of
 * test_cuda_attention_tc.cu: both implementations round P and dS to the
 * dtype before their products and accumulate in fp32; u = unit roundoff),
 * |gpu - ref| <= atol + rtol |ref| element by element:
 *   out    bf16: 1e-2 + 1e-2|ref|          fp16: 2e-3 + 2e-3|ref|
 *   stats  1e-3 absolute (natural-log log-sum-exp of the scaled scores)
 *   dq, dk, dv (each part; G = max |reference gradient| of the part)
 *          bf16: 2e-2 G + 1e-2|ref|        fp16: 2e-3 G + 2e-3|ref|
 * cuDNN against our kernels (same inputs, same dtype): twice those bounds,
 * as each sits within one bound of the reference. dqkv is filled with
 * garbage first: the backward must overwrite it. When the chosen backward
 * engine is deterministic, a second backward must give identical bytes, and
 * so must the backward run one sequence per call (st_cuda_attention_group_cap
 * 1, what --attention auto may choose under a budget), whose workspace must
 * be smaller when there is more than one sequence.
 *
 * Timings (printed, never asserted): B=32 T=1024 NH=12 hs=64, mean of 10
 * calls after 2 warm-ups, forward and backward, cuDNN and ours.
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"
#include "util/error.h"

/* ---- float64 reference: causal softmax attention per (b, h) */

typedef struct {
  double *out, *lse, *dqkv; /* [B,T,C], [B,NH,T], [B,T,3C] */
} reference;

static void ref_attention(const float *qkv, const float *dout, int B, int T, int C, int NH,
                          reference *r) {
  const int hs = C / NH, C3 = 3 * C;
  const double scale = 1.0 / sqrt((double)hs);
  r->out = calloc((size_t)B * T * C, sizeof(double));
  r->lse = calloc((size_t)B * NH * T, sizeof(double));
  r->dqkv = calloc((size_t)B * T * C3, sizeof(double));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      double *p = malloc((size_t)T * T * sizeof(double)); /* P, then dS */
      const float *base = qkv + (size_t)b * T * C3;
      for (int i = 0; i < T; i++) {
        const float *q = base + (size_t)i * C3 + h * hs;
        double m = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const float *k = base + (size_t)j * C3 + C + h * hs;
          double s = 0;
          for (int d = 0; d < hs; d++) s += (double)q[d] * k[d];
          p[(size_t)i * T + j] = s * scale;
          if (s * scale > m) m = s * scale;
        }
        double z = 0;
        for (int j = 0; j <= i; j++) z += exp(p[(size_t)i * T + j] - m);
        r->lse[((size_t)b * NH + h) * T + i] = m + log(z);
        double *o = r->out + ((size_t)b * T + i) * C + h * hs;
        for (int j = 0; j <= i; j++) {
          const double pij = exp(p[(size_t)i * T + j] - m) / z;
          p[(size_t)i * T + j] = pij;
          const float *v = base + (size_t)j * C3 + 2 * C + h * hs;
          for (int d = 0; d < hs; d++) o[d] += pij * v[d];
        }
      }
      double *dq = r->dqkv + (size_t)b * T * C3 + h * hs;
      for (int i = 0; i < T; i++) {
        const float *go = dout + ((size_t)b * T + i) * C + h * hs;
        const double *o = r->out + ((size_t)b * T + i) * C + h * hs;
        double D = 0;
        for (int d = 0; d < hs; d++) D += go[d] * o[d];
        for (int j = 0; j <= i; j++) {
          const float *v = base + (size_t)j * C3 + 2 * C + h * hs;
          double dp = 0;
          for (int d = 0; d < hs; d++) dp += (double)go[d] * v[d];
          const double pij = p[(size_t)i * T + j];
          double *dv = dq + (size_t)j * C3 + 2 * C;
          for (int d = 0; d < hs; d++) dv[d] += pij * go[d];
          p[(size_t)i * T + j] = pij * (dp - D) * scale; /* dS */
        }
      }
      for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
          const double ds = p[(size_t)i * T + j];
          const float *q = base + (size_t)i * C3 + h * hs;
          const float *k = base + (size_t)j * C3 + C + h * hs;
          double *gq = dq + (size_t)i * C3, *gk = dq + (size_t)j * C3 + C;
          for (int d = 0; d < hs; d++) gq[d] += ds * k[d], gk[d] += ds * q[d];
        }
      free(p);
    }
}

static float *to_f32(const double *x, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
  return y;
}

/* Part k (q, k, v) of a [B*T, 3C] gradient as a packed [B*T, C] copy. */
static float *part(const float *g, int64_t rows, int C, int k) {
  float *y = malloc((size_t)rows * C * sizeof *y);
  for (int64_t r = 0; r < rows; r++) memcpy(y + r * C, g + r * 3 * C + k * C, (size_t)C * 4);
  return y;
}

/* The gradient parts against a reference, with the G-relative bound. */
static void check_grads(const char *label, const float *got, const float *want, int64_t rows,
                        int C, double gtol, double rtol) {
  static const char *const names[3] = {"dq", "dk", "dv"};
  for (int k = 0; k < 3; k++) {
    float *a = part(got, rows, C, k), *b = part(want, rows, C, k);
    char what[96];
    snprintf(what, sizeof what, "%s %s", label, names[k]);
    const double G = maxabs(b, rows * C);
    expect_close(what, a, b, rows * C, gtol * G + 1e-6, rtol);
    free(a), free(b);
  }
}

/* Run attention forward and backward through the GPU table with impl
 * selected; host copies of out, stats and dqkv (and a second backward's
 * dqkv in dqkv2 when not NULL). -1 when the selection fails. */
static size_t g_last_ws; /* the last selection's workspace (bytes) */

static int run_gpu(st_attention_impl impl, const float *qkv, const float *dout, int B, int T,
                   int C, int NH, float **out, float **stats, float **dqkv, float **dqkv2,
                   int *deterministic) {
  st_attention_choice ch;
  if (st_cuda_attention_select(impl, DT, B, T, C, NH, &ch)) {
    printf("  select %s failed: %s  FAIL\n",
           impl == ST_ATTENTION_CUDNN   ? "cudnn"
           : impl == ST_ATTENTION_MIXED ? "mixed"
                                        : "flash",
           st_error_msg());
    g_checks++, g_failures++;
    return -1;
  }
  if (deterministic) *deterministic = ch.deterministic;
  g_last_ws = ch.workspace_bytes;
  if (GPU->reserve(0, 0)) {
    printf("  reserve of the attention workspace (%zu bytes) failed  FAIL\n", ch.workspace_bytes);
    g_checks++, g_failures++;
    return -1;
  }
  const int64_t N = (int64_t)B * T, NS = (int64_t)B * NH * T;
  void *d_qkv = dev_st(qkv, N * 3 * C), *d_dout = dev_st(dout, N * C);
  void *d_out = dev_bytes(NULL, (size_t)(N * C) * ES);
  float *d_att = dev(NULL, GPU->attention_state_floats(B, T, NH));
  float *d_datt = dev(NULL, GPU->attention_state_floats(B, T, NH));
  float *junk = randn(N * 3 * C, 3.0f);
  void *d_dqkv = dev_st(junk, N * 3 * C);
  GPU->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, NH);
  GPU->attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_out, d_att, B, T, C, NH, NH);
  *out = back_st(d_out, N * C);
  *stats = back(d_att, NS);
  *dqkv = back_st(d_dqkv, N * 3 * C);
  if (dqkv2) {
    upload_st(d_dqkv, junk, N * 3 * C);
    GPU->attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_out, d_att, B, T, C, NH, NH);
    *dqkv2 = back_st(d_dqkv, N * 3 * C);
  }
  free(junk);
  GPU->free(d_qkv), GPU->free(d_dout), GPU->free(d_out), GPU->free(d_att), GPU->free(d_datt);
  GPU->free(d_dqkv);
  return 0;
}

static void test_shape(int B, int T) {
  const int NH = 12, C = 768;
  const int64_t N = (int64_t)B * T;
  printf("attention %s: B=%d T=%d NH=%d hs=%d\n", st_dtype_name(DT), B, T, NH, C / NH);
  float *qkv = randn_st(N * 3 * C, 1.0f), *dout = randn_st(N * C, 1.0f);
  reference r;
  ref_attention(qkv, dout, B, T, C, NH, &r);
  float *rout = to_f32(r.out, N * C), *rlse = to_f32(r.lse, (int64_t)B * NH * T);
  float *rdqkv = to_f32(r.dqkv, N * 3 * C);
  const int bf = DT == ST_BF16;
  const double otol = bf ? 1e-2 : 2e-3, gtol = bf ? 2e-2 : 2e-3, grtol = bf ? 1e-2 : 2e-3;
  float *co, *cs, *cg, *cg2, *fo, *fs, *fg;
  int det = 0;
  if (run_gpu(ST_ATTENTION_CUDNN, qkv, dout, B, T, C, NH, &co, &cs, &cg, &cg2, &det) == 0) {
    expect_close("cudnn out vs float64", co, rout, N * C, otol, otol);
    expect_close("cudnn stats (lse) vs float64", cs, rlse, (int64_t)B * NH * T, 1e-3, 0);
    check_grads("cudnn vs float64", cg, rdqkv, N, C, gtol, grtol);
    if (det) expect_identical("cudnn backward dqkv", cg, cg2, (size_t)N * 3 * C * sizeof(float));
    else printf("  cudnn backward engine is NONDETERMINISTIC: bit-identity not checked\n");
    const size_t ws_whole = g_last_ws;
    float *so, *ss, *sg;
    st_cuda_attention_group_cap(1);
    const int rs = run_gpu(ST_ATTENTION_CUDNN, qkv, dout, B, T, C, NH, &so, &ss, &sg, NULL, NULL);
    st_cuda_attention_group_cap(0);
    if (rs == 0) {
      printf("  workspace: %zu bytes for %d sequence%s a backward call, %zu for one\n", ws_whole,
             B, B > 1 ? "s" : "", g_last_ws);
      if (B > 1) {
        g_checks++;
        if (g_last_ws >= ws_whole) {
          printf("  one sequence a call does not shrink the workspace  FAIL\n");
          g_failures++;
        }
      }
      expect_identical("cudnn out, backward one sequence a call", co, so,
                       (size_t)N * C * sizeof(float));
      if (det)
        expect_identical("cudnn backward dqkv, one sequence a call vs all", cg, sg,
                         (size_t)N * 3 * C * sizeof(float));
      else
        check_grads("cudnn one sequence a call vs all", sg, cg, N, C, 2 * gtol, 2 * grtol);
      free(so), free(ss), free(sg);
    }
    if (run_gpu(ST_ATTENTION_FLASH, qkv, dout, B, T, C, NH, &fo, &fs, &fg, NULL, NULL) == 0) {
      expect_close("cudnn out vs ours", co, fo, N * C, 2 * otol, 2 * otol);
      expect_close("cudnn stats vs ours", cs, fs, (int64_t)B * NH * T, 2e-3, 0);
      check_grads("cudnn vs ours", cg, fg, N, C, 2 * gtol, 2 * grtol);
      /* mixed: cuDNN's forward feeding our backward through its stats */
      float *mo, *ms, *mg, *mg2;
      int mdet = 0;
      if (run_gpu(ST_ATTENTION_MIXED, qkv, dout, B, T, C, NH, &mo, &ms, &mg, &mg2, &mdet) == 0) {
        printf("  mixed: cuDNN's forward workspace %zu bytes\n", g_last_ws);
        expect_close("mixed out vs float64", mo, rout, N * C, otol, otol);
        expect_close("mixed stats (lse) vs float64", ms, rlse, (int64_t)B * NH * T, 1e-3, 0);
        expect_close("mixed out vs cudnn", mo, co, N * C, otol, otol);
        check_grads("mixed vs float64", mg, rdqkv, N, C, gtol, grtol);
        check_grads("mixed vs ours", mg, fg, N, C, 2 * gtol, 2 * grtol);
        g_checks++;
        if (!mdet) {
          printf("  mixed: the selection does not call itself deterministic  FAIL\n");
          g_failures++;
        }
        expect_identical("mixed backward dqkv, run twice", mg, mg2,
                         (size_t)N * 3 * C * sizeof(float));
        free(mo), free(ms), free(mg), free(mg2);
      }
      free(fo), free(fs), free(fg);
    }
    free(co), free(cs), free(cg), free(cg2);
  }
  free(qkv), free(dout), free(rout), free(rlse), free(rdqkv);
  free(r.out), free(r.lse), free(r.dqkv);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Mean milliseconds of forward and backward over 10 calls, B sequences of
 * T tokens, NH heads of C / NH. */
static void timing(st_attention_impl impl, const char *name, int B, int T, int C, int NH) {
  const int reps = 10;
  const int64_t N = (int64_t)B * T;
  st_attention_choice ch;
  if (st_cuda_attention_select(impl, DT, B, T, C, NH, &ch) || GPU->reserve(0, 0)) {
    printf("  %-6s %s: not timed (%s)\n", name, st_dtype_name(DT), st_error_msg());
    return;
  }
  void *qkv = dev_bytes(NULL, (size_t)N * 3 * C * ES), *dqkv = dev_bytes(NULL, (size_t)N * 3 * C * ES);
  void *out = dev_bytes(NULL, (size_t)N * C * ES), *dout = dev_bytes(NULL, (size_t)N * C * ES);
  float *h = randn_st(N * 3 * C, 1.0f);
  upload_st(qkv, h, N * 3 * C);
  upload_st(dout, h, N * C);
  free(h);
  float *att = dev(NULL, GPU->attention_state_floats(B, T, NH));
  float *datt = dev(NULL, GPU->attention_state_floats(B, T, NH));
  double tf = 0, tb = 0;
  for (int i = 0; i < reps + 2; i++) {
    GPU->synchronize();
    double t0 = now_s();
    GPU->attention_forward(out, att, qkv, B, T, C, NH, NH);
    GPU->synchronize();
    double t1 = now_s();
    GPU->attention_backward(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NH);
    GPU->synchronize();
    double t2 = now_s();
    if (i >= 2) tf += t1 - t0, tb += t2 - t1;
  }
  /* causal: half of the 4*B*NH*T*T*hs forward FLOPs; backward 2.5x forward */
  const double ff = 4.0 * B * NH * (double)T * T * (C / NH) / 2;
  printf("  %-6s %s B=%d T=%d hs=%d: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms "
         "(%.0f TFLOP/s)\n", name, st_dtype_name(DT), B, T, C / NH, tf / reps * 1e3, ff / (tf / reps) / 1e12, tb / reps * 1e3,
         2.5 * ff / (tb / reps) / 1e12);
  GPU->free(qkv), GPU->free(dqkv), GPU->free(out), GPU->free(dout), GPU->free(att);
  GPU->free(datt);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_attention_cudnn", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_attention_cudnn: cuDNN fused attention on %s\n", name);
  const st_dtype dts[2] = {ST_BF16, ST_FP16};
  const int shapes[3][2] = {{2, 64}, {3, 256}, {4, 1024}};
  for (int d = 0; d < 2; d++) {
    use_dtype(dts[d]);
    for (int s = 0; s < 3; s++) test_shape(shapes[s][0], shapes[s][1]);
  }
  printf("timings (printed, not checked; mixed is cuDNN's forward, ours' backward):\n");
  /* GPT-2 124M's heads at three lengths; head size 128 (Llama 3 8B's) */
  const int tshapes[4][4] = {{32, 1024, 768, 12}, {4, 4096, 768, 12}, {1, 8192, 768, 12},
                             {2, 4096, 2048, 16}};
  for (int d = 0; d < 2; d++) {
    use_dtype(dts[d]);
    for (int t = 0; t < 4; t++) {
      const int *sh = tshapes[t];
      timing(ST_ATTENTION_CUDNN, "cudnn", sh[0], sh[1], sh[2], sh[3]);
      timing(ST_ATTENTION_MIXED, "mixed", sh[0], sh[1], sh[2], sh[3]);
      timing(ST_ATTENTION_FLASH, "ours", sh[0], sh[1], sh[2], sh[3]);
    }
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
