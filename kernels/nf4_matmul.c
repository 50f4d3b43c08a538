/* nf4_matmul.c - dequantise-then-GEMM for NF4 weights (see nf4_matmul.h). */
#include "kernels/nf4_matmul.h"

void st_nf4_matmul_forward(const st_ops *ops, void *out, const void *inp, const st_nf4 *w,
                           const void *bias, void *scratch, int N) {
  ops->nf4_dequantize(scratch, w);
  ops->matmul_forward(out, inp, scratch, bias, N, (int)w->cols, (int)w->rows);
}

void st_nf4_matmul_backward(const st_ops *ops, void *dinp, const void *dout, const st_nf4 *w,
                            void *scratch, int N) {
  ops->nf4_dequantize(scratch, w);
  ops->matmul_backward_input(dinp, dout, scratch, N, (int)w->cols, (int)w->rows);
}
