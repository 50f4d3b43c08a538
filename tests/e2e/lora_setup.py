"""The work directory test_lora.py and test_qlora.py share: kjv.h5 (the
first 200 kB of the test corpus, 5% validation) and base/, llama-tiny
imported as the frozen base, plus the training arguments both runs use."""
import os
import shutil

from common import corpus_text, run

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "tests", "data", "hf", "llama-tiny")


def prepare(a):
    """Empties a.work and makes kjv.h5 and base/ in it. Returns W (a path
    under a.work) and the arguments every training run there takes: 8 steps
    of 4 x 32 tokens, micro-batch 1, a loss every step."""
    W = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    os.makedirs(a.work, exist_ok=True)
    for d in os.listdir(a.work):
        p = W(d)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    open(W("kjv.txt"), "w").write(corpus_text()[:200000])
    run([a.bin, "prep", "--input", W("kjv.txt"), "--out", W("kjv.h5"), "--val-fraction", "0.05"])
    run([a.bin, "ckpt", "import", MODEL, "--out", W("base")])
    common = ["--data", W("kjv.h5"), "--seq-len", 32, "--micro-batch", 1, "--global-batch", 4,
              "--steps", 8, "--lr", 3e-3, "--warmup", 2, "--log-every", 1, "--val-seqs", 4]
    return W, common
