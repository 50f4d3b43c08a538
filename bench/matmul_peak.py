"""The bf16 matmul peak of GPU 0 in TFLOP/s, as the benchmarks' MFU
denominator: torch.matmul of two random 8192 x 8192 bf16 matrices (random,
not zeros: zeros ran 13% faster on an H200), 5 warmup products, then the
mean of 50 timed between synchronisations. Prints one number."""
import time

import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
n = 50
t = time.perf_counter()
for _ in range(n):
    a @ b
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / n
print(f"{2 * 8192**3 / dt / 1e12:.1f}")
