#!/usr/bin/env bash
# Memory and load speed of a real-size checkpoint (e.g. a full-depth E2B-shaped one from
# tools/make_e2b_checkpoint.py): what `info` plans per worker, `evaluate`'s peak RSS in one
# process, the per-worker sharded load beside transformers' (bench_load + bench/peers/load_peer.py
# in the same run), then a short 2-worker finetune of the last layers with every worker's RSS and
# PSS sampled once a second (/proc/<pid>/smaps_rollup; PSS counts the shared mapped file once per
# host), and the saved checkpoint checked against transformers (tools/check_checkpoint.py: same
# loss as `slicetrain evaluate`, frozen tensors byte-identical to the source).
#   bench/e2b_memory.sh MODEL_DIR [FREEZE_REGEX]
# Env: SLICETRAIN (binary), PYTHON (tools/.venv/bin/python), STEPS (training examples per worker, 2),
#      SKIP_TRANSFORMERS_LOSS=1 (skip the fp32 transformers load: 4 bytes x parameters of memory),
#      OUT=DIR (keep the run and its checkpoint there), ONLY_FINETUNE=1 (skip info, evaluate, load).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
bench_load="$(dirname "$bin")/bench/bench_load"
py="${PYTHON:-$root/tools/.venv/bin/python}"
model="$1"
freeze="${2:-^(embed_tokens|per_layer|layers\.([0-9]|[12][0-9]|3[0-2])\.)}"
steps="${STEPS:-2}"
tok="$root/data/tokenizer"
if [ -n "${OUT:-}" ]; then  # kept afterwards
  out="$OUT" && mkdir -p "$out"
else
  out="$(mktemp -d)" && trap 'rm -rf "$out"' EXIT
fi

if [ -z "${ONLY_FINETUNE:-}" ]; then
echo "## info (2 workers, --freeze '$freeze', batch 1 x 64)"
"$bin" info --model-id "$model" --num-workers 2 --freeze "$freeze" --batch-size-per-device 1 \
  --max-seq-len 64 | tail -12

echo "## evaluate, one process (16 records, batch 8 x 64)"
/usr/bin/time -f "wall %e s, peak RSS %M KB" "$bin" evaluate --json --model-id "$model" \
  --tokenizer "$tok" --dataset-split 'train[:16]' --batch-size 8 --max-seq-len 64

echo "## sharded load per worker, then transformers' load (same page cache)"
"$bench_load" --model "$model" --workers 1,2 --freeze "$freeze" --peer "$py"
fi

echo "## finetune, 2 workers, $steps steps, RSS and PSS sampled each second"
"$bin" finetune --no-dashboard --progress lines --model-id "$model" --tokenizer "$tok" \
  --freeze "$freeze" --dataset-split "train[:$((2 * steps))]" --batch-size-per-device 1 \
  --max-seq-len 64 --num-epochs 1 --max-shard-size 2GB --storage-path "$out" --run-name e2b \
  > "$out/finetune.log" 2>&1 &
driver=$!
max_pss=0 max_rss=0
while kill -0 "$driver" 2>/dev/null; do
  pss=0 rss=0
  for pid in $(pgrep -f "slicetrain finetune.*--run-name e2b" || true); do
    [ "$pid" = "$driver" ] && continue
    p=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    r=$(awk '/^Rss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    pss=$((pss + ${p:-0})) rss=$((rss + ${r:-0}))
  done
  [ "$pss" -gt "$max_pss" ] && max_pss=$pss
  [ "$rss" -gt "$max_rss" ] && max_rss=$rss
  sleep 1
done
wait "$driver" || { cat "$out/finetune.log"; exit 1; }
grep -E "Data:|Epoch|Memory per worker|Checkpoint" "$out/finetune.log"
echo "all processes of the job (driver + workers): peak total PSS $((max_pss / 1024)) MiB, peak total RSS $((max_rss / 1024)) MiB (sampled each second)"

ckpt="$(ls -d "$out"/e2b/checkpoint_* | head -1)"
echo "## the saved checkpoint: $(ls "$ckpt" | tr '\n' ' ')"
"$py" "$root/tools/check_checkpoint.py" --checkpoint "$ckpt" --compare-weights "$model" \
  --only-failures || true  # trained tensors differ by design; frozen ones must not
if [ -z "${SKIP_TRANSFORMERS_LOSS:-}" ]; then
  "$py" "$root/tools/check_checkpoint.py" --checkpoint "$ckpt" --slicetrain "$bin" --records 4 \
    --max-seq-len 32
fi
