#!/usr/bin/env bash
# Image SFT with LoRA on every linear (all-linear: the text model's, the vision tower's and the
# projection) of a Gemma 4 multimodal model, one record (one 640x480 image and a question) a step:
# slicetrain finetune against transformers + PEFT (bench/peers/vision_lora_peer.py: sdpa, fp32 and
# bf16 autocast) on the same model and data, in the same run. Prints samples/s for both.
#   bench/vision_lora.sh                      # WIDTHS=tiny (the test fixture's tower), 8 records
#   WIDTHS=e2b BUDGET=70 bench/vision_lora.sh # E2B's tower widths (16 layers of 768), budget 70
# THREADS (default: all CPUs) applies to both; RECORDS (8) records, the first step of each side is
# a warm-up (slicetrain: its second epoch is timed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
threads="${THREADS:-$(nproc)}"
widths="${WIDTHS:-tiny}"
records="${RECORDS:-8}"
budget="${BUDGET:-70}"
rank="${RANK:-16}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" "$root/bench/peers/vision_lora_peer.py" --write "$tmp" --widths "$widths" --records "$records" \
  --budget "$budget" 2>/dev/null
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads;" \
  "widths $widths, budget $budget, $records records, LoRA r=$rank all-linear, batch 1"
out="$(OMP_NUM_THREADS=$threads "$bin" finetune --model-id "$tmp/model" --dataset "$tmp/train.parquet" \
  --dataset-split train --max-seq-len 2048 --batch-size-per-device 1 --topology 1 --packing off \
  --lora-rank "$rank" --lora-target-modules all-linear --lr 1e-4 --num-epochs 2 --precision fp32 \
  --storage-path "$tmp/runs" --run-name v --no-dashboard --progress off 2>&1)" || { echo "$out"; exit 1; }
echo "$out" | grep -E '^Parts:' || true
"$py" - "$tmp/runs/v/metrics.jsonl" "$records" <<'PY'
import json, sys
epochs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "epoch"]
e = epochs[-1]
seconds = e.get("epoch_time_s") or e.get("epoch_time")
print(f"slicetrain fp32: {int(sys.argv[2]) / seconds:.2f} samples/s ({seconds / int(sys.argv[2]):.3f} s a step, epoch 2)")
PY
OMP_NUM_THREADS=$threads "$py" "$root/bench/peers/vision_lora_peer.py" --model "$tmp/model" \
  --data "$tmp/train.parquet" --rank "$rank" --threads "$threads" 2>/dev/null | "$py" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print("transformers + PEFT %s (%s): %.2f samples/s (%.3f s a step, %d steps)"
          % (r["dtype"], r["attn"], r["samples_per_s"], r["seconds_per_step"], r["steps"]))'
