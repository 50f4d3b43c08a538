/* ops.h - the op table: every kernel the model needs, behind one struct.
 *
 * The trainer calls ops only through an st_ops table, so the same forward and
 * backward schedule runs on the CPU reference (kernels/cpu/, fp32, OpenMP) or
 * on CUDA (kernels/cuda/, later). Shapes are row-major; N = B*T rows.
 * Backward ops ACCUMULATE (+=) into parameter gradients and into input
 * gradients, so callers zero gradient buffers once per micro-batch.
 * Reductions run in a fixed order independent of the thread count, so a run
 * is bit-for-bit repeatable on the same machine.
 */
#ifndef ST_OPS_H
#define ST_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *name;

  /* Memory the ops read and write: host memory for the CPU backend, device
   * memory for CUDA. alloc returns zeroed memory or NULL. Copies are
   * synchronous from the caller's point of view. */
  void *(*alloc)(size_t bytes);
  void (*free)(void *p);
  void (*zero)(void *p, size_t bytes);
  void (*to_device)(void *dst, const void *host_src, size_t bytes);
  void (*to_host)(void *host_dst, const void *src, size_t bytes);

  /* out[B,T,C] = wte[inp[b,t]] + wpe[t].  inp: token ids in [0, V). */
  void (*encoder_forward)(float *out, const int *inp, const float *wte,
                          const float *wpe, int B, int T, int C);
  /* dwte[inp] += dout; dwpe[t] += sum_b dout[b,t]. */
  void (*encoder_backward)(float *dwte, float *dwpe, const float *dout,
                           const int *inp, int B, int T, int C);

  /* LayerNorm over the last dim (eps 1e-5). mean/rstd [N] saved for backward. */
  void (*layernorm_forward)(float *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b,
                            int N, int C);
  void (*layernorm_backward)(float *dinp, float *dw, float *db,
                             const float *dout, const float *inp,
                             const float *w, const float *mean,
                             const float *rstd, int N, int C);

  /* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL). */
  void (*matmul_forward)(float *out, const float *inp, const float *w,
                         const float *bias, int N, int C, int OC);
  /* dinp += dout @ w; dw += dout^T @ inp; dbias += colsum(dout) (if not NULL). */
  void (*matmul_backward)(float *dinp, float *dw, float *dbias,
                          const float *dout, const float *inp, const float *w,
                          int N, int C, int OC);

  /* Causal multi-head self-attention. qkv[B,T,3C] holds q|k|v per row, heads
   * of size C/NH. out[B,T,C]. att is what forward saves for backward and datt
   * backward's scratch, each attention_state_floats(B, T, NH) floats: the CPU
   * reference keeps the softmax [B,NH,T,T]; a flash-attention backend keeps
   * only per-row statistics (O(B*NH*T)), so no T x T matrix exists. */
  int64_t (*attention_state_floats)(int B, int T, int NH);
  void (*attention_forward)(float *out, float *att, const float *qkv,
                            int B, int T, int C, int NH);
  void (*attention_backward)(float *dqkv, float *datt, const float *dout,
                             const float *qkv, const float *att,
                             int B, int T, int C, int NH);

  /* GELU, tanh approximation (Hendrycks & Gimpel 2016, as in GPT-2). */
  void (*gelu_forward)(float *out, const float *inp, int64_t n);
  void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int64_t n);

  /* out = a + b, n elements. */
  void (*residual_forward)(float *out, const float *a, const float *b, int64_t n);

  /* Softmax over the first V of Vp logits per row (padded columns get
   * probability 0), loss[N] = -log p[target], and, when dlogits is not NULL,
   * dlogits[N,Vp] = (p - onehot(target)) * dloss (padded columns get 0).
   * logits may alias dlogits. Returns nothing; targets in [0, V). */
  void (*softmax_crossentropy)(float *loss, float *dlogits, const float *logits,
                               const int *targets, float dloss, int N, int V, int Vp);

  /* One AdamW step on n elements (Loshchilov & Hutter 2019, the form of
   * torch.optim.AdamW): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
   * p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p), with bias corrections
   * 1-b1^t and 1-b2^t. g is scaled by grad_scale first (clipping). t >= 1. */
  void (*adamw_update)(float *p, const float *g, float *m, float *v, int64_t n,
                       float lr, float b1, float b2, float eps, float wd,
                       float grad_scale, int64_t t);

  /* Sum of squares of n elements, accumulated in double. */
  double (*sum_squares)(const float *x, int64_t n);
} st_ops;

/* The CPU fp32 reference implementation. */
const st_ops *st_ops_cpu(void);

#endif
