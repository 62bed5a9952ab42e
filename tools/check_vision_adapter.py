#!/usr/bin/env python3
"""Checks a LoRA adapter of a multimodal Gemma 4 model (the vision tower's adapters included, as
`slicetrain finetune --lora-target-modules all-linear` writes them on an image chat set) with the
reference: PEFT loads it onto Gemma4ForConditionalGeneration (PeftModel.from_pretrained) and the loss
on an image chat set in JSON Lines (TRL's layout: `messages` with {"type": "image"} parts, `images` as
paths relative to the file), computed as tools/make_vision_chat_fixtures.py computes it (Google's
template, TRL's copy; the processor's expansion of each image; every token but the placeholders a
target), must equal what `slicetrain evaluate --adapter DIR --train-on all` reports.

Usage: tools/.venv/bin/python tools/check_vision_adapter.py --adapter DIR \
           [--base tests/fixtures/vision_chat/model] [--dataset tests/fixtures/vision_chat/data/train.jsonl] \
           [--slicetrain build/slicetrain]
Exit status 0 when the two losses agree to 1e-5 (relative). Also prints the base model's loss (the
adapter off) and how many of the adapter's modules are in the vision tower, so that an adapter whose
tower part was ignored shows.

With --merged DIR (what `slicetrain export --model-id BASE --adapter DIR --output MERGED` wrote), also
checks the merged model: transformers loads it as Gemma4ForConditionalGeneration with no missing or
unexpected tensor (the towers are there), and its loss, and `slicetrain evaluate --model-id MERGED`'s,
equal PEFT's loss with the adapter (1e-5 relative for an fp32 export, 1e-2 for bf16).
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_vision_chat_fixtures as fx  # noqa: E402  (sets ATEN_CPU_CAPABILITY before torch loads)

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import Gemma4ForConditionalGeneration, PreTrainedTokenizerFast  # noqa: E402
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--base", default=os.path.join(fx.OUT, "model"))
    ap.add_argument("--dataset", default=os.path.join(fx.OUT, "data", "train.jsonl"))
    ap.add_argument("--slicetrain", default=os.path.join(fx.ROOT, "build", "slicetrain"))
    ap.add_argument("--merged", help="an export of --base with --adapter merged, checked too")
    a = ap.parse_args()

    records = []
    here = os.path.dirname(os.path.abspath(a.dataset))
    with open(a.dataset) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                records.append((r["messages"], [os.path.normpath(os.path.join(here, p)) for p in r.get("images", [])]))
    tok = PreTrainedTokenizerFast.from_pretrained(a.base)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (fx.BOI, fx.IMAGE, fx.EOI)}
    with open(os.path.join(a.base, "processor_config.json")) as f:
        p = json.load(f)["image_processor"]
    proc = Gemma4ImageProcessorPil(patch_size=p["patch_size"], pooling_kernel_size=p["pooling_kernel_size"],
                                   max_soft_tokens=p["max_soft_tokens"])
    template = open(fx.TEMPLATE).read()

    base = Gemma4ForConditionalGeneration.from_pretrained(a.base, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, a.adapter).eval()
    tower = sum(1 for n, _ in model.named_parameters() if "lora_A" in n and ("vision_tower" in n or "embed_vision" in n))
    text = sum(1 for n, _ in model.named_parameters() if "lora_A" in n and "language_model" in n)
    _, total, count = fx.set_loss(model, tok, template, proc, ids, records)
    with model.disable_adapter():
        _, base_total, _ = fx.set_loss(model, tok, template, proc, ids, records)
    ref = total / count

    def evaluate(*model_args):
        out = subprocess.run([a.slicetrain, "evaluate", *model_args, "--dataset", a.dataset, "--max-seq-len", "4096",
                              "--train-on", "all", "--precision", "fp32", "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"slicetrain evaluate failed: {out.stdout}{out.stderr}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    ours = evaluate("--model-id", a.base, "--adapter", a.adapter)
    rel = abs(ours["loss"] - ref) / abs(ref)
    print(f"adapter {a.adapter}: {text} text modules, {tower} vision tower modules")
    print(f"PEFT (transformers fp32): loss {ref:.6f} over {count} targets; without the adapter {base_total / count:.6f}")
    print(f"slicetrain evaluate --adapter: loss {ours['loss']:.6f} over {ours['tokens']} targets; relative difference {rel:.1e}")
    ok = rel <= 1e-5 and ours["tokens"] == count
    if a.merged:
        merged, info = Gemma4ForConditionalGeneration.from_pretrained(a.merged, dtype=torch.float32,
                                                                      output_loading_info=True)
        with open(os.path.join(a.merged, "config.json")) as f:
            bound = 1e-5 if json.load(f).get("torch_dtype") == "float32" else 1e-2
        missing, unexpected = info["missing_keys"], info["unexpected_keys"]
        _, merged_total, _ = fx.set_loss(merged.eval(), tok, template, proc, ids, records)
        theirs = merged_total / count
        mine = evaluate("--model-id", a.merged)
        rel_t, rel_o = abs(theirs - ref) / abs(ref), abs(mine["loss"] - ref) / abs(ref)
        print(f"merged {a.merged}: {len(missing)} missing and {len(unexpected)} unexpected tensors in transformers"
              f"{' ' + str(sorted(missing)[:4]) if missing else ''}")
        print(f"merged, transformers fp32: loss {theirs:.6f} ({rel_t:.1e} from PEFT's); slicetrain evaluate: "
              f"{mine['loss']:.6f} ({rel_o:.1e}); bound {bound:g}")
        ok = ok and not missing and not unexpected and rel_t <= bound and rel_o <= bound
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
