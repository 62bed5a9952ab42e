#!/usr/bin/env bash
# GRPO speed, slicetrain beside its peers in the same run, on one gemma4-small checkpoint (bf16,
# as Gemma's are), CPU threads THREADS (default: all):
# 1. sampling: bench_rollout's new tokens/s of BATCH (8) completions decoded together against one
#    at a time (fp32 and bf16), and transformers' model.generate on the same batch and prompt ids
#    (bench/peers/grpo_peer.py --mode generate: sdpa, fp32 and bf16, do_sample, min_new_tokens);
# 2. a GRPO step: `slicetrain finetune --objective grpo` (G = 8 completions of one prompt a step,
#    NEW = 128 new tokens at most, full fine-tuning, one worker) against TRL's GRPOTrainer without
#    vLLM (bench/peers/grpo_peer.py --mode step: fp32 and bf16 autocast), on the same prompts and
#    a reward of the completion's length; each prints its step seconds and mean completion length.
#   bench/grpo.sh                       # everything
#   PROMPT_LEN=8 bench/grpo.sh          # sampling with short prompts (decoding dominates)
# Needs tools/.venv (tools/setup_venv.sh) for the peers; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
bench_rollout="${BENCH_ROLLOUT:-$(dirname "$bin")/bench/bench_rollout}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
threads="${THREADS:-$(nproc)}"
prompt_len="${PROMPT_LEN:-128}"
new="${NEW:-128}"
batch="${BATCH:-8}"
steps="${STEPS:-4}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS="$threads"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads threads"
"$bin" finetune --model-id gemma4-small --save-dtype bf16 --max-seq-len 64 --batch-size-per-device 4 \
  --topology 1 --dataset-split "train[:8]" --num-epochs 1 --storage-path "$tmp" --run-name model \
  --no-dashboard --progress off > "$tmp/model.log" 2>&1 || { cat "$tmp/model.log"; exit 1; }
model="$(ls -d "$tmp"/model/checkpoint_* | head -1)"

echo "## 1. sampling: $batch prompts of $prompt_len tokens, $new new tokens each, temperature 1"
for p in fp32 bf16; do
  "$bench_rollout" --model "$model" --prompts "$batch" --batch "$batch" --prompt-len "$prompt_len" \
    --new "$new" --precision "$p" --repeats 3 | grep -v '^#' | sed "s/^/[$p] /"
done
ids="2"
x=12345
for ((i = 1; i < prompt_len; i++)); do
  x=$(( (x * 1103515245 + 12345) % 2147483648 ))
  ids="$ids,$(( 3 + x % (8192 - 3) ))"
done
"$py" "$root/bench/peers/grpo_peer.py" --mode generate --model "$model" --prompt-ids "$ids" \
  --batch "$batch" --new "$new" --threads "$threads" --repeats 3 2>/dev/null | grep '^peer='

echo "## 2. a GRPO step: G = 8 completions of one prompt, at most $new new tokens, full fine-tuning"
"$py" - "$tmp/prompts.jsonl" <<'PY'
import json, random, sys
r = random.Random(0)
words = "one two three four five six seven eight nine ten".split()
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write(json.dumps({"prompt": "Count: " + " ".join(r.choice(words) for _ in range(6))}) + "\n")
PY
for p in fp32 bf16; do
  "$bin" finetune --model-id "$model" --dataset "$tmp/prompts.jsonl" --objective grpo \
    --reward "overlong:$new:$((new / 2))" --num-generations 8 --batch-size-per-device 8 \
    --max-completion-length "$new" --max-seq-len 64 --max-steps "$steps" --topology 1 \
    --threads "$threads" --precision "$p" --storage-path "$tmp/runs" --run-name "s_$p" \
    --no-dashboard --progress off > "$tmp/s_$p.log" 2>&1 || { cat "$tmp/s_$p.log"; exit 1; }
  "$py" - "$tmp/runs/s_$p/metrics.jsonl" "$p" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [s for s in steps if s.get("type") == "step"][1:]  # after the first
times = " ".join(f"{s['step_s']:.2f}" for s in steps)
print(f"slicetrain grpo precision={sys.argv[2]} step_s={times} "
      f"median_step_s={statistics.median(s['step_s'] for s in steps):.3f} "
      f"generate_s={statistics.median(s['generate_s'] for s in steps):.3f} "
      f"mean_completion_length={statistics.mean(s['completions/mean_length'] for s in steps):.1f}")
PY
done
for bf in "" "--bf16"; do
  "$py" "$root/bench/peers/grpo_peer.py" --mode step --model "$model" --dataset "$tmp/prompts.jsonl" \
    --generations 8 --new "$new" --steps "$steps" --threads "$threads" $bf 2>/dev/null | grep '^peer='
done
