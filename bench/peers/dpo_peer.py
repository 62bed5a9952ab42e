#!/usr/bin/env python3
"""TRL peer of slicetrain's DPO step (bench/dpo_vs_trl.sh runs both on the same pairs).

TRL's DPOTrainer with PEFT as its users run it on a CPU: Gemma4ForCausalLM from the same checkpoint
slicetrain loads (attn_implementation="sdpa"), LoraConfig(r=--rank, lora_alpha=2r, lora_dropout=0,
target_modules=--target-modules), ref_model=None (the reference is the base with the adapters
disabled, as slicetrain's), DPOConfig(beta=0.1, loss_type sigmoid, max_length=--max-length,
per_device_train_batch_size=--batch, bf16 autocast where the CPU has bf16 instructions (avx512_bf16
or amx_bf16; --autocast off forces fp32), gradient_checkpointing=False (faster; the memory fits),
AdamW lr 5e-6), one process with all cores (the DPOTrainer user's set-up on one machine; TRL has no
CPU multi-process path without accelerate launch). --compile sets torch_compile=True.
Timing: --warmup steps, then --steps timed steps (a TrainerCallback stamps each step's end).
Prints one line:
  peer=trl-dpo pairs/s=... step_s=... tokens/s=... peak_rss_mib=... autocast=bf16|off compile=yes|no
(tokens/s: the batch's non-padding tokens of both sides, forward+backward of the policy and the
reference forward as in slicetrain's figure.)
Usage: tools/.venv/bin/python bench/peers/dpo_peer.py --model DIR --pairs FILE.jsonl
         [--rank 16] [--target-modules all-linear] [--batch 4] [--max-length 256] [--steps 4]
"""
import argparse
import json
import logging
import os
import resource
import tempfile
import time
import warnings

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOConfig, DPOTrainer


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class Stamps(TrainerCallback):
    def __init__(self):
        self.t = []

    def on_step_end(self, args, state, control, **kwargs):
        self.t.append(time.perf_counter())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--target-modules", default="all-linear")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("trl").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    bf16 = args.autocast == "bf16" or (args.autocast == "auto" and cpu_has_bf16())

    records = [json.loads(line) for line in open(args.pairs, encoding="utf-8") if line.strip()]
    need = (args.warmup + args.steps) * args.batch
    records = (records * (need // len(records) + 1))[:need]
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    targets = args.target_modules if args.target_modules == "all-linear" else args.target_modules.split(",")
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=targets,
                      task_type="CAUSAL_LM")
    stamps = Stamps()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DPOConfig(output_dir=tmp, max_length=args.max_length, per_device_train_batch_size=args.batch,
                        max_steps=args.warmup + args.steps, learning_rate=5e-6, beta=0.1, bf16=bf16,
                        use_cpu=True, gradient_checkpointing=False, report_to=[], logging_strategy="no",
                        save_strategy="no", dataloader_num_workers=0, torch_compile=args.compile,
                        disable_tqdm=True, seed=0)
        trainer = DPOTrainer(model=model, ref_model=None, args=cfg, train_dataset=Dataset.from_list(records),
                             processing_class=tok, peft_config=lora, callbacks=[stamps])
        tokens = 0
        ds = trainer.train_dataset
        for i in range(args.warmup * args.batch, need):
            p = len(ds[i]["prompt_ids"])
            tokens += min(p + len(ds[i]["chosen_ids"]), args.max_length)
            tokens += min(p + len(ds[i]["rejected_ids"]), args.max_length)
        trainer.train()
    t = stamps.t
    timed = t[-1] - t[args.warmup - 1] if args.warmup > 0 else t[-1] - t[0]
    steps = args.steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"peer=trl-dpo pairs/s={steps * args.batch / timed:.2f} step_s={timed / steps:.3f} "
          f"tokens/s={tokens / timed:.1f} peak_rss_mib={peak:.0f} autocast={'bf16' if bf16 else 'off'} "
          f"compile={'yes' if args.compile else 'no'}", flush=True)


if __name__ == "__main__":
    main()
