#!/usr/bin/env python3
"""Generate the synthetic instruction data sets of bench/dataset_read.sh (data set reading throughput).

Usage (from the repository root; needs pyarrow from tools/requirements.txt):
    tools/.venv/bin/python tools/make_bench_datasets.py --out DIR [--big-gb 1.0] [--seed 0]

Writes (DIR is created if needed; these three files are overwritten, nothing else is touched):
    DIR/dolly.jsonl    15011 rows in the databricks-dolly-15k layout, one JSON object a line in the order instruction,
                       context, response, category (json.dumps, ensure_ascii=False: UTF-8, "\\n" and '"' escaped)
    DIR/dolly.parquet  the same rows, pq.write_table defaults (snappy, dictionary on, one row group)
    DIR/big.parquet    about --big-gb GB (1e9 bytes) on disk of more rows from the same generator (another seed),
                       compression='zstd', otherwise pyarrow defaults; written with a ParquetWriter one batch of
                       --batch-rows (100000) rows at a time, so each write is one row group of 100000 rows (the last
                       one smaller: it is sized from the bytes per row so far to land on the target size) and the
                       generator holds one batch in memory, never the file.

The rows look like Dolly's: all four columns are non-null strings; category takes Dolly's 8 values with Dolly's
frequencies (open_qa 25 %, general_qa 15 %, classification 14 %, closed_qa 12 %, brainstorming 12 %,
information_extraction 10 %, summarization 8 %, creative_writing 5 %); context is non-empty only for closed_qa,
information_extraction and summarization, so it is "" in ~70 % of the rows, as in Dolly. Lengths (characters) are
log-normal, like Dolly's: instruction mean ~70, context mean ~360 where present, response mean ~360, with a long tail
(0.3 % of contexts/responses are 3k-20k characters). The text is English-looking: words of a fixed vocabulary (common
English words, then made-up syllable words, Zipf-weighted; a few non-ASCII ones) in sentences with commas, full stops,
quotes and newlines. Python cannot draw GBs of words one at a time fast enough, so a ~32 MB pool of such text is drawn
once and every field is a slice of it at a random word boundary (then capitalised and punctuated; instructions get a
Dolly-like opening such as "What is"); with a pool far larger than a Parquet page, values practically never repeat and
compression sees word-level redundancy only, as with real text.

Deterministic: everything comes from random.Random(--seed) generators, so a rerun with the same Python and pyarrow
versions writes byte-identical files. Prints each file written with its size and row count, and the length statistics
of the dolly rows.
"""
import argparse
import bisect
import json
import math
import os
import random
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

DOLLY_ROWS = 15011
COLUMNS = ("instruction", "context", "response", "category")
SCHEMA = pa.schema([(c, pa.string()) for c in COLUMNS])
# Dolly's category counts (databricks-dolly-15k).
CATEGORIES = (("open_qa", 3742), ("general_qa", 2191), ("classification", 2136), ("closed_qa", 1773),
              ("brainstorming", 1766), ("information_extraction", 1506), ("summarization", 1188),
              ("creative_writing", 709))
WITH_CONTEXT = {"closed_qa", "information_extraction", "summarization"}
OPENINGS = {
    "open_qa": ("What is", "Who was", "Why do", "How does", "Where is", "When did", "What are"),
    "general_qa": ("How can I", "What should I know about", "Why is", "What do you think of", "Is it true that"),
    "classification": ("Classify each of the following as", "Which of these is", "Tell me whether",
                       "Identify which"),
    "closed_qa": ("Given this paragraph, what is", "Based on the text, who", "According to the passage, when",
                  "From the reference text, how"),
    "brainstorming": ("Give me a list of", "What are some ideas for", "Brainstorm ways to", "List some"),
    "information_extraction": ("Extract the", "From the passage provided, list the", "Using the text, extract",
                               "Give me the"),
    "summarization": ("Summarize", "Give me a short summary of", "In a few sentences, summarize",
                      "What are the main points of"),
    "creative_writing": ("Write a short story about", "Write a poem about", "Compose a letter to",
                         "Write a paragraph about"),
}
QUESTIONS = {"open_qa", "general_qa", "closed_qa"}
COMMON = """the of and to a in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so no will can more about what out up them some
could into other than then only its time two may these first any new like our over also after did many most made
where before through back years much way well down should because each just those people how too little state good
very make world still own see men work long here get both between life being under never day same another know while
last might great old year off come since against go came right used take three states himself few house use during
without again place around however home small found thought went say part once general high upon school every
interest large country often important city water river music film book team game war company government system
history century music language island north south east west season album species family village town player party
university national american british french german first second named known called built released played born based
population area church county district league football band song series television station army navy king queen
president minister law court energy food plant animal bird fish tree flower mountain lake sea ocean coast valley
road bridge railway car engine ship aircraft space planet star light color colour number example question answer
story poem letter recipe coffee tea bread cheese wine garden travel summer winter spring autumn morning evening
reason idea list ways simple different popular famous modern ancient early late common local public private small
large best better easy hard quickly slowly usually always sometimes""".split()
NON_ASCII = ("café", "naïve", "São", "Zürich", "résumé", "façade", "über", "Malmö", "piñata", "Ærø", "Dvořák",
             "Kraków", "jalapeño", "crème", "São Paulo", "Bogotá", "€5", "10°C", "—", "“quoted”")


def vocabulary(rng: random.Random, n_made_up: int = 6000) -> list[str]:
    """COMMON (in order: the most frequent words first), then made-up words of 1-4 syllables, then NON_ASCII."""
    onsets = "b c d f g h k l m n p r s t v w b c d f g h l m n p r s t br cr dr fr gr pr tr pl st ch sh th".split()
    vowels = "a e i o u a e i o u ea ai ou".split()
    codas = ["", "", "", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
    seen, made = set(COMMON), []
    while len(made) < n_made_up:
        w = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                    for _ in range(rng.choice((1, 2, 2, 2, 3))))
        if w not in seen:
            seen.add(w)
            made.append(w.capitalize() if rng.random() < 0.08 else w)  # a few proper-noun-looking words
    return COMMON + made + list(NON_ASCII)


def text_pool(rng: random.Random, target_chars: int) -> str:
    """~target_chars of sentences of Zipf-weighted vocabulary words (commas, quotes, paragraphs, list items)."""
    vocab = vocabulary(rng)
    cum, acc = [], 0.0
    for i in range(len(vocab)):
        acc += (i + 2.7) ** -1.1
        cum.append(acc)
    words = rng.choices(vocab, cum_weights=cum, k=target_chars // 6 + 1000)
    out, i, n, total = [], 0, len(words), 0
    while total < target_chars and i < n:
        k = min(max(3, int(rng.gauss(14, 6))), n - i)
        s = words[i:i + k]
        i += k
        if k > 6 and rng.random() < 0.35:
            j = rng.randrange(2, k - 2)
            s[j] += ","
        if k > 5 and rng.random() < 0.04:
            j = rng.randrange(0, k - 3)
            s[j] = '"' + s[j]
            s[j + 2] += '"'
        sent = " ".join(s)
        sent = sent[0].upper() + sent[1:] + rng.choice("......?!:")
        r = rng.random()
        sep = "\n\n" if r < 0.03 else ("\n- " if r < 0.05 else " ")
        out.append(sent + sep)
        total += len(sent) + len(sep)
    return "".join(out)


class RowGenerator:
    """Rows in the Dolly layout: fields are slices of a shared text pool (see the module docstring)."""

    def __init__(self, pool: str, seed: int):
        self.pool = pool
        self.rng = random.Random(seed)
        self.cats = [c for c, _ in CATEGORIES]
        self.cat_cum = []
        acc = 0
        for _, count in CATEGORIES:
            acc += count
            self.cat_cum.append(acc)

    def length(self, median: float, sigma: float, lo: int, tail: float) -> int:
        rng = self.rng
        if rng.random() < tail:
            return rng.randrange(3000, 20001)
        return max(lo, min(20000, int(rng.lognormvariate(math.log(median), sigma))))

    def slice(self, n: int) -> str:
        """About n characters of the pool, starting and ending at word boundaries, stripped."""
        pool = self.pool
        start = pool.find(" ", self.rng.randrange(0, len(pool) - n - 200)) + 1
        end = pool.find(" ", start + n)
        if end < 0 or end > start + n + 40:
            end = start + n
        return pool[start:end].strip()

    def row(self) -> tuple[str, str, str, str]:
        rng = self.rng
        cat = self.cats[bisect.bisect_right(self.cat_cum, rng.randrange(self.cat_cum[-1]))]
        opening = rng.choice(OPENINGS[cat])
        body = self.slice(max(4, self.length(52, 0.6, 12, 0.0) - len(opening) - 1)).rstrip(".,:!?\n-\" ")
        instruction = f"{opening} {body[:1].lower()}{body[1:]}{'?' if cat in QUESTIONS else '.'}"
        context = ""
        if cat in WITH_CONTEXT:
            c = self.slice(self.length(185, 1.05, 40, 0.003))
            context = c[:1].upper() + c[1:]
        r = self.slice(self.length(185, 1.05, 2, 0.003))
        response = r[:1].upper() + r[1:]
        return instruction, context, response, cat

    def batch(self, n: int) -> pa.RecordBatch:
        cols = tuple(zip(*(self.row() for _ in range(n))))
        return pa.record_batch([pa.array(c, type=pa.string()) for c in cols], schema=SCHEMA)


def mb(path: str) -> str:
    return f"{os.path.getsize(path) / 1e6:.1f} MB"


def stats(batch: pa.RecordBatch) -> str:
    d = batch.to_pydict()
    n = batch.num_rows
    parts = []
    for c in ("instruction", "context", "response"):
        lens = [len(s) for s in d[c] if s]
        parts.append(f"{c} mean {sum(lens) / len(lens):.0f} max {max(lens)}")
    empty = sum(1 for s in d["context"] if not s)
    return ", ".join(parts) + f" chars (context non-empty only); context empty in {100 * empty / n:.1f} % of rows"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--big-gb", type=float, default=1.0, help="size of big.parquet on disk, GB (1e9 bytes)")
    ap.add_argument("--batch-rows", type=int, default=100_000, help="rows per write (= per row group) of big.parquet")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    pool = text_pool(random.Random(a.seed), 32_000_000)

    dolly = RowGenerator(pool, a.seed + 1).batch(DOLLY_ROWS)
    path = os.path.join(a.out, "dolly.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in dolly.to_pylist():
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {DOLLY_ROWS} rows, {mb(path)}", flush=True)
    path = os.path.join(a.out, "dolly.parquet")
    pq.write_table(pa.Table.from_batches([dolly]), path)
    print(f"wrote {path}: {DOLLY_ROWS} rows, {mb(path)} (snappy, dictionary on, 1 row group)", flush=True)
    print(f"  dolly rows: {stats(dolly)}", flush=True)
    del dolly

    path = os.path.join(a.out, "big.parquet")
    target = a.big_gb * 1e9
    gen = RowGenerator(pool, a.seed + 2)
    rows = groups = 0
    t1 = time.perf_counter()
    with pq.ParquetWriter(path, SCHEMA, compression="zstd") as w:
        while True:
            size = os.path.getsize(path)
            if rows and size >= target:
                break
            n = a.batch_rows
            if rows:  # size the last row group from the bytes per row so far to land on the target
                n = min(n, max(1, math.ceil((target - size) / (size / rows))))
            w.write_batch(gen.batch(n))
            rows += n
            groups += 1
    print(f"wrote {path}: {rows} rows, {mb(path)} (zstd, {groups} row groups of up to {a.batch_rows} rows; "
          f"{time.perf_counter() - t1:.1f} s)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
