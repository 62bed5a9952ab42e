#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) in build-fuzz/ and runs each one for
# N seconds (default 20) over a scratch copy of its seed corpus, so that new inputs never land in
# the repository. Fails on the first crash, leak, sanitizer report or timeout; the reproducer is
# left in build-fuzz/findings/<target>/. See docs/reliability.md ("Fuzzing").
#   scripts/fuzz.sh [seconds-per-target] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-20}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(fuzz_safetensors fuzz_gguf fuzz_model_dir fuzz_dataset fuzz_parquet fuzz_tokenizer fuzz_config
           fuzz_store_protocol fuzz_image)
fi

CC=clang CXX=clang++ cmake -S fuzz -B build-fuzz -G Ninja >/dev/null
cmake --build build-fuzz

max_len() {
  case "$1" in
    fuzz_tokenizer) echo 65536 ;;  # seeds are small tokenizer.json files of ~20 KB
    fuzz_config) echo 8192 ;;
    fuzz_parquet) echo 32768 ;;  # seeds are pyarrow-written files of 1-16 KB
    *) echo 4096 ;;
  esac
}

status=0
for t in "${TARGETS[@]}"; do
  work="build-fuzz/work/$t"
  findings="build-fuzz/findings/$t"
  # The targets that read files get their input through a scratch file: on a RAM file system
  # when there is one (a disk-backed one makes them ten times slower).
  scratch="$work/tmp"
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then scratch="/dev/shm/slicetrain_fuzz_$$_$t"; fi
  rm -rf "$work" "$scratch"
  mkdir -p "$work/corpus" "$findings" "$scratch"
  cp fuzz/corpus/"$t"/* "$work/corpus/"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a reader that allocates what a
  # header claims instead of what the file holds.
  if ! TMPDIR="$scratch" ./build-fuzz/"$t" "$work/corpus" -max_total_time="$SECONDS_PER_TARGET" \
      -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$findings/" >"$work/log" 2>&1; then
    echo "fuzz: $t FAILED; reproducer in $findings/, log $work/log:"
    tail -40 "$work/log"
    status=1
    rm -rf "$scratch"
    continue
  fi
  rm -rf "$scratch"
  grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^#[0-9]+ *DONE" "$work/log" |
    tr '\n' ' ' | sed "s/^/fuzz: $t ok: /"
  echo
done
exit $status
