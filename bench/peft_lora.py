"""PyTorch peer for the LoRA benchmark: Hugging Face transformers + PEFT.

A randomly initialised transformers model at one of shardtrain's preset
shapes (rank/model/config.c: the same layers, width, heads, KV heads, MLP
width, vocabulary, tied head, rotary base and Llama 3 scaling), its weights
in bf16 (frozen), SDPA attention, PEFT LoRA adapters (LoraConfig with the
same r, alpha, dropout and targets as `shardtrain train --lora`; PEFT keeps
them in fp32), bf16 autocast, AdamW on the adapters only (betas 0.9/0.95,
eps 1e-8, weight decay 0.1, gradient clipping 1.0: shardtrain's defaults),
optional gradient checkpointing, uniform random tokens. This is how a PEFT
user fine-tunes (the Trainer's bf16=True); a benchmark peer, not a test.

    python3 bench/peft_lora.py --preset llama-3.2-1b --batch 4 --seq 2048 \
        --rank 16 --alpha 32 --targets q,v --steps 20 --warmup 5 [--ckpt 1] \
        [--mem-gib 24]

--targets takes shardtrain's names (GPT-2 qkv,o,up,down; Llama/Qwen2
q,k,v,o,gate,up,down). --mem-gib G caps this process with
torch.cuda.set_per_process_memory_fraction(G GiB / the device's total).
Prints progress on stderr and one JSON line on stdout:
{"tokens_per_s", "steps", "loss_first", "loss_last", "max_allocated_mib",
 ...}: tokens/s is B x T over the median step time of the steps after the
warmup; max_allocated_mib is torch's allocator peak (nvidia-smi's, for the
whole process, comes from smi_peak.sh around this script). Out of memory
prints the JSON line with "error" and exits 1.
--device cpu --dtype fp32 with a small --layers/--dim shape checks the
script without a GPU.
"""
import argparse
import inspect
import json
import math
import sys
import time

# name: (family, layers, heads, kv_heads, dim, ffn, vocab, max_pos, tied, theta, eps, llama3 factor)
PRESETS = {
    "gpt2-124m": ("gpt2", 12, 12, 12, 768, 3072, 50257, 1024, 1, 0, 1e-5, 0),
    "gpt2-350m": ("gpt2", 24, 16, 16, 1024, 4096, 50257, 1024, 1, 0, 1e-5, 0),
    "gpt2-774m": ("gpt2", 36, 20, 20, 1280, 5120, 50257, 1024, 1, 0, 1e-5, 0),
    "gpt2-1558m": ("gpt2", 48, 25, 25, 1600, 6400, 50257, 1024, 1, 0, 1e-5, 0),
    "llama-3.2-1b": ("llama", 16, 32, 8, 2048, 8192, 128256, 131072, 1, 500000.0, 1e-5, 32.0),
    "llama-3.2-3b": ("llama", 28, 24, 8, 3072, 8192, 128256, 131072, 1, 500000.0, 1e-5, 32.0),
    "llama-3.1-8b": ("llama", 32, 32, 8, 4096, 14336, 128256, 131072, 0, 500000.0, 1e-5, 8.0),
    "qwen2.5-0.5b": ("qwen2", 24, 14, 2, 896, 4864, 151936, 32768, 1, 1e6, 1e-6, 0),
    "qwen2.5-1.5b": ("qwen2", 28, 12, 2, 1536, 8960, 151936, 32768, 1, 1e6, 1e-6, 0),
    "smollm2-135m": ("llama", 30, 9, 3, 576, 1536, 49152, 8192, 1, 100000.0, 1e-5, 0),
    "smollm2-360m": ("llama", 32, 15, 5, 960, 2560, 49152, 8192, 1, 100000.0, 1e-5, 0),
}
# shardtrain target name -> PEFT module path under a layer (io/peft_names.c)
MODULES = {
    "gpt2": {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"},
    "llama": {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
              "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
              "down": "mlp.down_proj"},
}
MODULES["qwen2"] = MODULES["llama"]


def target_modules(family, targets):
    """LoraConfig.target_modules for our target names: the leaf names, or the
    module path where the leaf would also match an untargeted module (PEFT
    matches by suffix: GPT-2's attn.c_proj and mlp.c_proj). As
    io/peft_export.c writes them."""
    fam = MODULES[family]
    bad = [t for t in targets if t not in fam]
    if bad:
        sys.exit(f"peft_lora.py: --targets {','.join(bad)} not in {family}'s {','.join(fam)}")
    chosen = {fam[t] for t in targets}
    out = set()
    for m in chosen:
        leaf = m.rsplit(".", 1)[-1]
        clash = any(o != m and o.rsplit(".", 1)[-1] == leaf and o not in chosen
                    for o in fam.values())
        out.add(m if clash else leaf)
    return sorted(out)


def rope_kwargs(cls, theta, factor):
    """transformers 5 takes rope_parameters, transformers 4 rope_theta + rope_scaling."""
    scaling = None if not factor else {"rope_type": "llama3", "factor": factor,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:
        params = {"rope_type": "default"} if scaling is None else dict(scaling)
        params["rope_theta"] = theta
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": scaling}


def load_base(a, torch):
    """--base DIR: the model as from_pretrained gives it, in the storage dtype, SDPA."""
    import transformers
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.base, dtype=dt, attn_implementation="sdpa").to(a.device)
    c = model.config
    fam = {"gpt2": "gpt2", "qwen2": "qwen2"}.get(c.model_type, "llama")
    if fam == "gpt2":
        shape = dict(family=fam, layers=c.n_layer, heads=c.n_head, kv_heads=c.n_head,
                     dim=c.n_embd, ffn=c.n_inner or 4 * c.n_embd, vocab=c.vocab_size, tied=1)
    else:
        shape = dict(family=fam, layers=c.num_hidden_layers, heads=c.num_attention_heads,
                     kv_heads=c.num_key_value_heads, dim=c.hidden_size,
                     ffn=c.intermediate_size, vocab=c.vocab_size,
                     tied=int(bool(c.tie_word_embeddings)))
    return model, shape


def build_model(a, torch):
    import transformers
    if a.base:
        return load_base(a, torch)
    fam, L, H, KV, C, F, V, P, tied, theta, eps, factor = PRESETS[a.preset] if a.preset else \
        (a.family, 0, 0, 0, 0, 0, 0, 0, 1, 500000.0, 1e-5, 0)
    over = dict(layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, dim=a.dim, ffn=a.ffn,
                vocab=a.vocab)
    L, H, KV, C, F, V = [over[k] or d for k, d in zip(
        ("layers", "heads", "kv_heads", "dim", "ffn", "vocab"), (L, H, KV, C, F, V))]
    if a.tied is not None:
        tied = a.tied
    if not all((L, H, C)):
        sys.exit("peft_lora.py: give --preset or --layers/--heads/--dim")
    KV, F, V = KV or H, F or 4 * C, V or 50257
    P = max(P, a.seq)
    if fam == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_positions=P, n_embd=C, n_layer=L,
                                      n_head=H, n_inner=F, activation_function="gelu_new",
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      tie_word_embeddings=True)
        cls = transformers.GPT2LMHeadModel
    else:
        cls_cfg = transformers.Qwen2Config if fam == "qwen2" else transformers.LlamaConfig
        kw = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                  num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=P,
                  rms_norm_eps=eps, tie_word_embeddings=bool(tied), hidden_act="silu",
                  attention_dropout=0.0)
        kw.update(rope_kwargs(cls_cfg, theta, factor))
        cfg = cls_cfg(**kw)
        cls = transformers.Qwen2ForCausalLM if fam == "qwen2" else transformers.LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    torch.manual_seed(a.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)  # made in the storage dtype, on the device: no fp32 copy
    with torch.device(a.device):
        model = cls(cfg)
    torch.set_default_dtype(old)
    try:
        model.set_attn_implementation("sdpa")
    except (AttributeError, ValueError):
        pass
    shape = dict(family=fam, layers=L, heads=H, kv_heads=KV, dim=C, ffn=F, vocab=V, tied=tied)
    return model, shape


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--family", default="llama", choices=("gpt2", "llama", "qwen2"),
                   help="without --preset")
    for k in ("layers", "heads", "kv-heads", "dim", "ffn", "vocab"):
        p.add_argument("--" + k, type=int, default=0, help="override the preset's")
    p.add_argument("--tied", type=int, default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20, help="measured steps after the warmup")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=8.0, help="lora_alpha (8: PEFT's and ours)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--targets", default=None, help="ours: q,v (Llama) or qkv (GPT-2) by default")
    p.add_argument("--ckpt", type=int, default=0, help="1: gradient checkpointing")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--mem-gib", type=float, default=0, help="cap: set_per_process_memory_fraction")
    p.add_argument("--mem-fraction", type=float, default=0, help="the fraction itself")
    p.add_argument("--compile", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", default=None, help="a Hugging Face directory to start from "
                   "(from_pretrained, bf16) instead of a random init of the preset")
    p.add_argument("--save-base", default=None, help="write the random preset model "
                   "(bf16, save_pretrained) to this directory and exit")
    a = p.parse_args()

    import torch

    if a.save_base:
        a.device = "cpu" if not torch.cuda.is_available() else a.device
        model, shape = build_model(a, torch)
        model.save_pretrained(a.save_base)
        print(json.dumps(dict(saved=a.save_base, **shape)))
        return 0
    from peft import LoraConfig, get_peft_model

    cuda = a.device.startswith("cuda")
    frac = a.mem_fraction
    if cuda:  # set_per_process_memory_fraction wants an index, not "cuda"
        idx = torch.device(a.device).index
        idx = torch.cuda.current_device() if idx is None else idx
    if cuda and a.mem_gib:
        total = torch.cuda.get_device_properties(idx).total_memory
        frac = min(1.0, a.mem_gib * 2**30 / total)
    if cuda and frac:
        torch.cuda.set_per_process_memory_fraction(frac, idx)
    result = {"tokens_per_s": None, "steps": 0, "loss_first": None, "loss_last": None,
              "max_allocated_mib": None}
    try:
        model, shape = build_model(a, torch)
        fam = shape["family"]
        targets = (a.targets or ("qkv" if fam == "gpt2" else "q,v")).split(",")
        alpha = a.alpha
        lcfg = LoraConfig(r=a.rank, lora_alpha=alpha, lora_dropout=a.dropout, bias="none",
                          task_type="CAUSAL_LM", target_modules=target_modules(fam, targets),
                          fan_in_fan_out=fam == "gpt2")
        if a.ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model = get_peft_model(model, lcfg)
        train = [q for q in model.parameters() if q.requires_grad]
        n_train = sum(q.numel() for q in train)
        n_all = sum(q.numel() for q in model.parameters())
        adapter_dtypes = sorted({str(q.dtype) for q in train})
        opt = torch.optim.AdamW(train, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                **({"fused": True} if cuda else {}))
        fwd = torch.compile(model) if a.compile else model
        model.train()
        g = torch.Generator(device=a.device).manual_seed(a.seed + 1)
        V = shape["vocab"]
        times, losses = [], []
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for step in range(a.warmup + a.steps):
            idx = torch.randint(0, V, (a.batch, a.seq + 1), device=a.device, generator=g)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16,
                                enabled=a.dtype == "bf16"):
                logits = fwd(input_ids=idx[:, :-1], use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(train, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            del logits, loss
            if step >= a.warmup:
                times.append(dt)
            print(f"step {step + 1}: loss {losses[-1]:.4f}, {1e3 * dt:.1f} ms", file=sys.stderr)
        med = sorted(times)[len(times) // 2] if times else float("nan")
        result.update(tokens_per_s=round(a.batch * a.seq / med, 1) if times else None,
                      steps=len(losses), loss_first=losses[0], loss_last=losses[-1])
        if not all(math.isfinite(x) for x in losses):
            result["error"] = "non-finite loss"
    except torch.cuda.OutOfMemoryError as e:
        result["error"] = "out of memory: " + str(e).split("\n")[0][:200]
        shape, n_train, n_all, adapter_dtypes, targets = {}, None, None, [], a.targets
    if cuda:
        result["max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    result.update(preset=a.preset, **shape, batch=a.batch, seq=a.seq, rank=a.rank,
                  alpha=a.alpha,
                  targets=",".join(targets) if isinstance(targets, list) else targets,
                  ckpt=a.ckpt, mem_fraction=round(frac, 4) if frac else None,
                  trainable_params=n_train, params=n_all, adapter_dtypes=adapter_dtypes,
                  torch=torch.__version__, device=a.device)
    try:
        import peft
        import transformers
        result.update(peft=peft.__version__, transformers=transformers.__version__)
    except ImportError:
        pass
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
