"""hf_common.py - what the Hugging Face round trips on the GPU machine share
(hf_roundtrip.py, hf_llama_roundtrip.py): the SKIP where torch or
transformers does not import, the command line, the check/run helpers that
collect failures, shardtrain's CPU logits through the hf_logits driver, and
the closing summary.
"""
import argparse
import os
import subprocess
import sys

fails = []


def hf_imports(*names):
    """numpy, torch and the named transformers classes (a list, in order).

    Where any of them does not import (no torch, or a transformers too old
    for a class), prints SKIP and exits 0: not the machine for this check."""
    try:
        import numpy
        import torch
        import transformers
        return numpy, torch, [getattr(transformers, n) for n in names]
    except Exception as e:  # noqa: BLE001 - any import failure means: not this machine
        print(f"SKIP: torch/transformers not importable here ({e})")
        sys.exit(0)


def parse_args(torch):
    """--shardtrain PATH (required), --driver PATH, --keep; returns (args,
    driver path). The driver defaults to tests/hf_logits next to shardtrain.
    TF32 is turned off so the GPU reference logits are fp32 ones."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardtrain", required=True)
    ap.add_argument("--driver", default=None,
                    help="hf_logits (default: next to shardtrain in tests/)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    drv = a.driver or os.path.join(os.path.dirname(os.path.abspath(a.shardtrain)), "tests",
                                   "hf_logits")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return a, drv


def check(ok, msg):
    """Prints ok/FAIL and msg; a failure is kept for finish()."""
    print(("ok: " if ok else "FAIL: ") + msg, flush=True)
    if not ok:
        fails.append(msg)


def run(cmd):
    """Runs cmd (items str()-ed); on a nonzero exit prints the tails of its
    output and exits with a FAIL line naming the command."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(f"FAIL: {' '.join(map(str, cmd))} exited {r.returncode}")
    return r


def check_driver_logits(np, torch, drv, ckpt, ids, vocab, ref_cpu, W, label=""):
    """shardtrain's CPU logits of checkpoint `ckpt` on ids [B, T] (int64
    tensor) through the hf_logits driver, against HF's fp32 CPU logits
    ref_cpu [B, T, vocab]: max abs <= 1e-4. W(name) names the scratch files;
    label prefixes the message. A missing driver is a failure."""
    if not os.path.exists(drv):
        check(False, f"driver {drv} not found (build the tests, or pass --driver)")
        return
    B, T = ids.shape
    ids.numpy().astype(np.int32).tofile(W("ids.i32"))
    run([drv, ckpt, W("ids.i32"), B, T, W("st.f32")])
    st = torch.from_numpy(np.fromfile(W("st.f32"), dtype="<f4").reshape(B, T, vocab))
    d = float((st - ref_cpu).abs().max())
    check(d <= 1e-4, f"{label}shardtrain CPU logits of the import vs HF fp32 CPU: max abs "
                     f"diff {d:.3g} (<= 1e-4; logits span {float(ref_cpu.abs().max()):.3g})")


def finish(title):
    """Prints the summary line and exits 1 if any check failed, else 0."""
    print(f"{title}:", "FAILED " + "; ".join(fails) if fails else "all checks passed")
    sys.exit(1 if fails else 0)
