/* profile.c - the timed op table (see profile.h). */
#define _POSIX_C_SOURCE 200809L
#include "kernels/profile.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROWS 96

typedef struct {
  char label[80];
  double seconds;
  long calls;
} row;

static const st_ops *g_inner;
static st_ops g_table;
static row g_rows[MAX_ROWS];
static int g_nrows;
static double g_t0;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void start(void) {
  g_inner->synchronize();
  g_t0 = now_s();
}

static void stop(const char *label) {
  g_inner->synchronize();
  double dt = now_s() - g_t0;
  for (int i = 0; i < g_nrows; i++)
    if (strcmp(g_rows[i].label, label) == 0) {
      g_rows[i].seconds += dt;
      g_rows[i].calls++;
      return;
    }
  if (g_nrows == MAX_ROWS) return;
  snprintf(g_rows[g_nrows].label, sizeof g_rows[g_nrows].label, "%s", label);
  g_rows[g_nrows].seconds = dt;
  g_rows[g_nrows].calls = 1;
  g_nrows++;
}

#define TIMED(label, call) \
  do {                     \
    start();               \
    call;                  \
    stop(label);           \
  } while (0)

static void p_zero(void *p, size_t bytes) { TIMED("zero (memset)", g_inner->zero(p, bytes)); }
static void p_encoder_forward(void *out, const int *inp, const void *wte, const void *wpe, int B,
                              int T, int C) {
  TIMED("encoder_forward", g_inner->encoder_forward(out, inp, wte, wpe, B, T, C));
}
static void p_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *inp, int B,
                               int T, int C, void *scratch, size_t scratch_bytes) {
  TIMED("encoder_backward",
        g_inner->encoder_backward(dwte, dwpe, dout, inp, B, T, C, scratch, scratch_bytes));
}
static void p_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                const void *w, const void *b, int N, int C) {
  TIMED("layernorm_forward", g_inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C));
}
static void p_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                                 const void *inp, const void *w, const float *mean,
                                 const float *rstd, int N, int C) {
  TIMED("layernorm_backward",
        g_inner->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}
static void p_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N,
                              int C, float eps) {
  TIMED("rmsnorm_forward", g_inner->rmsnorm_forward(out, rstd, inp, w, N, C, eps));
}
static void p_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
                               const void *w, const float *rstd, int N, int C) {
  TIMED("rmsnorm_backward", g_inner->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C));
}
static void p_rope_forward(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                           int HD) {
  TIMED("rope_forward", g_inner->rope_forward(qkv, cs, B, T, pos0, NH, NKV, HD));
}
static void p_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD) {
  TIMED("rope_backward", g_inner->rope_backward(dqkv, cs, B, T, NH, NKV, HD));
}
static void p_matmul_forward(void *out, const void *inp, const void *w, const void *bias, int N,
                             int C, int OC) {
  char l[80];
  snprintf(l, sizeof l, "matmul_forward %dx%dx%d", N, C, OC);
  TIMED(l, g_inner->matmul_forward(out, inp, w, bias, N, C, OC));
}
static void p_matmul_residual_forward(void *out, const void *inp, const void *w, const void *bias,
                                      const void *res, int N, int C, int OC) {
  char l[80];
  snprintf(l, sizeof l, "matmul_residual_forward %dx%dx%d", N, C, OC);
  TIMED(l, g_inner->matmul_residual_forward(out, inp, w, bias, res, N, C, OC));
}
static void p_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
                              const void *inp, const void *w, int N, int C, int OC) {
  char l[80];
  snprintf(l, sizeof l, "matmul_backward %dx%dx%d", N, C, OC);
  TIMED(l, g_inner->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC));
}
static void p_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w,
                                  const void *bias, int N, int C, int OC) {
  char l[80];
  snprintf(l, sizeof l, "matmul_gelu_forward %dx%dx%d", N, C, OC);
  TIMED(l, g_inner->matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC));
}
static void p_matmul_backward_gelu(void *dinp, float *dw, float *dbias, const void *dout,
                                   const void *inp, const void *w, const void *pre, int N, int C,
                                   int OC) {
  char l[80];
  snprintf(l, sizeof l, "matmul_backward_gelu %dx%dx%d", N, C, OC);
  TIMED(l, g_inner->matmul_backward_gelu(dinp, dw, dbias, dout, inp, w, pre, N, C, OC));
}
static void p_attention_forward(void *out, float *att, const void *qkv, int B, int T, int C,
                                int NH, int NKV) {
  TIMED("attention_forward", g_inner->attention_forward(out, att, qkv, B, T, C, NH, NKV));
}
static void p_attention_backward(void *dqkv, float *datt, const void *dout, const void *qkv,
                                 const void *out, const float *att, int B, int T, int C, int NH,
                                 int NKV) {
  TIMED("attention_backward",
        g_inner->attention_backward(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NKV));
}
static void p_gelu_forward(void *out, const void *inp, int64_t n) {
  TIMED("gelu_forward", g_inner->gelu_forward(out, inp, n));
}
static void p_gelu_backward(void *dinp, const void *inp, const void *dout, int64_t n) {
  TIMED("gelu_backward", g_inner->gelu_backward(dinp, inp, dout, n));
}
static void p_swiglu_forward(void *out, const void *inp, int N, int F) {
  TIMED("swiglu_forward", g_inner->swiglu_forward(out, inp, N, F));
}
static void p_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F) {
  TIMED("swiglu_backward", g_inner->swiglu_backward(dinp, dout, inp, N, F));
}
static void p_residual_forward(void *out, const void *a, const void *b, int64_t n) {
  TIMED("residual_forward", g_inner->residual_forward(out, a, b, n));
}
static void p_accumulate_f32(float *dst, const float *src, int64_t n) {
  TIMED("accumulate_f32", g_inner->accumulate_f32(dst, src, n));
}
static void p_softmax_crossentropy(float *loss, void *dlogits, const void *logits,
                                   const int *targets, float dloss, int N, int V, int Vp) {
  TIMED("softmax_crossentropy",
        g_inner->softmax_crossentropy(loss, dlogits, logits, targets, dloss, N, V, Vp));
}
static void p_adamw_update(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                           float lr, float b1, float b2, float eps, float wd, float grad_scale,
                           int64_t t, void *work) {
  TIMED("adamw_update", g_inner->adamw_update(p, g, gdt, m, v, n, lr, b1, b2, eps, wd,
                                              grad_scale, t, work));
}
static void p_adamw_update_segments(float *p, const void *g, st_dtype gdt, float *m, float *v,
                                    int64_t n, const int64_t *seg_end, const float *seg_wd,
                                    int nseg, float lr, float b1, float b2, float eps,
                                    float grad_scale, int64_t t, void *work) {
  TIMED("adamw_update_segments",
        g_inner->adamw_update_segments(p, g, gdt, m, v, n, seg_end, seg_wd, nseg, lr, b1, b2,
                                       eps, grad_scale, t, work));
}
static void p_adamw_update_segments_split(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                          float *v, int64_t n, const int64_t *seg_end,
                                          const float *seg_wd, int nseg, float lr, float b1,
                                          float b2, float eps, float grad_scale, int64_t t,
                                          uint16_t *work) {
  TIMED("adamw_update_segments_split",
        g_inner->adamw_update_segments_split(lo, g, gdt, m, v, n, seg_end, seg_wd, nseg, lr, b1,
                                             b2, eps, grad_scale, t, work));
}
static void p_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  TIMED("f32_to_bf16", g_inner->f32_to_bf16(dst, src, n));
}
static void p_lora_add_cols(void *y, const void *v, float s, int N, int OC, int c0, int n) {
  TIMED("lora_add_cols", g_inner->lora_add_cols(y, v, s, N, OC, c0, n));
}
static void p_lora_take_cols(void *d, const void *y, float s, int N, int OC, int c0, int n) {
  TIMED("lora_take_cols", g_inner->lora_take_cols(d, y, s, N, OC, c0, n));
}
static void p_dropout(void *out, const void *in, int64_t n, float p, uint64_t seed) {
  TIMED("dropout", g_inner->dropout(out, in, n, p, seed));
}
static double p_sum_squares(const void *x, st_dtype dt, int64_t n) {
  double r;
  TIMED("sum_squares", r = g_inner->sum_squares(x, dt, n));
  return r;
}

const st_ops *st_ops_profiled(const st_ops *inner) {
  g_inner = inner;
  g_table = *inner; /* memory functions, dtype, attention_state_floats, decode pass through */
  g_table.zero = p_zero;
  g_table.encoder_forward = p_encoder_forward;
  g_table.encoder_backward = p_encoder_backward;
  g_table.layernorm_forward = p_layernorm_forward;
  g_table.layernorm_backward = p_layernorm_backward;
  /* The family's ops only where the backend has them: a NULL stays NULL,
   * so a caller's check for a missing op still sees it. */
  if (inner->rmsnorm_forward) g_table.rmsnorm_forward = p_rmsnorm_forward;
  if (inner->rmsnorm_backward) g_table.rmsnorm_backward = p_rmsnorm_backward;
  if (inner->rope_forward) g_table.rope_forward = p_rope_forward;
  if (inner->rope_backward) g_table.rope_backward = p_rope_backward;
  g_table.matmul_forward = p_matmul_forward;
  g_table.matmul_residual_forward = p_matmul_residual_forward;
  g_table.matmul_backward = p_matmul_backward;
  g_table.matmul_gelu_forward = p_matmul_gelu_forward;
  g_table.matmul_backward_gelu = p_matmul_backward_gelu;
  g_table.attention_forward = p_attention_forward;
  g_table.attention_backward = p_attention_backward;
  g_table.gelu_forward = p_gelu_forward;
  g_table.gelu_backward = p_gelu_backward;
  if (inner->swiglu_forward) g_table.swiglu_forward = p_swiglu_forward;
  if (inner->swiglu_backward) g_table.swiglu_backward = p_swiglu_backward;
  g_table.residual_forward = p_residual_forward;
  g_table.accumulate_f32 = p_accumulate_f32;
  if (inner->f32_to_bf16) g_table.f32_to_bf16 = p_f32_to_bf16;
  g_table.softmax_crossentropy = p_softmax_crossentropy;
  g_table.adamw_update = p_adamw_update;
  if (inner->adamw_update_segments) g_table.adamw_update_segments = p_adamw_update_segments;
  if (inner->adamw_update_segments_split)
    g_table.adamw_update_segments_split = p_adamw_update_segments_split;
  g_table.sum_squares = p_sum_squares;
  if (inner->lora_add_cols) g_table.lora_add_cols = p_lora_add_cols;
  if (inner->lora_take_cols) g_table.lora_take_cols = p_lora_take_cols;
  if (inner->dropout) g_table.dropout = p_dropout;
  return &g_table;
}

void st_ops_profile_reset(void) { g_nrows = 0; }

static int by_time(const void *a, const void *b) {
  double x = ((const row *)a)->seconds, y = ((const row *)b)->seconds;
  return x < y ? 1 : x > y ? -1 : 0;
}

void st_ops_profile_report(FILE *f, int steps, double wall_s) {
  if (steps < 1) steps = 1;
  double total = 0;
  for (int i = 0; i < g_nrows; i++) total += g_rows[i].seconds;
  qsort(g_rows, (size_t)g_nrows, sizeof *g_rows, by_time);
  fprintf(f, "op profile (%s), per step over %d steps:\n", g_inner ? g_inner->name : "?", steps);
  fprintf(f, "  %-44s %8s %10s %7s\n", "op", "calls", "ms", "share");
  for (int i = 0; i < g_nrows; i++)
    fprintf(f, "  %-44s %8.1f %10.3f %6.1f%%\n", g_rows[i].label,
            (double)g_rows[i].calls / steps, 1e3 * g_rows[i].seconds / steps,
            total > 0 ? 100 * g_rows[i].seconds / total : 0);
  fprintf(f, "  %-44s %8s %10.3f\n", "timed ops", "", 1e3 * total / steps);
  if (wall_s > 0)
    fprintf(f, "  %-44s %8s %10.3f   (the rest: host work, copies, collectives)\n",
            "step wall time", "", 1e3 * wall_s / steps);
}
