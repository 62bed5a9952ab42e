#!/usr/bin/env bash
# The fine-tuning step of gemma4-small (batch 4 x 512 per worker, FSDP with MLP units, AdamW) at
# 1, 2 and 4 local CPU workers (every row a full 512 tokens: --packing off --padding max_length, as
# the peer's random batches): slicetrain finetune in each --precision of PRECISIONS, then the
# PyTorch FSDP2 peer (bench/peers/fsdp_peer.py, same config.json, gloo; sdpa attention and bf16
# autocast where the CPU has bf16 instructions) in the same run. Prints the CPU, tokens/s per
# worker count for both, and slicetrain's per-worker memory.
#   bench/finetune_vs_pytorch.sh   # WORKERS="1 2 4" STEPS=3 PRECISIONS="fp32 bf16"
#                                  # PARAM_DTYPE=float32 PEER_ATTN=sdpa PEER_AUTOCAST=auto PEER=0|1
# Needs tools/.venv (tools/setup_venv.sh) for the peer; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
workers="${WORKERS:-1 2 4}"
steps="${STEPS:-3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
echo "# slicetrain finetune, gemma4-small, 4 x 512 tokens per worker, epoch 2 of 2 ($steps steps each)"
for p in ${PRECISIONS:-fp32 bf16}; do
  for n in $workers; do
    out="$("$bin" finetune --model-id gemma4-small --max-seq-len 512 --batch-size-per-device 4 \
      --topology "$n" --dataset-split "train[:$((n * 4 * steps))]" --num-epochs 2 --precision "$p" \
      --packing off --padding max_length \
      --storage-path "$tmp" --run-name "w$n$p" 2>&1)" || { echo "$out"; exit 1; }
    echo "precision=$p workers=$n $(echo "$out" | grep 'Epoch 2/2')"
    echo "          $(echo "$out" | grep 'Memory per worker')"
  done
done
config="$(ls -d "$tmp"/w*/checkpoint_* | head -1)"
[ "${PEER:-1}" = 0 ] && exit 0
"$py" "$root/bench/peers/fsdp_peer.py" --config "$config" --workers $workers --steps "$steps" \
  --param-dtype "${PARAM_DTYPE:-float32}" --attn "${PEER_ATTN:-sdpa}" --autocast "${PEER_AUTOCAST:-auto}"
