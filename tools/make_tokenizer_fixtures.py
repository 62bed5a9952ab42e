#!/usr/bin/env python3
"""Writes the tokenizer golden fixtures under tests/fixtures/tokenizer/ (rerun after changing anything here).

  gemma_style/tokenizer.json   a Gemma-style BPE trained here whose merges may span spaces, with a
                               Strip decoder, <0xF0> left out of the vocabulary (unk path), and three
                               extra added tokens (lstrip/rstrip, normalized, special)
  gemma_style/golden.jsonl     expected ids / decoded strings from the `tokenizers` package
  bundled_golden.jsonl         the same for data/tokenizer (run tools/make_bundled_data.py first),
                               with `hf_ids` from transformers' AutoTokenizer (tokenizer_config.json)
  collate_golden.json          transformers' padded/truncated batch + DataCollatorForLanguageModeling
                               labels for the first 12 bundled records (T = 16)
  spm/tiny.model + golden.jsonl  a SentencePiece BPE model made with Debian's spm_train; expected
                               ids from spm_encode (the reference implementation)

Each golden line is one case: {"text", "ids", "ids_plain", "decoded", "decoded_skip"} (ids with and
without special tokens; decode of ids with and without skipping special tokens), or a decode-only
case {"decode_ids", "decoded", "decoded_skip"} for arbitrary id sequences.

Usage (from the repository root):  tools/.venv/bin/python tools/make_tokenizer_fixtures.py
Needs: tools/.venv (tokenizers, transformers), and `spm_train`/`spm_encode` (Debian package sentencepiece).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gemma_style_tokenizer as gst  # noqa: E402
import make_bundled_data  # noqa: E402
from tokenizers import AddedToken, Tokenizer  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
SEED = 1234

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "Größenwahn und Übermut: Straße, Maß, Fußgänger.",
    "Les élèves étaient très fatigués après l'examen.",
    "¿Dónde está la biblioteca? ¡Está allí!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก วันนี้อากาศดี",
    "你好，世界！今天天气很好。",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계, 반갑습니다.",
    "Emoji: 😀 😃 👍🏽 🇩🇪 👨‍👩‍👧‍👦 ❤️ 🙂",
    "Code: def f(x):\n    return x**2  # square\n\tindent",
    "Numbers 3.14159, 1,000,000 and 2024-06-07T12:00:00Z.",
    "   leading spaces and trailing spaces   ",
    "multiple     spaces\n\n\nnewlines\t\ttabs",
]

HANDWRITTEN = [
    "", " ", "  ", "     ", "\n", "\t", "\r\n", " \n ", "a", "A", "aa", "aaaa", "aaaaaaaaaaaaaaa",
    "hello", " hello", "hello ", "  hello  world  ", "hello\u2581world", "\u2581", "\u2581\u2581x",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<bos>hello<eos>", "hello <bos> world",
    "<|turn>user\nWhat is 2 + 2?<turn|>\n<|turn>model\n4<turn|>\n", "<|turn", "<turn|", "<|turn><|turn>",
    "<bos><bos><eos>", "<|think|>\nthinking", "<|channel>thought\n<channel|>",
    "[[sep]]", "a[[sep]]b", "a   [[sep]]   b", "x [[sep]]\ny", "my token", "this is my token!",
    "mytoken my  token", "<|custom|>", "z<|custom|>z", "<|custom|> <|custom|>",
    "<0x41>", "<0xF0>", "\x00", "\x01\x02\x7f", "\u00a0non-breaking\u00a0space", "\u200bzero\u200bwidth",
    "🙂", "🙂🙂🙂", "a🙂b", "😀😃😄😁", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐍈", "\U0010ffff", "\ufffd", "\ufeffbom",
    "café", "cafe\u0301", "ﬁ ligature", "ǅ", "İstanbul", "ß", "½ ¼ ¾", "™ © ®",
    "Instruction: What is 23 + 58?\nResponse: 81",
    "Instruction: Reverse the word \"planet\".\nResponse: tenalp",
    "Instruction: How old is Ben?\nContext: Ana is 31 years old. Ben is 45 years old.\nResponse: 45",
    "What colour is a zorbel?", "A zorbel is blue.", "HELLO WORLD", "p-l-a-n-e-t",
    "x" * 300, "ab" * 150, " " * 64, "\n" * 20, "🙂" * 40, "<eos>" * 10,
] + MULTILINGUAL


def random_strings(r, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n",
        " " * 8, ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`", "äöüßéèêàçñ", "абвгдежзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθικλμνξοπρστυφχψω", "你好世界天气很中文字", "こんにちはカタナ", "한국어세계", "مرحبالعم",
        "😀😃👍🏽🇩🇪❤️🙂🚀🎉", "\u2581", "\u0301\u200d\ufe0f",
    ]
    specials = ["<bos>", "<eos>", "<|turn>", "<turn|>", "[[sep]]", "my token", "<|custom|>", "<pad>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(r.randint(1, 12)):
            if r.random() < 0.08:
                parts.append(r.choice(specials))
            else:
                pool = r.choice(pools)
                parts.append("".join(r.choice(pool) for _ in range(r.randint(1, 10))))
        out.append("".join(parts))
    return out


def corpus_texts(r):
    recs = make_bundled_data.make_records()
    texts = [make_bundled_data.prompt(x) for x in recs[:1500]]
    texts += MULTILINGUAL * 20
    texts += ["  ".join(x.split()) for x in texts[:200]]  # double spaces: merges across spaces
    texts += ["\n\n".join(texts[i:i + 3]) for i in range(0, 300, 3)]
    return texts


def cases_for(tok, texts, r, n_decode=60, hf=None):
    lines = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        ids_plain = tok.encode(t, add_special_tokens=False).ids
        case = {"text": t, "ids": ids, "ids_plain": ids_plain,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
        if hf is not None:
            case["hf_ids"] = hf(t)["input_ids"]
        lines.append(case)
    v = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = sorted(i for tkn, i in tok.get_vocab().items() if tkn.startswith("<0x"))
    for _ in range(n_decode):
        ids = [r.choice(byte_ids) if r.random() < 0.5 else r.randrange(v) for _ in range(r.randint(0, 12))]
        lines.append({"decode_ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return lines


def write_jsonl(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for x in lines:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")


def main():
    r = random.Random(SEED)
    texts = HANDWRITTEN + random_strings(r, 220)

    gdir = os.path.join(OUT, "gemma_style")
    extra = [AddedToken("[[sep]]", lstrip=True, rstrip=True, special=False, normalized=False),
             AddedToken("my token", special=False, normalized=True),
             AddedToken("<|custom|>", special=True, normalized=False)]
    tok = gst.train_and_save(corpus_texts(random.Random(SEED)), gdir, vocab_size=1200,
                             word_level_merges=False, strip_decoder=True, drop_bytes=(0xF0,),
                             extra_added=extra)
    tok = Tokenizer.from_file(os.path.join(gdir, "tokenizer.json"))
    write_jsonl(os.path.join(gdir, "golden.jsonl"), cases_for(tok, texts, r))

    bdir = os.path.join(ROOT, "data", "tokenizer")
    btok = Tokenizer.from_file(os.path.join(bdir, "tokenizer.json"))
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(bdir)
    write_jsonl(os.path.join(OUT, "bundled_golden.jsonl"), cases_for(btok, texts, r, hf=hf))

    # Collation: the seed's tokenizer(..., truncation, padding="max_length") + DataCollatorForLanguageModeling
    # (mlm=False) on the first records of the bundled data set, padding on the right.
    from transformers import DataCollatorForLanguageModeling
    hf.padding_side = "right"
    recs = []
    with open(os.path.join(ROOT, "data", "tiny_instruct", "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            recs.append(json.loads(line))
            if len(recs) == 12:
                break
    feats = [hf(make_bundled_data.prompt(x), truncation=True, max_length=16, padding="max_length") for x in recs]
    batch = DataCollatorForLanguageModeling(tokenizer=hf, mlm=False)(feats)
    with open(os.path.join(OUT, "collate_golden.json"), "w", encoding="utf-8") as f:
        json.dump({"max_seq_len": 16, "split": "train[:12]",
                   "input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist(),
                   "labels": batch["labels"].tolist()}, f)
        f.write("\n")

    # SentencePiece: a small BPE model with byte fallback, trained by the reference spm_train.
    sdir = os.path.join(OUT, "spm")
    os.makedirs(sdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for t in corpus_texts(random.Random(SEED)):
                f.write(t.replace("\n", " ") + "\n")
        # Relative paths: the model records its training flags, so a fixed cwd keeps it reproducible.
        subprocess.run(["spm_train", "--input=corpus.txt", "--model_prefix=tiny", "--model_type=bpe",
                        "--vocab_size=600", "--byte_fallback=true", "--character_coverage=0.9995",
                        "--num_threads=1", "--random_seed=7", "--pad_id=0", "--eos_id=1", "--bos_id=2",
                        "--unk_id=3", "--minloglevel=2"], check=True, capture_output=True, cwd=tmp)
        shutil.copyfile(os.path.join(tmp, "tiny.model"), os.path.join(sdir, "tiny.model"))
        spm_texts = [t for t in texts if "\n" not in t and "\r" not in t and t != ""]
        inp = os.path.join(tmp, "in.txt")
        with open(inp, "w", encoding="utf-8") as f:
            f.write("\n".join(spm_texts) + "\n")
        res = subprocess.run(["spm_encode", f"--model={sdir}/tiny.model", "--output_format=id", f"--input={inp}"],
                             check=True, capture_output=True, text=True)
        out_lines = res.stdout.split("\n")[:len(spm_texts)]
        write_jsonl(os.path.join(sdir, "golden.jsonl"),
                    [{"text": t, "ids": [int(x) for x in o.split()]} for t, o in zip(spm_texts, out_lines)])
    print(f"wrote {len(texts)} texts of golden cases under {OUT}")


if __name__ == "__main__":
    main()
