"""Hugging Face round trip of the Llama family (run on the GPU machine).

    python3 tests/gpu/hf_llama_roundtrip.py --shardtrain build-gpu/shardtrain [--driver PATH]

Needs torch and transformers; where either does not import it prints SKIP
and exits 0. For each of
  smollm2-135m  LlamaForCausalLM at SmolLM2-135M's shape (30 layers, width 576,
                9 heads, 3 KV heads, FFN 1536, vocab 49152, tied, theta 100000)
  llama3-small  LlamaForCausalLM, 4 layers, width 512, 8 heads, 2 KV heads,
                FFN 1536, Llama 3's vocab 128256 and rope scaling (factor 32,
                low 1, high 4, original 8192), untied, theta 500000
  qwen2-small   Qwen2ForCausalLM, 4 layers, width 448, 7 heads, 1 KV head,
                FFN 1216, vocab 151936, q/k/v biases, tied, theta 1e6
(random weights, RMSNorm gains and biases included, saved with
save_pretrained):
 1. shardtrain ckpt import, then ckpt export --dtype fp32 and --dtype bf16;
 2. each export reloaded with from_pretrained: every tensor equal to the
    original's (fp32) or the original rounded to bf16, and fp32 logits on a
    fixed [2, 64] batch within 1e-4 (max abs) of the original's;
 3. shardtrain's CPU logits of the import (tests/hf_logits, built next to
    shardtrain) against HF's fp32 CPU logits (eager attention): max abs <= 1e-4.
Prints every figure; exits 1 on any failure.
"""
import inspect
import os
import shutil
import tempfile

from hf_common import check, check_driver_logits, finish, hf_imports, parse_args, run

np, torch, (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM) = hf_imports(
    "LlamaConfig", "LlamaForCausalLM", "Qwen2Config", "Qwen2ForCausalLM")
a, drv = parse_args(torch)


def config(cls, theta, scaling, **kw):
    """transformers 5 takes rope_parameters, 4 rope_theta + rope_scaling."""
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:
        p = {"rope_type": "default"} if scaling is None else dict(scaling)
        p["rope_theta"] = theta
        kw["rope_parameters"] = p
    else:
        kw.update(rope_theta=theta, rope_scaling=scaling)
    return cls(attention_dropout=0.0, hidden_act="silu", **kw)


def eager(m):
    try:
        m.set_attn_implementation("eager")
    except AttributeError:
        pass
    return m.eval()


MODELS = [
    ("smollm2-135m", LlamaForCausalLM, lambda: config(
        LlamaConfig, 100000.0, None, hidden_size=576, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
        max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    ("llama3-small", LlamaForCausalLM, lambda: config(
        LlamaConfig, 500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=1536, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009])),
    ("qwen2-small", Qwen2ForCausalLM, lambda: config(
        Qwen2Config, 1000000.0, None, hidden_size=448, num_hidden_layers=4,
        num_attention_heads=7, num_key_value_heads=1, intermediate_size=1216,
        vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False)),
]

work = tempfile.mkdtemp(prefix="hf_llama_roundtrip_")
dev = "cuda" if torch.cuda.is_available() else "cpu"
for name, cls, make_cfg in MODELS:
    W = lambda n: os.path.join(work, f"{name}_{n}")
    torch.manual_seed(0)
    cfg = make_cfg()
    model = eager(cls(cfg))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif n.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(W("src"))
    ids = torch.randint(0, cfg.vocab_size, (2, 64), generator=g)

    def logits(m, device):
        with torch.no_grad():
            return m.to(device)(ids.to(device), use_cache=False).logits.float().cpu()

    ref_dev, ref_cpu = logits(model, dev), logits(model, "cpu")
    run([a.shardtrain, "ckpt", "import", W("src"), "--out", W("run")])
    run([a.shardtrain, "ckpt", "export", W("run"), "--out", W("exp32")])
    run([a.shardtrain, "ckpt", "export", W("run"), "--out", W("exp16"), "--dtype", "bf16"])
    sd = {k: v.float().cpu() for k, v in model.state_dict().items()}

    m32 = eager(cls.from_pretrained(W("exp32")))
    s32 = m32.state_dict()
    check(set(s32) == set(sd) and all(torch.equal(s32[k].float().cpu(), v) for k, v in sd.items()),
          f"{name}: fp32 export reloaded by from_pretrained: every tensor equals the original's")
    d = float((logits(m32, dev) - ref_dev).abs().max())
    check(d <= 1e-4, f"{name}: fp32 export: logits max abs diff vs the original on {dev} = "
                     f"{d:.3g} (<= 1e-4)")
    m16 = cls.from_pretrained(W("exp16"))
    s16 = m16.state_dict()
    bf = torch.bfloat16
    check(all(torch.equal(s16[k].cpu().to(bf), v.to(bf)) for k, v in sd.items()),
          f"{name}: bf16 export: every tensor is the original rounded to bf16 "
          f"(reloaded as {next(m16.parameters()).dtype})")
    del m16, m32
    check_driver_logits(np, torch, drv, W("run"), ids, cfg.vocab_size, ref_cpu, W, f"{name}: ")
    if not a.keep:
        for n in ("src", "run", "exp32", "exp16"):
            shutil.rmtree(W(n), ignore_errors=True)

if not a.keep:
    shutil.rmtree(work, ignore_errors=True)
finish("hf_llama_roundtrip")
