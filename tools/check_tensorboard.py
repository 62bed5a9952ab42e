#!/usr/bin/env python3
"""Reads a slicetrain run's TensorBoard events with TensorBoard's own reader and checks them against the
run's metrics.jsonl: every step record's loss, learning rate, grad norm, tokens/s (as float32) must be the
scalar TensorBoard reports at that step under train/loss, train/learning_rate, train/grad_norm,
train/tokens_per_s, every epoch record's loss under epoch/loss at the epoch's global step, and every eval
record's eval_loss under eval/loss at its step; and that no tag has a step twice (after a resume, the
interrupted run's later steps must have been purged).

Usage: tools/.venv/bin/python tools/check_tensorboard.py RUN_DIR     (needs tensorboard, tools/requirements.txt)
Exit status 0 when everything matches; prints the tags found and the number of values compared.
"""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    run = sys.argv[1]
    acc = EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    print("tags:", ", ".join(sorted(tags)))
    scalars = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    # Each step once per tag: a resumed run's SessionLog START has purged what the interrupted run
    # wrote after the checkpoint (without it TensorBoard shows both runs' values of those steps).
    repeated = {t: len(acc.Scalars(t)) - len(scalars[t]) for t in tags if len(acc.Scalars(t)) != len(scalars[t])}
    for t, n in sorted(repeated.items()):
        print(f"{t}: {n} step(s) appear more than once")
    steps, epochs, evals = [], [], []
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            # "samples" records (--sample-prompts) have no scalar in TensorBoard.
            {"step": steps, "epoch": epochs, "eval": evals}.get(r.get("type"), []).append(r)
    compared, bad = 0, 0
    for r in steps:
        for tag, key in [("train/loss", "loss"), ("train/learning_rate", "lr"), ("train/grad_norm", "grad_norm"),
                         ("train/tokens_per_s", "tokens_per_s"), ("train/real_tokens_per_s", "real_tokens_per_s")]:
            got = scalars.get(tag, {}).get(r["step"])
            compared += 1
            if got is None or got != f32(r[key]):
                bad += 1
                print(f"step {r['step']} {tag}: tensorboard {got}, metrics.jsonl {r[key]}")
    for r in epochs:
        got = scalars.get("epoch/loss", {}).get(r["global_step"])
        compared += 1
        if got is None or got != f32(r["loss"]):
            bad += 1
            print(f"epoch {r['epoch']} epoch/loss: tensorboard {got}, metrics.jsonl {r['loss']}")
    for r in evals:
        got = scalars.get("eval/loss", {}).get(r["step"])
        compared += 1
        if got is None or got != f32(r["eval_loss"]):
            bad += 1
            print(f"eval at step {r['step']} eval/loss: tensorboard {got}, metrics.jsonl {r['eval_loss']}")
    print(f"{len(steps)} steps, {len(epochs)} epochs, {len(evals)} evaluations, {compared} values compared, "
          f"{bad} differ")
    return 0 if bad == 0 and not repeated and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
