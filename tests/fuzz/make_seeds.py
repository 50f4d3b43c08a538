"""Writes the seed inputs of the fuzz targets into corpus/NAME/seed-*
(tests/fuzz/README.md). Run from anywhere: python3 tests/fuzz/make_seeds.py.
Findings live beside them as corpus/NAME/crash-* (kept: ctest replays them).
Standard library only; the formats are written by hand from their specs."""
import base64, json, os, struct, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpt2_bytes import bytes_to_unicode  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CUT = b"\n--8<--\n"


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("safetensors", "f32", safetensors([("w", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6)),
                                       ("b", "F32", [3], f32(0.5, -1, 2))]))
put("safetensors", "bf16-f16-meta", safetensors(
    [("h.0.attn.c_attn.weight", "BF16", [2, 2], b"\x80\x3f\x00\x40\x40\x40\x80\x40"),
     ("ln", "F16", [2], b"\x00\x3c\x00\xc0")], {"format": "pt"}))
put("safetensors", "scalar-empty", safetensors([("s", "F32", [], f32(3)), ("e", "F32", [0], b"")]))

# config.json of each family, as transformers writes them
cfgs = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64,
             "vocab_size": 100, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
             "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 96,
              "max_position_embeddings": 128, "vocab_size": 300, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192},
              "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16"},
    "qwen2": {"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "hidden_size": 64, "intermediate_size": 128,
              "max_position_embeddings": 256, "vocab_size": 200, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "eos_token_id": 151643, "torch_dtype": "bfloat16"},
}
for k, v in cfgs.items():
    put("hf_config", k, json.dumps(v, indent=2).encode())


b2u = bytes_to_unicode()
merges = [("t", "h"), ("th", "e"), ("h", "e"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("an", "d")]
vocab = {b2u[b]: b for b in range(256)}
for a, b in merges:
    vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
vocab_json = json.dumps(vocab, ensure_ascii=False).encode()
merges_txt = ("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)).encode()
text = "And the men said: in the land of Nod,  3.14 \u00e9t\u00e9 \u4e16\u754c<|endoftext|>\xff".encode(
    "utf-8", "surrogatepass") + b"\xc3(\xa0\xa1 end"
put("tokenizer", "vocab-merges", b"\x00" + vocab_json + CUT + merges_txt + CUT + text)
put("tokenizer", "encoder-bpe", b"\x01" + vocab_json + CUT + merges_txt + CUT + text)
gpt2_pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
tok_json = {
    "version": "1.0",
    "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True,
                      "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": gpt2_pattern}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
              "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
              "merges": ["%s %s" % m for m in merges]},
}
put("tokenizer", "tokenizer-json", b"\x02" + json.dumps(tok_json, ensure_ascii=False).encode() +
    CUT + text)
nfc = os.path.join(HERE, "..", "data", "tokenizer", "qwen2_nfc", "tokenizer.json")
with open(nfc, "rb") as f:
    put("tokenizer", "qwen2-nfc-json", b"\x02" + f.read() + CUT + text)
ranks = [bytes([b]) for b in range(256)] + [b"th", b"he", b"the", b" t", b" the", b"in", b"an",
                                           b"and"]
rank_file = b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(ranks))
# the presets' special ids (128000.., 151643..) leave a hole in a rank file
# this small: refused, with the message; the layout 5 seed loads
put("tokenizer", "ranks-llama3", b"\x03" + rank_file + CUT + text)
put("tokenizer", "ranks-qwen", b"\x04" + rank_file + CUT + text)
put("tokenizer", "ranks-with-json", b"\x05" + json.dumps(
    {"added_tokens": [{"id": len(ranks), "content": "<|endoftext|>", "special": True}],
     "pre_tokenizer": {"type": "Split", "pattern": {"Regex": gpt2_pattern}}}).encode() + CUT +
    rank_file + CUT + text)

put("tokenizer", "shardtrain-tiktoken-json", b"\x06" + json.dumps(
    {"rank_file": "ranks.tiktoken", "preset": None, "pattern": gpt2_pattern,
     "special_tokens": {"<|endoftext|>": len(ranks)}}).encode() + CUT + rank_file + CUT + text)

# llm.c model file (llm.c train_gpt2.c): 256 int32 header, then fp32 params
L, H, C, V, Vp, T = 1, 2, 8, 10, 16, 4
hdr = [20240326, 3, T, V, L, H, C, Vp] + [0] * 248
sizes = [Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
         L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
params = b"".join(struct.pack("<%df" % n, *[(i % 7) * 0.01 for i in range(n)]) for n in sizes)
put("llmc", "fp32", struct.pack("<256i", *hdr) + params)
hdr5 = hdr[:]
hdr5[1] = 5
put("llmc", "bf16", struct.pack("<256i", *hdr5) + b"\x80\x3c" * (len(params) // 4))

# llm.c token shard (dev/data/data_common.py): 256 int32 header, then tokens
toks = [50256, 464, 1893, 318, 257, 1332, 13, 50256]
put("tokens_bin", "v1", struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253)) +
    struct.pack("<%dH" % len(toks), *toks))
put("tokens_bin", "v2", struct.pack("<256i", *([20240520, 2, len(toks)] + [0] * 253)) +
    struct.pack("<%dI" % len(toks), *[t + 100000 for t in toks]))

# a PEFT LoRA adapter of GPT-2 (peft's save_pretrained layout): config, cut, weights
C, r = 8, 2
peft_cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 4, "lora_dropout": 0.0, "bias": "none",
            "target_modules": ["c_attn", "c_fc"], "fan_in_fan_out": True, "use_rslora": False,
            "use_dora": False, "base_model_name_or_path": "gpt2", "task_type": "CAUSAL_LM"}
pre = "base_model.model.transformer.h.0."
peft_w = safetensors([(pre + "attn.c_attn.lora_A.weight", "F32", [r, C], f32(*[0.1] * (r * C))),
                      (pre + "attn.c_attn.lora_B.weight", "F32", [3 * C, r],
                       f32(*[0.2] * (3 * C * r))),
                      (pre + "mlp.c_fc.lora_A.weight", "BF16", [r, C], b"\x80\x3f" * (r * C)),
                      (pre + "mlp.c_fc.lora_B.weight", "BF16", [4 * C, r],
                       b"\x00\x40" * (4 * C * r))])
put("peft", "gpt2-lora", json.dumps(peft_cfg).encode() + CUT + peft_w)
llama_cfg = dict(peft_cfg, target_modules=["q_proj", "v_proj"], fan_in_fan_out=False)
pre = "base_model.model.model.layers.1."
put("peft", "llama-lora", json.dumps(llama_cfg).encode() + CUT + safetensors(
    [(pre + "self_attn.q_proj.lora_A.weight", "F16", [r, C], b"\x00\x3c" * (r * C)),
     (pre + "self_attn.q_proj.lora_B.weight", "F16", [C, r], b"\x00\x3c" * (C * r))]))

# a sharded model directory: the index, cut, its one shard
shard = safetensors([("wte.weight", "F32", [4, 2], f32(*range(8))),
                     ("ln_f.weight", "F32", [2], f32(1, 1))])
index = {"metadata": {"total_size": 40}, "weight_map": {
    "wte.weight": "model-00001-of-00001.safetensors",
    "ln_f.weight": "model-00001-of-00001.safetensors"}}
put("sf_dir", "index-one-shard", json.dumps(index).encode() + CUT + shard)

# lists of token shards (fuzz_shards writes a.bin, b.bin, c.bin beside them)
for i, lst in enumerate(["a.bin\n", "a.bin\n# two of the same width\n\n./a.bin\n",
                         "a.bin\nb.bin\n", "a.bin\nc.bin\n", "nope.bin\n", "*.bin\n"]):
    put("shards", "%02d" % i, lst.encode())

# ST_GEMM_CACHE files (kernels/gemm_cache.h)
algo = " ".join("%x" % (w * 0x1111) for w in range(8))
put("gemm_cache", "two-lines", (
    "st-gemm-1 NVIDIA_H200_cublasLt_130000 4 768 2304 32768 1 : %s\n"
    "st-gemm-1 other_gpu 2 5 6 : %s\n" % (algo, algo)).encode())

# command lines of train and plan, arguments cut by NUL
for i, args in enumerate([
        ["--model", "gpt2-124m", "--seq-len", "1024", "--micro-batch", "8", "--global-batch",
         "32", "--zero", "2", "--recompute", "selective", "--gpu-mem", "24GiB"],
        ["--arch", "llama", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--dim", "64",
         "--ffn-dim", "96", "--rope-theta", "500000", "--lr", "3e-4", "--steps", "10"],
        ["--model", "tiny", "--auto-fit-zero", "--gpu-mem", "1GiB", "--offload", "optimizer",
         "--attention", "auto", "--precision", "bf16", "--dump-grads", "2:h.0.*"],
        ["--fit", "--json", "--model", "gpt2-774m", "--ranks", "8", "--headroom", "5"]]):
    put("cli", "%02d" % i, b"\0".join(a.encode() for a in args))

for i, s in enumerate(["24GiB", "1.5GiB", "80GB", "4096", "64KiB", "8B", "3:7", "12", "auto",
                       "simt", "1", "0", "18446744073709551615", "0.5TiB"]):
    put("parse", "%02d" % i, s.encode())
