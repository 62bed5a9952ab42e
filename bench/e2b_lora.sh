#!/usr/bin/env bash
# LoRA fine-tuning of a real-size checkpoint (e.g. the full-depth E2B-shaped one from
# tools/make_e2b_checkpoint.py, bf16, 35 layers, vocabulary 262144) on this machine: the memory
# plan (--dry-run), then `finetune --lora-rank` at 2 workers with every worker's RSS and PSS
# sampled once a second (/proc/<pid>/smaps_rollup: PSS counts the shared memory-mapped base once
# per host), the run's seed lines and tokens/s, and `evaluate --adapter` on the saved adapter.
#   bench/e2b_lora.sh MODEL_DIR
# Env: SLICETRAIN (binary), RANK (16), TARGETS (q_proj,v_proj), BATCH (1), SEQ (512),
#      STEPS (steps per worker, 3), CKPT (--activation-checkpointing, layer), OUT=DIR (keep the run),
#      OBJECTIVE (sft; dpo or orpo train on PAIRS, a preference file, with SEQ tokens a side),
#      PRECISION (--precision of finetune: auto, bf16 or fp32; default auto).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
model="$1"
rank="${RANK:-16}" targets="${TARGETS:-q_proj,v_proj}" batch="${BATCH:-1}" seq="${SEQ:-512}"
steps="${STEPS:-3}" ckpt="${CKPT:-layer}"
tok="$root/data/tokenizer"
if [ -n "${OUT:-}" ]; then
  out="$OUT" && mkdir -p "$out"
else
  out="$(mktemp -d)" && trap 'rm -rf "$out"' EXIT
fi
objective="${OBJECTIVE:-sft}"
flags=(--model-id "$model" --tokenizer "$tok" --lora-rank "$rank" --lora-target-modules "$targets"
       --batch-size-per-device "$batch" --max-seq-len "$seq" --topology 2
       --activation-checkpointing "$ckpt" --dataset-split "train[:$((2 * batch * steps))]"
       --num-epochs 1 --precision "${PRECISION:-auto}")
data=()
if [ "$objective" != sft ]; then
  [ -n "${PAIRS:-}" ] || { echo "OBJECTIVE=$objective needs PAIRS=FILE (preference pairs)"; exit 2; }
  flags+=(--objective "$objective" --dataset "$PAIRS" --packing off)
  data=(--objective "$objective" --dataset "$PAIRS")
fi
echo "## memory plan"
"$bin" finetune "${flags[@]}" --dry-run | tail -12

echo "## finetune --objective $objective --lora-rank $rank ($targets), 2 workers, $steps steps of $batch x $seq tokens"
"$bin" finetune "${flags[@]}" --no-dashboard --progress lines --storage-path "$out" \
  --run-name lora > "$out/finetune.log" 2>&1 &
driver=$!
declare -A peak_rss peak_pss
max_total_pss=0
while kill -0 "$driver" 2>/dev/null; do
  total=0
  for pid in $(pgrep -f "slicetrain finetune.*--run-name lora" || true); do
    [ "$pid" = "$driver" ] && continue
    p=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    r=$(awk '/^Rss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    p=${p:-0} r=${r:-0}
    total=$((total + p))
    [ "$p" -gt "${peak_pss[$pid]:-0}" ] && peak_pss[$pid]=$p
    [ "$r" -gt "${peak_rss[$pid]:-0}" ] && peak_rss[$pid]=$r
  done
  [ "$total" -gt "$max_total_pss" ] && max_total_pss=$total
  sleep 1
done
wait "$driver" || { cat "$out/finetune.log"; exit 1; }
grep -E "Data:|Objective:|LoRA|step [0-9]+/|Epoch|Memory per worker|Checkpoint" "$out/finetune.log"
for pid in "${!peak_pss[@]}"; do
  echo "worker pid $pid: peak RSS $((peak_rss[$pid] / 1024)) MiB, peak PSS $((peak_pss[$pid] / 1024)) MiB"
done
echo "all workers: peak total PSS $((max_total_pss / 1024)) MiB (sampled each second)"

adapter="$(ls -d "$out"/lora/checkpoint_* | head -1)"
echo "## the saved adapter: $(ls "$adapter" | tr '\n' ' ')"
/usr/bin/time -f "evaluate --adapter: wall %e s, peak RSS %M KB" "$bin" evaluate --json \
  --model-id "$model" --adapter "$adapter" --tokenizer "$tok" --dataset-split 'train[:4]' \
  --batch-size 2 --max-seq-len 128 "${data[@]}"
