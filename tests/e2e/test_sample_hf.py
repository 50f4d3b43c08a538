"""sample and eval against transformers on the committed random GPT-2
(tests/data/hf/tiny; oracle/oracle.json holds transformers 5.17's outputs,
made by tests/fixtures/make_hf_gpt2.py):

- sample --temperature 0 from oracle's "prompt" gives exactly "greedy_20",
  the ids of generate(do_sample=False, max_new_tokens=20);
- the same from the run directory `ckpt import` makes of it and from the
  llm.c file `ckpt export --format llmc` writes of that;
- text mode without a tokenizer (vocabulary 1000): exit 2 naming --tokenizer;
- eval over eval_tokens.bin at --seq-len 16 and 32 gives
  "eval_mean_loss_by_seq_len" within 1e-5 relative, with the same token
  count (windows tokens[i*T : i*T+T] -> tokens[i*T+1 : i*T+T+1])."""
import argparse
import json
import os
import shutil
import subprocess
import sys

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mpirun", default="mpirun")
p.add_argument("--work", required=True)
a = p.parse_args()
HF = os.path.join(os.path.dirname(__file__), "..", "data", "hf")
MODEL = os.path.join(HF, "tiny")
oracle = json.load(open(os.path.join(HF, "oracle", "oracle.json")))


def run(cmd):
    e = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run([str(x) for x in cmd], capture_output=True, text=True, env=e)


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)
    print("ok:", msg)


r = run([a.bin, "sample", "--init", MODEL, "--device", "cpu", "--temperature", 0, "--max-new", 20,
         "--prompt-ids", ",".join(map(str, oracle["prompt"])), "--print-ids"])
if r.returncode != 0:
    sys.exit(f"FAIL: sample exit {r.returncode}: {r.stderr.strip()}")
got = [int(x) for x in r.stdout.strip().split(",")]
check(got == oracle["greedy_20"], f"greedy 20 ids equal generate(do_sample=False): {got}")

# The same weights through the other sources: a run directory made by
# ckpt import, and an llm.c model file made by ckpt export.
shutil.rmtree(a.work, ignore_errors=True)  # a rerun must not meet the last run's import
os.makedirs(a.work)
run_dir, llmc = os.path.join(a.work, "imported"), os.path.join(a.work, "tiny.llmc.bin")
steps = [[a.bin, "ckpt", "import", MODEL, "--out", run_dir],
         [a.bin, "ckpt", "export", run_dir, "--out", llmc, "--format", "llmc"]]
for cmd in steps:
    r = run(cmd)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(map(str, cmd[1:3]))} exit {r.returncode}: {r.stderr.strip()}")
for src in (run_dir, llmc):
    r = run([a.bin, "sample", "--init", src, "--device", "cpu", "--temperature", 0, "--max-new",
             20, "--prompt-ids", ",".join(map(str, oracle["prompt"])), "--print-ids"])
    ids = [int(x) for x in r.stdout.strip().split(",")] if r.returncode == 0 else r.stderr
    check(ids == oracle["greedy_20"], f"greedy 20 ids from {os.path.basename(src)} equal "
          f"generate's too")
r = run([a.bin, "sample", "--init", MODEL, "--device", "cpu", "--prompt", "hello"])
check(r.returncode == 2 and "--tokenizer" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      "text mode on a source without tokenizer files and a vocabulary of 1000: exit 2 naming "
      "--tokenizer: " + r.stderr.strip())

data = os.path.join(HF, "oracle", oracle["eval_file"])
for T, want in sorted(oracle["eval_mean_loss_by_seq_len"].items(), key=lambda kv: int(kv[0])):
    for mb in (1, 3):
        r = run([a.bin, "eval", "--init", MODEL, "--data", data, "--seq-len", T, "--micro-batch",
                 mb, "--device", "cpu", "--json"])
        if r.returncode != 0:
            sys.exit(f"FAIL: eval exit {r.returncode}: {r.stderr.strip()}")
        e = json.loads(r.stdout.strip().splitlines()[-1])
        rel = abs(e["loss"] - want["loss"]) / want["loss"]
        check(rel <= 1e-5 and e["tokens"] == want["tokens"],
              f"eval --seq-len {T} --micro-batch {mb}: loss {e['loss']:.8f} vs HF "
              f"{want['loss']:.8f} (relative {rel:.1e}), {e['tokens']} tokens")
