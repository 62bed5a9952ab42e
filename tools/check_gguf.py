#!/usr/bin/env python3
"""Check `slicetrain export --format gguf` against llama.cpp itself: its converter, its loader, its tokenizer, its logits.

Usage (from any directory; about a minute once llama-cpp-python is built):
    tools/.venv/bin/pip install -r tools/requirements-llama.txt   # builds llama.cpp from source: ~15 min on 2 cores
    tools/.venv/bin/python tools/check_gguf.py --bin build/slicetrain [--model DIR] [--work /tmp/gguf_check]

Needs tools/.venv (tools/requirements.txt) plus llama-cpp-python (tools/requirements-llama.txt; PyPI carries its
source only, with llama.cpp's tree vendored, so pip compiles it). The converter is llama.cpp's own
convert_hf_to_gguf.py and gguf-py from the same source distribution (pip download, no build).

What it does:
  1. The model: --model DIR (a Hugging Face Gemma 4 directory with tokenizer.json), or else a random Gemma4ForCausalLM
     made with transformers (seed 0): gemma4-tiny's shape but with the layer layout llama.cpp can run (its KV-shared
     layers read layer first_shared - 1 (full) and - 2 (sliding), as in E2B; see CheckLlamaCppKvSharing), and the
     bundled tokenizer (data/tokenizer) with vocab_size equal to its token count, then trained for 150 steps with
     `slicetrain finetune` on the bundled data (the checkpoint is what is exported).
  2. `slicetrain export --format gguf --quant Q` for f32, bf16, f16, q8_0, q6_k, q4_k_m and q4_0; the q4_k_m file must
     equal, tensor for tensor and byte for byte, what llama.cpp's llama-quantize (Q4_K_M, no importance matrix) makes
     of our f32 file.
  3. llama.cpp's converter on the same directory for f32, bf16, f16 and q8_0 (when the model's vocab_size equals its
     tokenizer's size; see the note printed otherwise): every metadata key and value
     (general.name, size_label and the like aside: the converter derives them from the directory's name), every tensor
     name, type, shape, order and byte must equal ours.
  4. llama-cpp-python loads each of our files; its tokenizer gives transformers' ids on a set of texts (special
     tokens included); its logits on a prompt match transformers' fp32 logits (relative L2 error, asserted for f32
     (1e-4) and bf16 (2e-2)); its greedy continuation (32 tokens from 6 prompts, ending at eos or <turn|>) agrees
     with transformers' and with `slicetrain generate` (fp32 model) token for token; the other formats' agreement with
     bf16 is printed, and so are q4_k_m's agreement with `slicetrain generate` and that of `slicetrain generate
     --weights-dtype q8_0` with its fp32 tokens and with llama.cpp's q8_0 file.
  5. LoRA (`--format gguf-lora`): a rank-8 adapter on every Linear layer but per_layer_model_projection trained here for 40 steps (or --adapter): our f32, bf16
     and q8_0 adapter files equal llama.cpp's convert_lora_to_gguf.py's; llama.cpp with the f32 base and our adapter,
     and llama.cpp with our merged export (`--format gguf --adapter`), match transformers with PEFT (logits within
     1e-4), and the merged file's greedy tokens equal `slicetrain generate --adapter`'s.
Prints one line per check and a summary table; exits non-zero on the first failed assertion.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
GEMMA_CHAT = ("{{ bos_token }}{% for message in messages %}<|turn>"
              "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
              "{{ message['content'] | trim }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}")
# Every Linear layer but per_layer_model_projection, whose adapter llama.cpp would ignore (export refuses it).
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,per_layer_input_gate,per_layer_projection"
PROMPTS = ["Instruction: Name three colors.\nResponse:", "The quick brown fox", "Once upon a time",
           "<|turn>user\nWhat is a GPU?<turn|>\n<|turn>model\n", "1 2 3 4 5", "Write a haiku about rain."]
TEXTS = PROMPTS + ["  leading spaces and\ttabs\n\nnewlines", "Ünïcödé — ümlauts, 中文, emoji 🙂",
                   "<bos>literal specials<eos> and <unk>", "numbers 1234567890 and symbols !@#$%^&*()"]


def make_model(out: Path) -> Path:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    tok_dir = ROOT / "data/tokenizer"
    tj = json.loads((tok_dir / "tokenizer.json").read_text())
    n = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj["added_tokens"]]) + 1
    S, F = "sliding_attention", "full_attention"
    cfg = Gemma4TextConfig(
        vocab_size=n, vocab_size_per_layer_input=n, hidden_size=128, intermediate_size=512, num_hidden_layers=6,
        layer_types=[S, S, S, F, S, F], num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        hidden_size_per_layer_input=32, num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=64,
        max_position_embeddings=4096, final_logit_softcapping=30.0, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        tie_word_embeddings=True,
        rope_parameters={S: {"rope_type": "default", "rope_theta": 10000.0},
                         F: {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}})
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 and a layer scalar away from 1, so that a misplaced one shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.9)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out / f)
    # A template in the directory, so that the converter writes one too (without one, slicetrain writes its built-in
    # gemma-chat template and the converter none).
    (out / "chat_template.jinja").write_text(GEMMA_CHAT)
    return out


def train(binary: str, model: Path, work: Path) -> Path:
    """150 steps of `slicetrain finetune` on the bundled data: a random model's logits are nearly flat, so that greedy
    comparisons would flip on rounding noise; a trained one's are not."""
    subprocess.run([binary, "finetune", "--model-id", str(model), "--max-steps", "150", "--lr", "2e-3",
                    "--storage-path", str(work / "runs"), "--run-name", "gguf_check"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = sorted((work / "runs/gguf_check").glob("checkpoint_*"))[-1]
    shutil.copy(model / "chat_template.jinja", ckpt / "chat_template.jinja")
    return ckpt


def llama_cpp_source(work: Path) -> Path:
    """The llama.cpp tree inside llama-cpp-python's source distribution (downloaded once)."""
    dest = work / "llama_cpp_src"
    tree = next(dest.glob("llama_cpp_python-*/vendor/llama.cpp"), None) if dest.exists() else None
    if tree is None:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON, "--no-binary", ":all:",
                        "--no-deps", "-d", str(dest)], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(next(dest.glob("llama_cpp_python-*.tar.gz"))) as t:
            t.extractall(dest, filter="data")
        tree = next(dest.glob("llama_cpp_python-*/vendor/llama.cpp"))
    return tree


def read_gguf(path: Path, gguf_mod):
    r = gguf_mod.GGUFReader(str(path))
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        t = f.types
        if t[0] == gguf_mod.GGUFValueType.ARRAY:
            if t[-1] == gguf_mod.GGUFValueType.STRING:
                v = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
            else:
                v = [f.parts[i].tolist() for i in f.data]
        elif t[0] == gguf_mod.GGUFValueType.STRING:
            v = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
        else:
            v = f.parts[f.data[0]].tolist()
        meta[k] = ([x.name for x in t], v)
    tensors = [(t.name, t.tensor_type.name, [int(x) for x in t.shape], bytes(np.asarray(t.data).tobytes()))
               for t in r.tensors]
    return meta, tensors


def compare_with_converter(ours: Path, ref: Path, gguf_mod, special_added: set) -> int:
    """Asserts equality; returns how many token types differ in the one known way (see the docstring's note)."""
    m1, t1 = read_gguf(ours, gguf_mod)
    m2, t2 = read_gguf(ref, gguf_mod)
    # The converter derives general.name, size_label, basename, version, finetune from the directory's name.
    kept = {"general.architecture", "general.type", "general.file_type", "general.quantization_version"}
    k1 = [k for k in m1 if not k.startswith("general.") or k in kept]
    k2 = [k for k in m2 if not k.startswith("general.") or k in kept]
    assert k1 == k2, f"metadata keys differ:\n ours {k1}\n ref  {k2}"
    control_not_normal = 0
    for k in k1:
        if k == "tokenizer.ggml.token_type":
            # The converter marks CONTROL only the specials transformers names (bos, eos, unk, pad, mask); slicetrain
            # marks every added token tokenizer.json flags "special" (<|turn>, <turn|>, ...), without which llama.cpp
            # splits "<|turn>" in a prompt into pieces instead of reading the token (checked below).
            a, b = m1[k][1], m2[k][1]
            assert len(a) == len(b)
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    assert x == [3] and y == [1] and i in special_added, f"token {i}: type {x} (ours), {y} (ref)"
                    control_not_normal += 1
            continue
        assert m1[k] == m2[k], f"metadata {k} differs: ours {str(m1[k])[:300]} ref {str(m2[k])[:300]}"
    assert [t[:3] for t in t1] == [t[:3] for t in t2], "tensor names, types or shapes differ"
    for a, b in zip(t1, t2):
        assert a[3] == b[3], f"tensor {a[0]} ({a[1]}) bytes differ"
    return control_not_normal


def compare_with_quantize(ours: Path, ref: Path, gguf_mod) -> dict:
    """Asserts that our q4_k_m file equals llama-quantize's Q4_K_M of our f32 file: every metadata value, every tensor's
    type, shape and bytes (llama-quantize orders the tensors by layer, we by name; compared by name). Returns the
    tensor count per type."""
    m1, t1 = read_gguf(ours, gguf_mod)
    m2, t2 = read_gguf(ref, gguf_mod)
    assert sorted(m1) == sorted(m2), f"metadata keys differ:\n ours {sorted(m1)}\n ref  {sorted(m2)}"
    for k in m1:
        assert m1[k] == m2[k], f"metadata {k} differs: ours {str(m1[k])[:300]} ref {str(m2[k])[:300]}"
    by_name = {t[0]: t for t in t2}
    assert sorted(by_name) == sorted(t[0] for t in t1), "tensor names differ"
    types = {}
    for t in t1:
        r = by_name[t[0]]
        assert t[1:3] == r[1:3], f"tensor {t[0]}: ours {t[1:3]}, llama-quantize {r[1:3]}"
        assert t[3] == r[3], f"tensor {t[0]} ({t[1]}) bytes differ from llama-quantize's"
        types[t[1]] = types.get(t[1], 0) + 1
    return types


def llama_quantize(src: Path, dst: Path, ftype: int) -> None:
    """llama.cpp's llama-quantize (llama_model_quantize through llama-cpp-python's bindings), no importance matrix."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    assert rc == 0, f"llama_model_quantize failed ({rc})"


def AutoTokenizerFor(model_dir: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)


def hf_greedy(model, ids, n, stop):
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=sorted(stop))
    return out[0, len(ids):].tolist()


def llama_greedy(llm, prompt_ids, n, stop):
    """llama.cpp's greedy continuation of each prompt: up to n tokens, ending at a stop token."""
    out = []
    for ids in prompt_ids:
        toks = []
        for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            toks.append(t)
            if len(toks) == n or t in stop:
                break
        out.append(toks)
    return out


def slicetrain_greedy(args, model_dir: Path, prompt_ids, weights_dtype: str, adapter=None) -> list:
    """`slicetrain generate` greedy continuations (token ids) of each prompt."""
    extra = ["--adapter", str(adapter)] if adapter else []
    out = []
    for ids in prompt_ids:
        r = subprocess.run([args.bin, "generate", "--model-id", str(model_dir), *extra, "--weights-dtype", weights_dtype,
                            "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(args.new_tokens),
                            "--threads", "2", "--json"], capture_output=True, text=True, check=True)
        out.append(json.loads(r.stdout.strip().splitlines()[-1])["token_ids"])
    return out


def agreement(xs, ys) -> float:
    """Position-wise agreement of greedy continuations (each ends at eos or after n tokens)."""
    same = sum(a == b for x, y in zip(xs, ys) for a, b in zip(x, y))
    return same / sum(max(len(x), len(y)) for x, y in zip(xs, ys))


def check_lora(args, work: Path, model_dir: Path, tree: Path, gguf_src, env, tok, prompt_ids, stop, base_f32: Path):
    """5. --format gguf-lora: our adapter file against llama.cpp's convert_lora_to_gguf.py, and llama.cpp running the
    base with it against the merged model (ours, in llama.cpp) and transformers with PEFT."""
    import torch
    from llama_cpp import Llama
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    if args.adapter:
        adapter = Path(args.adapter)
    elif args.model:
        print("lora: skipped (--model without --adapter)")
        return
    else:
        subprocess.run([args.bin, "finetune", "--model-id", str(model_dir), "--lora-rank", "8",
                        "--lora-target-modules", LORA_TARGETS, "--max-steps", "40", "--lr", "3e-3",
                        "--storage-path", str(work / "out/runs"), "--run-name", "gguf_check_lora"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        adapter = sorted((work / "out/runs/gguf_check_lora").glob("checkpoint_*"))[-1]
    files = {}
    for q in ("f32", "bf16", "q8_0"):
        files[q] = work / f"out/ours_lora_{q}.gguf"
        r = subprocess.run([args.bin, "export", "--model-id", str(model_dir), "--adapter", str(adapter), "--format",
                            "gguf-lora", "--quant", q, "--output", str(files[q])], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ref = work / f"out/ref_lora_{q}.gguf"
        subprocess.run([sys.executable, str(tree / "convert_lora_to_gguf.py"), str(adapter), "--base", str(model_dir),
                        "--outfile", str(ref), "--outtype", q], check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        compare_with_converter(files[q], ref, gguf_src, set())
        print(f"lora converter {q}: metadata and every tensor byte equal llama.cpp's convert_lora_to_gguf.py")
    merged = work / "out/ours_merged_f32.gguf"
    r = subprocess.run([args.bin, "export", "--model-id", str(model_dir), "--adapter", str(adapter), "--format",
                        "gguf", "--quant", "f32", "--output", str(merged)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        ref_logits = peft_model(torch.tensor([prompt_ids[0]])).logits[0].numpy()
    def run(path, lora=None):
        kw = dict(lora_path=str(lora)) if lora else {}
        llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=2, seed=0, **kw)
        llm.eval(prompt_ids[0])
        lg = np.array(llm.scores[:len(prompt_ids[0])], dtype=np.float64)
        return lg, llama_greedy(llm, prompt_ids, args.new_tokens, stop)
    rel = lambda a: float(np.linalg.norm(a - ref_logits) / np.linalg.norm(ref_logits))
    lg_m, tok_m = run(merged)
    st_tokens = slicetrain_greedy(args, model_dir, prompt_ids, "fp32", adapter)
    print(f"lora merged f32 in llama.cpp: logits vs transformers+PEFT rel. L2 error {rel(lg_m):.2e}, greedy tokens "
          f"= slicetrain generate --adapter: {100 * agreement(tok_m, st_tokens):.1f} %")
    assert rel(lg_m) < 1e-4 and agreement(tok_m, st_tokens) == 1.0
    for q, path in files.items():
        lg, toks = run(base_f32, path)
        print(f"lora {q:5s} on the f32 base in llama.cpp: {path.stat().st_size / 1e6:.2f} MB, logits vs "
              f"transformers+PEFT rel. L2 error {rel(lg):.2e}, greedy tokens = the merged model's "
              f"{100 * agreement(toks, tok_m):.1f} %")
        if q == "f32":
            assert rel(lg) < 1e-4, "llama.cpp's base + f32 LoRA differs from transformers+PEFT"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build/slicetrain"))
    ap.add_argument("--model", help="Hugging Face Gemma 4 directory (default: a random tiny one, see above)")
    ap.add_argument("--work", default="/tmp/slicetrain_gguf_check")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--adapter", help="PEFT LoRA adapter of --model for the LoRA checks (default: one trained here "
                                      "on the default model; none with --model)")
    args = ap.parse_args()
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work / "out", ignore_errors=True)
    (work / "out").mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model) if args.model else train(args.bin, make_model(work / "out/model"), work / "out")

    # 2. Our files.
    ours = {}
    for q in ("f32", "bf16", "f16", "q8_0", "q6_k", "q4_k_m", "q4_0"):
        path = work / f"out/ours_{q}.gguf"
        r = subprocess.run([args.bin, "export", "--model-id", str(model_dir), "--format", "gguf", "--quant", q,
                            "--output", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ours[q] = path
        print(f"export {q}: {r.stdout.splitlines()[0]}")

    # 3. llama.cpp's converter, from the same source distribution.
    tree = llama_cpp_source(work)
    sys.path.insert(0, str(tree / "gguf-py"))
    import gguf as gguf_src  # llama.cpp's gguf-py, as the converter uses it
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"))
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    special_added = {a["id"] for a in tj["added_tokens"] if a.get("special")}
    n_rows = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    n_tokens = len(AutoTokenizerFor(model_dir))
    converter_formats = ("f32", "bf16", "f16", "q8_0") if n_rows == n_tokens else ()
    if not converter_formats:
        print(f"converter: not compared: the model has {n_rows} embedding rows and its tokenizer {n_tokens} tokens; "
              f"llama.cpp's converter cuts token_embd to the tokenizer's size (a file llama.cpp then refuses to load), "
              f"slicetrain pads the vocabulary with [PAD<id>] tokens up to the rows")
    for q in converter_formats:
        ref = work / f"out/ref_{q}.gguf"
        subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(ref),
                        "--outtype", q], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        n = compare_with_converter(ours[q], ref, gguf_src, special_added)
        print(f"converter {q}: metadata and every tensor byte equal llama.cpp's convert_hf_to_gguf.py "
              f"(but {n} added special tokens typed CONTROL, not NORMAL)")

    # llama-quantize's Q4_K_M (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15) of our f32 file.
    ref = work / "out/ref_q4_k_m.gguf"
    llama_quantize(ours["f32"], ref, 15)
    types = compare_with_quantize(ours["q4_k_m"], ref, gguf_src)
    print(f"llama-quantize q4_k_m: metadata and every tensor byte equal ours ({types})")

    # 4. llama.cpp runs our files.
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    # Every generator stops at eos and at Gemma 4's end of turn (slicetrain and llama.cpp both do).
    stop = {tok.eos_token_id} | ({tok.convert_tokens_to_ids("<turn|>")} if "<turn|>" in tok.get_vocab() else set())
    hf_tokens = [hf_greedy(hf, ids, args.new_tokens, stop) for ids in prompt_ids]
    st_tokens = slicetrain_greedy(args, model_dir, prompt_ids, "fp32")
    agree_st = agreement(st_tokens, hf_tokens)
    print(f"slicetrain generate vs transformers (greedy, fp32): {100 * agree_st:.1f} % of tokens agree")
    with torch.no_grad():
        ref_logits = hf(torch.tensor([prompt_ids[0]])).logits[0].numpy()

    # llama.cpp's gemma4 tokenizer splits at newlines before merging (Gemma 4's vocabulary has no token joining a
    # newline with other text); a tokenizer that has such tokens is compared on texts without newlines only.
    vocab = tok.get_vocab()
    newline_joining = sum(1 for t in vocab if "\n" in t and set(t) != {"\n"})
    newline_texts_differing = 0
    rows = []
    greedy = {}
    for q, path in ours.items():
        llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=2, seed=0)
        for text in TEXTS:
            a = llm.tokenize(text.encode(), add_bos=True, special=True)
            b = tok(text)["input_ids"]
            if "\n" in text and newline_joining:
                newline_texts_differing += (a != b) and q == "f32"
                continue
            assert a == b, f"{q}: llama.cpp tokenizes {text!r} as {a}, transformers as {b}"
        llm.reset()
        llm.eval(prompt_ids[0])
        lg = np.array(llm.scores[:len(prompt_ids[0])], dtype=np.float64)
        rel = float(np.linalg.norm(lg - ref_logits) / np.linalg.norm(ref_logits))
        toks = llama_greedy(llm, prompt_ids, args.new_tokens, stop)
        greedy[q] = toks
        agree_hf = agreement(toks, hf_tokens)
        rows.append((q, path.stat().st_size, rel, agree_hf))
        del llm
    for q, size, rel, agree in rows:
        vs_bf16 = agreement(greedy[q], greedy["bf16"])
        print(f"llama.cpp {q:5s}: {size / 1e6:6.2f} MB, logits vs transformers fp32 rel. L2 error {rel:.2e}, "
              f"greedy tokens agreeing with transformers {100 * agree:5.1f} %, with llama.cpp bf16 {100 * vs_bf16:5.1f} %")
    if newline_joining:
        n_nl = sum("\n" in t for t in TEXTS)
        print(f"llama.cpp tokenizer: transformers' ids on the {len(TEXTS) - n_nl} texts without newlines, for every "
              f"file; {newline_texts_differing} of the {n_nl} with newlines differ ({newline_joining} tokens of this "
              f"tokenizer join a newline with other text, which llama.cpp's gemma4 tokenizer never produces)")
    else:
        print(f"llama.cpp tokenizer: transformers' ids on all {len(TEXTS)} texts, for every file")
    by_q = {r[0]: r for r in rows}
    assert by_q["f32"][2] < 1e-4, f"f32 logits differ from transformers by {by_q['f32'][2]:.2e}"
    assert by_q["bf16"][2] < 2e-2, f"bf16 logits differ from transformers by {by_q['bf16'][2]:.2e}"
    assert by_q["f32"][3] == 1.0, "llama.cpp's f32 greedy tokens differ from transformers'"
    agree_f32_st = agreement(greedy["f32"], st_tokens)
    print(f"llama.cpp f32 greedy vs slicetrain generate: {100 * agree_f32_st:.1f} % of tokens agree")
    assert agree_f32_st == 1.0, "llama.cpp's f32 greedy tokens differ from slicetrain's"
    print(f"llama.cpp q4_k_m greedy vs slicetrain generate (fp32): "
          f"{100 * agreement(greedy['q4_k_m'], st_tokens):.1f} % of tokens agree")
    # slicetrain's own 8-bit decoding (generate --weights-dtype q8_0, quantized on load).
    st_q8 = slicetrain_greedy(args, model_dir, prompt_ids, "q8_0")
    print(f"slicetrain generate --weights-dtype q8_0 greedy: {100 * agreement(st_q8, st_tokens):.1f} % of tokens "
          f"agree with its fp32, {100 * agreement(st_q8, greedy['q8_0']):.1f} % with llama.cpp's q8_0 file")
    check_lora(args, work, model_dir, tree, gguf_src, env, tok, prompt_ids, stop, ours["f32"])
    print("all checks passed")


if __name__ == "__main__":
    main()
