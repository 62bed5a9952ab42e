#!/usr/bin/env python3
"""Peer of slicetrain's checkpoint-load benchmark: how fast the Python stack reads a safetensors checkpoint.

Two measurements, each in a fresh subprocess (so each peak RSS is that measurement's own):
  safetensors     safetensors.torch.load_file() on every weight file of DIR (model.safetensors, or every
                  shard named by model.safetensors.index.json), keeping all tensors alive, as a loader would.
  from_pretrained transformers AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.bfloat16) (CPU).
  safetensors_copy (only with --only) load_file() file by file, then .clone() of every tensor into private
                  memory, the file's mapping dropped after each file: a peer for a loader that reads into its own
                  buffers rather than mapping the file.
Both calls return memory-mapped tensors (safetensors 0.8 load_file and transformers 5 from_pretrained on CPU read
lazily: the call alone takes milliseconds for GBs and leaves RSS unchanged), so every measurement also reads one
byte of every 4 KiB page of every tensor afterwards ("touch"), which makes all weight bytes resident.
  seconds       load call(s) + touch: the time until every weight byte is in memory (the headline figure)
  call_seconds  the load call(s) alone
Imports are timed separately (import_seconds). GB/s = weight file bytes / seconds (GB = 1e9 bytes). peak_rss is the child's getrusage(RUSAGE_SELF).ru_maxrss after the load; rss_after_import is
its resident size before the load (torch + transformers alone), so peak_rss - rss_after_import is what the load
itself added. The page cache is NOT dropped: run it twice (or --repeat 2) if you want warm figures only.

Usage (from the repository root):
    tools/.venv/bin/python bench/peers/load_peer.py --model DIR [--repeat N] [--only safetensors,from_pretrained,...]
Prints one line per measurement and, last, one JSON line with all figures.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

MEASUREMENTS = ("safetensors", "from_pretrained", "safetensors_copy")
DEFAULT = ("safetensors", "from_pretrained")


def weight_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, s) for s in shards]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise SystemExit(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def touch(tensors) -> int:
    """Read one byte per 4 KiB page of each tensor's storage so that the whole tensor becomes resident."""
    import torch
    acc = 0
    for t in tensors:
        if t.numel() == 0:
            continue
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        acc += int(flat[::4096].sum()) + int(flat[-1])
    return acc


def child(kind: str, model_dir: str) -> dict:
    t0 = time.perf_counter()
    import torch  # noqa: F401  (imported in both cases so that rss_after_import is comparable)
    if kind.startswith("safetensors"):
        from safetensors.torch import load_file
    else:
        from transformers import AutoModelForCausalLM
    import_s = time.perf_counter() - t0
    files = weight_files(model_dir)
    nbytes = sum(os.path.getsize(f) for f in files)
    rss0 = rss_now()
    t1 = time.perf_counter()
    if kind == "safetensors":
        state = {}
        for f in files:
            state.update(load_file(f))
        t2 = time.perf_counter()
        rss_call = rss_now()
        touch(state.values())
        extra = {"tensors": len(state), "tensor_bytes": sum(t.numel() * t.element_size() for t in state.values())}
    elif kind == "safetensors_copy":
        state = {}
        for f in files:
            mapped = load_file(f)
            for k in list(mapped):
                state[k] = mapped.pop(k).clone()
            del mapped
        t2 = time.perf_counter()
        rss_call = rss_now()
        touch(state.values())
        extra = {"tensors": len(state), "tensor_bytes": sum(t.numel() * t.element_size() for t in state.values())}
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        t2 = time.perf_counter()
        rss_call = rss_now()
        touch(list(model.parameters()) + list(model.buffers()))
        extra = {"class": type(model).__name__,
                 "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    t3 = time.perf_counter()
    secs, call = t3 - t1, t2 - t1
    return dict(measurement=kind, seconds=secs, GB_per_s=nbytes / secs / 1e9, call_seconds=call,
                call_GB_per_s=nbytes / call / 1e9, weight_bytes=nbytes, files=len(files), import_seconds=import_s,
                rss_after_import_bytes=rss0, rss_after_call_bytes=rss_call, peak_rss_bytes=peak_rss(), **extra)


def run_child(kind: str, model_dir: str) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", model_dir, "--child", kind],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (each a fresh process)")
    ap.add_argument("--only", default=",".join(DEFAULT), help=f"comma-separated subset of {','.join(MEASUREMENTS)}")
    ap.add_argument("--child", choices=MEASUREMENTS, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        print(json.dumps(child(a.child, a.model)), flush=True)
        return 0

    kinds = [k for k in a.only.split(",") if k]
    for k in kinds:
        if k not in MEASUREMENTS:
            ap.error(f"unknown measurement {k}; known: {MEASUREMENTS}")
    files = weight_files(a.model)
    results = {}
    for kind in kinds:
        runs = []
        for r in range(a.repeat):
            res = run_child(kind, a.model)
            runs.append(res)
            print(f"{kind:16s} run {r + 1}/{a.repeat}: {res['seconds']:8.2f} s  {res['GB_per_s']:6.2f} GB/s  "
                  f"(call alone {res['call_seconds']:.3f} s)  peak RSS {res['peak_rss_bytes'] / 2**30:6.2f} GiB  "
                  f"(after imports {res['rss_after_import_bytes'] / 2**30:.2f} GiB, after the call "
                  f"{res['rss_after_call_bytes'] / 2**30:.2f} GiB; {res['weight_bytes'] / 1e9:.3f} GB in "
                  f"{res['files']} file(s))", flush=True)
        best = min(runs, key=lambda x: x["seconds"])  # figures of the fastest run; runs_seconds lists all
        results[kind] = dict(best, runs_seconds=[x["seconds"] for x in runs])
    import safetensors
    import torch
    import transformers
    summary = dict(model=os.path.abspath(a.model), weight_bytes=sum(os.path.getsize(f) for f in files),
                   files=len(files), repeat=a.repeat, cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                   versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                 safetensors=safetensors.__version__),
                   **{k: {f: v[f] for f in ("seconds", "GB_per_s", "call_seconds", "call_GB_per_s", "peak_rss_bytes",
                                            "rss_after_import_bytes", "rss_after_call_bytes", "import_seconds",
                                            "runs_seconds")} for k, v in results.items()})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
