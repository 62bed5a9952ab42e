#!/usr/bin/env bash
# Data set reading throughput: slicetrain's reader (BUILD_DIR/bench/bench_dataset) against the Python stack
# (bench/peers/dataset_peer.py: pyarrow columnar, pyarrow + to_pylist rows, datasets.load_dataset + row iteration)
# on three synthetic instruction files from tools/make_bench_datasets.py: dolly.jsonl and dolly.parquet (15011 rows
# in the databricks-dolly-15k layout, ~9 / ~5 MB) and big.parquet (~BIG_GB GB of zstd Parquet, row groups of 100000
# rows). Every measurement reads the whole file (columns instruction, context, response) once in its own process, and
# prints rows/s, MB/s (file size on disk, MB = 1e6 bytes) and the process's peak RSS (ru_maxrss); the datasets peer's
# time includes its conversion to the Arrow cache (a fresh cache each run). Ends with a markdown table, preceded by
# the size of the largest row group of each Parquet file (slicetrain's peak RSS should be bounded by one row group).
# The page cache is not dropped (the first reader of a file may pay for the disk).
#   bench/dataset_read.sh [BUILD_DIR] [DATA_DIR]   # defaults: build, /tmp/slicetrain_bench_data
#   BIG_GB=0.05 SKIP_DATASETS_BIG=1 REPEAT=3 bench/dataset_read.sh
# BIG_GB (default 1.0) sizes big.parquet when DATA_DIR lacks the files (they are generated once, then reused: delete
# DATA_DIR to regenerate); SKIP_DATASETS_BIG=1 skips the datasets peer on big.parquet; REPEAT=N runs each measurement
# N times (each a fresh process) and keeps the fastest. Needs tools/.venv (tools/setup_venv.sh); PYTHON=path
# overrides its interpreter. Without BUILD_DIR/bench/bench_dataset only the peers run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
data="${2:-/tmp/slicetrain_bench_data}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
bench="$build/bench/bench_dataset"
repeat="${REPEAT:-1}"
files="dolly.jsonl dolly.parquet big.parquet"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for f in $files; do
  if [ ! -f "$data/$f" ]; then
    echo "# generating $data (big.parquet ~${BIG_GB:-1.0} GB)"
    "$py" "$root/tools/make_bench_datasets.py" --out "$data" --big-gb "${BIG_GB:-1.0}"
    break
  fi
done
"$py" -c 'import os, pyarrow, datasets
print(f"# pyarrow {pyarrow.__version__}, datasets {datasets.__version__}, {os.cpu_count()} CPUs")'
[ -x "$bench" ] || echo "# note: $bench not built yet; running the peers only"

# measure NAME CMD...: runs CMD REPEAT times, keeps the fastest of its result lines ("... rows N seconds S ...",
# the first line starting with NAME), prints it and appends "file<TAB>size<TAB>line" to the results.
measure() {
  local name="$1" best="" out line
  shift
  for _ in $(seq "$repeat"); do
    out="$("$@" 2>&1)" || { echo "$out"; echo "failed: $*"; exit 1; }
    line="$(printf '%s\n' "$out" | grep -m1 "^$name " || true)"
    [ -n "$line" ] || { echo "$out"; echo "no '$name ...' result line from: $*"; exit 1; }
    if [ -z "$best" ] || awk -v a="$line" -v b="$best" 'BEGIN {
        n = split(a, x, " "); for (i = 1; i < n; i++) if (x[i] == "seconds") s = x[i + 1]
        n = split(b, y, " "); for (i = 1; i < n; i++) if (y[i] == "seconds") t = y[i + 1]
        exit !(s + 0 < t + 0) }'; then
      best="$line"
    fi
  done
  echo "  $best"
  printf '%s\t%s\t%s\n' "$file" "$size_mb" "$best" >>"$tmp/results"
}

for file in $files; do
  path="$data/$file"
  size_mb="$(awk -v b="$(stat -c %s "$path")" 'BEGIN { printf "%.1f", b / 1e6 }')"
  echo "# $file ($size_mb MB)"
  if [ -x "$bench" ]; then
    measure slicetrain "$bench" "$path"
  fi
  for reader in pyarrow pyarrow-rows datasets; do
    if [ "$file" = big.parquet ] && [ "$reader" = datasets ] && [ "${SKIP_DATASETS_BIG:-0}" = 1 ]; then
      echo "  (datasets skipped: SKIP_DATASETS_BIG=1)"
      continue
    fi
    measure peer "$py" "$root/bench/peers/dataset_peer.py" "$path" --reader "$reader"
  done
done

echo
echo "# Row groups (uncompressed = after decompression, all 4 columns, from the footer)"
for file in $files; do
  case "$file" in *.parquet) ;; *) continue ;; esac
  "$py" -c 'import sys, pyarrow.parquet as pq
m = pq.ParquetFile(sys.argv[1]).metadata
g = max((m.row_group(i) for i in range(m.num_row_groups)), key=lambda g: g.total_byte_size)
print(f"{sys.argv[2]}: {m.num_row_groups} row group(s), {m.num_rows} rows; largest {g.num_rows} rows,",
      f"{g.total_byte_size / 1e6:.1f} MB uncompressed")' "$data/$file" "$file"
done

echo
echo "| file | size MB | reader | rows/s | MB/s | peak RSS MiB |"
echo "|---|---:|---|---:|---:|---:|"
awk -F '\t' '{
  n = split($3, x, " "); reader = (x[1] == "peer") ? x[2] : x[1]
  for (i = 1; i < n; i++) v[x[i]] = x[i + 1]
  printf "| %s | %s | %s | %.0f | %.1f | %.0f |\n", $1, $2, reader, v["rows_per_s"], v["mb_per_s"], v["peak_rss_mib"]
  if (!($1 in rows)) rows[$1] = v["rows"]
  else if (rows[$1] != v["rows"])
    bad = bad sprintf("\nwarning: %s: %s read %s rows, the first reader %s", $1, reader, v["rows"], rows[$1])
} END { if (bad != "") print bad }' "$tmp/results"
