#!/usr/bin/env python3
"""Generate data set fixtures for the slicetrain C++ Parquet/JSON/CSV readers and the hub data set resolver.

Usage (from the repository root; needs pyarrow and datasets from tools/requirements.txt):
    tools/.venv/bin/python tools/make_dataset_fixtures.py [--out tests/fixtures/datasets]

The three sub-directories parquet/, hub/ and hub_golden/ of --out are deleted and rewritten (nothing else is touched).
Everything is built from seeded random.Random generators and fixed strings, so a rerun with the pinned package
versions produces byte-identical files. Goldens come from the real references: pyarrow.parquet.read_table for
parquet/, datasets.load_dataset for hub_golden/ (run offline, with a throw-away HF cache in a temporary directory
that is deleted afterwards, so nothing is written to ~/.cache).

parquet/  (Parquet reader fixtures; see tests/fixtures/README.md, section "Data set fixtures")
    <name>.parquet             written by pyarrow.parquet.write_table (write_statistics=False)
    <name>.expected.jsonl      one line per row of pq.read_table(<name>.parquet).to_pylist():
                               json.dumps(row, ensure_ascii=False, sort_keys=True) (struct fields sorted too)
    <name>.meta.json           {"num_rows", "num_row_groups", "columns" (top-level names, schema order),
                                "compression" (codec as named in the footer: SNAPPY, ZSTD, GZIP, UNCOMPRESSED),
                                "data_page_version" ("1.0" / "2.0"), "dictionary" (use_dictionary)}
  The "instruction" files share one 40-row table (random.Random(7)); columns instruction (string, REQUIRED),
  context (string, ~30 % null, one ""), response (string, three long ones of 300 / 900 / 2000 chars),
  category (string, 5 values), id (int64, REQUIRED, one 2**53+1), score (float64, some null), flag (bool, some
  null), rank (int32, includes INT32_MIN / INT32_MAX). row_group_size=11 (row groups of 11, 11, 11, 7 rows),
  data_page_size=512, max_rows_per_page=5, write_batch_size=4 (pyarrow checks the page size only between write
  batches, and dictionary-encoded chunks of 11 rows never reach 512 bytes; so every column chunk has 2-3 data
  pages):
    plain_snappy_v1            use_dictionary=False, snappy, data pages v1
    dict_zstd_v2               use_dictionary=True,  zstd,   data pages v2
    dict_gzip_v1               use_dictionary=True,  gzip,   data pages v1
    plain_none_v2              use_dictionary=False, uncompressed, data pages v2
    dict_fallback_snappy       use_dictionary=True, dictionary_pagesize_limit=64, snappy, v1: the writer starts
                               every chunk dictionary-encoded and falls back to PLAIN pages once the dictionary
                               passes 64 bytes (checked after each batch of 4 values), so 19 of the 32 chunks hold a
                               dictionary page, RLE_DICTIONARY data page(s), then PLAIN data pages (asserted)
    empty                      the instruction schema, 0 rows (plain, snappy, v1); pyarrow writes ONE row group
                               with 0 rows (num_row_groups is 1), whose column chunks have no data pages
  The "messages" files share one 30-row table of conversation data (random.Random(17)): messages
  list<struct<role, content>> (one [], one null list, one null content), conversations list<struct<from, value>>
  (ShareGPT human/gpt), tags list<string> (one null element, one null list), nested list<list<int32>> (an empty
  inner list, a null inner list, a null element), meta struct<source: string, turns: int64> (one null struct,
  one struct with a null field); data_page_size=512, max_rows_per_page=5, write_batch_size=4:
    messages_snappy            use_dictionary=True,  snappy, v1, row_group_size=8 (8, 8, 8, 6 rows)
    messages_zstd_v2           use_dictionary=False, zstd,   v2, one row group

hub/  (data set repositories laid out as on the hub, one directory <org>--<name> per repository)
    acme--instruct/README.md   YAML front matter with `configs:` in the datasets library's format: default
                               (default: true; train: data/train-*.parquet, test: data/test-*.parquet),
                               jsonl (train: jsonl/train.jsonl), csv (train: csv/train.csv)
    acme--instruct/data/train-00000-of-00002.parquet, train-00001-of-00002.parquet   train rows 0-149, 150-299
    acme--instruct/data/test-00000-of-00001.parquet                                  20 test rows
    acme--instruct/jsonl/train.jsonl   the same 300 train rows, one JSON object a line (ensure_ascii=False)
    acme--instruct/csv/train.csv       the same 300 rows, csv module defaults (excel dialect: QUOTE_MINIMAL,
                                       "\\r\\n" line ends), header row
        columns instruction, context, response, category (all strings; context is "" in ~1/3 of the rows);
        Parquet: row_group_size=64, snappy, dictionary on, statistics off
    acme--dolly/README.md                  front matter (license, task_categories, language), no `configs:`
    acme--dolly/databricks-dolly-15k.jsonl 60 rows in the Dolly layout (instruction, context, response, category)
    acme--splits/README.md                 plain markdown, no front matter
    acme--splits/data/train-00000-of-00001.parquet       the 40-row instruction table of parquet/
    acme--splits/data/validation-00000-of-00001.parquet  10 more rows of that schema (random.Random(8))

hub_golden/
    <dir>__<config or "default">__<split>.jsonl   every row of datasets.load_dataset(hub/<dir>, name=config,
                               split=split), json.dumps(row, ensure_ascii=False, sort_keys=True); <split> is the
                               split string made file-name safe: train[100:200] -> train_from_100_to_200,
                               train[:10%] -> train_from_start_to_10pct, train[-5%:] -> train_from_m5pct_to_end
    index.json                 one entry per golden: repo ("acme/instruct"), dir, config (as passed; null = none),
                               resolved_config (the builder's config name), split, file, num_rows, columns
                               ([name, arrow type] of the loaded Dataset), data_files (the files the builder's
                               config.data_files holds for the split's base name, relative to the repository
                               directory, in order), loaded_with ("repo" or, see below, "json" / "csv") and, where
                               loading the repository failed, load_error ("<exception type>: <message>").
  datasets picks ONE packaged builder per repository, from the extensions of the first config's files (here
  Parquet), and uses it for every config. So load_dataset(hub/acme--instruct, name="jsonl" / "csv") fails
  (the Parquet builder cannot read train.jsonl / train.csv). For those cases index.json records that error, and the
  golden rows come from load_dataset("json" / "csv", data_files={<split>: <the files the repository's config
  resolved>}, split=...), i.e. what a resolver that picks the format per config gets (loaded_with = "json"/"csv").
  CSV null rule (datasets reads CSV with pandas.read_csv and its default NA strings): an empty field is null, so
  the 108 contexts that are "" in the Parquet / JSON Lines copies are null in the csv goldens (and the columns come
  back as large_string, not string). No other pandas NA string ("NA", "null", "None", "nan", "N/A", ...) occurs as
  a field. The script asserts every golden against the rows it wrote, with exactly this rule for the CSV ones.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------------------------------------
# Text generation (deterministic: every draw comes from the generator passed in)

WORDS = (
    "the a of to and in model data train step loss batch token layer weight gradient learning rate adapter "
    "shard file row column page value sample prompt answer question context summary story river mountain city "
    "garden kitchen recipe music history planet ocean forest winter summer coffee bridge library window engine "
    "signal network memory cache kernel vector matrix sparse dense small large quick careful simple"
).split()

CATEGORIES = ["open_qa", "closed_qa", "brainstorming", "summarization", "creative_writing"]
DOLLY_CATEGORIES = ["open_qa", "general_qa", "classification", "closed_qa", "brainstorming",
                    "information_extraction", "summarization", "creative_writing"]


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return (" ".join(words)).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def paragraph(rng: random.Random, n_sent: int) -> str:
    return " ".join(sentence(rng, 4, 12) for _ in range(n_sent))


def text_of_length(rng: random.Random, n: int) -> str:
    """A paragraph cut to exactly n characters (no trailing space)."""
    parts = []
    total = 0
    while total < n:
        s = sentence(rng, 5, 14)
        parts.append(s)
        total += len(s) + 1
    return " ".join(parts)[:n].rstrip() + "."


# --------------------------------------------------------------------------------------------------------------------
# Part 1: Parquet reader fixtures

INSTRUCTION_SCHEMA = pa.schema([
    pa.field("instruction", pa.string(), nullable=False),
    pa.field("context", pa.string()),
    pa.field("response", pa.string()),
    pa.field("category", pa.string()),
    pa.field("id", pa.int64(), nullable=False),
    pa.field("score", pa.float64()),
    pa.field("flag", pa.bool_()),
    pa.field("rank", pa.int32()),
])

SPECIAL_INSTRUCTIONS = {
    2: "Erkläre mir bitte, wie ein Kühlschrank funktioniert – kurz und präzise. Grüße aus Köln!",
    5: "Write a haiku about rockets 🚀 and the moon 🌕",
    9: "用一句话解释什么是机器学习。",
    13: "",
    17: 'Line one\nline two with "double quotes", a comma, and \'single quotes\'',
    23: "Tab\tseparated and a back\\slash: C:\\temp\\new",
    31: "¿Qué tal? Ça va? Zoë's naïve café — ½ ∑ ≠ ∞ (Ελληνικά, русский, עברית)",
}
LONG_RESPONSES = {4: 300, 19: 900, 33: 2000}


def instruction_rows(n: int, rng: random.Random, specials: bool) -> list[dict]:
    """Rows of INSTRUCTION_SCHEMA; with specials, the fixed edge-case values above replace the drawn ones."""
    rows = []
    for i in range(n):
        instruction = sentence(rng, 3, 10)
        context = sentence(rng, 3, 14)
        context_null = rng.random() < 0.3
        response = sentence(rng, 4, 14)
        category = rng.choice(CATEGORIES)
        score = round(rng.uniform(-10.0, 10.0), 4)
        score_null = rng.random() < 0.15
        flag = rng.random() < 0.5
        flag_null = rng.random() < 0.15
        rank = rng.randint(-1000, 1_000_000)
        row = dict(instruction=instruction, context=None if context_null else context, response=response,
                   category=category, id=100_000 + i, score=None if score_null else score,
                   flag=None if flag_null else flag, rank=rank)
        if specials:
            if i in SPECIAL_INSTRUCTIONS:
                row["instruction"] = SPECIAL_INSTRUCTIONS[i]
            if i in LONG_RESPONSES:
                row["response"] = text_of_length(rng, LONG_RESPONSES[i] - 1)
            if i == 11:
                row["context"] = ""  # empty, not null
            if i == 26:
                row["context"] = "Kontext mit Umlauten: Größe, Übung, Maß. 日本語のテキスト。"
            if i == 6:
                row["score"] = 0.0
            if i == 12:
                row["score"] = 1e-07
            if i == 27:
                row["score"] = 1.5e16
            if i == 8:
                row["rank"] = 2**31 - 1
            if i == 21:
                row["rank"] = -(2**31)
            if i == 37:
                row["id"] = 2**53 + 1  # not representable as a double
            if i == 38:
                row["id"] = -42
        rows.append(row)
    return rows


MESSAGES_SCHEMA = pa.schema([
    pa.field("messages", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
    pa.field("conversations", pa.list_(pa.struct([pa.field("from", pa.string()), pa.field("value", pa.string())]))),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("nested", pa.list_(pa.list_(pa.int32()))),
    pa.field("meta", pa.struct([pa.field("source", pa.string()), pa.field("turns", pa.int64())])),
])

TAGS = ["math", "code", "chat", "easy", "hard", "multi-turn", "deutsch", "日本語"]
SOURCES = ["sharegpt", "oasst", "dolly", "synthetic"]


def messages_rows(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        # messages: optional system turn, then user/assistant alternating, 1..5 turns in all
        n_turns = rng.randint(1, 5)
        has_system = rng.random() < 0.3
        messages = []
        for t in range(n_turns):
            if t == 0 and has_system:
                role = "system"
            else:
                role = "user" if (t - (1 if has_system else 0)) % 2 == 0 else "assistant"
            messages.append({"role": role, "content": sentence(rng, 2, 10)})
        # conversations: ShareGPT layout, human/gpt alternating, 1..4 turns
        conversations = [{"from": "human" if t % 2 == 0 else "gpt", "value": sentence(rng, 2, 8)}
                         for t in range(rng.randint(1, 4))]
        tags = rng.sample(TAGS, rng.randint(0, 3))
        nested = [[rng.randint(-(2**31), 2**31 - 1) if rng.random() < 0.2 else rng.randint(0, 99)
                   for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 3))]
        meta = {"source": rng.choice(SOURCES), "turns": len(messages)}
        if i == 4:
            messages = []
            meta["turns"] = 0
        if i == 9:
            messages = None
            meta["turns"] = 0
        if i == 13:
            messages = [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": None}]
            meta["turns"] = 2
        if i == 2:
            messages = [{"role": "system", "content": "Du bist ein hilfreicher Assistent. Antworte auf Deutsch."},
                        {"role": "user", "content": "Wie heißt die Hauptstadt von Österreich?"},
                        {"role": "assistant", "content": "Die Hauptstadt von Österreich ist Wien. 🇦🇹"},
                        {"role": "user", "content": 'Und "die größte Stadt",\nfalls anders?'},
                        {"role": "assistant", "content": "Auch Wien."}]
            meta["turns"] = 5
        if i == 6:
            tags = ["math", None, "easy"]
        if i == 18:
            tags = None
        if i == 11:
            nested = [[1, 2], [], [3]]
        if i == 25:
            nested = []
        if i == 26:
            nested = None
        if i == 27:
            nested = [[5], None, [6]]
        if i == 28:
            nested = [[7, None, 8]]
        if i == 15:
            meta = None
        if i == 16:
            meta = {"source": None, "turns": len(messages)}
        rows.append(dict(messages=messages, conversations=conversations, tags=tags, nested=nested, meta=meta))
    return rows


CODEC_NAME = {"snappy": "SNAPPY", "zstd": "ZSTD", "gzip": "GZIP", "none": "UNCOMPRESSED"}

# name -> (table key, write_table kwargs); write_statistics=False is added for all. pyarrow checks data_page_size
# only between batches of write_batch_size values (default 1024, i.e. once per 11-row chunk here), and the
# dictionary-encoded chunks never reach 512 bytes, so max_rows_per_page=5 caps every data page at 5 rows and
# write_batch_size=4 lets data_page_size split the text columns further.
_INSTR = dict(row_group_size=11, data_page_size=512, write_batch_size=4, max_rows_per_page=5)
_MSG = dict(data_page_size=512, write_batch_size=4, max_rows_per_page=5)
PARQUET_FILES = {
    "plain_snappy_v1": ("instruction", dict(_INSTR, use_dictionary=False, compression="snappy",
                                            data_page_version="1.0")),
    "dict_zstd_v2": ("instruction", dict(_INSTR, use_dictionary=True, compression="zstd", data_page_version="2.0")),
    "dict_gzip_v1": ("instruction", dict(_INSTR, use_dictionary=True, compression="gzip", data_page_version="1.0")),
    "plain_none_v2": ("instruction", dict(_INSTR, use_dictionary=False, compression="none",
                                          data_page_version="2.0")),
    "dict_fallback_snappy": ("instruction", dict(_INSTR, use_dictionary=True, dictionary_pagesize_limit=64,
                                                 compression="snappy", data_page_version="1.0")),
    "messages_snappy": ("messages", dict(_MSG, row_group_size=8, use_dictionary=True, compression="snappy",
                                         data_page_version="1.0")),
    "messages_zstd_v2": ("messages", dict(_MSG, use_dictionary=False, compression="zstd", data_page_version="2.0")),
    "empty": ("empty", dict(use_dictionary=False, compression="snappy", data_page_version="1.0")),
}


# -- a minimal Thrift compact-protocol reader, to check the page layout the writer produced -------------------------

class _Compact:
    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, t: int):
        if t in (1, 2):
            return t == 1
        if t == 3:
            return self.byte()
        if t in (4, 5, 6):
            return self.zigzag()
        if t == 7:
            self.pos += 8
            return None
        if t == 8:
            n = self.varint()
            self.pos += n
            return None
        if t in (9, 10):
            h = self.byte()
            n, et = h >> 4, h & 0x0F
            if n == 15:
                n = self.varint()
            return [self.value(et) if et not in (1, 2) else bool(self.byte()) for _ in range(n)]
        if t == 11:
            n = self.varint()
            if n:
                kv = self.byte()
                for _ in range(n):
                    self.value(kv >> 4)
                    self.value(kv & 0x0F)
            return None
        if t == 12:
            return self.struct()
        raise ValueError(f"thrift compact type {t}")

    def struct(self) -> dict:
        out, fid = {}, 0
        while True:
            h = self.byte()
            if h == 0:
                return out
            delta, t = h >> 4, h & 0x0F
            fid = fid + delta if delta else self.zigzag()
            out[fid] = self.value(t)


_PAGE_TYPES = {0: "DATA_PAGE", 2: "DICTIONARY_PAGE", 3: "DATA_PAGE_V2"}
_ENCODINGS = {0: "PLAIN", 2: "PLAIN_DICTIONARY", 3: "RLE", 8: "RLE_DICTIONARY"}


def page_layout(path: str) -> list[list[list[tuple[str, str, int]]]]:
    """[row group][column chunk] -> [(page type, encoding, num_values)] read from the page headers."""
    with open(path, "rb") as f:
        buf = f.read()
    md = pq.ParquetFile(path).metadata
    out = []
    for g in range(md.num_row_groups):
        rg = []
        for c in range(md.num_columns):
            cc = md.row_group(g).column(c)
            start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
            end, pos, pages = start + cc.total_compressed_size, start, []
            while pos < end:
                r = _Compact(buf, pos)
                h = r.struct()
                ptype = _PAGE_TYPES[h[1]]
                sub = h.get({"DATA_PAGE": 5, "DICTIONARY_PAGE": 7, "DATA_PAGE_V2": 8}[ptype])
                enc = sub[4] if ptype == "DATA_PAGE_V2" else sub[2]
                pages.append((ptype, _ENCODINGS.get(enc, str(enc)), sub[1]))
                pos = r.pos + h[3]
            assert pos == end, (path, g, c)
            rg.append(pages)
        out.append(rg)
    return out


def jsonl(rows) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def make_parquet(out: str) -> dict:
    tables = {
        "instruction": pa.Table.from_pylist(instruction_rows(40, random.Random(7), specials=True),
                                            schema=INSTRUCTION_SCHEMA),
        "messages": pa.Table.from_pylist(messages_rows(30, random.Random(17)), schema=MESSAGES_SCHEMA),
        "empty": INSTRUCTION_SCHEMA.empty_table(),
    }
    summary = {}
    for name, (key, kw) in PARQUET_FILES.items():
        path = os.path.join(out, f"{name}.parquet")
        pq.write_table(tables[key], path, write_statistics=False, **kw)
        back = pq.read_table(path)
        assert back.equals(tables[key]), name
        rows = back.to_pylist()
        write_text(os.path.join(out, f"{name}.expected.jsonl"), jsonl(rows))
        md = pq.ParquetFile(path).metadata
        codec = CODEC_NAME[kw["compression"]]
        for g in range(md.num_row_groups):
            for c in range(md.num_columns):
                assert md.row_group(g).column(c).compression == codec, (name, g, c)
        meta = {"num_rows": md.num_rows, "num_row_groups": md.num_row_groups, "columns": back.schema.names,
                "compression": codec, "data_page_version": kw["data_page_version"],
                "dictionary": kw["use_dictionary"]}
        write_text(os.path.join(out, f"{name}.meta.json"), json.dumps(meta, indent=2) + "\n")
        summary[name] = (meta, page_layout(path), md)
    return summary


def check_page_layout(summary: dict) -> None:
    """Assert that the files exercise what the README says they do, and print a one-line page summary of each."""
    for name, (meta, layout, md) in summary.items():
        chunks = [pages for rg in layout for pages in rg]
        data_pages = [[p for p in pages if p[0] != "DICTIONARY_PAGE"] for pages in chunks]
        n_dict = sum(1 for pages in chunks for p in pages if p[0] == "DICTIONARY_PAGE")
        kinds = sorted({p[0] for d in data_pages for p in d})
        multi = sum(1 for d in data_pages if len(d) > 1)
        fallback = sum(1 for pages in chunks
                       if any(p[1] == "RLE_DICTIONARY" for p in pages) and any(p[0] != "DICTIONARY_PAGE"
                                                                                and p[1] == "PLAIN" for p in pages))
        print(f"  {name:22s} rows={meta['num_rows']:3d} row_groups={meta['num_row_groups']} "
              f"chunks={len(chunks):2d} data_pages={sum(map(len, data_pages)):3d} "
              f"(chunks with >1: {multi:2d}) dict_pages={n_dict:2d} dict->plain fallbacks={fallback:2d} {kinds}")
        if meta["num_rows"]:
            want = "DATA_PAGE_V2" if meta["data_page_version"] == "2.0" else "DATA_PAGE"
            assert kinds == [want], (name, kinds)
            assert multi > 0, f"{name}: no column chunk has several data pages"
            assert (n_dict > 0) == meta["dictionary"], name
        if name == "dict_fallback_snappy":
            assert fallback >= 8, f"{name}: only {fallback} chunks fall back from dictionary to plain"


# --------------------------------------------------------------------------------------------------------------------
# Part 2: hub repositories

# pandas' default NA strings (pandas._libs.parsers.STR_NA_VALUES); besides "" none of them may appear as a CSV field
PANDAS_NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
             "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}

HUB_SPECIAL = {
    # row index -> (column, value): non-ASCII and CSV quoting cases
    3: ("instruction", "Q003: Übersetze „Guten Morgen“ ins Englische – und erkläre das ß."),
    57: ("instruction", "Q057: 请用三句话总结这段文字。"),
    120: ("response", 'He said "no", then\n"yes, maybe" - a comma, a quote and a newline in one field.'),
    149: ("instruction", "Q149: last row of the first train shard"),
    150: ("instruction", "Q150: first row of the second train shard"),
    201: ("context", "Emoji context 😀👍🏽 and a trailing space "),
    260: ("response", "Line with a CRLF-free break\nsecond line,\n\nfourth line after a blank one"),
}


def instruct_rows(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        instruction = f"Q{i:03d}: " + sentence(rng, 2, 6)
        context = sentence(rng, 2, 6)
        context_empty = rng.random() < 0.35
        response = sentence(rng, 2, 7)
        category = rng.choice(CATEGORIES)
        row = dict(instruction=instruction, context="" if context_empty else context, response=response,
                   category=category)
        if i in HUB_SPECIAL:
            col, val = HUB_SPECIAL[i]
            row[col] = val
        rows.append(row)
    return rows


def dolly_rows(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        instruction = sentence(rng, 4, 10)
        context = paragraph(rng, rng.randint(1, 2))
        context_empty = rng.random() < 0.6
        response = paragraph(rng, rng.randint(1, 2))
        category = rng.choice(DOLLY_CATEGORIES)
        rows.append(dict(instruction=instruction, context="" if context_empty else context, response=response,
                         category=category))
    rows[7]["response"] = "Ein Beispiel mit Umlauten: Äpfel, Öl, Übermut. 😊"
    return rows


INSTRUCT_README = """\
---
license: apache-2.0
language:
- en
configs:
- config_name: default
  default: true
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: test
    path: data/test-*.parquet
- config_name: jsonl
  data_files:
  - split: train
    path: jsonl/train.jsonl
- config_name: csv
  data_files:
  - split: train
    path: csv/train.csv
---

# acme/instruct

Test fixture for the slicetrain hub resolver: the same 300 training rows as sharded Parquet (config `default`),
JSON Lines (config `jsonl`) and CSV (config `csv`), plus a 20-row Parquet test split.
"""

DOLLY_README = """\
---
license: cc-by-sa-3.0
task_categories:
- question-answering
- summarization
language:
- en
pretty_name: acme-dolly
size_categories:
- n<1K
---

# acme/dolly

Test fixture laid out like databricks/databricks-dolly-15k: one JSON Lines file at the repository root, no `configs:`.
"""

SPLITS_README = """\
# acme/splits

Test fixture without a YAML header: the splits come from the file names (data/train-*, data/validation-*).
"""


def write_parquet_rows(path: str, rows: list[dict], schema: pa.Schema | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, row_group_size=64, compression="snappy", use_dictionary=True, write_statistics=False)


def make_hub(out: str) -> dict:
    rows = instruct_rows(320, random.Random(11))
    train, test = rows[:300], rows[300:]
    for r in train:
        for v in r.values():
            assert v not in PANDAS_NA or v == "", v
    d = os.path.join(out, "acme--instruct")
    write_text(os.path.join(d, "README.md"), INSTRUCT_README)
    write_parquet_rows(os.path.join(d, "data", "train-00000-of-00002.parquet"), train[:150])
    write_parquet_rows(os.path.join(d, "data", "train-00001-of-00002.parquet"), train[150:])
    write_parquet_rows(os.path.join(d, "data", "test-00000-of-00001.parquet"), test)
    write_text(os.path.join(d, "jsonl", "train.jsonl"),
               "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in train))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(train[0]))
    w.writeheader()
    w.writerows(train)
    write_text(os.path.join(d, "csv", "train.csv"), buf.getvalue())

    dolly = dolly_rows(60, random.Random(13))
    d = os.path.join(out, "acme--dolly")
    write_text(os.path.join(d, "README.md"), DOLLY_README)
    write_text(os.path.join(d, "databricks-dolly-15k.jsonl"),
               "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in dolly))

    split_train = instruction_rows(40, random.Random(7), specials=True)
    split_val = instruction_rows(10, random.Random(8), specials=False)
    d = os.path.join(out, "acme--splits")
    write_text(os.path.join(d, "README.md"), SPLITS_README)
    write_parquet_rows(os.path.join(d, "data", "train-00000-of-00001.parquet"), split_train, INSTRUCTION_SCHEMA)
    write_parquet_rows(os.path.join(d, "data", "validation-00000-of-00001.parquet"), split_val, INSTRUCTION_SCHEMA)
    return {"instruct_train": train, "instruct_test": test, "dolly": dolly, "splits_train": split_train,
            "splits_validation": split_val}


# (dir, config, splits)
GOLDEN_CASES = [
    ("acme--instruct", None, ["train", "train[:10%]", "train[100:200]", "train[-5%:]", "test"]),
    ("acme--instruct", "jsonl", ["train", "train[100:200]"]),
    ("acme--instruct", "csv", ["train", "train[:10%]"]),
    ("acme--dolly", None, ["train", "train[10:20]"]),
    ("acme--splits", None, ["train", "validation"]),
]

_SLICE_RE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


def split_file_name(split: str) -> str:
    m = _SLICE_RE.match(split)
    assert m, split
    base, lo, hi = m.groups()
    if "[" not in split:
        return base

    def tok(s, default):
        return default if s is None else s.replace("-", "m").replace("%", "pct")
    return f"{base}_from_{tok(lo, 'start')}_to_{tok(hi, 'end')}"


def tree_digest(path: str) -> str:
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for fn in sorted(files):
            p = os.path.join(root, fn)
            h.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def make_hub_golden(hub: str, out: str, src: dict) -> list[dict]:
    cache = tempfile.mkdtemp(prefix="slicetrain-hf-cache-")
    try:
        os.environ.update(HF_HOME=cache, HF_DATASETS_CACHE=os.path.join(cache, "datasets"),
                          HF_HUB_CACHE=os.path.join(cache, "hub"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                          HF_HUB_DISABLE_TELEMETRY="1")
        import datasets  # after the environment: datasets and huggingface_hub read it at import time
        import huggingface_hub

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity(logging.CRITICAL)
        huggingface_hub.utils.logging.set_verbosity(logging.CRITICAL)  # "Repo card metadata block was not found"
        ds_cache = os.path.join(cache, "datasets")
        before = tree_digest(hub)
        index = []
        for dirname, config, splits in GOLDEN_CASES:
            repo_dir = os.path.realpath(os.path.join(hub, dirname))
            builder = datasets.load_dataset_builder(repo_dir, name=config, cache_dir=ds_cache)
            for split in splits:
                base = _SLICE_RE.match(split).group(1)
                files = [str(f) for f in builder.config.data_files[base]]
                rel = [os.path.relpath(os.path.realpath(f), repo_dir).replace(os.sep, "/") for f in files]
                entry = {"repo": dirname.replace("--", "/", 1), "dir": dirname, "config": config,
                         "resolved_config": builder.config.name, "split": split}
                try:
                    ds = datasets.load_dataset(repo_dir, name=config, split=split, cache_dir=ds_cache)
                    loaded_with, error = "repo", None
                except Exception as e:  # noqa: BLE001 - recorded, see the module docstring
                    error = f"{type(e).__name__}: {e}"
                    assert repo_dir not in error, error
                    exts = {os.path.splitext(f)[1] for f in rel}
                    fmt = {".jsonl": "json", ".json": "json", ".csv": "csv"}.get(exts.pop() if len(exts) == 1 else "")
                    if fmt is None:
                        raise
                    ds = datasets.load_dataset(fmt, data_files={base: files}, split=split, cache_dir=ds_cache)
                    loaded_with = fmt
                rows = ds.to_list()
                fname = f"{dirname}__{config or 'default'}__{split_file_name(split)}.jsonl"
                write_text(os.path.join(out, fname), jsonl(rows))
                entry.update(file=fname, num_rows=len(rows),
                             columns=[[f.name, str(f.type)] for f in ds.data.schema], data_files=rel,
                             loaded_with=loaded_with)
                if error is not None:
                    entry["load_error"] = error
                index.append(entry)
                print(f"  {fname:58s} rows={len(rows):3d} via {loaded_with:4s} files={rel}")
        assert tree_digest(hub) == before, "datasets wrote into the repository directories"
        write_text(os.path.join(out, "index.json"), json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    check_hub_golden(out, index, src)
    return index


def check_hub_golden(out: str, index: list[dict], src: dict) -> None:
    """Cross-check the goldens against the rows the script wrote, to pin down the rules documented in the README."""
    def load(entry):
        with open(os.path.join(out, entry["file"]), encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def norm(rows):
        return [json.loads(json.dumps(r, sort_keys=True)) for r in rows]

    by = {(e["dir"], e["config"], e["split"]): e for e in index}
    train = norm(src["instruct_train"])
    csv_train = [{k: (None if v == "" else v) for k, v in r.items()} for r in train]  # the CSV null rule
    expect = {
        ("acme--instruct", None, "train"): train,
        ("acme--instruct", None, "train[:10%]"): train[:30],
        ("acme--instruct", None, "train[100:200]"): train[100:200],
        ("acme--instruct", None, "train[-5%:]"): train[-15:],
        ("acme--instruct", None, "test"): norm(src["instruct_test"]),
        ("acme--instruct", "jsonl", "train"): train,
        ("acme--instruct", "jsonl", "train[100:200]"): train[100:200],
        ("acme--instruct", "csv", "train"): csv_train,
        ("acme--instruct", "csv", "train[:10%]"): csv_train[:30],
        ("acme--dolly", None, "train"): norm(src["dolly"]),
        ("acme--dolly", None, "train[10:20]"): norm(src["dolly"])[10:20],
        ("acme--splits", None, "train"): norm(src["splits_train"]),
        ("acme--splits", None, "validation"): norm(src["splits_validation"]),
    }
    assert set(expect) == set(by), set(expect) ^ set(by)
    for key, rows in expect.items():
        assert load(by[key]) == rows, key


# --------------------------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "datasets"))
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    parts = {p: os.path.join(args.out, p) for p in ("parquet", "hub", "hub_golden")}
    for p in parts.values():
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)

    print(f"[parquet] pyarrow {pa.__version__}")
    summary = make_parquet(parts["parquet"])
    check_page_layout(summary)
    print("[hub]")
    src = make_hub(parts["hub"])
    print("[hub_golden]")
    make_hub_golden(parts["hub"], parts["hub_golden"], src)
    import datasets
    import pandas
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"done in {time.time() - t0:.1f} s: {total} bytes under {args.out} "
          f"(pyarrow {pa.__version__}, datasets {datasets.__version__}, pandas {pandas.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
