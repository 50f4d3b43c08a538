"""The two oracles for shardtrain's GPT-2 tokenizer, built from the same
encoder.json + vocab.bpe files the C code reads (no download):

  tiktoken: tiktoken.Encoding with mergeable ranks from those files
            (tiktoken.load.data_gym_to_mergeable_bpe_ranks) and the gpt2
            pattern from tiktoken_ext.openai_public;
  HF:       transformers' GPT2TokenizerFast(vocab_file, merges_file).

Invalid UTF-8 has no oracle of its own: tiktoken's private _encode_bytes
lumps everything after the first invalid byte into one BPE piece, and HF
takes only str (errors='replace' loses the bytes). shardtrain's rule is the
regex over each valid stretch and one piece per run of invalid bytes;
segmentwise() computes exactly that with tiktoken's public pieces
(encode_ordinary on the valid stretches, _encode_single_piece on the
invalid runs), so it is checked against tiktoken too.

    python3 oracle.py --tokenizer DIR --make-golden OUT.json   (needs the oracles)
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "tokenizer")
KNOWN = [("This is good.\n\n", [1212, 318, 922, 13, 628])]


def tiktoken_encoding(tok_dir):
    import tiktoken
    import tiktoken.load
    try:
        from tiktoken_ext.openai_public import r50k_pat_str as pat
    except ImportError:  # older tiktoken spelled the pattern inline
        pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(tok_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(tok_dir, "encoder.json"))
    return tiktoken.Encoding(name="gpt2-local", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def hf_tokenizer(tok_dir):
    """GPT2TokenizerFast.from_pretrained on the files under HF's names (the
    constructor's arguments changed names in transformers 5; this works in
    4 and 5 alike)."""
    import shutil
    import tempfile
    from transformers import GPT2TokenizerFast
    d = tempfile.mkdtemp(prefix="st_hf_tok_")
    shutil.copy(os.path.join(tok_dir, "encoder.json"), os.path.join(d, "vocab.json"))
    shutil.copy(os.path.join(tok_dir, "vocab.bpe"), os.path.join(d, "merges.txt"))
    tok = GPT2TokenizerFast.from_pretrained(d)
    shutil.rmtree(d)
    return tok


def hf_ordinary(hf, text):
    """HF ids with <|endoftext|> as plain text."""
    return hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def hf_special(hf, text):
    return hf(text, add_special_tokens=False)["input_ids"]


def segments(data):
    """[(valid: bool, bytes)] : maximal valid UTF-8 stretches and invalid runs."""
    out, i = [], 0
    while i < len(data):
        try:
            data[i:].decode("utf-8")
            out.append((True, data[i:]))
            break
        except UnicodeDecodeError as e:
            if e.start > 0:
                out.append((True, data[i:i + e.start]))
            bad = data[i + e.start:i + e.end]
            if out and not out[-1][0]:
                out[-1] = (False, out[-1][1] + bad)
            else:
                out.append((False, bad))
            i += e.end
    return out


def segmentwise(enc, data):
    ids = []
    for valid, seg in segments(data):
        ids += enc.encode_ordinary(seg.decode("utf-8")) if valid else enc._encode_single_piece(seg)
    return ids


def long_pieces():
    """Pre-tokens far longer than a word (the heap path of io/bpe_gpt2.c):
    runs of random letters, digits, symbols, spaces and newlines, and a KJV-like
    verse run together. Deterministic (seeded)."""
    import random
    rng = random.Random(13)
    parts = []
    for alphabet in ("etaoinshrdlu", "abcdefghijklmnopqrstuvwxyz", "0123456789", "!?.,;:-=+*#",
                     "ÄÖÜäöüßéèê", "аеиоуклмн", " ", "\n", " \t"):
        for n in (65, 300, 2000):
            parts.append("".join(rng.choice(alphabet) for _ in range(n)))
    parts.append("And God said Let there be light" .replace(" ", "") * 200)
    return "|".join(parts) + "\n"


def kjv_text():
    """The whole KJV as `bible -f` prints it (bible-kjv), or None."""
    import shutil
    import subprocess
    if not shutil.which("bible"):
        return None
    return subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True,
                          check=True).stdout


def ids_digest(ids):
    return hashlib.sha256(("\n".join(map(str, ids)) + "\n").encode()).hexdigest()


def make_golden(tok_dir, out):
    enc, hf = tiktoken_encoding(tok_dir), hf_tokenizer(tok_dir)
    sample = open(os.path.join(DATA, "sample.txt"), "rb").read()
    text = sample.decode("utf-8")
    inv = open(os.path.join(DATA, "invalid_utf8.bin"), "rb").read()
    g = {"files_sha256": {n: hashlib.sha256(open(os.path.join(tok_dir, n), "rb").read()).hexdigest()
                          for n in ("encoder.json", "vocab.bpe")},
         "made_with": {"tiktoken": __import__("tiktoken").__version__,
                       "transformers": __import__("transformers").__version__}}
    ordinary = enc.encode_ordinary(text)
    special = enc.encode(text, allowed_special="all")
    assert ordinary == hf_ordinary(hf, text), "tiktoken and HF disagree (ordinary)"
    assert special == hf_special(hf, text), "tiktoken and HF disagree (special)"
    g["sample.txt"] = {"ordinary": ordinary, "special": special}
    long = long_pieces()
    g["long_pieces"] = enc.encode_ordinary(long)
    assert g["long_pieces"] == hf_ordinary(hf, long), "tiktoken and HF disagree (long pieces)"
    g["invalid_utf8.bin"] = {"segmentwise": segmentwise(enc, inv),
                             "tiktoken_encode_bytes": enc._encode_bytes(inv)}
    kjv = kjv_text()
    if kjv is not None:
        ids = enc.encode_ordinary(kjv.decode("utf-8"))
        g["kjv"] = {"text_sha256": hashlib.sha256(kjv).hexdigest(), "bytes": len(kjv),
                    "tokens": len(ids), "ids_sha256": ids_digest(ids)}
    with open(out, "w") as f:
        json.dump(g, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--make-golden", required=True)
    p.add_argument("--oracle-path", default=os.path.join(REPO, ".cache", "oracle"))
    a = p.parse_args()
    sys.path.insert(0, a.oracle_path)
    make_golden(a.tokenizer, a.make_golden)
