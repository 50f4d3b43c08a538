"""Sampling speed of `shardtrain sample` against transformers' generate on
the same GPU and the same weights (run on the GPU machine, where torch and
transformers are installed):

    python3 bench/sample_vs_hf.py --bin build-gpu/shardtrain [--work /tmp/sample_bench]

A random GPT-2 124M (GPT2Config() defaults, torch.manual_seed(0), the
library's own init) is saved with save_pretrained into WORK/gpt2-124m, and
both sides load that directory. Batch 1, a 16-token prompt, greedy
(do_sample=False), use_cache=True, exactly 256 new tokens (no end-of-text
stop: eos_token_id None on the HF side, --ignore-eot
on ours), in bf16 and fp32 on both sides. HF is timed around generate()
with torch.cuda.synchronize(), best of --reps after one warm-up; ours from
the --json summary of `sample` (the process start and the weight load are
outside both timings). Prints, per precision, both rates in new tokens/s
(prefill included: 256 / wall time of the generation), our decode-only rate,
and the ratio ours / HF; and one JSON line per precision."""
import argparse
import json
import os
import subprocess
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NEW = 256


def make_model(path):
    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(path)


def hf_rate(path, prompt, dtype, reps):
    model = GPT2LMHeadModel.from_pretrained(path, dtype=dtype).cuda().eval()
    inp = torch.tensor([prompt], device="cuda")
    kw = dict(do_sample=False, max_new_tokens=NEW, use_cache=True,
              eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(inp))
    best = float("inf")
    with torch.no_grad():
        model.generate(inp, **kw)  # warm-up
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(inp, **kw)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    assert out.shape[1] == len(prompt) + NEW, out.shape
    del model
    torch.cuda.empty_cache()
    return NEW / best


def ours_rate(binary, path, prompt, precision, reps):
    best = None
    for _ in range(reps + 1):  # the first is a warm-up, as on the HF side
        r = subprocess.run([binary, "sample", "--init", path, "--device", "cuda", "--precision",
                            precision, "--prompt-ids", ",".join(map(str, prompt)), "--max-new",
                            str(NEW), "--temperature", "0", "--ignore-eot", "--print-ids",
                            "--json"], capture_output=True, text=True, check=True)
        s = json.loads(r.stderr.strip().splitlines()[-1])
        assert s["new_tokens"] == NEW, s
        if best is None or s["tokens_per_s"] > best["tokens_per_s"]:
            best = s
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--work", default="/tmp/sample_bench")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    path = os.path.join(a.work, "gpt2-124m")
    make_model(path)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 50257, (16,), generator=g).tolist()
    gpu = torch.cuda.get_device_name(0)
    for prec, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        hf = hf_rate(path, prompt, dt, a.reps)
        s = ours_rate(a.bin, path, prompt, prec, a.reps)
        ratio = s["tokens_per_s"] / hf
        print(f"{prec}: shardtrain {s['tokens_per_s']:.1f} tokens/s (decode "
              f"{s['decode_tokens_per_s']:.1f}, prefill {s['prefill_s'] * 1e3:.2f} ms), "
              f"transformers generate {hf:.1f} tokens/s, ratio {ratio:.2f} ({gpu}, GPT-2 124M, "
              f"batch 1, {NEW} new tokens)")
        print(json.dumps({"precision": prec, "shardtrain_tokens_per_s": s["tokens_per_s"],
                          "shardtrain_decode_tokens_per_s": s["decode_tokens_per_s"],
                          "hf_tokens_per_s": hf, "ratio": ratio, "gpu": gpu,
                          "torch": torch.__version__}))


if __name__ == "__main__":
    main()
