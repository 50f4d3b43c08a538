"""Make tests/data/gpt2_tiny_golden.h5: the reference for test_golden.c.

Runs Hugging Face transformers' GPT2LMHeadModel (eager attention, no dropout)
on a tiny GPT-2 with fixed random weights and tokens, in float64 so the
reference carries no rounding error of its own, and records:
  /params/<name>      initial weights in shardtrain's layout ([out, in] linears)
  /tokens, /targets   int32 [B, T]
  /logits             [B, T, V] float64
  /loss               scalar, mean cross-entropy
  /grads/<name>       d loss / d param (tied wte: head + embedding)
  /adamw/loss         [3] loss before each of three AdamW steps
  /adamw/params/<name> weights after three torch.optim.AdamW steps with
                       global-norm clipping (torch.nn.utils.clip_grad_norm_)
Hyperparameters are root attributes. Run it where torch, transformers and
h5py are installed (the GPU machine has all three):
  python3 tests/golden/make_gpt2_golden.py --out tests/data/gpt2_tiny_golden.h5
"""
import argparse

import h5py
import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
a = p.parse_args()

L, NH, C, T, V, B = 2, 4, 64, 32, 256, 3
LR, BETAS, EPS, WD, CLIP, STEPS = 3e-3, (0.9, 0.95), 1e-8, 0.1, 1.0, 3

torch.manual_seed(1234)
cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=NH,
                 activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=V - 1, eos_token_id=V - 1)
model = GPT2LMHeadModel(cfg).to(torch.float64)
try:  # float64 on CPU: eager and SDPA's math path agree; prefer eager when offered
    model.set_attn_implementation("eager")
except Exception:
    pass
model.eval()  # no dropout; gradients still flow
with torch.no_grad():
    # Non-trivial LayerNorm and bias values so every parameter matters.
    for n, prm in model.named_parameters():
        if n.endswith("bias") or ".ln_" in n:
            prm.add_(0.1 * torch.randn_like(prm))

tok = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(99))
inp, tgt = tok[:, :-1], tok[:, 1:]

def layout(model):
    """shardtrain name -> (HF parameter, transpose?). HF's Conv1D stores
    [in, out]; shardtrain stores linears [out, in]."""
    tr = model.transformer
    m = {"wte.weight": (tr.wte.weight, False), "wpe.weight": (tr.wpe.weight, False)}
    for i, blk in enumerate(tr.h):
        pre = f"h.{i}."
        for ours, mod, name, tp in [("ln_1", blk.ln_1, "weight", False),
                                    ("ln_1", blk.ln_1, "bias", False),
                                    ("attn.qkv", blk.attn.c_attn, "weight", True),
                                    ("attn.qkv", blk.attn.c_attn, "bias", False),
                                    ("attn.proj", blk.attn.c_proj, "weight", True),
                                    ("attn.proj", blk.attn.c_proj, "bias", False),
                                    ("ln_2", blk.ln_2, "weight", False),
                                    ("ln_2", blk.ln_2, "bias", False),
                                    ("mlp.fc", blk.mlp.c_fc, "weight", True),
                                    ("mlp.fc", blk.mlp.c_fc, "bias", False),
                                    ("mlp.proj", blk.mlp.c_proj, "weight", True),
                                    ("mlp.proj", blk.mlp.c_proj, "bias", False)]:
            m[f"{pre}{ours}.{name}"] = (getattr(mod, name), tp)
    m["ln_f.weight"] = (tr.ln_f.weight, False)
    m["ln_f.bias"] = (tr.ln_f.bias, False)
    return m

def ours(model, grad=False):
    out = {}
    for n, (prm, tp) in layout(model).items():
        x = (prm.grad if grad else prm).detach()
        out[n] = (x.t() if tp else x).contiguous().numpy()
    return out

with h5py.File(a.out, "w") as f:
    f.attrs.update(dict(n_layer=L, n_head=NH, n_embd=C, block_size=T, vocab_size=V, batch=B,
                        lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD,
                        grad_clip=CLIP, steps=STEPS))
    for k, v in (("torch", torch.__version__), ("transformers", transformers.__version__)):
        f.attrs[k] = np.bytes_(v)
    for n, x in ours(model).items():
        f[f"params/{n}"] = x.astype(np.float32)
    # fp32 weights are what the C side starts from: round the reference to them.
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(prm.to(torch.float32).to(torch.float64))
    f["tokens"] = inp.numpy().astype(np.int32)
    f["targets"] = tgt.numpy().astype(np.int32)
    out = model(input_ids=inp, labels=None)
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    loss.backward()
    f["logits"] = logits.detach().numpy()
    f["loss"] = loss.item()
    for n, x in ours(model, grad=True).items():
        f[f"grads/{n}"] = x

    # Three AdamW steps on the same batch: decay on matrices (2-D) only.
    model.zero_grad()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    nodecay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        lg = model(input_ids=inp).logits
        l = torch.nn.functional.cross_entropy(lg.reshape(-1, V), tgt.reshape(-1))
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(l.item())
    f["adamw/loss"] = np.array(losses)
    for n, x in ours(model).items():
        f[f"adamw/params/{n}"] = x
print("wrote", a.out)
