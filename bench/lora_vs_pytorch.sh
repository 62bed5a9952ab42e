#!/usr/bin/env bash
# The LoRA fine-tuning step of gemma4-small (rank 16, all-linear, batch 4 x 512 per worker, AdamW)
# at 1 and 2 local CPU workers: slicetrain finetune --lora-rank, then the PyTorch + PEFT peer
# (bench/peers/lora_peer.py, same config.json: one process, DDP over gloo, and full fine-tuning
# for the LoRA/full ratio) in the same run. Prints tokens/s per worker count for both, and
# slicetrain's per-worker memory and the peer's peak RSS.
#   bench/lora_vs_pytorch.sh            # WORKERS="1 2" STEPS=3 RANK=16 TARGETS=all-linear
#   MODES=single,ddp,fsdp2 COMPILE=1 bench/lora_vs_pytorch.sh   # more peer configurations
# Needs tools/.venv (tools/setup_venv.sh) for the peer; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
workers="${WORKERS:-1 2}"
steps="${STEPS:-3}"
rank="${RANK:-16}"
targets="${TARGETS:-all-linear}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The base: a gemma4-small checkpoint (a tiny full fine-tuning run), as LoRA is run on a
# pretrained model in practice; its config.json is the peer's too.
out="$("$bin" finetune --model-id gemma4-small --max-seq-len 64 --batch-size-per-device 4 \
  --topology 1 --dataset-split "train[:8]" --num-epochs 1 --storage-path "$tmp" \
  --run-name config --no-dashboard --progress off 2>&1)" || { echo "$out"; exit 1; }
config="$(ls -d "$tmp"/config/checkpoint_* | head -1)"
[ -f "$config/config.json" ] || { echo "no config.json in $config"; exit 1; }
echo "# slicetrain finetune --lora-rank $rank --lora-target-modules $targets, gemma4-small checkpoint," \
  "4 x 512 tokens per worker, epoch 2 of 2 ($steps steps each)"
for n in $workers; do
  out="$("$bin" finetune --model-id "$config" --max-seq-len 512 --batch-size-per-device 4 \
    --topology "$n" --lora-rank "$rank" --lora-target-modules "$targets" \
    --dataset-split "train[:$((n * 4 * steps))]" --num-epochs 2 \
    --storage-path "$tmp" --run-name "w$n" --no-dashboard --progress off 2>&1)" \
    || { echo "$out"; exit 1; }
  echo "workers=$n $(echo "$out" | grep 'Epoch 2/2')"
  echo "          $(echo "$out" | grep 'Memory per worker')"
done
# The peer's ddp/fsdp2 use the largest worker count of WORKERS; slicetrain's full fine-tuning at
# that count gives its LoRA/full ratio.
max_workers="$(printf '%s\n' $workers | sort -n | tail -1)"
out="$("$bin" finetune --model-id "$config" --max-seq-len 512 --batch-size-per-device 4 \
  --topology "$max_workers" --dataset-split "train[:$((max_workers * 4 * steps))]" --num-epochs 2 \
  --storage-path "$tmp" --run-name "full$max_workers" --no-dashboard --progress off 2>&1)" \
  || { echo "$out"; exit 1; }
echo "full fine-tuning workers=$max_workers $(echo "$out" | grep 'Epoch 2/2')"
echo "          $(echo "$out" | grep 'Memory per worker')"
modes="${MODES:-single,ddp}"
[ "$max_workers" -gt 1 ] || modes="${MODES:-single}"
"$py" "$root/bench/peers/lora_peer.py" --config "$config" --rank "$rank" \
  --target-modules "$targets" --modes "$modes" --workers "$max_workers" --steps "$steps" \
  --batch 4 --seq 512 --full ${COMPILE:+--compile}
