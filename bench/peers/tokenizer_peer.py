#!/usr/bin/env python3
"""Peer of bench/bench_tokenizer.cpp: the `tokenizers` package encoding the same texts.

Texts: the 4000 records of data/tiny_instruct/train.jsonl formatted with slicetrain's default prompt
template ("Instruction: ...\\nResponse: ..." / with "Context: ..."), encoded one per call without
special tokens (one thread, like our Encode), and all of them joined by newlines as one text.
encode_batch (Rust threads) is printed too, for reference.

Usage (from the repository root):  tools/.venv/bin/python bench/peers/tokenizer_peer.py
"""
import json
import os
import time

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prompts():
    out = []
    with open(os.path.join(ROOT, "data", "tiny_instruct", "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["context"]:
                out.append(f"Instruction: {r['instruction']}\nContext: {r['context']}\nResponse: {r['response']}")
            else:
                out.append(f"Instruction: {r['instruction']}\nResponse: {r['response']}")
    return out


def timeit(fn, min_time=1.0):
    fn()  # warm-up (and the tokenizer's word cache, as a long run would have it)
    n, t0 = 0, time.perf_counter()
    tokens = 0
    while True:
        tokens += fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return tokens / dt, dt / n


def main():
    texts = prompts()
    joined = "".join(t + "\n" for t in texts)
    for name, path in [("bundled", "data/tokenizer/tokenizer.json"),
                       ("gemma_style", "tests/fixtures/tokenizer/gemma_style/tokenizer.json")]:
        tok = Tokenizer.from_file(os.path.join(ROOT, path))
        rate, per = timeit(lambda: sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts))
        print(f"tokenizers {name:12s} records (1 thread)     {rate / 1e6:7.3f} M tokens/s  {per * 1e3:8.1f} ms/pass")
        rate, per = timeit(lambda: len(tok.encode(joined, add_special_tokens=False).ids))
        print(f"tokenizers {name:12s} one long text          {rate / 1e6:7.3f} M tokens/s  {per * 1e3:8.1f} ms/pass")
        rate, per = timeit(lambda: sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)))
        print(f"tokenizers {name:12s} encode_batch (threads) {rate / 1e6:7.3f} M tokens/s  {per * 1e3:8.1f} ms/pass")


if __name__ == "__main__":
    main()
