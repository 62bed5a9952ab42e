#!/usr/bin/env bash
# The fine-tuning step of gemma4-small (batch 4 x 512 per worker, FSDP with MLP units, AdamW) at
# 1, 2 and 4 local CPU workers: slicetrain finetune, then the PyTorch FSDP2 peer
# (bench/peers/fsdp_peer.py, same config.json, gloo) in the same run. Prints tokens/s per worker
# count for both, and slicetrain's per-worker memory.
#   bench/finetune_vs_pytorch.sh            # WORKERS="1 2 4" STEPS=3 PARAM_DTYPE=float32
# Needs tools/.venv (tools/setup_venv.sh) for the peer; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
workers="${WORKERS:-1 2 4}"
steps="${STEPS:-3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "# slicetrain finetune, gemma4-small, 4 x 512 tokens per worker, epoch 2 of 2 ($steps steps each)"
for n in $workers; do
  out="$("$bin" finetune --model-id gemma4-small --max-seq-len 512 --batch-size-per-device 4 \
    --topology "$n" --dataset-split "train[:$((n * 4 * steps))]" --num-epochs 2 \
    --storage-path "$tmp" --run-name "w$n" 2>&1)" || { echo "$out"; exit 1; }
  echo "workers=$n $(echo "$out" | grep 'Epoch 2/2')"
  echo "          $(echo "$out" | grep 'Memory per worker')"
done
config="$(ls -d "$tmp"/w*/checkpoint_* | head -1)"
"$py" "$root/bench/peers/fsdp_peer.py" --config "$config" --workers $workers --steps "$steps" \
  --param-dtype "${PARAM_DTYPE:-float32}"
