#!/usr/bin/env bash
# DPO with LoRA on gemma4-small: slicetrain finetune --objective dpo at 1 and 2 local CPU workers,
# then TRL's DPOTrainer with PEFT (bench/peers/dpo_peer.py: one process, all cores, bf16 autocast
# where the CPU has bf16 instructions, sdpa) on the same pairs and checkpoint, in the same run.
# Pairs: prompt about 100 tokens, each completion about 80 (about 180 tokens a side, 360 a pair),
# built from the bundled instruction set. A global batch of 4 pairs for everyone (slicetrain: 4 / N
# per worker, one pair a row, --packing off as TRL pads; then its default packing for reference).
# Prints pairs/s, tokens/s (both sides' tokens of the batch) and peak RSS.
#   bench/dpo_vs_trl.sh            # WORKERS="1 2" PAIRS=32 RANK=16 TARGETS=all-linear
# Needs tools/.venv (tools/setup_venv.sh) for the peer; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
workers="${WORKERS:-1 2}"
pairs="${PAIRS:-32}"
rank="${RANK:-16}"
targets="${TARGETS:-all-linear}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
# The base: a gemma4-small checkpoint (a tiny full fine-tuning run) with its tokenizer.
out="$("$bin" finetune --model-id gemma4-small --max-seq-len 64 --batch-size-per-device 4 \
  --topology 1 --dataset-split "train[:8]" --num-epochs 1 --storage-path "$tmp" \
  --run-name base --no-dashboard --progress off 2>&1)" || { echo "$out"; exit 1; }
model="$(ls -d "$tmp"/base/checkpoint_* | head -1)"
python3 - "$root/data/tiny_instruct/train.jsonl" "$tmp/pairs.jsonl" "$pairs" <<'PY'
import json, random, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
rng = random.Random(0)
def text(n_words):
    words = []
    while len(words) < n_words:
        r = rng.choice(recs)
        words += (r["instruction"] + " " + r["response"]).split()
    return " ".join(words[:n_words])
with open(sys.argv[2], "w") as f:
    for _ in range(int(sys.argv[3])):
        f.write(json.dumps({"prompt": "Instruction: " + text(60) + "\nResponse: ",
                            "chosen": text(50), "rejected": text(50)}) + "\n")
PY
echo "# slicetrain finetune --objective dpo --lora-rank $rank --lora-target-modules $targets," \
  "gemma4-small, $pairs pairs, global batch 4, epoch 2 of 2"
for n in $workers; do
  for packing in off truncate; do
    out="$("$bin" finetune --model-id "$model" --dataset "$tmp/pairs.jsonl" --dataset-split train \
      --objective dpo --max-seq-len 256 --batch-size-per-device $((4 / n)) --topology "$n" \
      --lora-rank "$rank" --lora-target-modules "$targets" --packing "$packing" --num-epochs 2 \
      --storage-path "$tmp" --run-name "w$n$packing" --no-dashboard --progress off 2>&1)" \
      || { echo "$out"; exit 1; }
    epoch="$(echo "$out" | grep '^Epoch 2/2 |')"
    t="$(echo "$epoch" | sed -E 's/.*epoch_time=([0-9.]+)s.*/\1/')"
    echo "slicetrain workers=$n packing=$packing pairs/s=$(python3 -c "print(f'{$pairs/$t:.2f}')") $epoch"
    echo "          $(echo "$out" | grep 'Memory per worker')"
  done
done
echo "$out" | grep -E '^Data:|^Compute:' | sed 's/^/# /'
"$py" "$root/bench/peers/dpo_peer.py" --model "$model" --pairs "$tmp/pairs.jsonl" --rank "$rank" \
  --target-modules "$targets" --batch 4 --max-length 256 --steps "${STEPS:-4}" ${COMPILE:+--compile}
