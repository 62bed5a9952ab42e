#!/usr/bin/env python3
"""Writes slicetrain's bundled default data: a small instruction data set and a BPE tokenizer.

  data/tiny_instruct/train.jsonl   records in Dolly's schema (instruction, context, response, category)
  data/tokenizer/tokenizer.json    Gemma-style BPE (byte fallback, Replace(" ","\u2581") normalizer,
  data/tokenizer/tokenizer_config.json   Split(" ", merged_with_previous) pre-tokenizer, Gemma's decoder)

Everything is generated from the tables below by a seeded RNG: a rerun writes byte-identical files
(given the pinned `tokenizers` version in tools/requirements.txt). The tasks are ones a tiny model
can learn in minutes: arithmetic, word reversal, spelling, counting, sorting, table lookups.
No third-party text is used; the output is released under CC0-1.0 (see data/README.md).

Usage (from the repository root):  tools/.venv/bin/python tools/make_bundled_data.py
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gemma_style_tokenizer  # noqa: E402

SEED = 20240607
NUM_RECORDS = 4000
VOCAB_SIZE = 4096

WORDS = """apple river stone planet garden window silver yellow orange castle dragon forest
market pencil rocket summer winter spring autumn bridge candle doctor engine farmer guitar
hammer island jacket kitten ladder monkey needle orchid parrot pillow rabbit saddle tomato
turtle valley wallet zipper anchor basket butter carpet cotton dinner flower ginger helmet
insect jungle kettle lemon magnet napkin ocean pepper puzzle quartz ribbon salmon tunnel
violin walnut yogurt zebra cloud music paper light water green table chair bread sugar
house mouse horse cheese queen train plant brick smile dream ghost honey juice knife""".split()

# A fixed lookup table of made-up creatures (no real-world facts to get wrong).
CREATURES = [
    ("zorbel", "blue", "mountains", 4), ("quimp", "red", "rivers", 6), ("flarn", "green", "caves", 2),
    ("drubble", "yellow", "forests", 8), ("snorp", "purple", "deserts", 3), ("wibbet", "orange", "lakes", 5),
    ("glimmox", "silver", "clouds", 7), ("trundle", "brown", "meadows", 4), ("plonk", "white", "islands", 9),
    ("vesk", "black", "swamps", 1), ("muddle", "pink", "beaches", 6), ("yarrow", "gold", "valleys", 2),
    ("kezzle", "grey", "glaciers", 3), ("bronth", "teal", "canyons", 8), ("ophel", "violet", "hills", 5),
    ("tasko", "amber", "jungles", 7),
]
NAMES = ["Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max",
         "Nia", "Oto", "Pia", "Raj", "Sue", "Tom", "Uma", "Vic", "Wen", "Yul", "Zoe"]


def t_add(r):
    a, b = r.randint(0, 99), r.randint(0, 99)
    return f"What is {a} + {b}?", "", str(a + b), "arithmetic"


def t_sub(r):
    a, b = r.randint(0, 99), r.randint(0, 99)
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", "", str(a - b), "arithmetic"


def t_mul(r):
    a, b = r.randint(2, 12), r.randint(2, 12)
    return f"What is {a} times {b}?", "", str(a * b), "arithmetic"


def t_reverse(r):
    w = r.choice(WORDS)
    return f'Reverse the word "{w}".', "", w[::-1], "reversal"


def t_upper(r):
    ws = " ".join(r.sample(WORDS, r.randint(1, 3)))
    return f'Write "{ws}" in capital letters.', "", ws.upper(), "spelling"


def t_spell(r):
    w = r.choice(WORDS)
    return f'Spell the word "{w}" with dashes.', "", "-".join(w), "spelling"


def t_count(r):
    w = r.choice(WORDS)
    return f'How many letters are in "{w}"?', "", str(len(w)), "counting"


def t_sort(r):
    xs = [r.randint(0, 50) for _ in range(r.randint(3, 6))]
    return ("Sort these numbers from smallest to largest: " + ", ".join(map(str, xs)) + ".", "",
            ", ".join(map(str, sorted(xs))), "sorting")


def t_creature(r):
    name, colour, home, legs = r.choice(CREATURES)
    kind = r.randrange(3)
    if kind == 0:
        return f"What colour is a {name}?", "", f"A {name} is {colour}.", "lookup"
    if kind == 1:
        return f"Where does a {name} live?", "", f"A {name} lives in {home}.", "lookup"
    return f"How many legs does a {name} have?", "", f"A {name} has {legs} legs.", "lookup"


def t_context_age(r):
    people = r.sample(NAMES, r.randint(2, 4))
    ages = {p: r.randint(5, 90) for p in people}
    ctx = " ".join(f"{p} is {ages[p]} years old." for p in people)
    who = r.choice(people)
    return f"How old is {who}?", ctx, str(ages[who]), "closed_qa"


def t_context_oldest(r):
    people = r.sample(NAMES, r.randint(2, 4))
    ages = r.sample(range(5, 90), len(people))
    ctx = " ".join(f"{p} is {a} years old." for p, a in zip(people, ages))
    return "Who is the oldest?", ctx, people[ages.index(max(ages))], "closed_qa"


def t_parity(r):
    n = r.randint(0, 999)
    return f"Is {n} even or odd?", "", "even" if n % 2 == 0 else "odd", "classification"


TASKS = [t_add, t_sub, t_mul, t_reverse, t_upper, t_spell, t_count, t_sort, t_creature,
         t_context_age, t_context_oldest, t_parity]


def make_records():
    r = random.Random(SEED)
    out = []
    for i in range(NUM_RECORDS):
        instruction, context, response, category = TASKS[i % len(TASKS)](r)
        out.append({"instruction": instruction, "context": context, "response": response,
                    "category": category})
    r.shuffle(out)
    return out


def prompt(rec):
    # The default prompt template of slicetrain (docs/data.md), so the tokenizer sees what training sees.
    if rec["context"]:
        return f"Instruction: {rec['instruction']}\nContext: {rec['context']}\nResponse: {rec['response']}"
    return f"Instruction: {rec['instruction']}\nResponse: {rec['response']}"


def main():
    records = make_records()
    ddir = os.path.join(ROOT, "data", "tiny_instruct")
    os.makedirs(ddir, exist_ok=True)
    with open(os.path.join(ddir, "train.jsonl"), "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tdir = os.path.join(ROOT, "data", "tokenizer")
    gemma_style_tokenizer.train_and_save(
        [prompt(rec) for rec in records], tdir, vocab_size=VOCAB_SIZE, word_level_merges=True,
        config=gemma_style_tokenizer.default_config(add_bos=True, add_eos=False))
    print(f"wrote {len(records)} records to {ddir}/train.jsonl and a tokenizer to {tdir}")


if __name__ == "__main__":
    main()
