#!/usr/bin/env python3
"""Writes the fuzz seed corpus (fuzz/corpus/<target>/) from the repository's own valid inputs:
the bundled data set and tokenizer, tests/fixtures configs, and small hand-built safetensors files
and store frames. Run from anywhere; the output is committed, so this is only needed to change it."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


# ---- model directories (fuzz_model_dir: index JSON, NUL, shard; or a lone model.safetensors) ----
# The target's micro config: vocab 8, hidden 4, one full-attention layer (1 head of 2), MLP 4.
MICRO = [("embed_tokens.weight", [8, 4])] + [
    ("layers.0." + n, shape) for n, shape in [
        ("input_layernorm.weight", [4]), ("self_attn.q_proj.weight", [2, 4]),
        ("self_attn.q_norm.weight", [2]), ("self_attn.k_proj.weight", [2, 4]),
        ("self_attn.k_norm.weight", [2]), ("self_attn.v_proj.weight", [2, 4]),
        ("self_attn.o_proj.weight", [4, 2]), ("post_attention_layernorm.weight", [4]),
        ("pre_feedforward_layernorm.weight", [4]), ("mlp.gate_proj.weight", [4, 4]),
        ("mlp.up_proj.weight", [4, 4]), ("mlp.down_proj.weight", [4, 4]),
        ("post_feedforward_layernorm.weight", [4]), ("layer_scalar", [1])]] + [("norm.weight", [4])]


def micro_model(dtype, prefix="model.", drop=()):
    size = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    out = []
    for i, (name, shape) in enumerate(MICRO):
        if name in drop:
            continue
        n = 1
        for d in shape:
            n *= d
        raw = bytes((i * 7 + j) % 251 for j in range(n * size))
        out.append((prefix + name, dtype, shape, raw))
    return safetensors(out, metadata={"format": "pt"})


def index_for(names, shard="model-00001-of-00001.safetensors"):
    return json.dumps({"metadata": {"total_size": 0}, "weight_map": {n: shard for n in names}})


put("fuzz_model_dir", "single_bf16", micro_model("BF16"))
put("fuzz_model_dir", "single_multimodal_f16",
    micro_model("F16", prefix="model.language_model."))
names = ["model." + n for n, _ in MICRO]
put("fuzz_model_dir", "index_f32", index_for(names).encode() + b"\0" + micro_model("F32"))
put("fuzz_model_dir", "index_missing_shard",
    index_for(names, "model-00002-of-00002.safetensors").encode() + b"\0" + micro_model("F32"))
put("fuzz_model_dir", "no_layer_scalar",
    micro_model("BF16", drop=("layers.0.layer_scalar",)))

# ---- safetensors ----
f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
put("fuzz_safetensors", "f32_2x3.safetensors", safetensors([("w", "F32", [2, 3], f32)]))
put("fuzz_safetensors", "mixed_dtypes.safetensors", safetensors(
    [("a.bf16", "BF16", [2], struct.pack("<2H", 0x3f80, 0xc000)),
     ("b.f16", "F16", [1, 2], struct.pack("<2H", 0x3c00, 0x4000)),
     ("c.i64", "I64", [2], struct.pack("<2q", 5, -3)),
     ("d.bool", "BOOL", [3], b"\x00\x01\x01"),
     ("e.u8", "U8", [], b"\x07")],
    metadata={"format": "pt"}))
put("fuzz_safetensors", "empty_and_scalar.safetensors", safetensors(
    [("empty", "F32", [0, 4], b""), ("scalar", "F64", [], struct.pack("<d", 2.5))], pad=False))
put("fuzz_safetensors", "no_tensors.safetensors", safetensors([], metadata={}))

# ---- data set: one control byte (bit 0: .json array, bits 1-3: split, bit 4: custom field) ----
with open(os.path.join(ROOT, "data", "tiny_instruct", "train.jsonl"), encoding="utf-8") as f:
    lines = [next(f) for _ in range(4)]
put("fuzz_dataset", "dolly.jsonl", b"\x00" + "".join(lines).encode())
put("fuzz_dataset", "dolly_split.jsonl", b"\x02" + "".join(lines[:3]).encode())
records = [json.loads(l) for l in lines[:2]]
alpaca = [{"instruction": r["instruction"], "input": r.get("context", ""), "output": r["response"]}
          for r in records]
put("fuzz_dataset", "alpaca_array.json", b"\x05" + json.dumps(alpaca, indent=1).encode())
put("fuzz_dataset", "mixed_bad_lines.jsonl",
    b"\x00\xef\xbb\xbf" + b'{"instruction": "a", "response": "b"}\r\n\n  \nnot json\n[1]\n'
    b'{"instruction": 3, "response": "b"}\n{"instruction": "\\u00e9\\"}", "context": null, '
    b'"response": "x"}\n')
put("fuzz_dataset", "split_text.jsonl", b"\x10train[10%:-2]")
# Control byte kinds (fuzz_dataset.cpp): 0x41 CSV, 0x60 TSV, 0x21 JSON with --dataset-field data,
# 0x20 JSON Lines conversations.
put("fuzz_dataset", "dolly.csv",
    b"\x41instruction,context,response\r\n\"a, \"\"b\"\"\",,\"multi\nline\"\r\nq,NA,r\r\n")
put("fuzz_dataset", "dolly.tsv", b"\x60instruction\tresponse\nq\ta\n\"x\ty\"\tz\n")
put("fuzz_dataset", "field.json",
    b"\x21" + json.dumps({"version": 1, "data": alpaca + [{"instruction": "q", "response": "r"}]}).encode())
put("fuzz_dataset", "messages.jsonl", b"\x20" + "\n".join(json.dumps(m) for m in [
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                  {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]},
    {"messages": [{"from": "human", "value": "u"}, {"from": "gpt", "value": None}]},
    {"messages": []}]).encode())

# ---- parquet: the pyarrow-written fixtures (tools/make_dataset_fixtures.py) ----
import glob
import shutil
for f in sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "datasets", "parquet", "*.parquet"))):
    os.makedirs(os.path.join(OUT, "fuzz_parquet"), exist_ok=True)
    shutil.copy(f, os.path.join(OUT, "fuzz_parquet", os.path.basename(f)))

# ---- images: the small fixture files of tools/make_image_fixtures.py (one per layout) ----
for f in sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "images", "*"))):
    if not f.endswith(".safetensors") and os.path.getsize(f) < 8192:
        os.makedirs(os.path.join(OUT, "fuzz_image"), exist_ok=True)
        shutil.copy(f, os.path.join(OUT, "fuzz_image", os.path.basename(f)))

# ---- tokenizer: tokenizer.json NUL text NUL tokenizer_config.json ----
def small_tokenizer(src, keep_tokens):
    with open(src, encoding="utf-8") as f:
        d = json.load(f)
    vocab = {t: i for t, i in d["model"]["vocab"].items() if i < keep_tokens}
    d["model"]["vocab"] = vocab
    merges = []
    for m in d["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    d["model"]["merges"] = merges
    d["added_tokens"] = [t for t in d["added_tokens"] if t["id"] < keep_tokens]
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


with open(os.path.join(ROOT, "data", "tokenizer", "tokenizer_config.json"), encoding="utf-8") as f:
    tok_config = f.read()
bundled = small_tokenizer(os.path.join(ROOT, "data", "tokenizer", "tokenizer.json"), 400)
gemma = small_tokenizer(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "gemma_style",
                                     "tokenizer.json"), 400)
text = "Instruction: Name three colours.\nResponse: red, green and blue \u00e9\U0001F600 <bos>"
put("fuzz_tokenizer", "bundled_small", bundled + "\0" + text + "\0" + tok_config)
put("fuzz_tokenizer", "gemma_style_small", gemma + "\0" + text)
put("fuzz_tokenizer", "gemma_style_no_config", gemma + "\0" + "  leading   spaces\tand\ttabs\n")

# ---- config.json ----
for fixture in ("tiny_text", "tiny_mm"):
    with open(os.path.join(ROOT, "tests", "fixtures", fixture, "config.json"), "rb") as f:
        put("fuzz_config", fixture + ".json", f.read())
put("fuzz_config", "minimal_text.json", json.dumps({
    "model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "global_head_dim": 8, "hidden_size_per_layer_input": 0, "eos_token_id": [1, 106]}))

# ---- store requests: a stream of frames, each a 2-byte little-endian length then the payload ----
def s(x):
    return struct.pack("<I", len(x)) + x


def frames(*payloads):
    return b"".join(struct.pack("<H", len(p)) + p for p in payloads)


put("fuzz_store_protocol", "set_get", frames(b"\x01" + s(b"k") + s(b"v"),
                                              b"\x02" + s(b"k") + struct.pack("<q", 100)))
put("fuzz_store_protocol", "add_cas", frames(b"\x03" + s(b"n") + struct.pack("<q", 5),
                                              b"\x03" + s(b"n") + struct.pack("<q", -9),
                                              b"\x04" + s(b"n") + s(b"-4") + s(b"x")))
put("fuzz_store_protocol", "wait_check", frames(
    b"\x01" + s(b"a") + s(b""),
    b"\x05" + struct.pack("<I", 2) + s(b"a") + s(b"b") + struct.pack("<q", 10),
    b"\x06" + struct.pack("<I", 1) + s(b"a")))
