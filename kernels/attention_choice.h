/* attention_choice.h - which of the CUDA backend's attention kernels takes a
 * shape, as plain C (built into st_kernels_cpu) so the rules are unit-tested
 * on the CPU (tests/test_attention_choice.c) and checked at setup, not found
 * out inside a step. */
#ifndef ST_ATTENTION_CHOICE_H
#define ST_ATTENTION_CHOICE_H

#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the tensor-core FlashAttention-2 kernels (attention_tc.cu) take
 * width C with NH heads in dtype dt: bf16 or fp16, C a positive multiple of
 * NH, head size C/NH of 32, 64 or 128. Else 0. */
int st_attention_tc_takes(int C, int NH, st_dtype dt);

/* The head-size tile of the fp32-arithmetic kernels (attention.cu) for width
 * C with NH heads: 32, 64 or 128, the smallest that holds the head size
 * C/NH; 0 when C/NH is not a whole number from 1 to 128 (no kernel). */
int st_attention_simt_tile(int C, int NH);

#ifdef __cplusplus
}
#endif
#endif
