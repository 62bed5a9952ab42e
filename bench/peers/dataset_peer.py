#!/usr/bin/env python3
"""Peer of slicetrain's data set reading benchmark (bench/dataset_read.sh): the Python stack reading one file.

Reads the whole FILE (.parquet, or .jsonl / .json: one JSON object a line) once with one reader and prints one line:
    peer <reader> rows <N> seconds <S> rows_per_s <R> mb_per_s <M> peak_rss_mib <P>
Readers:
  pyarrow       Parquet: pq.ParquetFile(FILE).iter_batches(columns=COLUMNS) over the whole file (pyarrow's default
                batches of 65536 rows, its thread pool on), counting rows: columnar decode only, no Python objects
                per row. ParquetFile's defaults are kept, pre_buffer=True included (pyarrow 26): it reads column
                chunks ahead; on the 1 GB big.parquet it took 1.4-2x the time and 3x the peak RSS (1.2 vs 0.4 GiB)
                of --no-pre-buffer.
                JSON lines: pyarrow.json.read_json(FILE) with an explicit schema of COLUMNS (string) and the other
                fields ignored (so the projection happens while parsing; multi-threaded by default).
  pyarrow-rows  the same, then batch.to_pylist() for every batch and each row's COLUMNS fields touched (len()):
                the per-row cost a Python trainer pays to get dicts of str.
  datasets      datasets.load_dataset("parquet" / "json", data_files=FILE, split="train", cache_dir=<a fresh temporary
                directory>), then ds.select_columns(COLUMNS) and `for row in ds`, touching each field. The time
                INCLUDES load_dataset's conversion of FILE into its Arrow cache (what a first run pays; a later run
                with a warm cache would skip it). HF_HOME and every HF cache point into that temporary directory,
                HF_DATASETS_OFFLINE=1, progress bars off; the directory is deleted afterwards.
Timing: time.perf_counter() around the read only (imports and the size lookup are outside it).
  mb_per_s     the file's size (os.path.getsize, MB = 1e6 bytes) / seconds
  peak_rss_mib getrusage(RUSAGE_SELF).ru_maxrss (KiB on Linux) / 1024 at the end, so the process's peak, imports
               included: run each reader in its own process. datasets memory-maps its Arrow cache, and the pages
               it touches count as resident too.
The page cache is not dropped: the first reader of a file may pay for the disk.

Usage (from the repository root):
    tools/.venv/bin/python bench/peers/dataset_peer.py FILE --reader pyarrow|pyarrow-rows|datasets \\
        [--columns instruction,context,response] [--no-pre-buffer]
"""
import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

READERS = ("pyarrow", "pyarrow-rows", "datasets")


def is_json(path: str) -> bool:
    return path.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz"))


def touch_rows(rows, columns) -> tuple[int, int]:
    """(rows, characters of the COLUMNS fields): reads every field of every row (a dict) once."""
    n = chars = 0
    for r in rows:
        for c in columns:
            v = r[c]
            chars += len(v) if v is not None else 0
        n += 1
    return n, chars


def read_pyarrow(path: str, columns: list[str], to_rows: bool, pre_buffer: bool) -> int:
    """Rows read (the touched character count is discarded)."""
    import pyarrow as pa
    n = 0
    if is_json(path):
        import pyarrow.json as pj
        opts = pj.ParseOptions(explicit_schema=pa.schema([(c, pa.string()) for c in columns]),
                               unexpected_field_behavior="ignore")
        table = pj.read_json(path, parse_options=opts)
        if not to_rows:
            return table.num_rows
        for batch in table.to_batches():
            touch_rows(batch.to_pylist(), columns)
            n += batch.num_rows
        return n
    import pyarrow.parquet as pq
    for batch in pq.ParquetFile(path, pre_buffer=pre_buffer).iter_batches(columns=columns):
        if to_rows:
            touch_rows(batch.to_pylist(), columns)
        n += batch.num_rows
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--reader", required=True, choices=READERS)
    ap.add_argument("--columns", default="instruction,context,response", help="comma-separated columns to read")
    ap.add_argument("--no-pre-buffer", action="store_true",
                    help="pyarrow readers, Parquet: ParquetFile(pre_buffer=False) instead of pyarrow's default True")
    a = ap.parse_args()
    path = os.path.abspath(a.file)
    columns = [c for c in a.columns.split(",") if c]
    size = os.path.getsize(path)

    cache = None
    if a.reader == "datasets":
        cache = tempfile.mkdtemp(prefix="slicetrain-dataset-peer-")
        # Before the import: datasets and huggingface_hub read these at import time.
        os.environ.update(HF_HOME=cache, HF_DATASETS_CACHE=os.path.join(cache, "datasets"),
                          HF_HUB_CACHE=os.path.join(cache, "hub"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                          HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        import datasets
        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    else:
        import pyarrow  # noqa: F401
        import pyarrow.json  # noqa: F401
        import pyarrow.parquet  # noqa: F401

    try:
        t0 = time.perf_counter()
        if a.reader == "datasets":
            ds = datasets.load_dataset("json" if is_json(path) else "parquet", data_files=path, split="train",
                                       cache_dir=os.path.join(cache, "datasets"))
            rows, _ = touch_rows(ds.select_columns(columns), columns)
        else:
            rows = read_pyarrow(path, columns, to_rows=a.reader == "pyarrow-rows",
                                pre_buffer=not a.no_pre_buffer)
        secs = time.perf_counter() - t0
        if a.reader == "datasets":
            del ds  # unmaps the cache files before they are deleted
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peer {a.reader} rows {rows} seconds {secs:.3f} rows_per_s {rows / secs:.0f} "
          f"mb_per_s {size / 1e6 / secs:.1f} peak_rss_mib {peak_mib:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
