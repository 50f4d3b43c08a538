"""Peer timing for causal attention at GPT-2 124M shapes: PyTorch's SDPA
with its flash (FlashAttention-2) and cuDNN backends, bf16, forward and
forward+backward, to set against shardtrain's tensor-core kernels
(build-gpu/tests/test_cuda_attention_tc prints the same shapes' times).

    python3 bench/torch_attention.py [--batch 32 --seq 1024 --heads 12 --hd 64]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--hd", type=int, default=64)
a = p.parse_args()
B, T, H, D = a.batch, a.seq, a.heads, a.hd
flops_fwd = 4 * B * H * T * T * D / 2  # causal: half the score matrix


def timed(fn, n=20):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n


q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    try:
        with sdpa_kernel(be):
            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

            def fb():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(do)

            both = timed(fb)
        bwd = both - fwd
        print(f"RESULT torch-{name} B={B} T={T} H={H} D={D}: forward {fwd:.3f} ms "
              f"({flops_fwd / fwd / 1e9:.1f} TFLOP/s), backward {bwd:.3f} ms "
              f"({2.5 * flops_fwd / bwd / 1e9:.1f} TFLOP/s)")
    except Exception as ex:  # a backend this build or GPU lacks
        print(f"RESULT torch-{name}: unavailable ({type(ex).__name__}: {ex})")
