#!/usr/bin/env python3
"""Checks a slicetrain checkpoint with the reference implementation: transformers loads it
(AutoModelForCausalLM / AutoTokenizer from the directory) and its loss on the first N records of an
instruction set, tokenized, padded and masked as slicetrain does, must equal what
`slicetrain evaluate` reports for the same records.

Usage: tools/.venv/bin/python tools/check_checkpoint.py --checkpoint DIR \
           [--slicetrain build/slicetrain] [--records 64] [--max-seq-len 64]
Exit status 0 when the two losses agree to 1e-4 (relative).
"""
import argparse
import json
import pathlib
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def prompt(rec: dict) -> str:
    inst = rec.get("instruction", "")
    ctx = rec.get("context") or rec.get("input") or ""
    resp = rec.get("response") or rec.get("output") or ""
    if ctx:
        return f"Instruction: {inst}\nContext: {ctx}\nResponse: {resp}"
    return f"Instruction: {inst}\nResponse: {resp}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--slicetrain", default=str(ROOT / "build" / "slicetrain"))
    p.add_argument("--dataset", default=str(ROOT / "data" / "tiny_instruct" / "train.jsonl"))
    p.add_argument("--records", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=64)
    a = p.parse_args()

    out = subprocess.run([a.slicetrain, "evaluate", "--json", "--model-id", a.checkpoint,
                          "--dataset", a.dataset, "--dataset-split", f"train[:{a.records}]",
                          "--max-seq-len", str(a.max_seq_len)],
                         check=True, capture_output=True, text=True).stdout
    ours = json.loads(out.strip().splitlines()[-1])

    tok = AutoTokenizer.from_pretrained(a.checkpoint)
    tok.padding_side = "right"
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with open(a.dataset, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(a.records), f)]
    enc = tok([prompt(r) for r in records], truncation=True, max_length=a.max_seq_len,
              padding="max_length", return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(records), 8):
            ids, mask, lab = (enc["input_ids"][i:i + 8], enc["attention_mask"][i:i + 8],
                              labels[i:i + 8])
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            shift = lab[:, 1:].reshape(-1)
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                   shift, ignore_index=-100, reduction="sum")
            total += float(ce)
            count += int((shift != -100).sum())
    ref = total / count
    ok = abs(ref - ours["loss"]) <= 1e-4 * abs(ref) and count == ours["tokens"]
    print(f"transformers loss={ref:.6f} tokens={count} | slicetrain evaluate loss={ours['loss']:.6f} "
          f"tokens={ours['tokens']} | {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
