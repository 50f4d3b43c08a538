/* nf4_matmul.h - the linear layer with a frozen NF4 weight (QLoRA's base
 * projections), on any op table: the weight is dequantised into a scratch
 * buffer of the storage dtype and the table's own GEMM runs on it, so the
 * arithmetic is exactly matmul_forward / matmul_backward_input's on the
 * dequantised weight (Dettmers et al. 2023, sec. 3: "we dequantize the
 * storage data type to the computation data type to perform the forward
 * and backward pass"). Only one weight is ever held in 16 bits: the caller
 * passes one scratch, st_nf4_scratch_bytes of the largest NF4 weight it
 * will use (kernels/nf4.h), reused by every call. There is no weight
 * gradient: the base is frozen.
 */
#ifndef ST_NF4_MATMUL_H
#define ST_NF4_MATMUL_H

#include "kernels/nf4.h"
#include "kernels/ops.h"

/* out[N, OC] = inp[N, C] @ W^T + bias[OC] (bias may be NULL), W = w
 * dequantised, [OC, C] = [w->rows, w->cols]. out, inp, bias and scratch
 * (st_nf4_scratch_bytes(OC, C, ops->dtype) bytes, 16-byte aligned) are
 * backend memory in the table's storage dtype; w's arrays too. On return
 * scratch holds W. */
void st_nf4_matmul_forward(const st_ops *ops, void *out, const void *inp, const st_nf4 *w,
                           const void *bias, void *scratch, int N);

/* dinp[N, C] = dout[N, OC] @ W, OVERWRITTEN; the rest as above. */
void st_nf4_matmul_backward(const st_ops *ops, void *dinp, const void *dout, const st_nf4 *w,
                            void *scratch, int N);

#endif
