"""Tokens/s and scaling efficiency against the rank count, from the
scaling.json that `shardtrain bench train` writes (Debian's matplotlib).

    /usr/bin/python3 bench/plot_scaling.py OUT_DIR/scaling.json OUT.png [--title T]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("scaling")
p.add_argument("out")
p.add_argument("--title", default="shardtrain scaling")
a = p.parse_args()
res = json.load(open(a.scaling))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
for mode, rows in res.items():
    n = [r["ranks"] for r in rows]
    ax1.plot(n, [r["tokens_per_s"] for r in rows], marker="o", label=f"{mode} scaling")
    ax2.plot(n, [100 * r["efficiency"] for r in rows], marker="o", label=f"{mode} scaling")
first = res.get("weak") or next(iter(res.values()))  # the linear line from one mode's base
base = first[0]
n = [r["ranks"] for r in first]
ax1.plot(n, [base["tokens_per_s"] * k / base["ranks"] for k in n], ls="--", color="gray",
         label="linear")
ax1.set(xlabel="ranks", ylabel="tokens/s", xscale="log", yscale="log")
ax2.set(xlabel="ranks", ylabel="efficiency (%)", xscale="log", ylim=(0, 105))
for ax in (ax1, ax2):
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(a.title)
fig.tight_layout()
fig.savefig(a.out, dpi=120)
print(a.out)
