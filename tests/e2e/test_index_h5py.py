"""index.h5 is readable without shardtrain: h5py returns whole tensors that
equal the program's own parameters (dumped with --dump-params), and the
attributes DESIGN.md promises are present, among them the run's memory
plan (docs/memory.md): a JSON string whose total is what `shardtrain plan
--json` gives for the same configuration, also logged in metrics.jsonl."""
import json
import os

import h5py
import numpy as np

from common import check, corpus, parse_args, run, train

a = parse_args()
data = corpus(a)
out = os.path.join(a.work, "run")
dump = os.path.join(a.work, "params.f32")
# width 40, 5 heads, seq-len 24: partitions of 3 ranks cut through matrix rows
train(a, 3, ["--data", data, "--layers", 2, "--heads", 5, "--dim", 40, "--seq-len", 24,
             "--micro-batch", 2, "--global-batch", 6, "--steps", 5, "--zero", 1,
             "--out", out, "--dump-params", dump, "--val-seqs", 4])
step = open(os.path.join(out, "ckpt", "latest")).read().strip()
ckpt = os.path.join(out, "ckpt", step)
check(sorted(os.listdir(ckpt)) == ["index.h5", "rank_00000.h5", "rank_00001.h5", "rank_00002.h5"],
      "step directory holds index.h5 and one file per rank")

flat = np.fromfile(dump, dtype=np.float32)
C, L, T, Vp = 40, 2, 24, 256
names = [("wte.weight", (Vp, C)), ("wpe.weight", (T, C))]
for l in range(L):
    for n, s in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.qkv.weight", (3 * C, C)),
                 ("attn.qkv.bias", (3 * C,)), ("attn.proj.weight", (C, C)),
                 ("attn.proj.bias", (C,)), ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                 ("mlp.fc.weight", (4 * C, C)), ("mlp.fc.bias", (4 * C,)),
                 ("mlp.proj.weight", (C, 4 * C)), ("mlp.proj.bias", (C,))]:
        names.append((f"h.{l}.{n}", s))
names += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]

with h5py.File(os.path.join(ckpt, "index.h5"), "r") as f:
    off = 0
    for n, shape in names:
        x = f["params/" + n][...]
        check(x.shape == shape and x.dtype == np.float32, f"params/{n} has shape {shape}")
        want = flat[off:off + x.size].reshape(shape)
        check(np.array_equal(x, want), f"params/{n} equals the program's own tensor")
        for g in ("adam_m", "adam_v"):
            y = f[f"{g}/{n}"][...]
            check(y.shape == shape and np.all(np.isfinite(y)), f"{g}/{n} is whole and finite")
        off += x.size
    check(off == flat.size, f"index covers all {flat.size} parameters")
    at = f.attrs
    cfg = json.loads(at["config"])
    check(cfg["model"]["n_embd"] == C and cfg["train"]["global_batch"] == 6, "config JSON attribute")
    check(int(at["step"]) == 5 and int(at["world_size"]) == 3 and int(at["zero_stage"]) == 1,
          "step, world_size and zero_stage attributes")
    check(int(at["tokens_seen"]) == 5 * 6 * 24 and int(at["data_position"]) == 5 * 6 * 24,
          "tokens_seen and data_position attributes")
    check(len(at["rng_state"]) == 2, "rng_state attribute")
    plan = json.loads(at["memory_plan"])
    r = run([a.bin, "plan", "--device", "cpu", "--vocab-size", "256", "--ranks", "3",
             "--layers", "2", "--heads", "5", "--dim", "40", "--seq-len", "24",
             "--micro-batch", "2", "--global-batch", "6", "--zero", "1", "--json"])
    want = json.loads(r.stdout)["bytes"]["total"]
    check(plan["bytes"]["total"] == want and int(at["memory_planned_bytes"]) == want,
          f"memory_plan (JSON) and memory_planned_bytes attributes: {want} bytes, as plan --json")
    check(plan["config"]["ranks"] == 3 and plan["config"]["zero"] == 1,
          "memory_plan holds the run's configuration")
first = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
check(first["memory_plan"]["bytes"]["total"] == want, "metrics.jsonl starts with the memory plan")
with h5py.File(os.path.join(ckpt, "rank_00001.h5"), "r") as f:
    ds = [f["params"][k] for k in f["params"]]
    check(len(ds) > 0 and all(d.fletcher32 and d.chunks is not None for d in ds),
          "rank files are chunked with Fletcher-32")
