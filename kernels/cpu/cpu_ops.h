/* cpu_ops.h - fp32 reference kernels; gathered into the op table by
 * ops_table.c. Signatures and semantics are documented in kernels/ops.h;
 * the CPU table's storage dtype is fp32, so every void * tensor is float. */
#ifndef ST_CPU_OPS_H
#define ST_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

void cpu_encoder_forward(void *out, const int *inp, const void *wte, const void *wpe,
                         int B, int T, int C);
void cpu_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *inp,
                          int B, int T, int C, void *scratch, size_t scratch_bytes);
void cpu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                           const void *w, const void *b, int N, int C);
void cpu_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                            const void *inp, const void *w, const float *mean,
                            const float *rstd, int N, int C);
void cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                         float eps);
void cpu_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
                          const void *w, const float *rstd, int N, int C);
void cpu_rope_forward(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                      int HD);
void cpu_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD);
void cpu_matmul_forward(void *out, const void *inp, const void *w, const void *bias,
                        int N, int C, int OC);
void cpu_matmul_residual_forward(void *out, const void *inp, const void *w, const void *bias,
                                 const void *res, int N, int C, int OC);
void cpu_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
                         const void *inp, const void *w, int N, int C, int OC);
void cpu_matmul_backward_input(void *dinp, const void *dout, const void *w, int N, int C,
                               int OC);
struct st_nf4;
void cpu_nf4_dequantize(void *dst, const struct st_nf4 *q);
int cpu_nf4_quantize(struct st_nf4 *q, const void *src, void *workspace);
int64_t cpu_attention_state_floats(int B, int T, int NH);
void cpu_attention_forward(void *out, float *att, const void *qkv, int B, int T, int C,
                           int NH, int NKV);
void cpu_attention_backward(void *dqkv, float *datt, const void *dout, const void *qkv,
                            const void *out, const float *att, int B, int T, int C, int NH,
                            int NKV);
void cpu_attention_decode(void *out, void *kcache, void *vcache, const void *qkv, int B,
                          int n_new, int pos0, int maxT, int C, int NH, int NKV);
void cpu_gelu_forward(void *out, const void *inp, int64_t n);
void cpu_gelu_backward(void *dinp, const void *inp, const void *dout, int64_t n);
void cpu_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w,
                             const void *bias, int N, int C, int OC);
void cpu_matmul_backward_gelu(void *dinp, float *dw, float *dbias, const void *dout,
                              const void *inp, const void *w, const void *pre, int N, int C,
                              int OC);
void cpu_swiglu_forward(void *out, const void *inp, int N, int F);
void cpu_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F);
void cpu_residual_forward(void *out, const void *a, const void *b, int64_t n);
void cpu_accumulate_f32(float *dst, const float *src, int64_t n);
void cpu_lora_add_cols(void *y, const void *v, float scale, int N, int OC, int col0, int n);
void cpu_lora_take_cols(void *dst, const void *y, float scale, int N, int OC, int col0, int n);
void cpu_dropout(void *out, const void *in, int64_t n, float p, uint64_t seed);
void cpu_softmax_crossentropy(float *loss, void *dlogits, const void *logits,
                              const int *targets, float dloss, int N, int V, int Vp);
void cpu_adamw_update(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                      float lr, float b1, float b2, float eps, float wd, float grad_scale,
                      int64_t t, void *work);
void cpu_adamw_update_segments_split(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                     float *v, int64_t n, const int64_t *seg_end,
                                     const float *seg_wd, int nseg, float lr, float b1, float b2,
                                     float eps, float grad_scale, int64_t t, uint16_t *work);
void cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
double cpu_sum_squares(const void *x, st_dtype dt, int64_t n);

#endif
