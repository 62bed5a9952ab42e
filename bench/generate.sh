#!/usr/bin/env bash
# Decoding speed: `slicetrain generate` with the KV cache and without (--no-kv-cache), beside
# transformers' generate (bench/peers/generate_peer.py: sdpa, DynamicCache, fp32 and bf16) on the
# same model and the same prompt in the same run. Greedy, eos ignored by neither (a random model
# rarely emits it; the lines print how many tokens each made). Prints decode tokens/s and GFLOP/s,
# the prompt's time, and whether both made the same tokens.
#   bench/generate.sh                  # gemma4-small checkpoint in bf16 (as Gemma's are), 128-token
#                                      # prompt, 128 new tokens
#   SAVE_DTYPE=fp32 bench/generate.sh  # the same checkpoint in fp32
#   MODEL=/path/to/hf_model_dir PROMPT_LEN=520 NEW=64 bench/generate.sh
#   COMPILE=1 bench/generate.sh        # also the peer's static cache + torch.compile
#   EXTRA_WEIGHTS="" bench/generate.sh # without the --weights-dtype q8_0, q4_0 and q4_k_m runs
#   LLAMA_CPP_FORMATS="bf16 q8_0" bench/generate.sh  # llama.cpp on these GGUF exports (default: the
#                                      # EXTRA_WEIGHTS formats; skipped without llama-cpp-python)
# THREADS (default: all CPUs) applies to both; REPEATS (3) runs each, the median is printed.
# Needs tools/.venv (tools/setup_venv.sh) for the peer; SLICETRAIN=path overrides the binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
threads="${THREADS:-$(nproc)}"
prompt_len="${PROMPT_LEN:-128}"
new="${NEW:-128}"
no_cache_new="${NO_CACHE_NEW:-16}"
repeats="${REPEATS:-3}"
dtypes="${DTYPES:-float32,bfloat16}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
model="${MODEL:-}"
if [ -z "$model" ]; then
  # A gemma4-small checkpoint (one short full fine-tuning run), so that both sides load the same
  # config.json and safetensors. slicetrain holds a bf16 checkpoint's matrices in bf16 (exact),
  # transformers computes in the dtype it is given (both fp32 and bf16 are run).
  out="$("$bin" finetune --model-id gemma4-small --save-dtype "${SAVE_DTYPE:-bf16}" \
    --max-seq-len 64 --batch-size-per-device 4 \
    --topology 1 --dataset-split "train[:8]" --num-epochs 1 --storage-path "$tmp" \
    --run-name model --no-dashboard --progress off 2>&1)" || { echo "$out"; exit 1; }
  model="$(ls -d "$tmp"/model/checkpoint_* | head -1)"
fi
vocab="$("$py" -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); c=c.get('text_config',c); print(c['vocab_size'])" "$model")"
# The prompt: bos, then ids from a fixed linear congruential sequence in [3, vocab).
ids="2"
x=12345
for ((i = 1; i < prompt_len; i++)); do
  x=$(( (x * 1103515245 + 12345) % 2147483648 ))
  ids="$ids,$(( 3 + x % (vocab - 3) ))"
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { "$py" -c "import json,sys; j=json.loads(sys.stdin.read()); print(j['$1'])"; }
run() {  # run N_NEW [flags]: one JSON line per repeat into $tmp/runs
  : > "$tmp/runs"
  for ((r = 0; r <= repeats; r++)); do  # the first is a warm-up
    line="$("$bin" generate --model-id "$model" --prompt-ids "$ids" --max-new-tokens "$1" \
      --threads "$threads" --max-seq-len $((prompt_len + $1 + 8)) --json "${@:2}")"
    [ "$r" -gt 0 ] && echo "$line" >> "$tmp/runs"
  done
  true
}
echo "# model $model (vocab $vocab), prompt $prompt_len tokens, greedy, $threads threads, median of $repeats"
run "$new"
tps="$(while read -r l; do echo "$l" | field decode_tokens_per_s; done < "$tmp/runs" | median)"
gfs="$(while read -r l; do echo "$l" | field decode_gflop_per_s; done < "$tmp/runs" | median)"
pre="$(while read -r l; do echo "$l" | field prefill_s; done < "$tmp/runs" | median)"
toks="$(head -1 "$tmp/runs" | "$py" -c "import json,sys; print(','.join(map(str, json.loads(sys.stdin.read())['token_ids'])))")"
made="$(head -1 "$tmp/runs" | field new_tokens)"
echo "slicetrain cache=yes new_tokens=$made prefill_s=$pre decode_tokens/s=$tps decode_GFLOP/s=$gfs"
# The same run with the matrices held as Q8_0 or Q4_0 blocks or the Q4_K_M mixture (--weights-dtype q8_0|q4_0|q4_k_m), and how
# many of its greedy tokens equal the line above's before the first difference.
for w in ${EXTRA_WEIGHTS-q8_0 q4_0 q4_k_m}; do
  run "$new" --weights-dtype "$w"
  tps_w="$(while read -r l; do echo "$l" | field decode_tokens_per_s; done < "$tmp/runs" | median)"
  gfs_w="$(while read -r l; do echo "$l" | field decode_gflop_per_s; done < "$tmp/runs" | median)"
  pre_w="$(while read -r l; do echo "$l" | field prefill_s; done < "$tmp/runs" | median)"
  same="$(head -1 "$tmp/runs" | "$py" -c "import json,sys; a=json.loads(sys.stdin.read())['token_ids']; b=[int(x) for x in sys.argv[1].split(',') if x]; n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b))); print(n)" "$toks")"
  echo "slicetrain cache=yes weights=$w prefill_s=$pre_w decode_tokens/s=$tps_w decode_GFLOP/s=$gfs_w first_${same}_tokens_equal_the_line_above"
done
# llama.cpp on the same model: exported to GGUF by slicetrain in each of LLAMA_CPP_FORMATS (default
# the block formats above), decoded by llama-cpp-python (tools/requirements-llama.txt) with the same
# prompt and threads. A layout llama.cpp cannot run (gemma4-small's KV sharing) is named and skipped.
if "$py" -c "import llama_cpp" 2>/dev/null; then
  for w in ${LLAMA_CPP_FORMATS-${EXTRA_WEIGHTS-q8_0 q4_0 q4_k_m}}; do
    if ! err="$("$bin" export --model-id "$model" --format gguf --quant "$w" --output "$tmp/model_$w.gguf" 2>&1)"; then
      echo "peer=llama.cpp file=$w skipped: $(echo "$err" | grep -m1 error)"
      continue
    fi
    "$py" "$root/bench/peers/llama_cpp_peer.py" --gguf "$tmp/model_$w.gguf" --label "$w" \
      --prompt-ids "$ids" --new-tokens "$new" --threads "$threads" --repeats "$repeats"
    rm -f "$tmp/model_$w.gguf"
  done
else
  echo "peer=llama.cpp skipped: llama-cpp-python is not installed (tools/requirements-llama.txt)"
fi
run "$no_cache_new" --no-kv-cache
tps_nc="$(while read -r l; do echo "$l" | field decode_tokens_per_s; done < "$tmp/runs" | median)"
gfs_nc="$(while read -r l; do echo "$l" | field decode_gflop_per_s; done < "$tmp/runs" | median)"
echo "slicetrain cache=no new_tokens=$no_cache_new decode_tokens/s=$tps_nc (useful GFLOP/s=$gfs_nc)"
"$py" "$root/bench/peers/generate_peer.py" --model "$model" --prompt-ids "$ids" --new-tokens "$new" \
  --no-cache-tokens "$no_cache_new" --dtype "$dtypes" --threads "$threads" --repeats "$repeats" \
  --expect-ids "$toks" ${COMPILE:+--compile}
