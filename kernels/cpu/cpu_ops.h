/* cpu_ops.h - fp32 reference kernels; gathered into the op table by
 * ops_table.c. Signatures and semantics are documented in kernels/ops.h. */
#ifndef ST_CPU_OPS_H
#define ST_CPU_OPS_H

#include <stdint.h>

void cpu_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                         int B, int T, int C);
void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                          int B, int T, int C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C);
void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C);
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                        int N, int C, int OC);
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC);
int64_t cpu_attention_state_floats(int B, int T, int NH);
void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH);
void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH);
void cpu_gelu_forward(float *out, const float *inp, int64_t n);
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void cpu_residual_forward(float *out, const float *a, const float *b, int64_t n);
void cpu_softmax_crossentropy(float *loss, float *dlogits, const float *logits,
                              const int *targets, float dloss, int N, int V, int Vp);
void cpu_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                      float b1, float b2, float eps, float wd, float grad_scale, int64_t t);
double cpu_sum_squares(const float *x, int64_t n);

#endif
