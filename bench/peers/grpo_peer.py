#!/usr/bin/env python3
"""Peers of slicetrain's GRPO (bench/grpo.sh runs both on the same checkpoint and prompts).

--mode generate: transformers' batched sampling, the work of a GRPO round without vLLM.
  Gemma4ForCausalLM.from_pretrained(--model, attn_implementation="sdpa", dtype=float32 or bfloat16), eval,
  torch.no_grad, torch.set_num_threads(--threads); model.generate on a batch of --batch prompts (the same ids as
  slicetrain's, left-padded none: all prompts have the same length), do_sample=True, temperature 1, top_k 0,
  max_new_tokens = min_new_tokens = --new (every sequence runs the whole length, as bench_rollout's do).
  Prints new tokens/s, the best of --repeats runs after one warm-up.
--mode step: TRL's GRPOTrainer (no vLLM: generation with the training model) on --dataset (prompt column),
  num_generations = per_device_train_batch_size = --generations, max_completion_length = --new, one prompt a
  step, a reward function of the completion's length, learning_rate 1e-6, beta 0 (TRL's default), bf16 autocast
  when --bf16 (use_cpu=True), sdpa attention. Runs --steps steps and prints the seconds of each step after the
  first (TRL's own timing of training_step via a callback) and their median.
Usage: tools/.venv/bin/python bench/peers/grpo_peer.py --mode generate --model DIR --prompt-ids 2,5,... [--batch 8]
         [--new 128] [--threads 2] [--repeats 3]
       tools/.venv/bin/python bench/peers/grpo_peer.py --mode step --model DIR --dataset prompts.jsonl
         [--generations 8] [--new 128] [--steps 4] [--bf16] [--threads 2]
"""
import argparse
import statistics
import time
import warnings

import torch

warnings.filterwarnings("ignore")


def generate(a):
    from transformers import Gemma4ForCausalLM, GenerationConfig
    ids = torch.tensor([[int(x) for x in a.prompt_ids.split(",")]] * a.batch)
    for dtype in a.dtypes.split(","):
        model = Gemma4ForCausalLM.from_pretrained(a.model, attn_implementation="sdpa",
                                                  dtype=getattr(torch, dtype)).eval()
        g = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=a.new,
                             min_new_tokens=a.new, eos_token_id=None, pad_token_id=0, use_cache=True)
        times = []
        with torch.no_grad():
            for r in range(a.repeats + 1):
                torch.manual_seed(r)
                t0 = time.perf_counter()
                out = model.generate(ids, generation_config=g)
                t = time.perf_counter() - t0
                assert out.shape[1] == ids.shape[1] + a.new
                if r > 0:
                    times.append(t)
        best = min(times)
        print(f"peer=transformers generate dtype={dtype} batch={a.batch} new_tokens={a.new} seconds={best:.3f} "
              f"new_tokens/s={a.batch * a.new / best:.1f}", flush=True)


def step(a):
    from datasets import load_dataset
    from transformers import AutoTokenizer, Gemma4ForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    tok = AutoTokenizer.from_pretrained(a.model)
    model = Gemma4ForCausalLM.from_pretrained(a.model, attn_implementation="sdpa", dtype=torch.float32)
    ds = load_dataset("json", data_files=a.dataset, split="train")

    def length_reward(completions, **kw):
        return [len(c) / 100.0 for c in completions]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    cfg = GRPOConfig(output_dir="/tmp/grpo_peer_out", use_cpu=True, bf16=a.bf16, report_to=[], seed=0,
                     per_device_train_batch_size=a.generations, num_generations=a.generations,
                     max_completion_length=a.new, learning_rate=1e-6, max_steps=a.steps, logging_steps=1,
                     save_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[Timer()])
    trainer.train()
    later = times[1:]
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    print(f"peer=trl GRPOTrainer bf16={a.bf16} generations={a.generations} max_completion_length={a.new} "
          f"step_s={' '.join(f'{t:.2f}' for t in later)} median_step_s={statistics.median(later):.3f} "
          f"mean_completion_length={statistics.mean(lengths):.1f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["generate", "step"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-ids", default="")
    p.add_argument("--dataset", default="")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    generate(a) if a.mode == "generate" else step(a)


if __name__ == "__main__":
    main()
