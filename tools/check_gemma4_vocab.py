#!/usr/bin/env python3
"""Check slicetrain's tokenizer for GGUF vocabularies on Gemma 4's real vocabulary against llama.cpp.

Usage (from any directory):
    tools/.venv/bin/python tools/check_gemma4_vocab.py --bin build/slicetrain [--work /tmp/slicetrain_vocab_check]

Gemma 4's tokenizer files on the Hugging Face hub are gated (unreachable here), but llama-cpp-python's source
distribution on PyPI carries llama.cpp's tree, with models/ggml-vocab-gemma-4.gguf (Gemma 4's 262144-token
vocabulary, its 514906 merges and its special tokens at their real ids) and llama.cpp's own tokenizer cases for it
(ggml-vocab-gemma-4.gguf.inp / .out, which llama.cpp's test-tokenizer-0 checks). The script downloads that
distribution once (pip download, no build) and:
  1. runs `slicetrain tokenize --tokenizer ggml-vocab-gemma-4.gguf --no-special` on every case of the .inp file and
     asserts the ids of the .out file, case by case (llama.cpp tokenizes them with parse_special off; none of the
     cases holds a special token's text);
  2. when llama-cpp-python is installed (tools/requirements-llama.txt), loads the same file in llama.cpp
     (vocab_only) and compares its ids with slicetrain's on 2000 rows of the bundled data set (instruction, context
     and response joined by newlines) and on texts with special tokens, spaces, tabs, runs of newlines and
     characters outside the vocabulary, with and without bos (llama.cpp's tokenize(special=True), which splits
     special tokens out as transformers does); and asserts that slicetrain's decode gives each text back
     (`tokenize --decode --jsonl`).
Prints one line per check; exits non-zero on the first mismatch.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_gguf import llama_cpp_source  # noqa: E402  (the download of the source distribution)

ROOT = Path(__file__).resolve().parent.parent
EXTRA = ["<|turn>user\nWhat is a GPU?<turn|>\n<|turn>model\n", "<bos>literal specials<eos> and <unk><mask>",
         "<|channel>thought\n<channel|>answer", "<|tool_call>call:f{x:<|\"|>1<|\"|>}<tool_call|>",
         "  leading spaces and\ttabs\t\t\n\n\nthree newlines\n\n\n\n\nfive", "trailing spaces   ", "\n", "\n\n\n\n\n\n",
         "Ünïcödé — ümlauts, 中文, 日本語のテキスト, emoji 🙂🦙, \u00ad soft hyphen",
         "numbers 1234567890 3.14159 and symbols !@#$%^&*()_+-=[]{}|;':\",./<>?`~", "\r\nwindows\r\nlines",
         "<unused0> <unused1234> look like specials but are normal tokens", "<0x41> is text, not a byte"]


def slicetrain_ids(binary: str, vocab: Path, texts: list, work: Path, special: bool) -> list:
    inp = work / "texts.jsonl"
    inp.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    cmd = [binary, "tokenize", "--tokenizer", str(vocab), "--file", str(inp), "--jsonl"]
    if not special:
        cmd.append("--no-special")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lines = r.stdout.split("\n")[:len(texts)]
    return [[int(x) for x in line.split()] for line in lines]


def slicetrain_decode(binary: str, vocab: Path, ids: list, work: Path) -> list:
    inp = work / "ids.txt"
    inp.write_text("".join(" ".join(map(str, x)) + "\n" for x in ids))
    r = subprocess.run([binary, "tokenize", "--tokenizer", str(vocab), "--file", str(inp), "--decode", "--jsonl"],
                       capture_output=True, text=True, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build/slicetrain"))
    ap.add_argument("--work", default="/tmp/slicetrain_vocab_check")
    ap.add_argument("--rows", type=int, default=2000)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    vocab = llama_cpp_source(work) / "models/ggml-vocab-gemma-4.gguf"

    # 1. llama.cpp's own cases.
    raw = Path(str(vocab) + ".inp").read_text(encoding="utf-8")
    cases = raw.split("\n__ggml_vocab_test__\n")
    outs = Path(str(vocab) + ".out").read_text().split("\n")
    assert len(outs) >= len(cases), (len(cases), len(outs))
    t0 = time.time()
    got = slicetrain_ids(args.bin, vocab, cases, work, special=False)
    for i, (text, want, ids) in enumerate(zip(cases, outs, got)):
        assert ids == [int(x) for x in want.split()], f"case {i} {text!r}: llama.cpp {want}, slicetrain {ids}"
    print(f"llama.cpp's {len(cases)} cases for ggml-vocab-gemma-4.gguf: slicetrain's ids equal, every case "
          f"({time.time() - t0:.1f} s, the vocabulary loaded once)")

    # 2. llama.cpp itself on more text.
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed (tools/requirements-llama.txt): step 2 skipped")
        return
    rows = [json.loads(line) for line in (ROOT / "data/tiny_instruct/train.jsonl").open(encoding="utf-8")]
    texts = ["\n".join(x for x in (r["instruction"], r.get("context", ""), r["response"]) if x)
             for r in rows[:args.rows]] + EXTRA
    llm = llama_cpp.Llama(model_path=str(vocab), vocab_only=True, verbose=False)
    for special in (False, True):
        ours = slicetrain_ids(args.bin, vocab, texts, work, special=special)
        bad = 0
        for text, ids in zip(texts, ours):
            ref = llm.tokenize(text.encode("utf-8"), add_bos=special, special=True)
            if ids != ref:
                bad += 1
                if bad <= 5:
                    print(f"  differs: {text!r}\n    llama.cpp {ref}\n    slicetrain {ids}")
        print(f"llama.cpp (vocab_only, special=True, add_bos={special}) on {len(texts)} texts: "
              f"{len(texts) - bad} equal")
        assert bad == 0
    decoded = slicetrain_decode(args.bin, vocab, slicetrain_ids(args.bin, vocab, texts, work, special=False), work)
    assert len(decoded) == len(texts)
    for text, back in zip(texts, decoded):
        assert back == text, (text, back)
    print(f"slicetrain's decode gives all {len(texts)} texts back exactly")


if __name__ == "__main__":
    main()
