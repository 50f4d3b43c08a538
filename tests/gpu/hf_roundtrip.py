"""Hugging Face round trip at GPT-2 124M shape (run on the GPU machine).

    python3 tests/gpu/hf_roundtrip.py --shardtrain build-gpu/shardtrain [--driver PATH]

Needs torch and transformers; where either does not import it prints SKIP
and exits 0. Steps:
 1. a random GPT2LMHeadModel at GPT-2 124M shape (vocab 50257, 1024
    positions, width 768, 12 layers, 12 heads; biases and LayerNorm gains
    randomised too, so a dropped bias or a missed transpose shows), saved
    with save_pretrained;
 2. shardtrain ckpt import, then ckpt export --dtype fp32 and --dtype bf16;
 3. each export reloaded with GPT2LMHeadModel.from_pretrained: fp32 logits
    on a fixed [2, 64] batch within 1e-4 (max abs) of the original's, and
    every tensor equal to the original's (fp32) or the original rounded to
    bf16 (bf16), whose logits then equal the bf16-rounded original's;
 4. shardtrain's CPU logits of the import (the hf_logits driver, built next
    to shardtrain in tests/) against HF's fp32 CPU logits: max abs <= 1e-4.
Prints every figure; exits 1 on any failure.
"""
import os
import shutil
import tempfile

from hf_common import check, check_driver_logits, finish, hf_imports, parse_args, run

np, torch, (GPT2Config, GPT2LMHeadModel) = hf_imports("GPT2Config", "GPT2LMHeadModel")
a, drv = parse_args(torch)

work = tempfile.mkdtemp(prefix="hf_roundtrip_")
W = lambda n: os.path.join(work, n)
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                 n_inner=None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg).eval()
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith(".bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=g))
model.save_pretrained(W("src"))
ids = torch.randint(0, 50257, (2, 64), generator=g)
dev = "cuda" if torch.cuda.is_available() else "cpu"


def logits(m, device):
    with torch.no_grad():
        return m.to(device)(ids.to(device)).logits.float().cpu()


ref_dev = logits(model, dev)
ref_cpu = logits(model, "cpu")

run([a.shardtrain, "ckpt", "import", W("src"), "--out", W("run")])
run([a.shardtrain, "ckpt", "export", W("run"), "--out", W("exp32")])
run([a.shardtrain, "ckpt", "export", W("run"), "--out", W("exp16"), "--dtype", "bf16"])

sd = {k: v.float() for k, v in model.state_dict().items()}
m32 = GPT2LMHeadModel.from_pretrained(W("exp32"), torch_dtype=torch.float32).eval()
same = all(torch.equal(m32.state_dict()[k].float(), v) for k, v in sd.items()
           if not k.endswith(("attn.bias", "attn.masked_bias")))
check(same, "fp32 export reloaded by from_pretrained: every tensor equals the original's")
d = float((logits(m32, dev) - ref_dev).abs().max())
check(d <= 1e-4, f"fp32 export: logits max abs diff vs the original on {dev} = {d:.3g} (<= 1e-4)")

m16 = GPT2LMHeadModel.from_pretrained(W("exp16"), torch_dtype=torch.bfloat16).eval()
same = all(torch.equal(m16.state_dict()[k], v.to(torch.bfloat16)) for k, v in sd.items()
           if not k.endswith(("attn.bias", "attn.masked_bias")))
check(same, "bf16 export: every tensor is the original rounded to bf16")
rounded = GPT2LMHeadModel(cfg).eval()
rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in sd.items()}, strict=False)
d = float((logits(m16.float(), dev) - logits(rounded, dev)).abs().max())
check(d <= 1e-4, f"bf16 export (computed in fp32): logits max abs diff vs the bf16-rounded "
      f"original = {d:.3g} (<= 1e-4)")

check_driver_logits(np, torch, drv, W("run"), ids, 50257, ref_cpu, W)

if not a.keep:
    shutil.rmtree(work, ignore_errors=True)
finish("hf_roundtrip")
