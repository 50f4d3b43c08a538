"""Issue 14's "done when" on the CPU: a Llama-shaped model imported from a
Hugging Face directory (tests/data/hf/llama-tiny: GQA 4/2, Llama 3 rope
scaling, SwiGLU, untied head, vocabulary 300, random weights saved by
transformers) is fine-tuned on 2 ranks at ZeRO 1, evaluated, sampled and
exported back, with the commands of README's "Fine-tuning" section (the
byte tokenizer here: the model's 300 ids hold the 256 bytes, and no
tokenizer download is needed).

- `ckpt import`, `prep` (bytes) and `eval` of the import: near ln(300);
- `train --init-from` 20 steps on 2 ranks, ZeRO 1: the loss falls;
- `eval --max-windows 16` measures what the trainer's validation measures
  (the first --val-seqs windows of /val at --seq-len): the same loss within
  1e-5; over 64 windows it is lower than before by more than 1.5 nats;
- `sample --temperature 0`: the same ids twice; every id a byte (< 256),
  the text mode output those bytes; the ids equal a greedy decode by HF's
  Llama forward in float64 numpy (hf_family.py) on the exported tensors,
  which checks the KV-cache decode with RoPE and GQA; the imported model
  (no tokenizer files, vocabulary 300) samples text with --tokenizer bytes
  and without it says to give --tokenizer (exit 2);
- `ckpt export --format hf`: config.json is LlamaForCausalLM with the
  shape, the rope scaling and the untied head; numpy's HF forward on the
  exported tensors gives the trainer's validation loss within 1e-5; a
  re-import evaluates to the run's loss bit for bit, and its export equals
  the first byte for byte;
- Qwen2 (tests/data/hf/qwen2-tiny: MQA, q/k/v biases, tied, vocabulary 260),
  shorter: import, 10 steps on 2 ranks, eval equal to the trainer's val
  loss, export as Qwen2ForCausalLM (tied, biases) whose HF forward gives
  that loss, and greedy ids equal to HF's on the export.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import corpus_text, parse_args, read_dir, run, train  # noqa: E402
from common import soft_check as check, soft_finish  # noqa: E402
from hf_family import reference_logits  # noqa: E402

a = parse_args()
REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "tests", "data", "hf", "llama-tiny")
W = lambda *p: os.path.join(a.work, *p)  # noqa: E731
T, VAL_SEQS, STEPS, V = 64, 16, 20, 300

open(W("kjv.txt"), "w").write(corpus_text())
run([a.bin, "prep", "--input", W("kjv.txt"), "--out", W("kjv.h5"), "--val-fraction", "0.05"])
r = run([a.bin, "ckpt", "import", MODEL, "--out", W("base")])
check("llama, 2 layers, 4 heads (2 KV)" in r.stdout, f"import: {r.stdout.strip()}")


def evaluate(src, windows=64):
    r = run([a.bin, "eval", "--init", src, "--data", W("kjv.h5"), "--seq-len", str(T),
             "--max-windows", str(windows), "--device", "cpu", "--json"])
    return json.loads(r.stdout.strip().splitlines()[-1])


def sample(src, *extra, expect_rc=0):
    return run([a.bin, "sample", "--init", src, "--prompt", "And God said", "--max-new", "24",
                "--temperature", "0", "--device", "cpu"] + list(extra), expect_rc=expect_rc)


def sample_bytes(src, *extra):
    """stdout as bytes: a random model's greedy bytes need not be UTF-8."""
    r = subprocess.run([a.bin, "sample", "--init", src, "--prompt", "And God said", "--max-new",
                        "24", "--temperature", "0", "--device", "cpu"] + list(extra),
                       capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return r.stdout if r.returncode == 0 else b""


before = evaluate(W("base"))
check(abs(before["loss"] - np.log(V)) < 0.5,
      f"the imported random model starts near ln({V}) = {np.log(V):.2f}: {before['loss']:.4f}")
train(a, 2, ["--init-from", W("base"), "--data", W("kjv.h5"), "--out", W("run"),
             "--seq-len", T, "--micro-batch", 4, "--global-batch", 8, "--zero", 1,
             "--steps", STEPS, "--lr", 3e-3, "--warmup", 5, "--log-every", 5,
             "--val-every", STEPS, "--val-seqs", VAL_SEQS])
metrics = [json.loads(l) for l in open(W("run", "metrics.jsonl"))]
loss = {m["step"]: m["loss"] for m in metrics if "loss" in m}
val = [m["val_loss"] for m in metrics if "val_loss" in m][-1]
check(loss[STEPS] < loss[1] - 1.5, f"{STEPS} steps on 2 ranks: loss {loss[1]:.4f} -> {loss[STEPS]:.4f}")

after = evaluate(W("run"))
check(after["tokens"] == before["tokens"] == 64 * T, f"eval read 64 windows of {T} tokens")
check(after["loss"] < before["loss"] - 1.5,
      f"the validation loss eval reports falls: {before['loss']:.4f} -> {after['loss']:.4f}")
same = evaluate(W("run"), VAL_SEQS)
check(abs(same["loss"] - val) <= 1e-5, f"eval over the trainer's {VAL_SEQS} validation windows: "
      f"{same['loss']:.8f}, the trainer's val loss {val:.8f}")

# sample: deterministic, bytes, and HF's greedy continuation.
r1 = sample(W("run"))
r2 = sample(W("run"))
check(r1.stdout == r2.stdout and len(r1.stdout.strip()) > 0,
      f"greedy sampling repeats: {r1.stdout.strip()!r}")
ids = [int(x) for x in sample(W("run"), "--print-ids").stdout.strip().split(",")]
check(len(ids) == 24 and all(0 <= i < 256 for i in ids), f"24 new ids, all bytes: {ids}")
raw = sample_bytes(W("run"))
check(raw == bytes(ids) + b"\n", "text mode writes exactly the bytes of those ids")

run([a.bin, "ckpt", "export", W("run"), "--out", W("export"), "--format", "hf"])
cfg = json.load(open(W("export", "config.json")))
rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
check(cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
      and cfg["intermediate_size"] == 96 and cfg["vocab_size"] == V
      and cfg["tie_word_embeddings"] is False and rp.get("rope_type") == "llama3"
      and rp.get("factor") == 8 and rp.get("original_max_position_embeddings") == 64,
      "export config.json: LlamaForCausalLM, 2 KV heads, FFN 96, vocab 300, llama3 x8 of 64, "
      "untied")
tens = read_dir(W("export"))
check("lm_head.weight" in tens and all(dt == "F32" for dt, _ in tens.values()),
      f"export holds {len(tens)} fp32 tensors with lm_head.weight")

PROMPT = list(b"And God said")


def greedy_gap(cfg, tens, ids):
    """None when ids are HF's greedy continuation of PROMPT (float64 numpy,
    the whole sequence each step), else the logit gap at the first other id."""
    seq = list(PROMPT)
    for i in ids:
        lg = reference_logits(cfg, tens, np.array([seq]))[0, -1]
        top = int(np.argmax(lg))
        if top != i:
            return float(lg[top] - lg[i])
        seq.append(top)
    return None


gap = greedy_gap(cfg, tens, ids)
check(gap is None or gap < 1e-4,
      "the run's greedy ids equal HF's Llama forward (float64 numpy) on the export"
      + ("" if gap is None else f" (first difference at a logit gap of {gap:.3g})"))
# The run's continuation is one pair repeated; the random import's changes
# its pattern mid-way (seen: 162, 191 x15, then 268/191), another check of
# the KV cache's rotary positions over 24 decode steps, ids past 255 included.
base_ids = [int(x) for x in
            sample(W("base"), "--tokenizer", "bytes", "--print-ids").stdout.strip().split(",")]
gap = greedy_gap(json.load(open(os.path.join(MODEL, "config.json"))), read_dir(MODEL), base_ids)
check(len(set(base_ids)) >= 3 and (gap is None or gap < 1e-4),
      f"the import's greedy ids {base_ids} equal HF's forward on {MODEL}"
      + ("" if gap is None else f" (first difference at a logit gap of {gap:.3g})"))



def hf_val_loss(cfg, tens):
    """HF's mean loss (float64 numpy) over the trainer's validation windows."""
    with h5py.File(W("kjv.h5"), "r") as f:
        v = f["val"][: VAL_SEQS * T + 1].astype(np.int64)
    x, y = v[:-1].reshape(VAL_SEQS, T), v[1:].reshape(VAL_SEQS, T)
    lg = reference_logits(cfg, tens, x)
    lg -= lg.max(-1, keepdims=True)
    return float(np.mean(np.log(np.exp(lg).sum(-1))
                         - np.take_along_axis(lg, y[..., None], -1)[..., 0]))


ce = hf_val_loss(cfg, tens)
check(abs(ce - val) <= 1e-5, f"HF's forward (float64) on the export: loss {ce:.8f} over the "
      f"validation windows, the trainer's {val:.8f}")

again = evaluate(W("export"))
check(again["loss"] == after["loss"], f"the export evaluates to the run's loss bit for bit: "
      f"{again['loss']!r} vs {after['loss']!r}")
run([a.bin, "ckpt", "import", W("export"), "--out", W("reimport")])
run([a.bin, "ckpt", "export", W("reimport"), "--out", W("export2"), "--format", "hf"])
check(open(W("export", "model.safetensors"), "rb").read()
      == open(W("export2", "model.safetensors"), "rb").read(),
      "import of the export, exported again: model.safetensors byte for byte")

# An imported model without tokenizer files: text needs --tokenizer.
r = sample(W("base"), expect_rc=None)
check(r.returncode == 2 and "--tokenizer" in r.stderr and r.stderr.count("\n") == 1,
      f"sample of the import without --tokenizer: exit 2, one line naming --tokenizer "
      f"(got {r.returncode}: {r.stderr.strip()[:160]})")
check(len(sample_bytes(W("base"), "--tokenizer", "bytes").strip()) > 0,
      "sample of the import with --tokenizer bytes writes text")

# Qwen2 (tests/data/hf/qwen2-tiny: MQA, q/k/v biases, tied head, vocabulary
# 260) through the same commands, shorter.
QWEN = os.path.join(REPO, "tests", "data", "hf", "qwen2-tiny")
run([a.bin, "ckpt", "import", QWEN, "--out", W("q_base")])
train(a, 2, ["--init-from", W("q_base"), "--data", W("kjv.h5"), "--out", W("q_run"),
             "--seq-len", T, "--micro-batch", 4, "--global-batch", 8, "--zero", 1,
             "--steps", 10, "--lr", 3e-3, "--warmup", 3, "--val-every", 10,
             "--val-seqs", VAL_SEQS])
qm = [json.loads(l) for l in open(W("q_run", "metrics.jsonl"))]
ql = {m["step"]: m["loss"] for m in qm if "loss" in m}
qval = [m["val_loss"] for m in qm if "val_loss" in m][-1]
check(ql[10] < ql[1] - 1.0, f"qwen2: 10 steps on 2 ranks: loss {ql[1]:.4f} -> {ql[10]:.4f}")
check(abs(evaluate(W("q_run"), VAL_SEQS)["loss"] - qval) <= 1e-5,
      f"qwen2: eval over the validation windows equals the trainer's {qval:.8f}")
run([a.bin, "ckpt", "export", W("q_run"), "--out", W("q_export"), "--format", "hf"])
qcfg = json.load(open(W("q_export", "config.json")))
qt = read_dir(W("q_export"))
check(qcfg["architectures"] == ["Qwen2ForCausalLM"] and qcfg["tie_word_embeddings"] is True
      and "lm_head.weight" not in qt and "model.layers.0.self_attn.k_proj.bias" in qt,
      "qwen2 export: Qwen2ForCausalLM, tied (no lm_head.weight), q/k/v biases")
check(abs(hf_val_loss(qcfg, qt) - qval) <= 1e-5,
      "qwen2: HF's forward (float64) on the export gives the trainer's val loss")
qids = [int(x) for x in sample(W("q_run"), "--print-ids", "--ignore-eot").stdout.strip().split(",")]
gap = greedy_gap(qcfg, qt, qids)
check(len(qids) == 24 and (gap is None or gap < 1e-4),
      f"qwen2: the run's greedy ids {qids} equal HF's forward on the export"
      + ("" if gap is None else f" (first difference at a logit gap of {gap:.3g})"))
soft_finish()
