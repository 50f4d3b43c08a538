/* ops_table.c - the CPU backend's op table (see kernels/ops.h). */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

static const st_ops k_cpu_ops = {
    .name = "cpu-fp32",
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .softmax_crossentropy = cpu_softmax_crossentropy,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
};

const st_ops *st_ops_cpu(void) { return &k_cpu_ops; }
