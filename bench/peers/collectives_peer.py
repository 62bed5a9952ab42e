#!/usr/bin/env python3
"""PyTorch gloo peer of bench_collectives: the same ops, sizes and worker counts with torch.distributed.

One process per rank (torch.multiprocessing.spawn), backend "gloo" over TCP on 127.0.0.1 (what PyTorch users run
on CPU; gloo has no shared-memory path), torch.set_num_threads(1) per rank, float32 tensors. Ops and sizes as
bench_collectives counts them: all_reduce on a [size/4] tensor (dist.all_reduce, SUM); all_gather into a [size/4]
output from [size/4/P] inputs (dist.all_gather_into_tensor); reduce_scatter of a [size/4] input into [size/4/P]
(dist.reduce_scatter_tensor, SUM). Time of one op = mean over iterations after one warm-up and a barrier, the
slowest rank's (all_reduce MAX of the per-rank means). Iterations: clamp(budget / size, 3, 200).
Prints one JSON object per row on stdout:
  {"peer": "torch-gloo", "torch": "2.x", "op": "all_reduce", "workers": 2, "bytes": 4194304, "us": 1234.5}
and {"op": ..., "error": "..."} when an op is not supported.
Usage: tools/.venv/bin/python bench/peers/collectives_peer.py --workers 2,4 --sizes 1024,4194304
         [--ops all_reduce,all_gather,reduce_scatter] [--budget 67108864]
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_op(op, a, b):
    if op == "all_reduce":
        dist.all_reduce(a, op=dist.ReduceOp.SUM)
    elif op == "all_gather":
        dist.all_gather_into_tensor(b, a)
    else:
        dist.reduce_scatter_tensor(b, a, op=dist.ReduceOp.SUM)


def worker(rank, world, port, ops, sizes, budget, out_path):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for op in ops:
        for size in sizes:
            unit = 4 * world
            size = max(unit, size // unit * unit)
            n = size // 4
            a = torch.ones(n // world if op == "all_gather" else n)
            b = torch.empty(n if op == "all_gather" else n // world)
            iters = max(3, min(200, budget // size))
            try:
                run_op(op, a, b)
            except Exception as e:  # an op this torch build's gloo lacks
                rows.append({"op": op, "workers": world, "bytes": size, "error": str(e).splitlines()[0]})
                continue
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run_op(op, a, b)
            us = torch.tensor([(time.perf_counter() - t0) / iters * 1e6])
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            rows.append({"peer": "torch-gloo", "torch": torch.__version__, "op": op, "workers": world,
                         "bytes": size, "us": round(us.item(), 2)})
    if rank == 0:
        with open(out_path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="2,4")
    p.add_argument("--sizes", default="1024,4194304,67108864")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--budget", type=int, default=512 << 20)
    args = p.parse_args()
    ops = args.ops.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    for world in [int(w) for w in args.workers.split(",")]:
        out_path = f"/tmp/collectives_peer_{os.getpid()}_{world}.jsonl"
        mp.spawn(worker, args=(world, free_port(), ops, sizes, args.budget, out_path), nprocs=world, join=True)
        with open(out_path) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
        os.remove(out_path)


if __name__ == "__main__":
    main()
