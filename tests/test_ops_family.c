/* test_ops_family.c - the CPU ops of the Llama family (kernels/ops.h):
 * RMSNorm, RoPE, SwiGLU, grouped-query attention and its KV-cache decode,
 * and the embedding without learned positions.
 *
 *  - RMSNorm, SwiGLU, attention (NH=4 with NKV 4, 2 and 1): every input
 *    gradient against central finite differences (tests/fd_check.h);
 *    RMSNorm's forward against Hugging Face LlamaRMSNorm's formula in double;
 *  - GQA forward against multi-head attention on qkv with each kv head
 *    copied to the query heads of its group (bit for bit: the same float
 *    operations), dq likewise, dk and dv against the group's sum; the
 *    backward bit for bit at 1, 2 and 3 threads;
 *  - RoPE forward against the rotate-half formula in double with angles
 *    p * theta^(-2i/HD) at positions pos0 + t (pos0 > 0), v untouched,
 *    a pos0 call equal to the matching rows of a pos0 = 0 call; backward
 *    as the transpose: <rope(x), y> = <x, rope_backward(y)>, and its
 *    inverse: rope_backward(rope(x)) = x;
 *  - attention_decode with GQA: rows bit for bit attention_forward's,
 *    whatever the chunking; the cache holds the k and v heads;
 *  - the profiled table (kernels/profile.h) runs the family's ops with the
 *    same bits and names them in its report; an op a backend lacks stays NULL.
 */
#define _POSIX_C_SOURCE 200809L /* fmemopen */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "kernels/profile.h"
#include "tests/fd_check.h"
#include "util/rng.h"

static const st_ops *ops;

/* ---- RMSNorm ---- */
typedef struct { float *out, *rstd, *inp, *w, *R; int N, C; float eps; } rn_ctx;
static double rn_loss(void *p) {
  rn_ctx *c = p;
  ops->rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->eps);
  return dot(c->out, c->R, (int64_t)c->N * c->C);
}
static void test_rmsnorm(void **state) {
  (void)state;
  rn_ctx c = {.N = 7, .C = 40, .eps = 1e-5f};
  const int64_t n = (int64_t)c.N * c.C;
  c.inp = randn(n, 2); c.w = randn(c.C, 1); c.R = randn(n, 1);
  c.out = zeros(n); c.rstd = zeros(c.N);
  rn_loss(&c);
  /* HF LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)). */
  double maxrel = 0;
  for (int r = 0; r < c.N; r++) {
    double ss = 0;
    for (int j = 0; j < c.C; j++) ss += (double)c.inp[r * c.C + j] * c.inp[r * c.C + j];
    const double rs = 1.0 / sqrt(ss / c.C + c.eps);
    assert_true(fabs(c.rstd[r] - rs) <= 1e-6 * rs);
    for (int j = 0; j < c.C; j++) {
      const double want = c.w[j] * (c.inp[r * c.C + j] * rs);
      maxrel = fmax(maxrel, fabs(c.out[r * c.C + j] - want) / (fabs(want) + 1e-6));
    }
  }
  assert_true(maxrel < 1e-5);
  /* dinp accumulates: start from a known base and take it off after. */
  float *base = randn(n, 1), *di = malloc((size_t)n * sizeof *di), *dw = randn(c.C, 1);
  float *dw0 = malloc((size_t)c.C * sizeof *dw0);
  memcpy(di, base, (size_t)n * sizeof *di);
  memcpy(dw0, dw, (size_t)c.C * sizeof *dw0);
  ops->rmsnorm_backward(di, dw, c.R, c.inp, c.w, c.rstd, c.N, c.C);
  for (int64_t i = 0; i < n; i++) di[i] -= base[i];
  for (int j = 0; j < c.C; j++) dw[j] -= dw0[j];
  g_fd_max_err = 0;
  int bad = check("rmsnorm dinp", c.inp, di, n, rn_loss, &c, 280);
  printf("rmsnorm dinp: max |analytic - numeric| %.3g\n", g_fd_max_err);
  g_fd_max_err = 0;
  bad += check("rmsnorm dw", c.w, dw, c.C, rn_loss, &c, 40);
  printf("rmsnorm dw: max |analytic - numeric| %.3g\n", g_fd_max_err);
  assert_int_equal(bad, 0);
  free(c.inp); free(c.w); free(c.R); free(c.out); free(c.rstd);
  free(base); free(di); free(dw); free(dw0);
}

/* ---- SwiGLU ---- */
typedef struct { float *out, *inp, *R; int N, F; } sg_ctx;
static double sg_loss(void *p) {
  sg_ctx *c = p;
  ops->swiglu_forward(c->out, c->inp, c->N, c->F);
  return dot(c->out, c->R, (int64_t)c->N * c->F);
}
static void test_swiglu(void **state) {
  (void)state;
  sg_ctx c = {.N = 6, .F = 25};
  const int64_t n = (int64_t)c.N * 2 * c.F;
  c.inp = randn(n, 2); c.R = randn((int64_t)c.N * c.F, 1); c.out = zeros((int64_t)c.N * c.F);
  float *di = randn(n, 1); /* overwritten: garbage must not survive */
  ops->swiglu_backward(di, c.R, c.inp, c.N, c.F);
  g_fd_max_err = 0;
  assert_int_equal(check("swiglu dinp", c.inp, di, n, sg_loss, &c, 300), 0);
  printf("swiglu dinp: max |analytic - numeric| %.3g\n", g_fd_max_err);
  /* Known value: silu(1) * 2 = 2 / (1 + e^-1) = 1.4621172. */
  float in[2] = {1.0f, 2.0f}, y;
  ops->swiglu_forward(&y, in, 1, 1);
  assert_float_equal(y, 1.4621172f, 1e-6f);
  free(c.inp); free(c.R); free(c.out); free(di);
}

/* ---- RoPE ---- */
enum { RB = 2, RT = 5, RNH = 4, RNKV = 2, RHD = 8, RMAXT = 16 };
#define RRS ((RNH + 2 * RNKV) * RHD)
static double angle(int p, int i) { return p * pow(10000.0, -2.0 * i / RHD); }
static float *rope_table(void) {
  float *cs = malloc((size_t)RMAXT * RHD * sizeof *cs);
  for (int p = 0; p < RMAXT; p++)
    for (int i = 0; i < RHD / 2; i++) {
      cs[p * RHD + i] = (float)cos(angle(p, i));
      cs[p * RHD + RHD / 2 + i] = (float)sin(angle(p, i));
    }
  return cs;
}
static void test_rope_forward(void **state) {
  (void)state;
  const int pos0 = 7, n = RB * RT * RRS, half = RHD / 2;
  float *cs = rope_table(), *x = randn(n, 1), *y = malloc((size_t)n * sizeof *y);
  memcpy(y, x, (size_t)n * sizeof *y);
  ops->rope_forward(y, cs, RB, RT, pos0, RNH, RNKV, RHD);
  double maxerr = 0;
  for (int r = 0; r < RB * RT; r++) {
    const int p = pos0 + r % RT;
    for (int h = 0; h < RNH + 2 * RNKV; h++) {
      const float *a = x + r * RRS + h * RHD, *b = y + r * RRS + h * RHD;
      if (h >= RNH + RNKV) { /* v heads */
        assert_memory_equal(a, b, RHD * sizeof *a);
        continue;
      }
      for (int i = 0; i < half; i++) {
        const double co = cos(angle(p, i)), si = sin(angle(p, i));
        maxerr = fmax(maxerr, fabs(b[i] - (a[i] * co - a[i + half] * si)));
        maxerr = fmax(maxerr, fabs(b[i + half] - (a[i + half] * co + a[i] * si)));
      }
    }
  }
  printf("rope forward: max |kernel - formula| %.3g\n", maxerr);
  assert_true(maxerr < 1e-5);
  /* Positions pos0.. of a later call are those positions of one long call. */
  enum { LT = 7 + RT };
  float *lx = randn((int64_t)LT * RRS, 1), *sx = malloc((size_t)RT * RRS * sizeof *sx);
  memcpy(sx, lx + pos0 * RRS, (size_t)RT * RRS * sizeof *sx);
  ops->rope_forward(lx, cs, 1, LT, 0, RNH, RNKV, RHD);
  ops->rope_forward(sx, cs, 1, RT, pos0, RNH, RNKV, RHD);
  assert_memory_equal(sx, lx + pos0 * RRS, (size_t)RT * RRS * sizeof *sx);
  free(cs); free(x); free(y); free(lx); free(sx);
}
static void test_rope_backward(void **state) {
  (void)state;
  const int n = RB * RT * RRS;
  float *cs = rope_table(), *x = randn(n, 1), *y = randn(n, 1);
  float *rx = malloc((size_t)n * sizeof *rx), *by = malloc((size_t)n * sizeof *by);
  memcpy(rx, x, (size_t)n * sizeof *rx);
  memcpy(by, y, (size_t)n * sizeof *by);
  ops->rope_forward(rx, cs, RB, RT, 0, RNH, RNKV, RHD);
  ops->rope_backward(by, cs, RB, RT, RNH, RNKV, RHD);
  const double l = dot(rx, y, n), r = dot(x, by, n);
  printf("rope adjoint: <rope(x), y> %.9g  <x, rope_backward(y)> %.9g\n", l, r);
  assert_true(fabs(l - r) <= 1e-5 * (fabs(l) + 1));
  for (int row = 0; row < RB * RT; row++) /* dv untouched */
    assert_memory_equal(by + row * RRS + (RNH + RNKV) * RHD, y + row * RRS + (RNH + RNKV) * RHD,
                        RNKV * RHD * sizeof(float));
  ops->rope_backward(rx, cs, RB, RT, RNH, RNKV, RHD); /* the inverse */
  double maxerr = 0;
  for (int i = 0; i < n; i++) maxerr = fmax(maxerr, fabs(rx[i] - x[i]));
  assert_true(maxerr < 1e-5);
  free(cs); free(x); free(y); free(rx); free(by);
}

/* ---- grouped-query attention ---- */
typedef struct { float *out, *att, *qkv, *R; int B, T, C, NH, NKV; } at_ctx;
static double at_loss(void *p) {
  at_ctx *c = p;
  ops->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->NKV);
  return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}
/* qkv with each kv head copied to the query heads of its group: [N, 3C]. */
static float *expand(const float *qkv, int N, int NH, int NKV, int hs) {
  const int RS = (NH + 2 * NKV) * hs, C = NH * hs, G = NH / NKV;
  float *e = malloc((size_t)N * 3 * C * sizeof *e);
  for (int r = 0; r < N; r++) {
    const float *s = qkv + (int64_t)r * RS;
    float *d = e + (int64_t)r * 3 * C;
    memcpy(d, s, (size_t)C * sizeof *d);
    for (int h = 0; h < NH; h++) {
      memcpy(d + C + h * hs, s + C + (h / G) * hs, (size_t)hs * sizeof *d);
      memcpy(d + 2 * C + h * hs, s + C + (NKV + h / G) * hs, (size_t)hs * sizeof *d);
    }
  }
  return e;
}
static void gqa_case(int NKV) {
  at_ctx c = {.B = 2, .T = 6, .NH = 4, .NKV = NKV};
  const int hs = 4, N = c.B * c.T, RS = (c.NH + 2 * NKV) * hs, G = c.NH / NKV;
  c.C = c.NH * hs;
  const int64_t n = (int64_t)N * RS, no = (int64_t)N * c.C;
  const int64_t na = ops->attention_state_floats(c.B, c.T, c.NH);
  c.qkv = randn(n, 1); c.R = randn(no, 1); c.out = zeros(no); c.att = zeros(na);
  at_loss(&c);
  float *dqkv = randn(n, 1), *datt = zeros(na); /* dqkv overwritten */
  ops->attention_backward(dqkv, datt, c.R, c.qkv, c.out, c.att, c.B, c.T, c.C, c.NH, NKV);
  char what[48];
  snprintf(what, sizeof what, "attention NKV=%d dqkv", NKV);
  g_fd_max_err = 0;
  assert_int_equal(check(what, c.qkv, dqkv, n, at_loss, &c, (int)n), 0);
  printf("%s (all %lld elements): max |analytic - numeric| %.3g\n", what, (long long)n,
         g_fd_max_err);
  /* Against plain multi-head attention on the expanded qkv (out and att
   * again at the unperturbed qkv: check() left the last perturbation's). */
  at_loss(&c);
  float *e = expand(c.qkv, N, c.NH, NKV, hs), *eo = zeros(no), *ea = zeros(na);
  float *ed = zeros((int64_t)N * 3 * c.C), *eda = zeros(na);
  ops->attention_forward(eo, ea, e, c.B, c.T, c.C, c.NH, c.NH);
  assert_memory_equal(eo, c.out, (size_t)no * sizeof *eo);
  ops->attention_backward(ed, eda, c.R, e, eo, ea, c.B, c.T, c.C, c.NH, c.NH);
  double maxerr = 0;
  for (int r = 0; r < N; r++) {
    const float *g = dqkv + (int64_t)r * RS, *m = ed + (int64_t)r * 3 * c.C;
    assert_memory_equal(g, m, (size_t)c.C * sizeof *g); /* dq */
    for (int kv = 0; kv < NKV; kv++)
      for (int i = 0; i < hs; i++) {
        double sk = 0, sv = 0;
        for (int h = kv * G; h < (kv + 1) * G; h++) {
          sk += m[c.C + h * hs + i];
          sv += m[2 * c.C + h * hs + i];
        }
        maxerr = fmax(maxerr, fabs(g[c.C + kv * hs + i] - sk));
        maxerr = fmax(maxerr, fabs(g[c.C + (NKV + kv) * hs + i] - sv));
      }
  }
  printf("attention NKV=%d dk, dv vs the group's sum of MHA's: max diff %.3g\n", NKV, maxerr);
  assert_true(maxerr < 1e-5);
  /* The same bits at any thread count. */
  float *d1 = zeros(n);
  for (int th = 1; th <= 3; th++) {
    omp_set_num_threads(th);
    ops->attention_backward(d1, datt, c.R, c.qkv, c.out, c.att, c.B, c.T, c.C, c.NH, NKV);
    assert_memory_equal(d1, dqkv, (size_t)n * sizeof *d1);
  }
  omp_set_num_threads(2);
  free(c.qkv); free(c.R); free(c.out); free(c.att); free(dqkv); free(datt);
  free(e); free(eo); free(ea); free(ed); free(eda); free(d1);
}
static void test_attention_mha(void **state) { (void)state; gqa_case(4); }
static void test_attention_gqa(void **state) { (void)state; gqa_case(2); }
static void test_attention_mqa(void **state) { (void)state; gqa_case(1); }

/* ---- decode over a GQA cache ---- */
static void test_decode_gqa(void **state) {
  (void)state;
  const int B = 2, T = 9, NH = 4, hs = 4, C = NH * hs, maxT = 12;
  static const int plans[2][8] = {{9, 0}, {3, 1, 1, 4, 0}};
  for (int NKV = 1; NKV <= 2; NKV++) {
    const int RS = (NH + 2 * NKV) * hs, KV = NKV * hs;
    float *qkv = randn((int64_t)B * T * RS, 1), *ref = zeros((int64_t)B * T * C);
    float *att = zeros(ops->attention_state_floats(B, T, NH));
    ops->attention_forward(ref, att, qkv, B, T, C, NH, NKV);
    float *kc = zeros((int64_t)B * maxT * KV), *vc = zeros((int64_t)B * maxT * KV);
    float *out = zeros((int64_t)B * T * C), *in = zeros((int64_t)B * T * RS);
    for (int p = 0; p < 2; p++) {
      int pos = 0;
      for (int k = 0; plans[p][k]; k++) {
        const int m = plans[p][k];
        for (int b = 0; b < B; b++)
          memcpy(in + (int64_t)b * m * RS, qkv + ((int64_t)b * T + pos) * RS,
                 (size_t)m * RS * sizeof *in);
        float *o = zeros((int64_t)B * m * C);
        ops->attention_decode(o, kc, vc, in, B, m, pos, maxT, C, NH, NKV);
        for (int b = 0; b < B; b++)
          memcpy(out + ((int64_t)b * T + pos) * C, o + (int64_t)b * m * C,
                 (size_t)m * C * sizeof *o);
        free(o);
        pos += m;
      }
      assert_memory_equal(out, ref, (size_t)B * T * C * sizeof *out);
      for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
          const float *row = qkv + ((int64_t)b * T + t) * RS;
          assert_memory_equal(kc + ((int64_t)b * maxT + t) * KV, row + C, KV * sizeof(float));
          assert_memory_equal(vc + ((int64_t)b * maxT + t) * KV, row + C + KV, KV * sizeof(float));
        }
    }
    free(qkv); free(ref); free(att); free(kc); free(vc); free(out); free(in);
  }
}

/* ---- the embedding without learned positions ---- */
typedef struct { float *out, *wte, *R; int *inp; int B, T, C; } en_ctx;
static double en_loss(void *p) {
  en_ctx *c = p;
  ops->encoder_forward(c->out, c->inp, c->wte, NULL, c->B, c->T, c->C);
  return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}
static void test_encoder_no_wpe(void **state) {
  (void)state;
  en_ctx c = {.B = 2, .T = 5, .C = 20};
  const int V = 6;
  int toks[10] = {1, 3, 3, 0, 5, 3, 1, 1, 2, 4};
  c.inp = toks;
  c.wte = randn(V * c.C, 1); c.R = randn(c.B * c.T * c.C, 1); c.out = zeros(c.B * c.T * c.C);
  en_loss(&c);
  for (int r = 0; r < c.B * c.T; r++)
    assert_memory_equal(c.out + r * c.C, c.wte + toks[r] * c.C, c.C * sizeof(float));
  float *dwte = zeros(V * c.C);
  ops->encoder_backward(dwte, NULL, c.R, c.inp, c.B, c.T, c.C, NULL, 0);
  assert_int_equal(check("encoder dwte (no wpe)", c.wte, dwte, V * c.C, en_loss, &c, 120), 0);
  free(c.wte); free(c.R); free(c.out); free(dwte);
}

/* ---- the profiled table passes the family's ops through ---- */
static void test_profiled_table(void **state) {
  (void)state;
  const st_ops *p = st_ops_profiled(ops);
  st_ops_profile_reset();
  enum { N = 3, C = 8, F = 4, T = 3, NH = 2, NKV = 1, HD = 4 };
  const int RS = (NH + 2 * NKV) * HD;
  enum { M = 64 }; /* room for the largest: T * RS = 48 */
  float *x = randn(M, 1), *w = randn(C, 1), *d = randn(M, 1), *cs = randn(T * HD, 1);
  float a[M], b[M], ra[N], rb[N], dwa[C] = {0}, dwb[C] = {0};
  ops->rmsnorm_forward(a, ra, x, w, N, C, 1e-6f);
  p->rmsnorm_forward(b, rb, x, w, N, C, 1e-6f);
  assert_memory_equal(a, b, N * C * sizeof *a);
  memset(a, 0, sizeof a); memset(b, 0, sizeof b);
  ops->rmsnorm_backward(a, dwa, d, x, w, ra, N, C);
  p->rmsnorm_backward(b, dwb, d, x, w, rb, N, C);
  assert_memory_equal(a, b, N * C * sizeof *a);
  assert_memory_equal(dwa, dwb, sizeof dwa);
  memcpy(a, x, T * RS * sizeof *a); memcpy(b, x, T * RS * sizeof *b);
  ops->rope_forward(a, cs, 1, T, 0, NH, NKV, HD);
  p->rope_forward(b, cs, 1, T, 0, NH, NKV, HD);
  ops->rope_backward(a, cs, 1, T, NH, NKV, HD);
  p->rope_backward(b, cs, 1, T, NH, NKV, HD);
  assert_memory_equal(a, b, T * RS * sizeof *a);
  ops->swiglu_forward(a, x, N, F);
  p->swiglu_forward(b, x, N, F);
  assert_memory_equal(a, b, N * F * sizeof *a);
  ops->swiglu_backward(a, d, x, N, F);
  p->swiglu_backward(b, d, x, N, F);
  assert_memory_equal(a, b, N * 2 * F * sizeof *a);
  char buf[4096] = {0};
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  assert_non_null(f);
  st_ops_profile_report(f, 1, 0);
  fclose(f);
  static const char *names[] = {"rmsnorm_forward", "rmsnorm_backward", "rope_forward",
                                "rope_backward",   "swiglu_forward",   "swiglu_backward"};
  for (int i = 0; i < 6; i++) assert_non_null(strstr(buf, names[i]));
  st_ops lacking = *ops;
  lacking.rope_forward = NULL;
  lacking.swiglu_backward = NULL;
  p = st_ops_profiled(&lacking);
  assert_null(p->rope_forward);
  assert_null(p->swiglu_backward);
  assert_non_null(p->rmsnorm_forward);
  free(x); free(w); free(d); free(cs);
}

int main(void) {
  st_rng_seed(&g_rng, 14);
  ops = st_ops_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm),       cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_rope_forward),  cmocka_unit_test(test_rope_backward),
      cmocka_unit_test(test_attention_mha), cmocka_unit_test(test_attention_gqa),
      cmocka_unit_test(test_attention_mqa), cmocka_unit_test(test_decode_gqa),
      cmocka_unit_test(test_encoder_no_wpe), cmocka_unit_test(test_profiled_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
