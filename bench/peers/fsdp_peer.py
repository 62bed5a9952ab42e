#!/usr/bin/env python3
"""PyTorch FSDP2 peer of slicetrain's fine-tuning step (bench/finetune_vs_pytorch.sh runs both).

The seed's recipe on CPU in the strongest configuration PyTorch users would pick: Gemma4ForCausalLM
built from the same config.json slicetrain uses, attn_implementation="sdpa" (--attn eager for the
old baseline), forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) where the CPU has
bf16 instructions (avx512_bf16 or amx_bf16; --autocast off|bf16 forces it), embed_tokens_per_layer
frozen and ignored, fully_shard on every layer's MLP then on the model,
MixedPrecisionPolicy(param_dtype, reduce_dtype=float32), AdamW(lr=2e-5, wd=0.01), gloo process
group, one process per worker with cores / workers threads each. torch.compile is not used: with
FSDP2 on CPU and gloo it compiled for minutes per shape without a faster step in our tries (--compile
turns it on for a run). Random token batches of [batch, seq] per worker (no padding). Prints one line
per worker count:
  workers=N tokens/s=... step_s=... peak_rss_mib=...
Usage: tools/.venv/bin/python bench/peers/fsdp_peer.py --config DIR --workers 1 2 4
"""
import argparse
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def worker(rank: int, world: int, args, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=args.attn, dtype=torch.float32)
    model.config.use_cache = False
    text = model.model
    text.embed_tokens_per_layer.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, args.param_dtype),
                                  reduce_dtype=torch.float32)
    for layer in text.layers:
        fully_shard(layer.mlp, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy,
                ignored_params=set(text.embed_tokens_per_layer.parameters()))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5,
                            weight_decay=0.01)
    if args.compile:
        model = torch.compile(model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16")
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps + 1):
        ids = torch.randint(1, cfg.vocab_size, (args.batch, args.seq), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        with autocast:
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        dist.barrier()
        if step > 0:  # step 0 warms up
            times.append(time.perf_counter() - t0)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        times.sort()
        queue.put((times[len(times) // 2], float(rss)))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="directory with config.json (gemma4_text)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--autocast", default="auto", choices=["auto", "bf16", "off"],
                   help="auto: bf16 where the CPU has avx512_bf16 or amx_bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    if args.autocast == "auto":
        args.autocast = "bf16" if cpu_has_bf16() else "off"
    print(f"# PyTorch {torch.__version__} FSDP2 (gloo, CPU), attn={args.attn}, "
          f"autocast={args.autocast}, compile={args.compile}, param_dtype={args.param_dtype}, "
          f"batch {args.batch}x{args.seq} per worker", flush=True)
    for world in args.workers:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(worker, args=(world, args, free_port(), queue), nprocs=world,
                           start_method="spawn")
        step_s, rss = queue.get()
        tokens = world * args.batch * args.seq
        print(f"workers={world} tokens/s={tokens / step_s:.1f} step_s={step_s:.3f} "
              f"peak_rss_mib={rss:.0f}", flush=True)


if __name__ == "__main__":
    main()
