#!/usr/bin/env python3
"""transformers peer of `slicetrain generate` (bench/generate.sh runs both on the same model and prompt).

Gemma4ForCausalLM.from_pretrained(--model, attn_implementation="sdpa", dtype=--dtype), eval, torch.no_grad,
torch.set_num_threads(--threads). Greedy decoding: model.generate(input_ids, do_sample=False, num_beams=1,
max_new_tokens=N, min_new_tokens=N, eos_token_id=None) with a GenerationConfig that replaces the model's (so no
processor and no early stop), use_cache=True (DynamicCache) or False (--no-cache rows: every step recomputes the
whole sequence). Decoding speed separates the prompt: t(N) - t(1) covers N - 1 new tokens, so
decode tokens/s = (N - 1) / (t(N) - t(1)); each time is the median of --repeats runs after one warm-up.
--compile additionally runs the cached path with cache_implementation="static" and torch.compile(model.forward)
(transformers' documented recipe for compiled generation), reporting "compile=failed: <reason>" if it fails.
Prints one line per configuration:
  peer=transformers dtype=float32 cache=yes compile=no new_tokens=N prefill_s=... decode_tokens/s=...
    decode_GFLOP/s=... tokens=<first 8 ids>...
and, with --expect-ids (slicetrain's ids, comma-separated), whether the greedy tokens are the same.
Usage: tools/.venv/bin/python bench/peers/generate_peer.py --model DIR --prompt-ids 2,5,... [--new-tokens 128]
         [--no-cache-tokens 16] [--dtype float32,bfloat16] [--threads 2] [--repeats 3] [--compile]
         [--expect-ids 1,2,...]
"""
import argparse
import os
import statistics
import time
import warnings

import torch
from transformers import Gemma4ForCausalLM, GenerationConfig

warnings.filterwarnings("ignore")


def gen_config(n, cache, static=False):
    g = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                         pad_token_id=0, use_cache=cache)
    if static:
        g.cache_implementation = "static"
    return g


def timed(model, ids, n, cache, repeats, static=False):
    model.generation_config = gen_config(n, cache, static)
    mask = torch.ones_like(ids)
    out = None
    times = []
    for r in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=gen_config(n, cache, static))
        if r > 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out[0, ids.shape[1]:].tolist()


def decode_flops_per_token(model, context):
    """2 x the matrix-product parameters (the tied head included, lookups excluded) plus the attention
    products over `context` visible keys per layer (window-limited for sliding layers)."""
    c = model.config
    n = 0
    for name, p in model.named_parameters():
        if p.dim() == 2 and "embed_tokens_per_layer" not in name and "embed_tokens" not in name:
            n += p.numel()
    n += c.vocab_size * c.hidden_size  # the tied head
    attn = 0
    for layer, t in zip(model.model.layers, c.layer_types):
        width = layer.self_attn.q_proj.weight.shape[0]  # heads x the layer's head dim
        keys = min(context + 1, c.sliding_window) if t == "sliding_attention" else context + 1
        attn += 4 * width * keys
    return 2 * n + attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--no-cache-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--expect-ids", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    prompt = [int(x) for x in a.prompt_ids.split(",")]
    ids = torch.tensor([prompt], dtype=torch.long)
    expect = [int(x) for x in a.expect_ids.split(",")] if a.expect_ids else None
    for dtype in a.dtype.split(","):
        model = Gemma4ForCausalLM.from_pretrained(a.model, attn_implementation="sdpa",
                                                  dtype=getattr(torch, dtype)).eval()
        flops = decode_flops_per_token(model, len(prompt) + a.new_tokens // 2)
        configs = [("yes", "no", a.new_tokens, True, False), ("no", "no", a.no_cache_tokens, False, False)]
        if a.compile:
            configs.append(("static", "yes", a.new_tokens, True, True))
        for cache, comp, n, use_cache, static in configs:
            with torch.no_grad():
                try:
                    if static:
                        model.forward = torch.compile(model.forward)
                    t1, _ = timed(model, ids, 1, use_cache, a.repeats, static)
                    tn, toks = timed(model, ids, n, use_cache, a.repeats, static)
                except Exception as e:  # noqa: BLE001 - report any failure of the compiled path
                    print(f"peer=transformers dtype={dtype} cache={cache} compile=failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                    continue
            rate = (n - 1) / (tn - t1) if tn > t1 else float("nan")
            line = (f"peer=transformers dtype={dtype} cache={cache} compile={comp} new_tokens={n} "
                    f"prefill_s={t1:.4f} decode_tokens/s={rate:.1f} decode_GFLOP/s={rate * flops / 1e9:.2f}")
            if expect is not None:
                m = min(len(expect), len(toks))
                line += f" same_tokens_as_slicetrain={'yes' if toks[:m] == expect[:m] else 'no'}({m})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
