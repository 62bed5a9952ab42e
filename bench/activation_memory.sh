#!/usr/bin/env bash
# Activation memory against sequence length, and the seed's shape with the real vocabulary.
#
#   bench/activation_memory.sh [SEQ_LENS] [MODEL_262K]
#
# 1. For each T in SEQ_LENS (default 512,2048,8192,32768): gemma4-small, one worker, batch 1,
#    --activation-checkpointing layer: the plan's activations (finetune --dry-run) and a one-step
#    finetune's peak RSS, epoch time and tokens/s. The activations must grow linearly in T (the
#    MiB per 1k tokens column stays flat); the 32k row is a real training step on this machine.
# 2. The seed's shape: MODEL_262K (gemma4-small's widths with the 262144-token vocabulary, from
#    `tools/make_e2b_checkpoint.py --widths small --dtype float32 --out DIR` plus the bundled
#    tokenizer files), 2 workers, batch 4 x 512: plan, peak RSS and epoch line with this binary and,
#    when BEFORE is set, with another build (e.g. the commit before tiled attention and the tiled
#    loss) in the same run.
# Env: SLICETRAIN (binary, default build/slicetrain), BEFORE (an older slicetrain binary),
#      MODES (checkpointing modes of part 1, default layer), OUT (keep the runs there).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
seqs="${1:-512,2048,8192,32768}"
model262k="${2:-}"
if [ -n "${OUT:-}" ]; then
  out="$OUT" && mkdir -p "$out"
else
  out="$(mktemp -d)" && trap 'rm -rf "$out"' EXIT
fi

plan_line() {  # $1: label in the plan; stdin: dry-run output -> MiB
  awk -v k="$1" '$1 == k {print $2; exit}'
}

echo "## gemma4-small, 1 worker, batch 1: activations per sequence length"
printf "%-6s %7s %12s %14s %12s %13s %10s %10s\n" mode T plan_act_MiB MiB_per_1k_tok \
  plan_total peak_rss_MiB epoch_s tokens/s
for mode in ${MODES:-layer}; do
  for T in ${seqs//,/ }; do
    flags="--model-id gemma4-small --topology 1 --batch-size-per-device 1 --max-seq-len $T \
      --activation-checkpointing $mode"
    plan="$("$bin" finetune --dry-run $flags)"
    act="$(plan_line activations <<<"$plan")"
    total="$(plan_line total <<<"$plan")"
    log="$out/${mode}_$T.log"
    "$bin" finetune --no-dashboard --progress off --num-epochs 1 --dataset-split 'train[:1]' \
      $flags --storage-path "$out" --run-name "${mode}_$T" >"$log" 2>&1 || { cat "$log"; exit 1; }
    rss="$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$log")"
    epoch_s="$(sed -n 's/.*epoch_time=\([0-9.]*\)s.*/\1/p' "$log")"
    tps="$(sed -n 's/.*| tokens\/s=\([0-9.]*\).*/\1/p' "$log")"
    printf "%-6s %7d %12.1f %14.1f %12.1f %13.0f %10s %10s\n" "$mode" "$T" "$act" \
      "$(echo "$act * 1024 / $T" | bc -l)" "$total" "$rss" "$epoch_s" "$tps"
  done
done

if [ -n "$model262k" ]; then
  echo "## the seed's shape: $model262k, 2 workers, batch 4 x 512"
  flags="--model-id $model262k --topology 2 --batch-size-per-device 4 --max-seq-len 512"
  "$bin" finetune --dry-run $flags | tail -11
  for b in ${BEFORE:+before} after; do
    exe="$bin"
    [ "$b" = before ] && exe="$BEFORE"
    log="$out/seed_$b.log"
    "$exe" finetune --no-dashboard --progress off --num-epochs 1 --dataset-split 'train[:8]' \
      $flags --storage-path "$out" --run-name "seed_$b" >"$log" 2>&1 || { cat "$log"; exit 1; }
    echo "$b: $(grep -E '^Epoch' "$log")"
    echo "$b: $(grep -E '^Memory per worker' "$log")"
  done
fi
