#!/usr/bin/env python3
"""Writes tests/fixtures/lr/schedules.json: the learning rate of every optimizer step under
transformers' get_scheduler, for the schedules slicetrain's --lr-scheduler offers.

Each case: {"name": slicetrain's scheduler name, "lr", "warmup_steps", "total_steps", "min_lr_ratio",
"cycles", "power", "decay_steps", "lrs": [lr of step 0, 1, ..., total_steps + 4]}. The lr of step k is
optimizer.param_groups[0]["lr"] after k calls of scheduler.step() (what the k-th update uses, as the
Trainer steps the scheduler after each optimizer step). slicetrain's names map to transformers':
cosine with min_lr_ratio > 0 -> cosine_with_min_lr (min_lr_rate), polynomial -> lr_end = min_lr_ratio x lr
(transformers' default 1e-7 when 0), cosine_with_restarts -> num_cycles, wsd -> warmup_stable_decay with
num_decay_steps and min_lr_ratio (linear warm-up, cosine decay: its defaults).

Usage: tools/.venv/bin/python tools/make_lr_fixtures.py   (from any directory; byte-identical on rerun)
"""
import json
import os

import torch
from transformers.optimization import get_scheduler

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "lr", "schedules.json")


def lrs(name, lr, warmup, total, min_lr_ratio=0.0, cycles=1.0, power=1.0, decay_steps=0):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=lr)
    kwargs = {}
    hf_name = name
    if name == "cosine" and min_lr_ratio > 0:
        hf_name, kwargs = "cosine_with_min_lr", {"min_lr_rate": min_lr_ratio}
    elif name == "cosine_with_restarts":
        kwargs = {"num_cycles": cycles}
    elif name == "polynomial":
        kwargs = {"power": power, "lr_end": min_lr_ratio * lr if min_lr_ratio > 0 else 1e-7}
    elif name == "wsd":
        hf_name, kwargs = "warmup_stable_decay", {"num_decay_steps": decay_steps, "min_lr_ratio": min_lr_ratio}
    sched = get_scheduler(hf_name, opt, num_warmup_steps=warmup, num_training_steps=total,
                          scheduler_specific_kwargs=kwargs or None)
    out = []
    for _ in range(total + 5):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return {"name": name, "lr": lr, "warmup_steps": warmup, "total_steps": total, "min_lr_ratio": min_lr_ratio,
            "cycles": cycles, "power": power, "decay_steps": decay_steps, "lrs": out}


def main():
    cases = []
    for warmup, total in [(0, 50), (5, 50), (10, 37), (3, 4)]:
        for name in ["constant", "constant_with_warmup", "linear", "cosine", "polynomial"]:
            cases.append(lrs(name, 1e-3, warmup, total))
        cases.append(lrs("cosine", 2e-5, warmup, total, min_lr_ratio=0.1))
        cases.append(lrs("cosine_with_restarts", 1e-3, warmup, total, cycles=3))
        cases.append(lrs("polynomial", 1e-3, warmup, total, min_lr_ratio=0.05, power=2.0))
        cases.append(lrs("wsd", 1e-3, warmup, total, decay_steps=max(1, total // 5)))
        cases.append(lrs("wsd", 1e-3, warmup, total, decay_steps=max(1, total // 3), min_lr_ratio=0.1))
    cases.append(lrs("linear", 1e-3, 60, 50))  # warm-up longer than the run
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"cases": cases}, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, {sum(len(c['lrs']) for c in cases)} learning rates")


if __name__ == "__main__":
    main()
