#!/usr/bin/env python3
"""Checks a DPO-trained LoRA adapter from `slicetrain finetune --objective dpo` with the reference
implementation: the DPO sigmoid loss of the adapter on a preference file, computed by transformers +
PEFT on the pairs exactly as TRL's DPOTrainer tokenizes them (its _prepare_dataset and
DataCollatorForPreference), with the base (adapter off) as the reference, must equal what
`slicetrain evaluate --objective dpo` reports for the same pairs.

Usage: tools/.venv/bin/python tools/check_dpo.py --base MODEL_DIR --adapter ADAPTER_DIR --dataset PAIRS.jsonl \
           [--split 'train[:32]'] [--max-seq-len 64] [--beta 0.1] [--slicetrain build/slicetrain]
Exit status 0 when the two losses agree to 1e-4 (relative); both are printed.

Why not DPOTrainer.evaluate(): on an already trained PeftModel with ref_model=None, TRL 1.16 adds a frozen copy of
the adapter as the reference ("ref"), so the policy equals the reference and the loss is ln 2. The loss is computed
here directly: per-token log-probs of the completion tokens summed per sequence, policy with the adapter, reference
inside model.disable_adapter(), loss = mean(-log sigmoid(beta * ((c - c_ref) - (r - r_ref)))).
The model runs in fp32, eval mode; the tokenizer is the base's, its chat template (conversational pairs) is
tools/chat_templates/gemma4_training.jinja, as slicetrain's gemma-chat renders it.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "chat_templates" / "gemma4_training.jinja"


def split_rows(records: list, split: str) -> list:
    """train, train[:N], train[A:B] (the forms this check needs)."""
    if "[" not in split:
        return records
    inner = split[split.index("[") + 1 : split.rindex("]")]
    a, b = inner.split(":")
    return records[int(a) if a else None : int(b) if b else None]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--slicetrain", default=str(HERE.parent / "build" / "slicetrain"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("trl").setLevel(logging.ERROR)
    torch.manual_seed(0)

    records = [json.loads(line) for line in Path(args.dataset).read_text(encoding="utf-8").splitlines() if line]
    records = split_rows(records, args.split)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = DPOConfig(output_dir=tmp, max_length=args.max_seq_len, report_to=[], beta=args.beta, use_cpu=True,
                        bf16=False, gradient_checkpointing=False, logging_strategy="no", save_strategy="no")
        ds = Dataset.from_list(records)
        # TRL's own tokenization (the trainer is only the holder of _prepare_dataset: nothing trains).
        trainer = DPOTrainer(model=model, ref_model=None, args=cfg, train_dataset=ds, processing_class=tokenizer)
        prepared = trainer._prepare_dataset(ds, tokenizer, cfg, "check")
    collate = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id, max_length=args.max_seq_len)
    losses = []
    with torch.no_grad():
        for i in range(0, len(prepared), 8):
            batch = collate([prepared[j] for j in range(i, min(i + 8, len(prepared)))])
            ids, am, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]

            def seq_logps():
                logits = model(input_ids=ids, attention_mask=am, use_cache=False).logits[:, :-1].float()
                lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None])[..., 0]
                return (lp * cm[:, 1:]).sum(1)

            pol = seq_logps()
            with model.disable_adapter():
                ref = seq_logps()
            n = ids.shape[0] // 2
            delta = (pol[:n] - ref[:n]) - (pol[n:] - ref[n:])
            losses.append(-F.logsigmoid(args.beta * delta))
    reference = float(torch.cat(losses).mean())

    cmd = [args.slicetrain, "evaluate", "--model-id", args.base, "--adapter", args.adapter, "--dataset", args.dataset,
           "--dataset-split", args.split, "--objective", "dpo", "--beta", str(args.beta), "--max-seq-len",
           str(args.max_seq_len), "--precision", "fp32", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout + out.stderr, file=sys.stderr)
        return 1
    got = json.loads(out.stdout[out.stdout.index("{"):])
    ok = abs(got["loss"] - reference) <= 1e-4 * abs(reference) and got["pairs"] == len(prepared)
    print(f"pairs: {len(prepared)} (TRL) / {got['pairs']} (slicetrain); DPO sigmoid loss: transformers+PEFT "
          f"{reference:.6f}, slicetrain {got['loss']:.6f}: {'agree' if ok else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
