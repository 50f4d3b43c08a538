/* bench_cuda_ops.c - each CUDA op timed at GPT-2 124M shapes (B=8, T=1024)
 * for each storage dtype: ms, and GB/s or TFLOP/s; then the Llama family's
 * ops at the llama-3.2-1b shape (B=4, T=2048, width 2048, 32 heads, 8 KV
 * heads, FFN 8192): RMSNorm, RoPE, SwiGLU and GQA attention (ours, and
 * cuDNN's for bf16/fp16). A benchmark, not a test (not in ctest);
 * ST_CUDA_OPS_DTYPE=fp32|bf16|fp16 times one dtype.
 *   build/tests/bench_cuda_ops
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
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static float g_sync;
static void sync_gpu(const float *any) { GPU->to_host(&g_sync, any, sizeof(float)); }

#define TIME(label, work, reps, call)                                                  \
  do {                                                                                 \
    call;                                                                              \
    sync_gpu(sync_ptr);                                                                \
    double t0_ = now();                                                                \
    for (int r_ = 0; r_ < (reps); r_++) call;                                          \
    sync_gpu(sync_ptr);                                                                \
    double ms_ = (now() - t0_) / (reps) * 1e3;                                         \
    printf("  %-34s %9.3f ms  %s\n", label, ms_, work_str(work, ms_));                 \
  } while (0)

static char g_work[64];
/* work > 0: bytes moved (GB/s); work < 0: -FLOPs (TFLOP/s) */
static const char *work_str(double work, double ms) {
  if (work > 0) snprintf(g_work, sizeof g_work, "%7.0f GB/s", work / ms * 1e-6);
  else snprintf(g_work, sizeof g_work, "%7.1f TFLOP/s", -work / ms * 1e-9);
  return g_work;
}

/* Storage-dtype buffers are allocated at 4 bytes per element (enough for any
 * dtype); byte counts use the dtype's size. */
static void bench(void) {
  const int B = 8, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304, BT = B * T;
  const int64_t BTC = (int64_t)BT * C, ATT = GPU->attention_state_floats(B, T, NH);
  const int64_t NP = 124475904;
  const double ATT_FLOP = 2.0 * B * NH * (double)T * T * (C / NH); /* causal: half of 4*T*T*hs */
  const double es = (double)ES;
  printf("timings, GPT-2 124M shapes, B=%d T=%d (%s)\n", B, T, GPU->name);
  float *a = dev(NULL, 4 * BTC), *b = dev(NULL, 4 * BTC), *c = dev(NULL, 4 * BTC);
  float *att = dev(NULL, ATT), *datt = dev(NULL, ATT), *w = dev(NULL, (int64_t)Vp * C);
  float *dw = dev(NULL, (int64_t)Vp * C);
  float *logits = dev(NULL, (int64_t)BT * Vp), *loss = dev(NULL, BT), *wpe = dev(NULL, (int64_t)T * C);
  float *dwpe = dev(NULL, (int64_t)T * C);
  float *stat = dev(NULL, 2 * BT), *p = dev(NULL, NP), *g = dev(NULL, NP), *m = dev(NULL, NP);
  float *v = dev(NULL, NP), *work = dev(NULL, NP);
  int *tok = rand_ints(BT, V);
  int *d_tok = dev_bytes(tok, (size_t)BT * sizeof(int));
  float *x = randn(4 * BTC, 1);
  upload_st(a, x, 4 * BTC), upload_st(b, x, 4 * BTC);
  upload_st(w, x, (int64_t)Vp * C < 4 * BTC ? (int64_t)Vp * C : 4 * BTC);
  const float *sync_ptr = loss;
  TIME("encoder_forward", 3.0 * BTC * es, 10, GPU->encoder_forward(c, d_tok, w, wpe, B, T, C));
  const size_t sort_bytes = (size_t)BT * 16 + ((size_t)1 << 20);
  float *sort_scratch = dev(NULL, (int64_t)(sort_bytes / 4));
  TIME("encoder_backward", BTC * (es + 8.0), 10,
       GPU->encoder_backward(dw, dwpe, a, d_tok, B, T, C, NULL, 0));
  TIME("encoder_backward, sort", BTC * (es + 8.0), 10,
       GPU->encoder_backward(dw, dwpe, a, d_tok, B, T, C, sort_scratch, sort_bytes));
  /* text's tokens: runs as long as a corpus makes them. Bytes of English
   * (the space about a sixth of them) and Zipf's law over GPT-2's ids (the
   * commonest about 9%): the backward's chains of additions, not its sort,
   * set the time */
  {
    static const char verse[] = "In the beginning God created the heaven and the earth. And the "
                                "earth was without form, and void; and darkness was upon the "
                                "face of the deep. ";
    int *txt = malloc((size_t)BT * sizeof *txt);
    for (int i = 0; i < BT; i++) txt[i] = (unsigned char)verse[i % (int)(sizeof verse - 1)];
    int *d_txt = dev_bytes(txt, (size_t)BT * sizeof(int));
    TIME("encoder_backward, sort, English bytes", BTC * (es + 8.0), 10,
         GPU->encoder_backward(dw, dwpe, a, d_txt, B, T, C, sort_scratch, sort_bytes));
    /* cdf[r-1] = 1 + 1/2 + ... + 1/r; cdf[V-1] is Zipf's normaliser */
    double *cdf = malloc((size_t)V * sizeof *cdf), cum = 0;
    for (int r = 1; r <= V; r++) cdf[r - 1] = cum += 1.0 / r;
    uint64_t st = 88172645463325252ull;
    for (int i = 0; i < BT; i++) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      const double u = (double)(st >> 11) / 9007199254740992.0 * cdf[V - 1];
      int lo = 0, hi = V - 1; /* the first rank whose cdf reaches u (the last if none) */
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (cdf[mid] >= u) hi = mid;
        else lo = mid + 1;
      }
      txt[i] = lo;
    }
    free(cdf);
    GPU->free(d_txt);
    d_txt = dev_bytes(txt, (size_t)BT * sizeof(int));
    TIME("encoder_backward, sort, Zipf ids", BTC * (es + 8.0), 10,
         GPU->encoder_backward(dw, dwpe, a, d_txt, B, T, C, sort_scratch, sort_bytes));
    GPU->free(d_txt);
    free(txt);
  }
  TIME("layernorm_forward", 2.0 * BTC * es, 10,
       GPU->layernorm_forward(c, stat, stat + BT, a, w, w, BT, C));
  TIME("layernorm_backward", 4.0 * BTC * es, 10,
       GPU->layernorm_backward(c, dw, dw + C, b, a, w, stat, stat + BT, BT, C));
  TIME("matmul_forward 768->2304 (qkv)", -2.0 * BT * C * 3 * C, 10,
       GPU->matmul_forward(c, a, w, w, BT, C, 3 * C));
  TIME("matmul_backward 768->2304 (qkv)", -4.0 * BT * C * 3 * C, 10,
       GPU->matmul_backward(c, dw, dw + 3 * C * C, a, b, w, BT, C, 3 * C));
  TIME("matmul_forward 768->50304 (lm head)", -2.0 * BT * C * Vp, 3,
       GPU->matmul_forward(logits, a, w, NULL, BT, C, Vp));
  TIME("attention_forward", -ATT_FLOP, 5, GPU->attention_forward(c, att, a, B, T, C, NH, NH));
  TIME("attention_backward", -2.5 * ATT_FLOP, 5,
       GPU->attention_backward(b, datt, a, a, c, att, B, T, C, NH, NH));
  TIME("gelu_forward (4C)", 2.0 * 4 * BTC * es, 10, GPU->gelu_forward(c, a, 4 * BTC));
  TIME("gelu_backward (4C)", 4.0 * 4 * BTC * es, 10, GPU->gelu_backward(c, a, b, 4 * BTC));
  TIME("residual_forward", 3.0 * BTC * es, 10, GPU->residual_forward(c, a, b, BTC));
  TIME("accumulate_f32 (124M)", 3.0 * NP * 4, 10, GPU->accumulate_f32(g, m, NP));
  TIME("softmax_crossentropy (in place)", 2.0 * BT * Vp * es, 5,
       GPU->softmax_crossentropy(loss, logits, logits, d_tok, 1.0f / BT, BT, V, Vp));
  TIME("adamw_update (124M, + work copy)", NP * (7.0 * 4 + es), 10,
       GPU->adamw_update(p, g, ST_FP32, m, v, NP, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, work));
  TIME("sum_squares (124M)", 1.0 * NP * 4, 10, (void)GPU->sum_squares(g, ST_FP32, NP));
  float *bufs[] = {a, b, c, att, datt, w, dw, logits, loss, wpe, dwpe, stat, p, g, m, v, work};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) GPU->free(bufs[i]);
  GPU->free(d_tok), GPU->free(sort_scratch);
  free(tok), free(x);
}

static void bench_family(void) {
  const int B = 4, T = 2048, C = 2048, NH = 32, NKV = 8, HD = C / NH, F = 8192, BT = B * T;
  const int64_t BTC = (int64_t)BT * C, R = (int64_t)(NH + 2 * NKV) * HD, QKV = BT * R;
  const int64_t ATT = GPU->attention_state_floats(B, T, NH), N2F = (int64_t)BT * 2 * F;
  const double ATT_FLOP = 2.0 * B * NH * (double)T * T * HD, es = (double)ES;
  printf("timings, llama-3.2-1b shapes, B=%d T=%d C=%d NH=%d NKV=%d F=%d (%s)\n", B, T, C, NH,
         NKV, F, GPU->name);
  float *a = dev(NULL, N2F), *b = dev(NULL, N2F), *c = dev(NULL, N2F), *w = dev(NULL, C);
  float *dw = dev(NULL, C), *rstd = dev(NULL, BT), *att = dev(NULL, ATT), *datt = dev(NULL, ATT);
  float *x = randn(N2F, 1), *cs = randn((int64_t)T * HD, 1);
  upload_st(a, x, N2F), upload_st(b, x, N2F), upload_st(w, x, C);
  float *d_cs = dev(cs, (int64_t)T * HD);
  const float *sync_ptr = rstd;
  TIME("rmsnorm_forward", 2.0 * BTC * es, 10, GPU->rmsnorm_forward(c, rstd, a, w, BT, C, 1e-5f));
  TIME("rmsnorm_backward", 4.0 * BTC * es, 10,
       GPU->rmsnorm_backward(c, dw, b, a, w, rstd, BT, C));
  TIME("rope_forward (q and k heads)", 2.0 * BT * (NH + NKV) * HD * es, 10,
       GPU->rope_forward(a, d_cs, B, T, 0, NH, NKV, HD));
  TIME("rope_backward", 2.0 * BT * (NH + NKV) * HD * es, 10,
       GPU->rope_backward(a, d_cs, B, T, NH, NKV, HD));
  TIME("swiglu_forward", 3.0 * BT * F * es, 10, GPU->swiglu_forward(c, a, BT, F));
  TIME("swiglu_backward", 5.0 * BT * F * es, 10, GPU->swiglu_backward(c, b, a, BT, F));
  upload_st(a, x, QKV); /* the rotations above drifted it */
  TIME("attention_forward GQA (ours)", -ATT_FLOP, 5,
       GPU->attention_forward(c, att, a, B, T, C, NH, NKV));
  TIME("attention_backward GQA (ours)", -2.5 * ATT_FLOP, 5,
       GPU->attention_backward(b, datt, a, a, c, att, B, T, C, NH, NKV));
  st_attention_choice ch;
  if (DT != ST_FP32 &&
      st_cuda_attention_select_gqa(ST_ATTENTION_CUDNN, DT, B, T, C, NH, NKV, &ch) == 0 &&
      GPU->reserve(0, 0) == 0) {
    TIME("attention_forward GQA (cuDNN)", -ATT_FLOP, 5,
         GPU->attention_forward(c, att, a, B, T, C, NH, NKV));
    TIME("attention_backward GQA (cuDNN)", -2.5 * ATT_FLOP, 5,
         GPU->attention_backward(b, datt, a, a, c, att, B, T, C, NH, NKV));
    st_cuda_attention_select_gqa(ST_ATTENTION_FLASH, DT, B, T, C, NH, NKV, &ch);
  } else if (DT != ST_FP32) {
    printf("  cuDNN GQA attention: not timed (no plan)\n");
  }
  float *bufs[] = {a, b, c, w, dw, rstd, att, datt, d_cs};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) GPU->free(bufs[i]);
  free(x), free(cs);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("bench_cuda_ops", name, sizeof name);
  if (rc) return rc == 77 ? 0 : rc;
  printf("device: %s\n", name);
  const char *only = getenv("ST_CUDA_OPS_DTYPE");
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    if (only && *only && strcmp(only, st_dtype_name(dts[i])) != 0) continue;
    use_dtype(dts[i]);
    bench();
    bench_family();
  }
  return 0;
}
