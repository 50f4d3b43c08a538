"""busbw against message size, one line per collective, from the JSON lines of
`shardtrain bench collectives --json`; optionally the PyTorch peer's table
(`torchrun ... torch_busbw.py` output) on the same axes, dashed.

    /usr/bin/python3 bench/plot_busbw.py ST.jsonl OUT.png [--peer TORCH.txt] [--title T]

matplotlib from Debian (python3-matplotlib); writes a PNG, prints its path.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("results")
p.add_argument("out")
p.add_argument("--peer", help="torch_busbw.py output (op bytes time_us algbw busbw columns)")
p.add_argument("--title", default="")
a = p.parse_args()

rows = [json.loads(l) for l in open(a.results) if l.startswith("{")]
if not rows:
    raise SystemExit(f"{a.results}: no JSON result lines (run bench collectives with --json)")
fig, ax = plt.subplots(figsize=(8, 5))
ops = []
for r in rows:
    if r["op"] not in ops:
        ops.append(r["op"])
colors = {}
for op in ops:
    pts = sorted((r["bytes"], r["busbw_GBs"]) for r in rows if r["op"] == op)
    (line,) = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3,
                      label=f"shardtrain {op}")
    colors[op] = line.get_color()
if a.peer:
    peer = {}
    for l in open(a.peer):
        f = l.split()
        if len(f) == 5 and f[1].isdigit():
            peer.setdefault(f[0].replace("_", "-"), []).append((int(f[1]), float(f[4])))
    for op, pts in peer.items():
        pts.sort()
        ax.plot([x for x, _ in pts], [y for _, y in pts], ls="--", marker="x", ms=4,
                color=colors.get(op), label=f"PyTorch {op}")
n = rows[0]["ranks"]
ax.set_xscale("log", base=2)
ax.set_xlabel("total array size S (bytes)")
ax.set_ylabel("busbw (GB/s, nccl-tests definition)")
ax.set_title(a.title or f"{rows[0]['backend']}, {n} ranks")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(a.out, dpi=120)
print(a.out)
