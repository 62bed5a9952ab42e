#!/usr/bin/env python3
"""Checks a slicetrain checkpoint with the reference implementation: transformers loads it
(AutoModelForCausalLM / AutoTokenizer from the directory) and its loss on the first N records of an
instruction set, tokenized, padded and masked as slicetrain does, must equal what
`slicetrain evaluate` reports for the same records.

Usage: tools/.venv/bin/python tools/check_checkpoint.py --checkpoint DIR \
           [--slicetrain build/slicetrain] [--records 64] [--max-seq-len 64]
Exit status 0 when the two losses agree to 1e-4 (relative).

The checkpoint may be one model.safetensors or a sharded export (model.safetensors.index.json plus the
shards it names), with any mix of F32 / BF16 / F16 tensors; transformers loads it in fp32. The weight files
are validated first (every shard present, every index entry in its shard, no tensor twice) and a one-line
summary (files, tensors, dtypes) goes to stderr.

Weight comparison instead of the loss check:
       tools/.venv/bin/python tools/check_checkpoint.py --checkpoint DIR --compare-weights OTHER_DIR \
           [--atol 0] [--only-failures] [--loss]
reads every tensor of both directories with safetensors (all shards), casts to fp32 and prints the largest
absolute difference per tensor. Exit status 1 if a tensor differs by more than --atol (default 0: bitwise-equal
values after the cast, so BF16 vs its exact F32 widening passes), a tensor is in only one directory, or the shapes
differ. With --loss the loss check above runs as well (both must pass).

LoRA adapter (PEFT format: adapter_config.json + adapter_model.safetensors) instead of --checkpoint:
       tools/.venv/bin/python tools/check_checkpoint.py --adapter DIR --base BASE_DIR \
           [--slicetrain build/slicetrain] [--records 64] [--max-seq-len 64]
the same loss check, with the reference model = transformers' BASE_DIR in fp32 plus the adapter
(peft.PeftModel.from_pretrained(base, DIR)), the tokenizer from BASE_DIR, compared with
`slicetrain evaluate --model-id BASE_DIR --adapter DIR` (same other flags). It also prints the base model's loss
without the adapter (peft's disable_adapter()), for information: a slicetrain loss equal to it means the adapter
was not applied.
       tools/.venv/bin/python tools/check_checkpoint.py --adapter DIR --base BASE_DIR --merged OUT_DIR \
           [--atol 1e-6] [--only-failures] [--loss]
instead compares OUT_DIR (an HF model directory, e.g. from `slicetrain export --model-id BASE_DIR --adapter DIR
--output OUT_DIR`; one file or sharded) with peft's merge_and_unload() of BASE_DIR + DIR, text model tensors only:
every tensor of the reference's text decoder (`model.` / `model.language_model.` ..., plus `lm_head.weight` if it
is not tied) must be in OUT_DIR with the same shape and max|diff| <= --atol (default 1e-6 here); an OUT_DIR tensor
under the text decoder's prefix that the reference lacks (e.g. a leftover lora_A) fails too; other OUT_DIR tensors
(vision / audio towers) are counted but not compared. With --loss the adapter loss check runs as well.
peft is imported only in these modes.
"""
import argparse
import collections
import json
import pathlib
import subprocess
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CHUNK_ELEMS = 1 << 24  # compare big tensors in row blocks of about this many elements (fp32 temporaries)


def weight_files(ckpt) -> dict:
    """{tensor name: file path} of a checkpoint directory, validated. Sharded (INDEX) or single file."""
    d = pathlib.Path(ckpt)
    index = d / INDEX
    if index.exists():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        where = {}
        for shard in sorted(set(weight_map.values())):
            path = d / shard
            if not path.exists():
                raise SystemExit(f"{d}: shard {shard} named in {INDEX} is missing")
            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys())
            for n in names:
                if n in where:
                    raise SystemExit(f"{d}: tensor {n} is in both {where[n].name} and {shard}")
                if weight_map.get(n) != shard:
                    raise SystemExit(f"{d}: tensor {n} is in {shard} but {INDEX} says {weight_map.get(n)}")
                where[n] = path
        missing = sorted(set(weight_map) - set(where))
        if missing:
            raise SystemExit(f"{d}: {len(missing)} tensor(s) of {INDEX} not found in their shard, e.g. {missing[0]}")
        return where
    path = d / SINGLE
    if not path.exists():
        raise SystemExit(f"{d}: neither {SINGLE} nor {INDEX}")
    with safe_open(str(path), framework="pt") as f:
        return {n: path for n in f.keys()}


def describe(ckpt, where: dict) -> str:
    dtypes = collections.Counter()
    by_file = collections.defaultdict(list)
    for n, p in where.items():
        by_file[p].append(n)
    for p, names in by_file.items():
        with safe_open(str(p), framework="pt") as f:
            for n in names:
                dtypes[f.get_slice(n).get_dtype()] += 1
    kind = f"{len(by_file)} shards" if (pathlib.Path(ckpt) / INDEX).exists() else "1 file"
    mix = ", ".join(f"{k} {v}" for k, v in sorted(dtypes.items()))
    return f"{ckpt}: {kind}, {len(where)} tensors ({mix}{'; mixed dtypes' if len(dtypes) > 1 else ''})"


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| after casting both to fp32 (float64 for integer tensors); equal values (also equal
    infinities, and NaN against NaN) count 0, NaN against a number counts inf."""
    wide = torch.float32 if a.dtype.is_floating_point and b.dtype.is_floating_point else torch.float64
    a2, b2 = a.reshape(a.shape[0] if a.dim() else 1, -1), b.reshape(b.shape[0] if b.dim() else 1, -1)
    rows = max(1, CHUNK_ELEMS // max(1, a2.shape[1]))
    worst = 0.0
    for r in range(0, a2.shape[0], rows):
        x, y = a2[r:r + rows].to(wide), b2[r:r + rows].to(wide)
        d = torch.where(x == y, torch.zeros((), dtype=wide), (x - y).abs())
        d = torch.where(torch.isnan(x) & torch.isnan(y), torch.zeros((), dtype=wide), d)
        d = torch.nan_to_num(d, nan=float("inf"), posinf=float("inf"))
        if d.numel():
            worst = max(worst, float(d.max()))
    return worst


def compare_weights(ckpt, other, atol: float, only_failures: bool) -> int:
    wa, wb = weight_files(ckpt), weight_files(other)
    print(describe(ckpt, wa))
    print(describe(other, wb))
    only_a, only_b = sorted(set(wa) - set(wb)), sorted(set(wb) - set(wa))
    failures = 0
    for n in only_a:
        print(f"ONLY IN {ckpt}: {n}")
    for n in only_b:
        print(f"ONLY IN {other}: {n}")
    failures += len(only_a) + len(only_b)
    handles = {}

    def get(path, name):
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        return handles[path].get_tensor(name)

    worst_name, worst = None, -1.0
    pairs = collections.Counter()
    for n in sorted(set(wa) & set(wb)):
        a, b = get(wa[n], n), get(wb[n], n)
        da, db = str(a.dtype).replace("torch.", ""), str(b.dtype).replace("torch.", "")
        pairs[f"{da}/{db}" if da != db else da] += 1
        if tuple(a.shape) != tuple(b.shape):
            print(f"SHAPE {n}: {list(a.shape)} vs {list(b.shape)}")
            failures += 1
            continue
        diff = max_abs_diff(a, b)
        bad = not diff <= atol
        failures += bad
        if diff > worst:
            worst_name, worst = n, diff
        if bad or not only_failures:
            print(f"{'DIFF' if bad else 'ok  '} {n} {da if da == db else da + '/' + db} {list(a.shape)} "
                  f"max|diff|={diff:.6g}")
        del a, b
    common = len(set(wa) & set(wb))
    print(f"compared {common} tensors ({', '.join(f'{k} {v}' for k, v in sorted(pairs.items()))}); "
          f"{len(only_a)} only in {ckpt}, {len(only_b)} only in {other}; largest max|diff|={max(worst, 0.0):.6g}"
          f"{f' ({worst_name})' if worst > 0 else ''}; atol={atol:g} | {'OK' if failures == 0 else 'MISMATCH'}")
    return 0 if failures == 0 else 1


def prompt(rec: dict) -> str:
    inst = rec.get("instruction", "")
    ctx = rec.get("context") or rec.get("input") or ""
    resp = rec.get("response") or rec.get("output") or ""
    if ctx:
        return f"Instruction: {inst}\nContext: {ctx}\nResponse: {resp}"
    return f"Instruction: {inst}\nResponse: {resp}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="slicetrain checkpoint (HF model directory) to check")
    p.add_argument("--adapter", metavar="DIR", help="instead of --checkpoint: a PEFT LoRA adapter directory "
                   "(needs --base)")
    p.add_argument("--base", metavar="BASE_DIR", help="with --adapter: the base model directory")
    p.add_argument("--slicetrain", default=str(ROOT / "build" / "slicetrain"))
    p.add_argument("--dataset", default=str(ROOT / "data" / "tiny_instruct" / "train.jsonl"))
    p.add_argument("--records", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--compare-weights", metavar="OTHER_DIR",
                   help="compare every tensor with OTHER_DIR's instead of checking the loss")
    p.add_argument("--merged", metavar="OUT_DIR",
                   help="with --adapter/--base: compare OUT_DIR's text tensors with peft's merge_and_unload() "
                   "instead of checking the loss")
    p.add_argument("--atol", type=float, default=None,
                   help="--compare-weights / --merged tolerance on max|diff| (default 0 / 1e-6)")
    p.add_argument("--only-failures", action="store_true",
                   help="--compare-weights / --merged: print only failing tensors")
    p.add_argument("--loss", action="store_true",
                   help="with --compare-weights / --merged: run the loss check as well")
    a = p.parse_args()

    if (a.checkpoint is None) == (a.adapter is None):
        p.error("give exactly one of --checkpoint and --adapter")
    if a.adapter is not None and a.base is None:
        p.error("--adapter needs --base")
    if a.adapter is None and (a.base is not None or a.merged is not None):
        p.error("--base and --merged go with --adapter")
    if a.adapter is not None and a.compare_weights is not None:
        p.error("--compare-weights goes with --checkpoint (use --merged with --adapter)")

    if a.compare_weights:
        rc = compare_weights(a.checkpoint, a.compare_weights, 0.0 if a.atol is None else a.atol, a.only_failures)
        if not a.loss:
            return rc
        return max(rc, check_loss(a))
    if a.merged:
        rc = compare_merged(a.base, a.adapter, a.merged, 1e-6 if a.atol is None else a.atol, a.only_failures)
        if not a.loss:
            return rc
        return max(rc, check_loss(a))
    return check_loss(a)


def adapter_files(adapter) -> str:
    """One-line summary of a PEFT adapter directory, validated (adapter_config.json + adapter_model.safetensors)."""
    d = pathlib.Path(adapter)
    for fn in ("adapter_config.json", "adapter_model.safetensors"):
        if not (d / fn).exists():
            raise SystemExit(f"{d}: no {fn} (not a PEFT adapter directory)")
    with open(d / "adapter_config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    with safe_open(str(d / "adapter_model.safetensors"), framework="pt") as f:
        n = len(list(f.keys()))
    scale = "rslora " if cfg.get("use_rslora") else ""
    return (f"{d}: {cfg.get('peft_type')} r={cfg.get('r')} alpha={cfg.get('lora_alpha')} {scale}"
            f"target_modules={cfg.get('target_modules')!r}, {n} tensors")


def load_reference(a):
    """The transformers (+ peft) model the loss check compares with, fp32, eval mode."""
    model_dir = a.checkpoint if a.adapter is None else a.base
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    if a.adapter is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, a.adapter)
    return model.eval()


def merged_reference(base, adapter):
    """peft's merge_and_unload() of BASE + adapter in fp32: (merged model, text decoder prefix, tensors to compare)."""
    from peft import PeftModel
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    decoder = model.get_decoder()
    prefix = next(n for n, m in model.named_modules() if m is decoder) + "."
    state = model.state_dict()
    ref = {k: v for k, v in state.items() if k.startswith(prefix)}
    out_emb = model.get_output_embeddings()
    if out_emb is not None and out_emb.weight is not decoder.embed_tokens.weight:  # untied lm_head
        name = next(n for n, m in model.named_modules() if m is out_emb) + ".weight"
        ref[name] = state[name]
    return model, prefix, ref


def compare_merged(base, adapter, merged, atol: float, only_failures: bool) -> int:
    print(adapter_files(adapter))
    wm = weight_files(merged)
    print(describe(merged, wm))
    _, prefix, ref = merged_reference(base, adapter)
    print(f"reference: peft merge_and_unload() of {base} + {adapter}, fp32, {len(ref)} text tensors "
          f"(prefix {prefix!r})")
    missing = sorted(set(ref) - set(wm))
    extra = sorted(n for n in wm if n not in ref and n.startswith(prefix))
    ignored = [n for n in wm if n not in ref and not n.startswith(prefix)]
    failures = len(missing) + len(extra)
    for n in missing:
        print(f"MISSING IN {merged}: {n}")
    for n in extra:
        print(f"ONLY IN {merged} (not a tensor of the merged reference): {n}")
    handles = {}
    worst_name, worst = None, -1.0
    dtypes = collections.Counter()
    for n in sorted(set(ref) & set(wm)):
        if wm[n] not in handles:
            handles[wm[n]] = safe_open(str(wm[n]), framework="pt")
        got, want = handles[wm[n]].get_tensor(n), ref[n]
        dg = str(got.dtype).replace("torch.", "")
        dtypes[dg] += 1
        if tuple(got.shape) != tuple(want.shape):
            print(f"SHAPE {n}: {list(got.shape)} vs reference {list(want.shape)}")
            failures += 1
            continue
        diff = max_abs_diff(got, want)
        bad = not diff <= atol
        failures += bad
        if diff > worst:
            worst_name, worst = n, diff
        if bad or not only_failures:
            print(f"{'DIFF' if bad else 'ok  '} {n} {dg} {list(got.shape)} max|diff|={diff:.6g}")
    print(f"compared {len(set(ref) & set(wm))} tensors ({', '.join(f'{k} {v}' for k, v in sorted(dtypes.items()))}); "
          f"{len(missing)} missing in {merged}, {len(extra)} unexpected, {len(ignored)} outside the text decoder not compared; "
          f"largest max|diff|={max(worst, 0.0):.6g}{f' ({worst_name})' if worst > 0 else ''}; atol={atol:g} | "
          f"{'OK' if failures == 0 else 'MISMATCH'}")
    return 0 if failures == 0 else 1


def check_loss(a) -> int:
    model_dir = a.checkpoint if a.adapter is None else a.base
    print(describe(model_dir, weight_files(model_dir)), file=sys.stderr)
    if a.adapter is not None:
        print(adapter_files(a.adapter), file=sys.stderr)

    cmd = [a.slicetrain, "evaluate", "--json", "--model-id", model_dir]
    if a.adapter is not None:
        cmd += ["--adapter", a.adapter]
    # The seed's layout (the prompt template, every token a target), which the reference below builds.
    cmd += ["--dataset", a.dataset, "--dataset-split", f"train[:{a.records}]", "--max-seq-len", str(a.max_seq_len),
            "--template", "instruction", "--train-on", "all"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    ours = json.loads(out.strip().splitlines()[-1])

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "right"
    model = load_reference(a)
    with open(a.dataset, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(a.records), f)]
    enc = tok([prompt(r) for r in records], truncation=True, max_length=a.max_seq_len,
              padding="max_length", return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    ref, count = reference_loss(model, enc, labels)
    ok = abs(ref - ours["loss"]) <= 1e-4 * abs(ref) and count == ours["tokens"]
    what = "transformers"
    if a.adapter is not None:
        with model.disable_adapter():
            base_loss, _ = reference_loss(model, enc, labels)
        what = f"transformers (base without adapter: loss={base_loss:.6f}) | transformers+peft"
    print(f"{what} loss={ref:.6f} tokens={count} | slicetrain evaluate loss={ours['loss']:.6f} "
          f"tokens={ours['tokens']} | {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def reference_loss(model, enc, labels):
    """Mean next-token CE over the labelled positions, in batches of 8: (loss, number of tokens)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, labels.shape[0], 8):
            ids, mask, lab = (enc["input_ids"][i:i + 8], enc["attention_mask"][i:i + 8],
                              labels[i:i + 8])
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            shift = lab[:, 1:].reshape(-1)
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                   shift, ignore_index=-100, reduction="sum")
            total += float(ce)
            count += int((shift != -100).sum())
    return total / count, count


if __name__ == "__main__":
    sys.exit(main())
