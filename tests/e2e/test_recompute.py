"""--recompute act, selective and full against none on the CPU backend (fp32):
after 4 steps of 2 micro-steps the final weights (--dump-params) are
bit-identical, for GPT-2 (LayerNorm, GELU), GPT-2 with LoRA adapters on
every projection (the GELU split from its GEMMs, adapter dropout) and a
Llama-shaped model (RMSNorm, RoPE, GQA, SwiGLU, untied head) with and
without LoRA on every projection. Full recompute reruns each block from its
kept input but stops before the down projection (its output is never read
by backward), so this is also what shows that shortcut loses nothing."""
import os

from common import check, corpus, losses, parse_args, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--seq-len", 32, "--micro-batch", 2, "--global-batch", 4, "--steps", 4,
        "--lr", 1e-3, "--warmup", 1, "--val-seqs", 0, "--resume", "none"]
llama = ["--arch", "llama", "--layers", 2, "--heads", 4, "--kv-heads", 2, "--dim", 64,
         "--vocab-size", 256, "--tied", 0]
models = {
    "gpt2": ["--model", "tiny"],
    "gpt2_lora": ["--model", "tiny", "--lora", "4,dropout=0.1,targets=qkv,o,up,down"],
    "llama": llama,
    "llama_lora": llama + ["--lora", "4,dropout=0.1,targets=q,k,v,o,gate,up,down"],
}
for name, args in models.items():
    for rec in ("none", "act", "selective", "full"):
        out = W(f"{name}_{rec}")
        train(a, 1, base + args + ["--recompute", rec, "--out", out, "--dump-params", out + ".f32"])
    ref = open(W(f"{name}_none.f32"), "rb").read()
    for rec in ("act", "selective", "full"):
        got = open(W(f"{name}_{rec}.f32"), "rb").read()
        check(len(ref) > 0 and got == ref and losses(W(f"{name}_{rec}")) == losses(W(f"{name}_none")),
              f"{name}: --recompute {rec} bit-identical to none (weights after 4 steps, every loss)")
