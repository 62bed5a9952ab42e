#!/usr/bin/env python3
"""llama.cpp's decoding of a GGUF file, for bench/generate.sh: the same prompt ids, greedy, timed.

    python bench/peers/llama_cpp_peer.py --gguf model.gguf --prompt-ids 2,17,... --new-tokens 128 \
        --threads 2 --repeats 3 [--label q8_0]

Runs llama.cpp through llama-cpp-python (tools/requirements-llama.txt; built from its source
distribution) with its own generation loop and greedy sampling (top_k=1): the prompt in one batch,
then one token at a time (eos does not stop it). Prints one line in bench/generate.sh's format with
the median of --repeats runs after a warm-up: the prompt's time (to the first token) and decode
tokens/s over the rest.
"""
import argparse
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    import llama_cpp

    ids = [int(x) for x in args.prompt_ids.split(",") if x]
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=len(ids) + args.new_tokens + 8, n_batch=512,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    prefill, decode, tokens = [], [], []
    for r in range(args.repeats + 1):  # the first is a warm-up
        out = []
        llm.reset()  # else generate() reuses the cached prompt of the previous run
        t0 = time.perf_counter()
        t1 = t0
        # llama.cpp's own loop and sampler; top_k=1 is greedy. The first token comes from the
        # prompt's logits, each later one from one evaluated token.
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if not out:
                t1 = time.perf_counter()
            out.append(tok)
            if len(out) == args.new_tokens:
                break
        t2 = time.perf_counter()
        if r > 0:
            prefill.append(t1 - t0)
            decode.append((len(out) - 1) / (t2 - t1) if len(out) > 1 else 0.0)
            tokens = out
    print(f"peer=llama.cpp file={args.label or os.path.basename(args.gguf)} new_tokens={len(tokens)} "
          f"prefill_s={statistics.median(prefill):.4f} decode_tokens/s={statistics.median(decode):.2f} "
          f"first_ids={','.join(map(str, tokens[:8]))}")


if __name__ == "__main__":
    main()
