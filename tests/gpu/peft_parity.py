"""LoRA parity with Hugging Face PEFT (run where torch, transformers and
peft import: the GPU machine; the CPU works too).

    python3 tests/gpu/peft_parity.py --bin build-gpu/shardtrain --work DIR \
        [--device cuda|cpu] [--precision fp32|bf16] [--family llama|gpt2|both]

For each family (a tiny LlamaForCausalLM with GQA, and a tiny GPT2LMHeadModel,
random weights, saved with save_pretrained, fp32):
 1. `shardtrain ckpt import`, then `shardtrain train --init-from` the import
    with `--lora 4,alpha=16,dropout=0,targets=ALL` (every projection:
    Llama q,k,v,o,gate,up,down; GPT-2 qkv,o,up,down), 2 steps on one fixed
    batch (a token file of exactly one global batch, B=2, T=16), constant lr
    0.5, AdamW betas (0.9, 0.95), eps 1.0, no weight decay, no clipping,
    a checkpoint after each step. eps 1.0 makes Adam's update g / (|g| + 1)
    instead of about sign(g) for a first step, so the comparison sees the
    gradients' values, not only their signs.
 2. `ckpt export STEP --lora-format peft` of steps 1 and 2 and `ckpt export
    STEP --merge` of step 2.
 3. PEFT from our step 0: B starts at zero (the contract), so step 1's
    gradient of A is zero and with no weight decay A1 = A0 bit for bit; our
    step-1 export is therefore A0 (and B0 = 0). PeftModel.from_pretrained
    loads it (is_trainable), B is set to 0, and torch.optim.AdamW with the
    same hyper-parameters takes the same 2 steps on the same batch.
    Checks:
    - PEFT's A after step 1 equals A0 exactly; our B1 and PEFT's B1, our
      (A2, B2) and PEFT's: max |ours - PEFT| <= TOL x max |PEFT's change|
      (TOL 1e-3 in fp32, 5e-2 with --precision bf16);
    - the loss of each step in our metrics.jsonl equals PEFT's (the base's
      loss at step 1, the step-1 adapters' at step 2): |diff| <= 1e-4
      (fp32), 2e-2 (bf16);
    - PEFT's logits with our exported step-2 adapters equal the logits of
      our --merge export loaded with from_pretrained: max abs <= 1e-4 (fp32;
      our export, not our training precision, is compared here), and
      PEFT's merge_and_unload of them equals our merged weights (max abs <=
      1e-5), every other tensor of the merge bit-identical to the base's.
--precision bf16 trains ours in bf16 (CUDA only: the CPU backend is fp32);
the PEFT side stays fp32, so the tolerances widen as stated above.
Prints every figure; exits 1 on any failure (0 with SKIP where torch,
transformers or peft does not import).
"""
import argparse
import glob
import inspect
import json
import os
import shutil
import subprocess
import sys

import numpy as np

try:
    import torch
    import transformers
    from peft import PeftModel
except Exception as e:  # noqa: BLE001 - any import failure: not the machine for this
    print(f"SKIP: torch/transformers/peft not importable here ({e})")
    sys.exit(0)

B, T, R, ALPHA, LR, EPS, STEPS = 2, 16, 4, 16.0, 0.5, 1.0, 2
TARGETS = {"llama": "q,k,v,o,gate,up,down", "gpt2": "qkv,o,up,down"}
fails = []


def check(ok, msg):
    print(("ok: " if ok else "FAIL: ") + msg, flush=True)
    if not ok:
        fails.append(msg)


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(f"FAIL: {' '.join(map(str, cmd))} exited {r.returncode}")
    return r


def llama_config():
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0,
              hidden_act="silu")
    if "rope_parameters" in inspect.signature(transformers.LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    return transformers.LlamaConfig(**kw)


def gpt2_config():
    return transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2,
                                   n_head=4, activation_function="gelu_new", resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0)


def eager(m):
    try:
        m.set_attn_implementation("eager")
    except AttributeError:
        pass
    return m


def make_base(family, path):
    """A random fp32 model saved with save_pretrained; every tensor drawn,
    norm gains near 1, so a mapping mistake changes the logits."""
    torch.manual_seed(11)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.GPT2LMHeadModel
    m = cls(llama_config() if family == "llama" else gpt2_config())
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight") or ".ln_" in n and n.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    m.save_pretrained(path)
    return cls


def load(cls, path, dev):
    """fp32 files load as fp32 (from_pretrained keeps the files' dtype by default)."""
    return eager(cls.from_pretrained(path)).to(dev).float().eval()


def write_tokens(path, toks):
    h = np.zeros(256, np.int32)
    h[:3] = (20240520, 1, len(toks))
    with open(path, "wb") as f:
        f.write(h.tobytes() + toks.astype(np.uint16).tobytes())


def metrics_losses(run_dir):
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        d = json.loads(line)
        if "loss" in d and "step" in d and "val_loss" not in d:
            out[d["step"]] = d["loss"]
    return out


def lora_modules(model):
    """name -> module of every PEFT LoRA layer."""
    return {n: m for n, m in model.named_modules() if hasattr(m, "lora_A") and
            "default" in getattr(m, "lora_A", {})}


def adapters(model):
    """module name -> (A, B) as float64 numpy."""
    return {n: (m.lora_A["default"].weight.detach().double().cpu().numpy(),
                m.lora_B["default"].weight.detach().double().cpu().numpy())
            for n, m in lora_modules(model).items()}


def loss_of(model, ids, tgt):
    logits = model(input_ids=ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             tgt.reshape(-1))


def parity(family, a, work):
    W = lambda n: os.path.join(work, family, n)
    os.makedirs(W(""), exist_ok=True)
    tol, ltol = (1e-3, 1e-4) if a.precision == "fp32" else (5e-2, 2e-2)
    cls = make_base(family, W("hf"))
    run([a.bin, "ckpt", "import", W("hf"), "--out", W("base")])
    toks = np.random.default_rng(5).integers(0, 256, B * T + 1)
    write_tokens(W("tok.bin"), toks)  # exactly one global batch: every step reads it
    ids = torch.tensor(np.stack([toks[i * T:i * T + T] for i in range(B)]), device=a.device)
    tgt = torch.tensor(np.stack([toks[i * T + 1:i * T + T + 1] for i in range(B)]),
                       device=a.device)
    lora = f"{R},alpha={ALPHA:g},dropout=0,targets={TARGETS[family]}"
    run([a.bin, "train", "--init-from", W("base"), "--data", W("tok.bin"), "--out", W("run"),
         "--seq-len", T, "--micro-batch", B, "--global-batch", B, "--steps", STEPS,
         "--ckpt-every", 1, "--lora", lora, "--lr", LR, "--warmup", 0, "--min-lr-frac", 1,
         "--weight-decay", 0, "--grad-clip", 0, "--beta1", 0.9, "--beta2", 0.95, "--eps", EPS,
         "--device", a.device, "--precision", a.precision, "--val-seqs", 0, "--seed", 3,
         "--resume", "none", "--shuffle", "off"])
    steps = sorted(glob.glob(W("run/ckpt/step_*")))
    check(len(steps) == STEPS, f"{family}: {len(steps)} step checkpoints ({STEPS} expected)")
    if len(steps) != STEPS:
        return
    for k, s in enumerate(steps, 1):
        run([a.bin, "ckpt", "export", s, "--out", W(f"peft{k}"), "--lora-format", "peft"])
    run([a.bin, "ckpt", "export", steps[-1], "--out", W("merged"), "--merge"])
    ours_loss = metrics_losses(W("run"))

    # PEFT from our step 0 (A0 = our A1, B0 = 0), AdamW as ours.
    peft = PeftModel.from_pretrained(load(cls, W("hf"), a.device), W("peft1"), is_trainable=True)
    ours1 = adapters(peft)
    check(len(ours1) > 0, f"{family}: PEFT put {len(ours1)} LoRA modules from our export")
    with torch.no_grad():
        for m in lora_modules(peft).values():
            m.lora_B["default"].weight.zero_()
    a0 = {n: A for n, (A, _) in adapters(peft).items()}
    params = [p for p in peft.parameters() if p.requires_grad]
    check(all(p.dtype == torch.float32 for p in params) and len(params) == 2 * len(ours1),
          f"{family}: PEFT trains {len(params)} fp32 adapter tensors, nothing else")
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=EPS, weight_decay=0.0)
    peft.train()
    peft_loss, peft_after = {}, {}
    for step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(peft, ids, tgt)
        loss.backward()
        opt.step()
        peft_loss[step] = loss.item()
        peft_after[step] = adapters(peft)
    peft.eval()
    same_a = all(np.array_equal(peft_after[1][n][0], a0[n]) for n in a0)
    check(same_a, f"{family}: PEFT's A after step 1 equals A0 (B0 = 0: no gradient to A)")
    ours2 = adapters(PeftModel.from_pretrained(load(cls, W("hf"), a.device), W("peft2")))
    for step, ours in ((1, ours1), (2, ours2)):
        worst_rel = 0.0
        for n, (pa, pb) in peft_after[step].items():
            oa, ob = ours[n]
            for o, p_, p0, what in ((oa, pa, a0[n], "A"), (ob, pb, 0.0 * pb, "B")):
                change = float(np.abs(p_ - p0).max())
                if change == 0.0:
                    if not np.array_equal(o, p_):
                        worst_rel = max(worst_rel, float("inf"))
                    continue
                worst_rel = max(worst_rel, float(np.abs(o - p_).max()) / change)
        check(worst_rel <= tol, f"{family}: adapters after step {step}: max |ours - PEFT| = "
              f"{worst_rel:.2e} x max |PEFT's change| (<= {tol:g})")
        lo, lp = ours_loss.get(step), peft_loss[step]
        check(lo is not None and abs(lo - lp) <= ltol,
              f"{family}: step {step} loss ours {lo} vs PEFT {lp:.6f} (<= {ltol:g})")

    # Our step-2 adapters in PEFT against our --merge export.
    with torch.no_grad():
        pm = PeftModel.from_pretrained(load(cls, W("hf"), a.device), W("peft2")).eval()
        lp = pm(input_ids=ids, use_cache=False).logits.float()
        merged = load(cls, W("merged"), a.device)
        lm = merged(input_ids=ids, use_cache=False).logits.float()
        base = load(cls, W("hf"), a.device)
        lb = base(input_ids=ids, use_cache=False).logits.float()
        d = float((lp - lm).abs().max())
        moved = float((lp - lb).abs().max())
        check(d <= 1e-4 and moved > 100 * max(d, 1e-6),
              f"{family}: PEFT logits with our step-2 adapters vs our --merge export: max abs "
              f"{d:.2e} (<= 1e-4; the adapters moved them by {moved:.3f})")
        pmerged = pm.merge_and_unload().state_dict()
        ms, bs = merged.state_dict(), base.state_dict()
        worst, untouched_ok, n_touched = 0.0, True, 0
        for k, v in ms.items():
            if k not in pmerged:
                continue
            if torch.equal(pmerged[k], bs[k]):  # PEFT left it: ours must have too
                untouched_ok &= torch.equal(v, bs[k])
            else:
                n_touched += 1
                worst = max(worst, float((pmerged[k] - v).abs().max()))
        check(n_touched == len(ours2) and worst <= 1e-5,
              f"{family}: our merged weights vs PEFT's merge_and_unload: {n_touched} merged "
              f"tensors, max abs {worst:.2e} (<= 1e-5)")
        check(untouched_ok, f"{family}: every other tensor of our merge equals the base's")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--family", default="both", choices=("llama", "gpt2", "both"))
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    print("torch", torch.__version__, "transformers", transformers.__version__, "peft",
          __import__("peft").__version__, "device", a.device, "precision", a.precision)
    for fam in (("llama", "gpt2") if a.family == "both" else (a.family,)):
        parity(fam, a, a.work)
    if fails:
        sys.exit(f"FAIL: {len(fails)} check(s): " + "; ".join(fails))
    print("PASS")


if __name__ == "__main__":
    main()
