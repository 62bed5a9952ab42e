#!/usr/bin/env python3
"""Writes the golden data for slicetrain's `--template gemma-chat` renderer and its response-only loss mask.

Output (tests/fixtures/chat/, rewritten on every run; nothing else there is touched):
  dolly_records.jsonl     100 Dolly-style records {"instruction", "context", "response"}
  messages_records.jsonl  100 conversation records {"messages": [{"role", "content"}, ...]}
  gemma_chat.jsonl        one line per record, Dolly records first, then the conversations, each
                          {"kind": "dolly" | "messages", "record": <the record as in the two files above>,
                           "text": <rendered string>, "input_ids": [...], "assistant_mask": [0/1 per token]}
  google_template.json    what the renderings were compared with: {"template": "trl/chat_templates/gemma4_v5.jinja",
                           "sha256": <of that file>, "trl": <version>, "records_compared": 200,
                           "generation_prompts_compared": 200}

From what:
  - tokenizer: the bundled data/tokenizer (tokenizer.json + tokenizer_config.json) loaded with
    transformers.AutoTokenizer; it has Gemma 4's control tokens (<bos>=2, <|turn>=5, <turn|>=6).
  - chat template: tools/chat_templates/gemma4_training.jinja, the text-only Gemma 4 chat format as documented,
    with {% generation %} markers around each assistant turn's trimmed content and its <turn|> (see its header).
    Google's own chat_template.jinja is gated; the script cross-checks every rendering (and the generation prompt)
    against the copy of it that TRL ships (trl/chat_templates/gemma4_v5.jinja), fails if that file is missing,
    and records the comparison in google_template.json.
  - records: 60 Dolly records sampled from data/tiny_instruct/train.jsonl (20 of them with a context), 40 synthetic
    Dolly records and 100 synthetic conversations (2-6 user/assistant turns, a third with a leading system turn,
    a quarter written with role "model" instead of "assistant"), built from fixed word tables and random.Random
    generators with fixed seeds. They exercise trim (spaces, tabs, newlines, U+00A0, U+2003, U+3000, U+001F at the
    ends; U+200B, which str.strip keeps), multi-line text, empty and whitespace-only contexts, accents, CJK, emoji and
    ~600-character texts. No content contains a control token's text (<bos>, <|turn>, ...); that is checked.

A Dolly record becomes [{"role": "user", "content": U}, {"role": "assistant", "content": response}] with
U = instruction if context.strip() == "" else instruction + "\\n\\n" + context.

  - text:       tokenizer.apply_chat_template(messages, chat_template=..., tokenize=False)
  - input_ids:  the same with tokenize=True, return_dict=True (checked equal to tokenizer(text,
                add_special_tokens=False) and to start with the only <bos>)
  - assistant_mask: TRL's assistant_only_loss path. trl.SFTTrainer (SFTConfig(assistant_only_loss=True,
                max_length=None, packing=False, shuffle_dataset=False)) prepares a datasets.Dataset of the 200
                conversations for a tiny randomly initialised LlamaForCausalLM (no download). TRL tokenizes with
                apply_chat_template(return_assistant_tokens_mask=True), folds the "assistant_masks" column into a
                "labels" column (-100 outside the mask) and drops it, so the mask is train_dataset["labels"] != -100.
                Cross-checks: the mask equals apply_chat_template's own "assistant_masks"; TRL's collator
                (trl.trainer.sft_trainer.DataCollatorForLanguageModeling) pads batches without shifting labels, so
                labels != -100 exactly where the mask is 1 (labels == input_ids there); the model's loss on such a
                batch equals the mean cross entropy of logits[:, t-1] against input_ids[:, t] over the masked t
                (the causal shift happens inside the model); and an independent offsets-based recomputation (a token
                is trained iff its characters overlap an assistant turn's trimmed content or its <turn|>).

Usage (from any directory):  tools/.venv/bin/python tools/make_chat_fixtures.py
Needs tools/.venv (tools/requirements.txt: transformers, tokenizers, datasets, torch, trl). Runs offline in a few
seconds on one CPU core; a rerun produces byte-identical files.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOKENIZER_DIR = ROOT / "data" / "tokenizer"
INSTRUCT = ROOT / "data" / "tiny_instruct" / "train.jsonl"
TEMPLATE = HERE / "chat_templates" / "gemma4_training.jinja"
GOOGLE_TEMPLATE = "gemma4_v5.jinja"  # Google's Gemma 4 chat template as TRL ships it
OUT = ROOT / "tests" / "fixtures" / "chat"

N_FROM_FILE_PLAIN = 40
N_FROM_FILE_CONTEXT = 20
N_DOLLY = 100
N_MESSAGES = 100

# ---------------------------------------------------------------------------------------------------------------
# Word tables
# ---------------------------------------------------------------------------------------------------------------

SUBJECTS = [
    "the river", "a copper kettle", "the old bridge", "my garden", "the village library", "a comet",
    "the harbour", "a sourdough starter", "the night train", "a paper lantern", "the lighthouse",
    "a violin", "the glacier", "a beehive", "the market square", "a clay pot", "the orchard", "a sailboat",
    "the observatory", "a wool sweater", "the desert", "a chess clock", "the bakery", "a tidal pool",
]
ADJECTIVES = [
    "quiet", "busy", "ancient", "bright", "fragile", "sturdy", "colourful", "cold", "warm", "famous",
    "hidden", "noisy", "gentle", "tall", "narrow", "curious",
]
ACTIVITIES = [
    "visiting it", "cleaning it", "painting it", "writing about it", "moving it", "repairing it",
    "photographing it", "explaining it to a child",
]
FACTS = [
    "changes with the seasons", "was built long ago", "needs regular care", "is loved by the locals",
    "looks best in the early morning", "can be surprisingly heavy", "makes a soft humming sound",
    "is older than most people think", "is easy to overlook", "has a long and strange history",
    "reflects the light in odd ways", "attracts visitors from far away", "keeps its shape in the rain",
]
REASONS = [
    "stands at the edge of town", "was made by hand", "is used every single day", "faces the sea",
    "sits in the shade most of the year", "was repaired many times",
]
USER_TEMPLATES = [
    "Tell me something about {s}.",
    "Why is {s} so {a}?",
    "Can you describe {s} in one sentence?",
    "What should I know about {s} before {act}?",
    "Give me two facts about {s}.",
    "Is {s} really {a}?",
    "How would you explain {s} to a friend?",
    "Write a short list of things to notice about {s}.",
]
ASSISTANT_TEMPLATES = [
    "{S} is {a} because it {r}.",
    "Here are two facts:\n1. {S} {f1}.\n2. {S} {f2}.",
    "Certainly. {S} {f1}, and it {f2}.",
    "Consider {s}: it {f1}. Most people also notice that it {f2}.",
    "Response: {S} {f1}.",
    "Can do. {S} {f1}.",
    "Things to notice:\n- it {f1}\n- it {f2}\n- it is {a}",
    "In short, {s} {f1}.\n\nIn more detail, it {f2}, which is why people call it {a}.",
    "Yes, {s} is {a}; it {r}.",
    "Remember that {s} {f1}.",
]
FOLLOW_UPS = [
    "And why does that matter?", "Can you say more?", "Thanks! Anything else?", "Shorter, please.",
    "What about in winter?", "Could you give an example?", "Is that always true?", "Say it again as a list.",
]
SYSTEM_PROMPTS = [
    "You are a concise assistant.",
    "Answer in plain English and keep replies short.",
    "You are a helpful tutor who explains things step by step.",
    "You are a friendly guide. Use lists where they help.",
    "Réponds toujours poliment.",
    "Always answer in full sentences.\nNever use more than three sentences.",
]
UNICODE_SNIPPETS = [
    "Café crème, naïve façade, São Paulo.",
    "Straße und Größe über Äpfel.",
    "東京は日本の首都です。",
    "你好，世界！",
    "안녕하세요.",
    "Emoji time 🙂🚀 and 👩‍💻 and 🇩🇪.",
    "Ελληνικά και русский текст.",
    "A price of 5 € or £4 — roughly.",
]
# Whitespace put around texts: ASCII, tabs, CR/LF, and Unicode spaces that Python's str.strip (hence jinja's trim)
# removes: U+00A0 no-break space, U+2003 em space, U+3000 ideographic space, U+001F unit separator.
PADS = [" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u00a0", "\u2003", "\u00a0\u2003 ", "\u3000", " \t\n"]


def cap(s):
    return s[0].upper() + s[1:]


def long_text(rng, min_chars=600):
    """Sentences from the tables until at least min_chars characters (about 600-700)."""
    parts = []
    while len(" ".join(parts)) < min_chars:
        s = rng.choice(SUBJECTS)
        parts.append(f"{cap(s)} {rng.choice(FACTS)}, and it is {rng.choice(ADJECTIVES)} because it {rng.choice(REASONS)}.")
    return " ".join(parts)


def pad(rng, text, p=0.35):
    """Maybe surround text with whitespace (each end independently)."""
    if rng.random() < p:
        text = rng.choice(PADS) + text
    if rng.random() < p:
        text = text + rng.choice(PADS)
    return text


def fill(rng, template):
    s = rng.choice(SUBJECTS)
    f1, f2 = rng.sample(FACTS, 2)
    return template.format(s=s, S=cap(s), a=rng.choice(ADJECTIVES), act=rng.choice(ACTIVITIES), r=rng.choice(REASONS),
                           f1=f1, f2=f2)


# ---------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------


def dolly(instruction, context, response):
    return {"instruction": instruction, "context": context, "response": response}


def dolly_from_file(rng):
    rows = [json.loads(line) for line in INSTRUCT.read_text(encoding="utf-8").splitlines() if line.strip()]
    with_ctx = [i for i, r in enumerate(rows) if r["context"].strip()]
    plain = [i for i, r in enumerate(rows) if not r["context"].strip()]
    picked = sorted(rng.sample(plain, N_FROM_FILE_PLAIN) + rng.sample(with_ctx, N_FROM_FILE_CONTEXT))
    return [dolly(rows[i]["instruction"], rows[i]["context"], rows[i]["response"]) for i in picked]


def dolly_synthetic(rng):
    long1 = long_text(rng)
    long2 = long_text(rng)
    recs = [
        # trim: spaces, newlines, tabs
        dolly("  What is the capital of France?  ", "", "  Paris.  "),
        dolly("\nName a primary colour.\n", "", "\n\nRed\n\n"),
        dolly("\tIndented question?\t", "", "\tIndented answer.\t"),
        dolly("Summarise the text.", "  The cat sat on the mat all afternoon.  ", " The cat sat. "),
        # instruction with trailing blanks followed by a context: only the ends of U are trimmed
        dolly("Use the context.  ", "\n  Bees make honey.  \n", "Bees make honey."),
        # empty and whitespace-only contexts (U is the instruction alone)
        dolly("Say hello.", "", "Hello!"),
        dolly("Say goodbye.", "   \n\t ", "Goodbye!"),
        dolly("Count to three.", "\u00a0\u2003", "1, 2, 3"),
        # multi-line responses
        dolly("List three fruits.", "", "- apple\n- banana\n- cherry"),
        dolly("Write a haiku about rain.", "", "Soft rain on the roof\n\npuddles gather in the yard\n\nthe cat stays inside\n"),
        dolly("Give steps to boil an egg.", "", "1. Boil water.\r\n2. Add the egg.\r\n3. Wait nine minutes.\r\n"),
        # unicode
        dolly("Translate 'coffee with cream' into French.", "", "Café crème."),
        dolly("What is the capital of Japan?", "日本の首都はどこですか。", "東京です。"),
        dolly("Reply with a happy emoji.", "", "🙂🚀 Done! 👩‍💻"),
        dolly("Write a greeting in Korean and Greek.", "", "안녕하세요 / Γειά σου"),
        dolly("Spell 'naïve' without the diaeresis.", "", "naive"),
        # U+00A0 and U+2003 at the ends (str.strip removes them), inside (kept)
        dolly("\u00a0What does NBSP stand for?\u00a0", "", "\u00a0No-break\u00a0space.\u00a0"),
        dolly("\u2003Em space question?\u2003", "", "\u2003An em\u2003space.\u2003"),
        dolly("Mixed blanks.", "\u00a0 \n\u2003Context with odd blanks.\u2003 \u00a0", "\u00a0\u2003 Answer. \u2003\u00a0"),
        dolly("\u3000Ideographic space?\u3000", "", "\u3000全角スペース。\u3000"),
        # U+001F (str.strip removes it) and U+200B (str.strip keeps it) at the end
        dolly("Unit separator at the end.", "", "Trailing unit separator.\u001f"),
        dolly("Zero-width space at the end.", "", "Trailing zero width space.\u200b"),
        # long texts
        dolly("Summarise the following passage.", long1, "It is about places and things that change."),
        dolly("Write a long paragraph about places.", "", long2),
        # punctuation, quotes, brackets, markup-like text (no control tokens)
        dolly('Quote "this" and \\that\\.', "", 'He said "yes" and left \\ fast.'),
        dolly("Return JSON.", "", '{"name": "kettle", "tags": ["copper", "old"], "ok": true}'),
        dolly("Is 3 < 5 and 7 > 2?", "", "Yes: 3 < 5 and 7 > 2; also a|b and <tag> are plain text."),
        # responses whose first characters can merge with the header's "\n" in this tokenizer's BPE
        dolly("What is the answer?", "", "Response: forty-two."),
        dolly("Name an animal.", "", "Cat"),
        dolly("Name a colour.", "", "\nRed"),
    ]
    while len(recs) < N_DOLLY - N_FROM_FILE_PLAIN - N_FROM_FILE_CONTEXT:
        instruction = pad(rng, fill(rng, rng.choice(USER_TEMPLATES)))
        context = pad(rng, rng.choice(UNICODE_SNIPPETS + [fill(rng, rng.choice(ASSISTANT_TEMPLATES))])) \
            if rng.random() < 0.5 else ""
        response = pad(rng, fill(rng, rng.choice(ASSISTANT_TEMPLATES)))
        recs.append(dolly(instruction, context, response))
    return recs


def conversation(rng, i):
    """One synthetic conversation: optional system turn, then 2-6 alternating user/assistant turns."""
    assistant_role = "model" if i % 4 == 3 else "assistant"
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": pad(rng, rng.choice(SYSTEM_PROMPTS))})
    n = rng.choice([2, 2, 3, 4, 4, 5, 6, 6])
    for t in range(n):
        if t % 2 == 0:
            content = fill(rng, rng.choice(USER_TEMPLATES)) if t == 0 else rng.choice(FOLLOW_UPS)
            if rng.random() < 0.15:
                content += " " + rng.choice(UNICODE_SNIPPETS)
            msgs.append({"role": "user", "content": pad(rng, content)})
        else:
            content = fill(rng, rng.choice(ASSISTANT_TEMPLATES))
            r = rng.random()
            if r < 0.1:
                content = rng.choice(UNICODE_SNIPPETS) + "\n" + content
            elif r < 0.15:
                content = long_text(rng)
            msgs.append({"role": assistant_role, "content": pad(rng, content)})
    return {"messages": msgs}


def messages_synthetic(rng):
    u, a, m, s = "user", "assistant", "model", "system"
    fixed = [
        {"messages": [{"role": s, "content": "\u00a0You answer in Japanese.\u2003"},
                      {"role": u, "content": "What is the capital of Japan?"},
                      {"role": a, "content": "  東京です。  "},
                      {"role": u, "content": "And of Korea?"},
                      {"role": a, "content": "ソウルです。🙂"}]},
        {"messages": [{"role": u, "content": "\tGive me a list.\n"},
                      {"role": m, "content": "\n- one\n- two\n\n- three\n\n"}]},
        {"messages": [{"role": u, "content": "Write a long answer."},
                      {"role": a, "content": long_text(rng)},
                      {"role": u, "content": "Now summarise your answer in one line."},
                      {"role": a, "content": "\u2003Places change, and people notice.\u00a0"}]},
        {"messages": [{"role": s, "content": "Be brief."},
                      {"role": u, "content": "Say 'Response:' and nothing else."},
                      {"role": a, "content": "Response:"},
                      {"role": u, "content": "Now name a cat."},
                      {"role": a, "content": "Cleo"},
                      {"role": u, "content": "Thanks."}]},
        {"messages": [{"role": u, "content": "Emoji only, please."},
                      {"role": m, "content": " 👍🏽🎉 "},
                      {"role": u, "content": "\u3000全角\u3000"},
                      {"role": m, "content": "Trailing zero width space.\u200b"}]},
        {"messages": [{"role": u, "content": "Unit separator and CRLF.\u001f"},
                      {"role": a, "content": "Line one.\r\nLine two.\r\n"}]},
    ]
    recs = list(fixed)
    i = 0
    while len(recs) < N_MESSAGES:
        recs.append(conversation(rng, i))
        i += 1
    return recs


def dolly_messages(rec):
    user = rec["instruction"] if not rec["context"].strip() else rec["instruction"] + "\n\n" + rec["context"]
    return [{"role": "user", "content": user}, {"role": "assistant", "content": rec["response"]}]


# ---------------------------------------------------------------------------------------------------------------
# Rendering and checks
# ---------------------------------------------------------------------------------------------------------------


def expected_text(messages, bos):
    """The documented format, written out with str.strip (the check that jinja's trim behaves the same)."""
    out = bos
    for msg in messages:
        role = "model" if msg["role"] == "assistant" else msg["role"]
        out += "<|turn>" + role + "\n" + msg["content"].strip() + "<turn|>" + "\n"
    return out


def trained_spans(messages, bos):
    """Character spans [begin, end) of each assistant turn's trimmed content plus its <turn|>."""
    spans, pos = [], len(bos)
    for msg in messages:
        role = "model" if msg["role"] == "assistant" else msg["role"]
        pos += len("<|turn>" + role + "\n")
        body = msg["content"].strip() + "<turn|>"
        if role == "model":
            spans.append((pos, pos + len(body)))
        pos += len(body) + 1
    return spans


def offsets_mask(offsets, spans):
    return [int(any(b < e_span and e > b_span for b_span, e_span in spans)) for b, e in offsets]


def trl_masks(tokenizer, all_messages, template):
    """The assistant masks by TRL's SFTTrainer data preparation (assistant_only_loss=True), with collator checks."""
    import datasets
    import torch
    import trl
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import is_chat_template_stop_token_trained

    datasets.disable_progress_bars()
    tokenizer.chat_template = template
    assert is_chat_template_stop_token_trained(tokenizer), "TRL: <turn|> is not inside the generation span"

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    dataset = datasets.Dataset.from_list([{"messages": msgs} for msgs in all_messages])
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, assistant_only_loss=True, max_length=None, packing=False,
                         shuffle_dataset=False, per_device_train_batch_size=8, report_to=[], use_cpu=True,
                         save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        prepared = trainer.train_dataset
        assert "assistant_masks" not in prepared.column_names  # TRL 1.16 folds it into "labels"
        rows = [prepared[i] for i in range(len(prepared))]
        masks = [[int(label != -100) for label in row["labels"]] for row in rows]
        for row in rows:
            assert all(label in (-100, tok) for label, tok in zip(row["labels"], row["input_ids"]))

        # TRL's collator: labels padded with -100, not shifted.
        collator = trainer.data_collator
        assert type(collator).__name__ == "DataCollatorForLanguageModeling", type(collator)
        model.eval()
        for start in range(0, len(rows), 8):
            chunk = rows[start:start + 8]
            batch = collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in chunk])
            for j, row in enumerate(chunk):
                n = len(row["input_ids"])
                labels = batch["labels"][j]
                assert batch["input_ids"][j, :n].tolist() == row["input_ids"]
                assert (labels[:n] != -100).long().tolist() == masks[start + j]
                assert (labels[n:] == -100).all() and (batch["attention_mask"][j, n:] == 0).all()
                kept = labels[:n] != -100
                assert (labels[:n][kept] == batch["input_ids"][j, :n][kept]).all()
            if start == 0:  # the shift is the model's: loss = CE(logits[:, t-1], input_ids[:, t]) over masked t
                with torch.no_grad():
                    out = model(**batch)
                logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float()
                target = batch["labels"][:, 1:].reshape(-1)
                manual = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)
                assert torch.allclose(out.loss, manual, rtol=1e-5, atol=1e-6), (out.loss, manual)
    return [r["input_ids"] for r in rows], masks, trl.__version__


def main():
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    template = TEMPLATE.read_text(encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    bos, bos_id = tokenizer.bos_token, tokenizer.bos_token_id
    control = sorted(tokenizer.get_added_vocab())  # <pad> <eos> <bos> <unk> <mask> <|turn> <turn|> ...

    dolly_recs = dolly_from_file(random.Random(11)) + dolly_synthetic(random.Random(12))
    message_recs = messages_synthetic(random.Random(13))
    assert len(dolly_recs) == N_DOLLY and len(message_recs) == N_MESSAGES

    def fields(rec):
        return [m["content"] for m in rec["messages"]] if "messages" in rec else list(rec.values())

    for rec in dolly_recs + message_recs:
        for text in fields(rec):
            bad = [c for c in control if c in text]
            assert not bad, (bad, text)

    cases = [("dolly", r, dolly_messages(r)) for r in dolly_recs] + \
            [("messages", r, r["messages"]) for r in message_recs]
    all_messages = [msgs for _, _, msgs in cases]

    # Google's template as shipped with TRL (text-only path), for a cross-check of the rendered strings.
    # Missing file = a TRL without it: fail rather than write goldens that were not compared.
    google = Path(__import__("trl").__file__).parent / "chat_templates" / GOOGLE_TEMPLATE
    if not google.is_file():
        raise SystemExit(f"{google} is missing: the renderings cannot be compared with Google's template "
                         f"(install trl as pinned in tools/requirements.txt)")
    google_bytes = google.read_bytes()
    google_template = google_bytes.decode("utf-8")

    lines, n_tokens, n_masked, n_straddle, n_google = [], 0, 0, 0, 0
    trl_ids, masks, trl_version = trl_masks(tokenizer, all_messages, template)
    for (kind, rec, msgs), ids_trl, mask in zip(cases, trl_ids, masks):
        text = tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False)
        assert text == expected_text(msgs, bos), (text, expected_text(msgs, bos))
        enc = tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])
        assert ids == tokenizer(text, add_special_tokens=False).input_ids
        assert ids[0] == bos_id and ids.count(bos_id) == 1
        assert ids == ids_trl, "TRL tokenized differently"
        assert list(enc["assistant_masks"]) == mask, "TRL mask != apply_chat_template's assistant_masks"
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        spans = trained_spans(msgs, bos)
        assert offsets_mask(offsets, spans) == mask, "mask != offsets-based recomputation"
        n_straddle += sum(1 for (b, e) in offsets for (sb, _) in spans if b < sb < e)
        assert tokenizer.apply_chat_template(msgs, chat_template=google_template, tokenize=False) == text
        prompt = msgs[:-1] if msgs[-1]["role"] != "user" else msgs
        assert tokenizer.apply_chat_template(prompt, chat_template=google_template, tokenize=False,
                                             add_generation_prompt=True) == \
            tokenizer.apply_chat_template(prompt, chat_template=template, tokenize=False,
                                          add_generation_prompt=True)
        n_google += 1
        n_tokens += len(ids)
        n_masked += sum(mask)
        lines.append(json.dumps({"kind": kind, "record": rec, "text": text, "input_ids": ids,
                                 "assistant_mask": mask}, ensure_ascii=False))

    OUT.mkdir(parents=True, exist_ok=True)

    def write(name, rows):
        with open(OUT / name, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(row + "\n")

    write("dolly_records.jsonl", [json.dumps(r, ensure_ascii=False) for r in dolly_recs])
    write("messages_records.jsonl", [json.dumps(r, ensure_ascii=False) for r in message_recs])
    write("gemma_chat.jsonl", lines)
    assert n_google == len(cases)
    write("google_template.json", [json.dumps({
        "template": f"trl/chat_templates/{GOOGLE_TEMPLATE}", "sha256": hashlib.sha256(google_bytes).hexdigest(),
        "trl": trl_version, "records_compared": n_google, "generation_prompts_compared": n_google}, indent=1)])

    n_turns = sum(1 for msgs in all_messages for m in msgs if m["role"] in ("assistant", "model"))
    print(f"wrote {OUT.relative_to(ROOT)}/: {len(dolly_recs)} dolly + {len(message_recs)} messages records "
          f"({n_turns} assistant turns), trl {trl_version}, transformers {transformers.__version__}")
    print(f"tokens: {n_tokens} total, {n_masked} in the assistant mask ({n_masked / n_tokens:.3f}), "
          f"longest {max(len(json.loads(line)['input_ids']) for line in lines)}")
    print(f"tokens spanning a model header's '\\n' and the content (masked): {n_straddle}")
    print(f"Google's template (TRL copy) renders the same text: {n_google}/{len(cases)}")


if __name__ == "__main__":
    main()
