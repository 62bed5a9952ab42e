#!/usr/bin/env bash
# Compute spent on padding, before and after [packing]: slicetrain finetune at the seed's shape
# (--max-seq-len 512, --batch-size-per-device 4, 2 local workers, one epoch) on the bundled data
# set and on a Dolly-shaped file (tools/make_bench_datasets.py's dolly.jsonl), for each MODEL, in
# three layouts:
#   max_length    the previous default: --packing off --template instruction --train-on all
#                 --padding max_length
#   packing-instr --template instruction --train-on all (packed: the same tokens as max_length)
#   longest       --packing off --padding longest --group-by-length (gemma-chat, loss on responses)
#   packing       the defaults: packed, gemma-chat template, loss on responses
# Prints each run's epoch line and a markdown table: tokens/s (positions computed, padding
# included), real tokens/s (the examples' tokens), padding fraction (1 - real / computed),
# examples/s (which does not depend on the template: gemma-chat renders the bundled records in
# about 2.4x the tokens of the instruction template, whose merges the bundled tokenizer learned),
# and the speed-up of real tokens/s and of examples/s over max_length.
#   bench/packing.sh                       # MODELS="gemma4-tiny gemma4-small"
#   MODELS=gemma4-tiny bench/packing.sh
# Each run reads train[:rows]: fewer rows for max_length (its steps all cost the same, so its
# rate needs few) than for the others (whose runs would otherwise be one or two steps long):
# gemma4-tiny 512 (max_length) and 2048 / 1024 (bundled / dolly), gemma4-small 128 and 1024 / 256.
# The figures are rates, comparable across row counts. DATA (default /tmp/slicetrain_bench_data)
# holds dolly.jsonl, generated once with tools/.venv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
data="${DATA:-/tmp/slicetrain_bench_data}"
models="${MODELS:-gemma4-tiny gemma4-small}"
# rows MODEL SET LAYOUT
rows() {
  case "$1:$2:$3" in
    gemma4-small:*:max_length) echo 128 ;;
    gemma4-small:bundled:*) echo 1024 ;;
    gemma4-small:*) echo 256 ;;
    *:max_length) echo 512 ;;
    *:bundled:*) echo 2048 ;;
    *) echo 1024 ;;
  esac
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$data/dolly.jsonl" ]; then
  echo "# generating $data/dolly.jsonl"
  "$py" "$root/tools/make_bench_datasets.py" --out "$data" --big-gb 0.01 >/dev/null
fi
echo "# $(nproc) CPUs; slicetrain finetune, 2 workers x batch 4 x max-seq-len 512, one epoch"
table="$tmp/table"
: >"$table"
for model in $models; do
  for set in bundled dolly; do
    ds=()
    [ "$set" = dolly ] && ds=(--dataset "$data/dolly.jsonl")
    base=""
    for layout in max_length packing-instr longest packing; do
      case "$layout" in
        max_length) flags=(--packing off --template instruction --train-on all --padding max_length) ;;
        packing-instr) flags=(--template instruction --train-on all) ;;
        longest) flags=(--packing off --padding longest --group-by-length) ;;
        packing) flags=() ;;
      esac
      n="$(rows "$model" "$set" "$layout")"
      out="$("$bin" finetune --model-id "$model" --max-seq-len 512 --batch-size-per-device 4 \
        --topology 2 --num-epochs 1 --dataset-split "train[:$n]" "${ds[@]}" "${flags[@]}" \
        --no-dashboard --progress off --storage-path "$tmp" --run-name "$model-$set-$layout" 2>&1)" ||
        { echo "$out"; exit 1; }
      line="$(echo "$out" | grep '^Epoch 1/1')"
      echo "$model $set $layout: $line"
      echo "    $(echo "$out" | grep '^Data:' | sed -E 's/^Data: .*skipped; //' | cut -c1-160)"
      tps="$(echo "$line" | sed -E 's/.*\| tokens\/s=([0-9.]+) .*/\1/')"
      real="$(echo "$line" | sed -E 's/.*real_tokens\/s=([0-9.]+).*/\1/')"
      secs="$(echo "$line" | sed -E 's/.*epoch_time=([0-9.]+)s.*/\1/')"
      if [ -z "$base" ]; then base="$real"; base_eps="$(awk -v n="$n" -v e="$secs" 'BEGIN { print n / e }')"; fi
      awk -v m="$model" -v s="$set" -v l="$layout" -v t="$tps" -v r="$real" -v b="$base" -v n="$n" \
        -v e="$secs" -v be="$base_eps" \
        'BEGIN { printf "| %s | %s (%s rows) | %s | %.0f | %.0f | %.1f %% | %.1f | %.2fx | %.2fx |\n", m, s, n, l, t, r, 100 * (1 - r / t), n / e, r / b, n / e / be }' >>"$table"
      rm -rf "${tmp:?}/$model-$set-$layout"
    done
  done
done
echo
echo "| model | data | layout | tokens/s | real tokens/s | padding | examples/s | real tokens/s vs max_length | examples/s vs max_length |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
cat "$table"
