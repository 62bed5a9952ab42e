#!/usr/bin/env python3
"""PyTorch + PEFT peer of slicetrain's LoRA fine-tuning step (bench/lora_vs_pytorch.sh runs both).

Gemma4ForCausalLM built from the same config.json slicetrain uses (fp32, sdpa attention,
use_cache off, torch.manual_seed(0)), every base weight frozen, peft LoraConfig(r=--rank,
lora_alpha=2r, lora_dropout=0, target_modules=--target-modules, CAUSAL_LM), AdamW(lr=2e-5,
wd=0.01) over the adapters. One warm-up step, then --steps timed steps of random token batches
[batch, seq] per worker (no padding, labels = input_ids). Every configuration runs in fresh
spawned processes, so each peak RSS is its own. Configurations (--modes):
  single  one process, os.cpu_count() threads, no process group
  ddp     --workers processes over gloo, DistributedDataParallel on the PEFT model,
          cores / workers threads each, each worker its own batch
  fsdp2   as ddp, with fully_shard on each decoder layer then on the model (prints
          "peer=fsdp2 unsupported: <reason>" where FSDP2 refuses or fails)
--full adds full fine-tuning (all but embed_tokens_per_layer trainable, single's set-up) for the
LoRA/full ratio; --compile wraps the model in torch.compile (falls back to eager on failure).
Prints one line per configuration:
  peer=NAME workers=N tokens/s=... step_s=... peak_rss_mib=... total_peak_rss_mib=...
  trainable_params=... compile=yes|no
(peak_rss_mib: max over workers of ru_maxrss; total_peak_rss_mib: their sum; tokens/s counts
all workers' tokens; step_s is the median timed step.)
Usage: tools/.venv/bin/python bench/peers/lora_peer.py --config DIR [--rank 16]
         [--target-modules all-linear|q_proj,v_proj,...] [--modes single,ddp,fsdp2]
         [--workers 2] [--batch 4] [--seq 512] [--steps 2] [--full] [--compile]
"""
import argparse
import os
import resource
import socket
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

warnings.filterwarnings("ignore", category=FutureWarning)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def build(args, lora: bool):
    """The model (PEFT-wrapped when lora) and its trainable parameter count."""
    cfg = AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                             dtype=torch.float32)
    model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model
        model.requires_grad_(False)
        targets = args.target_modules
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                 lora_dropout=0.0, target_modules=targets,
                                                 task_type="CAUSAL_LM"))
    else:
        model.model.embed_tokens_per_layer.requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return cfg, model, trainable


def worker(rank: int, world: int, mode: str, args, port: int, queue) -> None:
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        distributed = mode in ("ddp", "fsdp2")
        if distributed:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=rank, world_size=world)
        cfg, model, trainable = build(args, lora=(mode != "full"))
        if mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        elif mode == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            inner = model.get_base_model()  # the Gemma4ForCausalLM under the LoRA layers
            for layer in inner.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(inner, mesh=mesh)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5,
                                weight_decay=0.01)
        eager = model
        compiled = False
        if args.compile:
            try:
                model = torch.compile(model)
                compiled = True
            except Exception as e:  # noqa: BLE001 - any failure falls back to eager
                if rank == 0:
                    print(f"# peer={mode} torch.compile failed: {one_line(e)}", flush=True)
        gen = torch.Generator().manual_seed(rank)

        def step(ids):
            opt.zero_grad(set_to_none=True)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()

        times = []
        for i in range(args.steps + 1):
            ids = torch.randint(1, cfg.vocab_size, (args.batch, args.seq), generator=gen)
            if distributed:
                dist.barrier()
            t0 = time.perf_counter()
            if i == 0 and compiled:  # compilation happens here; a failure falls back to eager
                try:
                    step(ids)
                except Exception as e:  # noqa: BLE001
                    if rank == 0:
                        print(f"# peer={mode} torch.compile failed at the first step, eager: "
                              f"{one_line(e)}", flush=True)
                    model, compiled = eager, False
                    step(ids)
            else:
                step(ids)
            if distributed:
                dist.barrier()
            if i > 0:  # step 0 warms up (and compiles)
                times.append(time.perf_counter() - t0)
        times.sort()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        queue.put(("ok", rank, times[len(times) // 2], rss, trainable, compiled))
        if distributed:
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported by the parent as one line
        if os.environ.get("LORA_PEER_TRACE"):
            traceback.print_exc()
        queue.put(("error", rank, one_line(e)))
        os._exit(1)  # peers may be blocked in a collective; do not wait on them


def run(mode: str, world: int, args) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, mode, args, port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results, error = [], None
    while len(results) < world and error is None:
        if not queue.empty():
            msg = queue.get()
            if msg[0] == "error":
                error = msg[2]
            else:
                results.append(msg)
        elif any(p.exitcode not in (None, 0) for p in procs) and queue.empty():
            error = "worker exited with " + ", ".join(str(p.exitcode) for p in procs)
        else:
            time.sleep(0.1)
    if error is not None:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()
        kind = "unsupported" if mode == "fsdp2" else "failed"
        print(f"peer={mode} {kind}: {error}", flush=True)
        return
    for p in procs:
        p.join()
    step_s = max(r[2] for r in results)
    rss = [r[3] for r in results]
    tokens = world * args.batch * args.seq
    print(f"peer={mode} workers={world} tokens/s={tokens / step_s:.1f} step_s={step_s:.3f} "
          f"peak_rss_mib={max(rss):.0f} total_peak_rss_mib={sum(rss):.0f} "
          f"trainable_params={results[0][4]} compile={'yes' if results[0][5] else 'no'}",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="directory with config.json (gemma4_text)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank r (lora_alpha = 2r)")
    p.add_argument("--target-modules", default="all-linear",
                   help='"all-linear" or a comma list of module names (q_proj,v_proj,...)')
    p.add_argument("--modes", default="single,ddp", help="comma list of single, ddp, fsdp2")
    p.add_argument("--workers", type=int, default=2, help="processes of ddp and fsdp2")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2, help="timed steps (after 1 warm-up step)")
    p.add_argument("--full", action="store_true",
                   help="also full fine-tuning (no LoRA), single process, for the LoRA/full ratio")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("single", "ddp", "fsdp2"):
            p.error(f"unknown mode {m!r} (single, ddp, fsdp2)")
    print(f"# PyTorch {torch.__version__} + PEFT LoRA r={args.rank} alpha={2 * args.rank} "
          f"targets={args.target_modules}, AdamW, CPU ({os.cpu_count()} cores, gloo), "
          f"batch {args.batch}x{args.seq} per worker, {args.steps} timed steps", flush=True)
    for mode in modes + (["full"] if args.full else []):
        run(mode, 1 if mode in ("single", "full") else args.workers, args)


if __name__ == "__main__":
    main()
