#!/usr/bin/env bash
# How much of a fine-tuning step waits on communication, per transport: `slicetrain finetune` on
# gemma4-small at the seed's shape (4 rows x 512 tokens per worker, every row padded to 512, one
# example per row) with WORKERS local workers, full fine-tuning and LoRA, over TRANSPORTS. Prints per
# run the mean over steps 2.. (step 1 warms up) of the step time, the time the step blocked on
# collectives that compute did not hide (comm_wait_s, as the metrics JSONL records it), its share
# of the step, the seconds spent inside collectives on the comm thread (comm_s) and tokens/s.
#   bench/finetune_comm.sh               # WORKERS=4 STEPS=4 TRANSPORTS="shm tcp"
# SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
workers="${WORKERS:-4}"
steps="${STEPS:-4}"
transports="${TRANSPORTS:-shm tcp}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "# slicetrain finetune, gemma4-small, $workers workers x 4 x 512 tokens (padded), $steps steps, $(nproc) cores"
echo "| run | transport | step s | comm wait s | comm wait % | comm s (comm thread) | tokens/s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for mode in full lora; do
  extra=()
  [ "$mode" = lora ] && extra=(--lora-rank 16)
  for t in $transports; do
    SLICETRAIN_TRANSPORT="$t" "$bin" finetune --model-id gemma4-small --topology "$workers" \
      --max-seq-len 512 --batch-size-per-device 4 --packing off --padding max_length \
      --dataset-split "train[:$((workers * 4 * steps))]" --num-epochs 1 "${extra[@]}" \
      --storage-path "$tmp" --run-name "$mode-$t" --report-to "jsonl:$tmp/$mode-$t.jsonl" \
      >"$tmp/$mode-$t.log" 2>&1 || { cat "$tmp/$mode-$t.log"; exit 1; }
    python3 - "$tmp/$mode-$t.jsonl" "$mode" "$t" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r.get("type") == "step"][1:]
n = len(steps)
mean = lambda k: sum(s[k] for s in steps) / n
step, wait = mean("step_s"), mean("comm_wait_s")
comm = sum(s["comm_s"] for s in steps) / n / len(steps[0]["workers"])
print(f"| {sys.argv[2]} | {sys.argv[3]} | {step:.3f} | {wait:.3f} | {100 * wait / step:.1f}% | {comm:.3f} | {mean('tokens_per_s'):.0f} |")
EOF
  done
done
