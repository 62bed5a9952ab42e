#!/usr/bin/env python3
"""Generate golden DPO / ORPO fixtures for slicetrain's preference training with TRL's own code.

Usage (from any directory; offline, ~30 s on 2 cores):
    tools/.venv/bin/python tools/make_dpo_fixtures.py [--out tests/fixtures/dpo]

Needs tools/.venv (transformers 5.24, torch 2.15, peft 0.21.2, trl 1.16.0, datasets). The output directory is
rewritten on every run. Everything below is fp32, eager attention, dropout 0, use_cache=False, on the CPU.

Written to tests/fixtures/dpo/:
    model/                  tiny Gemma4ForCausalLM: tests/fixtures/tiny_text/config.json with vocab_size =
                            vocab_size_per_layer_input = 3072 (the bundled tokenizer has 3015 tokens), pad/eos/bos
                            0/1/2; transformers' own random init after torch.manual_seed(0); save_pretrained
                            (model.safetensors fp32, config.json, generation_config.json); plus tokenizer.json and
                            tokenizer_config.json, byte-identical copies of data/tokenizer/.
    adapter/                PEFT LoRA adapter on model/: LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                            target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"); torch.manual_seed(1) right
                            before get_peft_model (so lora_A is PEFT's kaiming-uniform init); then every lora_B
                            (PEFT init: zeros) is overwritten with 0.05*N(0,1) from torch.Generator().manual_seed(2),
                            in named_parameters order. adapter_config.json as PEFT writes it except
                            base_model_name_or_path = "model" (relative to this directory) and sorted target_modules;
                            adapter_model.safetensors as PEFT writes it; PEFT's README.md model card is deleted.
    text.jsonl              40 standard records {"prompt", "chosen", "rejected"} (str)
    conv.jsonl              40 conversational records {"prompt": [messages], "chosen": [assistant], "rejected": [...]}
    implicit_conv.jsonl     10 records {"chosen": [user, assistant], "rejected": [same user, other assistant]}
    implicit_text.jsonl     10 records {"chosen": "Question? Answer A", "rejected": "Question? Answer B"}
    implicit_conv.parquet   implicit_conv.jsonl's records as a hub preference set stores them (HuggingFaceH4/
                            ultrafeedback_binarized's columns): "prompt" (the user text, a string beside
                            conversational completions, which TRL's maybe_extract_prompt ignores and re-extracts),
                            "chosen", "rejected" (lists of {"role", "content"} structs), "score_chosen",
                            "score_rejected" (float64); written by pyarrow in two row groups of 5. Its tokenization
                            is implicit_conv.jsonl's.
                            All built from fixed word tables with random.Random(seed); edge cases listed in make_*().
    tokenized.jsonl         one line per record of the four files (in that order), {"file", "index", "prompt_ids",
                            "chosen_ids", "rejected_ids", "dropped_at_64"}: the columns of TRL's
                            DPOTrainer._prepare_dataset (extract_prompt for implicit prompts, EOS text appended to
                            non-conversational chosen/rejected unless already there, tokenize_fn with
                            common_prefix_length) with max_length=None; dropped_at_64: whether _prepare_dataset with
                            max_length=64 (truncation_mode keep_start) filters the record out (len(prompt_ids) >= 64;
                            checked against TRL's own filter).
    golden.json             {"beta", "max_length", "label_smoothing_robust", "versions", "batches": {"text": {...},
                            "conv": {...}}}; per batch "records" (indices into text.jsonl / conv.jsonl), "shape", and
                            for each of "sigmoid", "hinge", "ipo", "robust", "orpo" a dict {"loss": x, <metric>: x}
    golden.safetensors      "<batch>/input_ids", "<batch>/attention_mask", "<batch>/completion_mask" (int32, the
                            DataCollatorForPreference output: rows 0..3 prompt+chosen, rows 4..7 prompt+rejected) and
                            "<batch>/<loss>/<PEFT parameter name without .default>" (fp32) = d loss / d parameter for
                            every lora_A / lora_B (a parameter whose module takes no part in the forward, e.g. v_proj
                            of a kv-shared layer, gets an all-zero gradient)
    README.md               short description

How the goldens are produced:
  - the tokenizer is AutoTokenizer.from_pretrained(model/) with chat_template = the text of
    tools/chat_templates/gemma4_training.jinja.
  - a trl.DPOTrainer is built on the base model from model/ with peft_config = the LoraConfig above and
    DPOConfig(seed=1, beta=0.1, max_length=None, bf16=False, gradient_checkpointing=False, use_cpu=True, ...): TRL
    calls set_seed(1) and get_peft_model itself (lora_A is checked equal to adapter/'s), then lora_B is loaded from
    adapter/. With a peft_config (a new adapter) TRL's reference model is the PEFT model with adapters disabled. (Had
    a ready PeftModel been passed, TRL 1.16 would add a frozen "ref" copy of the adapter as the reference instead, and
    policy == reference at step 0.)
  - batch: the first 4 records of text.jsonl / conv.jsonl as prepared by _prepare_dataset (max_length=None), collated
    by DataCollatorForPreference(pad_token_id=0, max_length=64, truncation_mode="keep_start").
  - DPO: for loss_type in sigmoid, hinge, ipo, robust (beta 0.1, label_smoothing 0.1 for robust, 0 otherwise; set on
    the trainer's loss_types / loss_weights / label_smoothing attributes, which __init__ copies from DPOConfig):
    model.train(), zero_grad, loss = trainer._compute_loss(model, batch, False) (TRL's fused LM head path),
    loss.backward(). The metrics are what _compute_loss appends to trainer._metrics["train"] (rewards/chosen,
    rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, plus TRL's entropy,
    logits/chosen, logits/rejected, mean_token_accuracy and num_tokens = attention_mask.sum() of this batch).
  - ORPO: trl.experimental.orpo.ORPOTrainer(model=<the same PEFT model>, ORPOConfig(beta=0.1, max_length=64, ...)),
    loss, metrics = get_batch_loss_metrics(model, orpo_batch, "train") then backward. orpo_batch is built from the
    DPO collator output above (same token ids): chosen_input_ids = input_ids[:4], chosen_attention_mask =
    attention_mask[:4], chosen_labels = input_ids[:4] with -100 where completion_mask == 0 (prompt and padding);
    rejected_* from rows 4..7. Note TRL's ORPO nll_loss is the mean CE over every attended token of the chosen rows
    (prompt included), and its logps are per-token averages over the labels. Metrics: rewards/chosen,
    rewards/rejected, rewards/accuracies, rewards/margins, logps/rejected, logps/chosen, logits/rejected,
    logits/chosen, nll_loss, log_odds_ratio, log_odds_chosen.
  - check: model/ and adapter/ are loaded again (PeftModel.from_pretrained) and the sigmoid loss, rewards and
    gradients are recomputed independently (plain forward, log_softmax, disable_adapter() for the reference).

Deterministic: a rerun produces byte-identical files on the same torch build. On x86-64 it pins
ATEN_CPU_CAPABILITY=avx2 (unless already set) before importing torch, as tools/make_lora_fixtures.py does (fp32
reductions in the backward pass round differently under the AVX-512 kernels).
"""

from __future__ import annotations

import os
import platform

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
if platform.machine().lower() in ("x86_64", "amd64"):
    # Must be set before torch is imported. See the module docstring.
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import datasets  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoTokenizer, Gemma4ForCausalLM, Gemma4TextConfig  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DataCollatorForPreference  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TINY_CONFIG = ROOT / "tests" / "fixtures" / "tiny_text" / "config.json"
TOKENIZER_DIR = ROOT / "data" / "tokenizer"
TEMPLATE = HERE / "chat_templates" / "gemma4_training.jinja"
OUT = ROOT / "tests" / "fixtures" / "dpo"

VOCAB = 3072
BETA = 0.1
MAX_LENGTH = 64
ROBUST_LS = 0.1
LOSS_TYPES = ["sigmoid", "hinge", "ipo", "robust"]
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
B_STD = 0.05
ADAPTER = "default"
BATCH_RECORDS = [0, 1, 2, 3]
FILES = ["text.jsonl", "conv.jsonl", "implicit_conv.jsonl", "implicit_text.jsonl"]

# ---------------------------------------------------------------------------------------------------------------
# Word tables and records
# ---------------------------------------------------------------------------------------------------------------

SUBJECTS = [
    "the river", "a copper kettle", "the old bridge", "my garden", "the village library", "a comet",
    "the harbour", "a sourdough starter", "the night train", "a paper lantern", "the lighthouse", "a violin",
    "the glacier", "a beehive", "the market square", "a clay pot", "the orchard", "a sailboat",
]
ADJECTIVES = ["quiet", "busy", "ancient", "bright", "fragile", "sturdy", "cold", "warm", "famous", "hidden", "tall"]
FACTS = [
    "changes with the seasons", "was built long ago", "needs regular care", "is loved by the locals",
    "looks best in the early morning", "can be surprisingly heavy", "makes a soft humming sound",
    "is older than most people think", "is easy to overlook", "has a long and strange history",
]
WRONG = [
    "is made of cheese", "was invented last week", "never existed", "can fly on its own", "is purple on Tuesdays",
    "speaks three languages", "weighs nothing at all", "is a kind of fish",
]
QUESTIONS = [
    "Tell me something about {s}.", "Why is {s} so {a}?", "Describe {s} in one sentence.",
    "Give me one fact about {s}.", "Is {s} really {a}?", "What do people say about {s}?",
]
TEXT_PROMPTS = [
    "A fact about {s}:", "Complete the sentence. {S}", "Question: what is true of {s}? Answer:",
    "Here is a note about {s}.", "{S} is {a}, and it",
]
SHORT_QUESTIONS = ["Why is {s} {a}?", "Is {s} {a}?", "What is {s}?"]  # system / multi-turn prompts stay < 64 tokens
FOLLOW_UPS = ["Why?", "More?", "Really?", "Shorter, please."]
SYSTEM_PROMPTS = ["Be brief.", "Be kind.", "Réponds poliment.", "Use\nlists."]
UNICODE = [
    "Café crème, naïve façade, São Paulo.", "Straße und Größe über Äpfel.", "東京は日本の首都です。", "你好，世界！",
    "Ελληνικά και русский текст.",
]


def fill(rng: random.Random, template: str) -> str:
    s = rng.choice(SUBJECTS)
    return template.format(s=s, S=s[0].upper() + s[1:], a=rng.choice(ADJECTIVES))


def good(rng: random.Random, s: str | None = None) -> str:
    s = s or rng.choice(SUBJECTS)
    return f"{s[0].upper() + s[1:]} {rng.choice(FACTS)}."


def bad(rng: random.Random, s: str | None = None) -> str:
    s = s or rng.choice(SUBJECTS)
    return f"{s[0].upper() + s[1:]} {rng.choice(WRONG)}."


def long_text(rng: random.Random, n_sentences: int) -> str:
    return " ".join(good(rng) for _ in range(n_sentences))


def make_text(rng: random.Random) -> list[dict]:
    """Standard (non-conversational) records. Edge cases at fixed indices:
    1: prompt ends with a space; 2: non-ASCII (accents); 3: long chosen (~100 tokens), truncated at 64 in the golden
    batch; 5: ~200-token prompt (dropped at 64); 6: empty prompt; 7: chosen already ends with "<eos>";
    8: completions start with a space; 9: CJK; 10: long rejected; 4, 11, 18, 25, 32, 39: a non-ASCII sentence
    appended to the prompt (record 4's prompt reaches 64 tokens, so it is dropped at 64 as well)."""
    recs = []
    for i in range(40):
        prompt = fill(rng, rng.choice(TEXT_PROMPTS))
        chosen, rejected = " " + good(rng), " " + bad(rng)
        if i == 1:
            prompt, chosen, rejected = "Finish this: the lighthouse is ", "tall and white.", "made of soup."
        elif i == 2:
            prompt, chosen, rejected = "Décrivez le café crème.", " Un café très doux, à la crème.", " Une bière."
        elif i == 3:
            chosen = " " + long_text(rng, 5)
        elif i == 5:
            prompt = "Read the notes and answer. " + long_text(rng, 8) + " Question: which is oldest?"
        elif i == 6:
            prompt = ""
        elif i == 7:
            chosen = " " + good(rng) + "<eos>"
        elif i == 8:
            prompt = "Say something about " + rng.choice(SUBJECTS) + "."
            chosen, rejected = "  " + good(rng), " \n" + bad(rng)
        elif i == 9:
            prompt, chosen, rejected = "日本の首都はどこですか？", "東京です。", "大阪です。"
        elif i == 10:
            rejected = " " + long_text(rng, 6)
        elif i % 7 == 4:
            prompt += " " + rng.choice(UNICODE)
        recs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return recs


def make_conv(rng: random.Random) -> list[dict]:
    """Conversational records. 1, 5, 9, ...: leading system turn; 2, 6, 10, ...: multi-turn prompt (user, assistant,
    user); 3: non-ASCII; 4: ~200-token user turn (dropped at 64); others: one user turn."""
    recs = []
    for i in range(40):
        s = rng.choice(SUBJECTS)
        questions = QUESTIONS if i % 4 in (0, 3) else SHORT_QUESTIONS
        user = rng.choice(questions).format(s=s, a=rng.choice(ADJECTIVES))
        prompt = [{"role": "user", "content": user}]
        if i % 4 == 1:
            prompt.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        elif i % 4 == 2:
            prompt += [{"role": "assistant", "content": f"{s[0].upper() + s[1:]} is {rng.choice(ADJECTIVES)}."},
                       {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
        if i == 3:
            prompt = [{"role": "user", "content": "Traduis : " + rng.choice(UNICODE)}]
        elif i == 4:
            prompt = [{"role": "user", "content": "Summarise: " + long_text(rng, 8)}]
        chosen = good(rng, s) if i != 3 else "Voilà : 東京は日本の首都です。"
        rejected = bad(rng, s)
        recs.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": rejected}]})
    return recs


def make_implicit_conv(rng: random.Random) -> list[dict]:
    recs = []
    for _ in range(10):
        s = rng.choice(SUBJECTS)
        user = {"role": "user", "content": rng.choice(QUESTIONS).format(s=s, a=rng.choice(ADJECTIVES))}
        recs.append({"chosen": [user, {"role": "assistant", "content": good(rng, s)}],
                     "rejected": [dict(user), {"role": "assistant", "content": bad(rng, s)}]})
    return recs


def make_implicit_text(rng: random.Random) -> list[dict]:
    """Even indices: both answers start with the same subject, so TRL's (character-level) extract_prompt takes the
    shared start of the answer into the prompt; odd indices: the answers differ from their first character."""
    recs = []
    for i in range(10):
        s = rng.choice(SUBJECTS)
        q = rng.choice(QUESTIONS).format(s=s, a=rng.choice(ADJECTIVES))
        rejected = bad(rng, s) if i % 2 == 0 else "I do not know."
        recs.append({"chosen": f"{q} {good(rng, s)}", "rejected": f"{q} {rejected}"})
    return recs


def write_jsonl(path: Path, rows: list[dict]):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Model and adapter
# ---------------------------------------------------------------------------------------------------------------

def saved_key(param_name: str) -> str:
    key = param_name.replace(f".{ADAPTER}.", ".")
    assert key != param_name, param_name
    return key


def load_base(model_dir: Path) -> Gemma4ForCausalLM:
    model = Gemma4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.set_attn_implementation("eager")
    return model


def make_model(out: Path) -> Path:
    model_dir = out / "model"
    cfg = Gemma4TextConfig.from_pretrained(TINY_CONFIG.parent)
    cfg.vocab_size = cfg.vocab_size_per_layer_input = VOCAB
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = 0, 1, 2
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(model_dir)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / fn, model_dir / fn)
    return model_dir


def make_adapter(out: Path, model_dir: Path) -> dict[str, torch.Tensor]:
    adapter_dir = out / "adapter"
    base = load_base(model_dir)
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(**LORA))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                assert not p.any(), n
                p.copy_(B_STD * torch.randn(p.shape, generator=gen))
    model.save_pretrained(adapter_dir)
    (adapter_dir / "README.md").unlink()
    path = adapter_dir / "adapter_config.json"
    text = path.read_text(encoding="utf-8")
    cfg = json.loads(text)
    assert json.dumps(cfg, indent=2, sort_keys=True) == text, "adapter_config.json is not in PEFT's format"
    cfg["base_model_name_or_path"] = "model"
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    assert sorted(os.listdir(adapter_dir)) == ["adapter_config.json", "adapter_model.safetensors"]
    with safe_open(adapter_dir / "adapter_model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ---------------------------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------------------------

def lora_params(model) -> dict[str, torch.nn.Parameter]:
    ps = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert ps and all(".lora_A." in n or ".lora_B." in n for n in ps), sorted(ps)
    return ps


def grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in lora_params(model).items():
        g = torch.zeros_like(p) if p.grad is None else p.grad
        out[saved_key(n)] = g.detach().float().contiguous()
    return out


def to_py(v):
    return float(v.item() if isinstance(v, torch.Tensor) else v)


def run_dpo(trainer, model, batch, loss_type):
    trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
    trainer.label_smoothing = ROBUST_LS if loss_type == "robust" else 0.0
    trainer._metrics["train"].clear()
    trainer._total_train_tokens = 0
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, batch, False)
    loss.backward()
    metrics = {"loss": to_py(loss)}
    for k, v in trainer._metrics["train"].items():
        assert len(v) == 1, (k, v)
        metrics[k] = to_py(v[0])
    return metrics, grads(model)


def orpo_batch(batch, n):
    ids, am, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    labels = ids.masked_fill(cm == 0, -100)
    return {
        "chosen_input_ids": ids[:n], "chosen_attention_mask": am[:n], "chosen_labels": labels[:n],
        "rejected_input_ids": ids[n:], "rejected_attention_mask": am[n:], "rejected_labels": labels[n:],
    }


def run_orpo(orpo, model, batch):
    model.train()
    model.zero_grad(set_to_none=True)
    loss, metrics = orpo.get_batch_loss_metrics(model, orpo_batch(batch, len(BATCH_RECORDS)), train_eval="train")
    loss.backward()
    return {"loss": to_py(loss), **{k: to_py(v) for k, v in metrics.items()}}, grads(model)


def manual_sigmoid(model, batch):
    """Independent DPO sigmoid loss: plain forward + log_softmax; reference = adapters disabled."""
    ids, am, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]

    def seq_logps():
        logits = model(input_ids=ids, attention_mask=am, use_cache=False).logits[:, :-1].float()
        lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None])[..., 0]
        return (lp * cm[:, 1:]).sum(1)

    model.train()
    model.zero_grad(set_to_none=True)
    with torch.no_grad(), model.disable_adapter():
        ref = seq_logps()
    pol = seq_logps()
    n = ids.shape[0] // 2
    cr, rr = pol[:n] - ref[:n], pol[n:] - ref[n:]
    loss = -F.logsigmoid(BETA * (cr - rr)).mean()
    loss.backward()
    return {"loss": float(loss), "rewards/chosen": float(BETA * cr.mean()), "rewards/rejected": float(BETA * rr.mean()),
            "logps/chosen": float(pol[:n].mean()), "logps/rejected": float(pol[n:].mean())}, grads(model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    out = Path(args.out)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)

    if out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    # Records
    records = {
        "text.jsonl": make_text(random.Random(1001)),
        "conv.jsonl": make_conv(random.Random(1002)),
        "implicit_conv.jsonl": make_implicit_conv(random.Random(1003)),
        "implicit_text.jsonl": make_implicit_text(random.Random(1004)),
    }
    for fn in FILES:
        write_jsonl(out / fn, records[fn])
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = records["implicit_conv.jsonl"]
    table = pa.table({
        "prompt": [r["chosen"][0]["content"] for r in rows],
        "chosen": [r["chosen"] for r in rows],
        "rejected": [r["rejected"] for r in rows],
        "score_chosen": [8.0 + i % 3 for i in range(len(rows))],
        "score_rejected": [2.0 + i % 3 for i in range(len(rows))],
    })
    pq.write_table(table, out / "implicit_conv.parquet", row_group_size=5)

    model_dir = make_model(out)
    adapter = make_adapter(out, model_dir)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert len(tokenizer) <= VOCAB

    with tempfile.TemporaryDirectory() as tmp:
        cfg = DPOConfig(output_dir=tmp, max_length=None, report_to=[], per_device_train_batch_size=4, beta=BETA,
                        seed=1, bf16=False, gradient_checkpointing=False, use_cpu=True, loss_type=["sigmoid"],
                        logging_strategy="no", save_strategy="no")
        base = load_base(model_dir)
        trainer = DPOTrainer(model=base, ref_model=None, args=cfg, train_dataset=Dataset.from_list(records["text.jsonl"]),
                             processing_class=tokenizer, peft_config=LoraConfig(**LORA))
        model = trainer.model
        assert isinstance(model, PeftModel) and trainer.ref_model is None and "ref" not in model.peft_config
        # TRL's own adapter (set_seed(1) + get_peft_model) has adapter/'s lora_A; take lora_B from adapter/.
        with torch.no_grad():
            for n, p in lora_params(model).items():
                if ".lora_A." in n:
                    assert torch.equal(p, adapter[saved_key(n)]), n
                else:
                    p.copy_(adapter[saved_key(n)])
        assert set(adapter) == {saved_key(n) for n in lora_params(model)}

        # Tokenization, the TRL way
        cfg64 = copy.copy(cfg)
        cfg64.max_length = MAX_LENGTH
        prepared = {}
        lines = []
        n_dropped = {}
        for fn in FILES:
            ds = Dataset.from_list(records[fn])
            prep = trainer._prepare_dataset(ds, tokenizer, cfg, fn)
            prep64 = trainer._prepare_dataset(ds, tokenizer, cfg64, fn)
            assert len(prep) == len(ds)
            rows = [{k: prep[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for i in range(len(prep))]
            kept = [r for r in rows if len(r["prompt_ids"]) < MAX_LENGTH]
            assert kept == [{k: prep64[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                            for i in range(len(prep64))], fn
            if fn == "text.jsonl":
                assert rows == [{k: trainer.train_dataset[i][k] for k in rows[0]} for i in range(len(rows))]
            prepared[fn] = rows
            n_dropped[fn] = [i for i, r in enumerate(rows) if len(r["prompt_ids"]) >= MAX_LENGTH]
            for i, r in enumerate(rows):
                lines.append({"file": fn, "index": i, **r, "dropped_at_64": len(r["prompt_ids"]) >= MAX_LENGTH})
        write_jsonl(out / "tokenized.jsonl", lines)

        # ORPO trainer on the same PEFT model
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        ocfg = ORPOConfig(output_dir=tmp, beta=BETA, max_length=MAX_LENGTH, report_to=[], bf16=False,
                          gradient_checkpointing=False, use_cpu=True, per_device_train_batch_size=4,
                          remove_unused_columns=False, logging_strategy="no", save_strategy="no")
        orpo = ORPOTrainer(model=model, args=ocfg, train_dataset=Dataset.from_list(records["text.jsonl"][:4]),
                           processing_class=tokenizer)
        assert orpo.model is model and orpo.beta == BETA and not orpo.is_encoder_decoder

        collator = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id, max_length=MAX_LENGTH,
                                             truncation_mode="keep_start")
        golden = {"beta": BETA, "max_length": MAX_LENGTH, "label_smoothing_robust": ROBUST_LS,
                  "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                               "peft": peft.__version__, "torch": torch.__version__},
                  "batches": {}}
        tensors = {}
        batches = {}
        for name, fn in (("text", "text.jsonl"), ("conv", "conv.jsonl")):
            assert not set(BATCH_RECORDS) & set(n_dropped[fn])
            batch = collator([prepared[fn][i] for i in BATCH_RECORDS])
            batches[name] = batch
            for k in ("input_ids", "attention_mask", "completion_mask"):
                tensors[f"{name}/{k}"] = batch[k].to(torch.int32).contiguous()
            entry = {"records": BATCH_RECORDS, "shape": list(batch["input_ids"].shape)}
            for lt in LOSS_TYPES:
                metrics, g = run_dpo(trainer, model, batch, lt)
                entry[lt] = metrics
                for k, v in g.items():
                    tensors[f"{name}/{lt}/{k}"] = v
            metrics, g = run_orpo(orpo, model, batch)
            entry["orpo"] = metrics
            for k, v in g.items():
                tensors[f"{name}/orpo/{k}"] = v
            golden["batches"][name] = entry
        model.zero_grad(set_to_none=True)

    (out / "golden.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    save_file(tensors, out / "golden.safetensors", metadata={
        "generator": f"tools/make_dpo_fixtures.py trl={trl.__version__} peft={peft.__version__} "
        f"transformers={transformers.__version__} torch={torch.__version__}; see README.md"})
    write_readme(out, golden, n_dropped)

    # Verification: reload model/ + adapter/ and recompute the sigmoid loss independently.
    base = load_base(model_dir)
    reloaded = PeftModel.from_pretrained(base, out / "adapter", is_trainable=True)
    for name, batch in batches.items():
        m, g = manual_sigmoid(reloaded, batch)
        want = golden["batches"][name]["sigmoid"]
        for k, v in m.items():
            assert abs(v - want[k]) <= 1e-5 * max(1.0, abs(want[k])), (name, k, v, want[k])
        for k, v in g.items():
            ref = tensors[f"{name}/sigmoid/{k}"]
            err = float((v - ref).abs().max())
            assert err <= 1e-5 * max(1e-3, float(ref.abs().max())) + 1e-9, (name, k, err)
        nz = sum(1 for k in g if tensors[f"{name}/sigmoid/{k}"].any())
        print(f"[{name}] shape={want and golden['batches'][name]['shape']} sigmoid loss={want['loss']:.8f} "
              f"(reloaded, plain forward: {m['loss']:.8f}) rewards/margins={want['rewards/margins']:.6g} "
              f"nonzero grads {nz}/{len(g)}")
        for lt in LOSS_TYPES + ["orpo"]:
            print(f"    {lt:8s} loss={golden['batches'][name][lt]['loss']:.8f}")
    print("dropped at max_length 64:", {k: v for k, v in n_dropped.items() if v})
    total = 0
    for p in sorted(out.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            print(f"    {str(p.relative_to(out)):40s} {p.stat().st_size:>10d} bytes")
    print(f"    {'total':40s} {total:>10d} bytes")


def write_readme(out: Path, golden: dict, n_dropped: dict):
    text = f"""# DPO / ORPO fixtures

Written by `tools/make_dpo_fixtures.py` (TRL {golden['versions']['trl']}, transformers
{golden['versions']['transformers']}, PEFT {golden['versions']['peft']}, torch {golden['versions']['torch']}); see
its docstring for every detail. Regenerate with `tools/.venv/bin/python tools/make_dpo_fixtures.py` (deterministic).

- `model/`: tiny Gemma4ForCausalLM (tiny_text's config, vocab 3072), random init (seed 0), fp32, with the bundled
  tokenizer (`tokenizer.json`, `tokenizer_config.json` copied from `data/tokenizer/`).
- `adapter/`: LoRA r=4, alpha=8 on q_proj/v_proj; `base_model_name_or_path` = "model" (relative to this directory).
- `text.jsonl`, `conv.jsonl` (40 records each), `implicit_conv.jsonl`, `implicit_text.jsonl` (10 each): preference
  records (standard, conversational, implicit-prompt conversational, implicit-prompt standard).
- `tokenized.jsonl`: per record `{{"file", "index", "prompt_ids", "chosen_ids", "rejected_ids", "dropped_at_64"}}`
  from TRL's `DPOTrainer._prepare_dataset` (max_length=None; the chat template is
  `tools/chat_templates/gemma4_training.jinja`; non-conversational chosen/rejected get "<eos>" appended).
  Dropped at max_length 64 (prompt_ids >= 64 tokens): {json.dumps({k: v for k, v in n_dropped.items() if v})}.
- `golden.json` / `golden.safetensors`: batches "text" and "conv" = records 0..3 of text.jsonl / conv.jsonl collated
  by `DataCollatorForPreference(max_length=64, keep_start)` (rows 0..3 chosen, 4..7 rejected, right padded with 0);
  for DPO loss types sigmoid, hinge, ipo, robust (beta 0.1, label smoothing 0.1 for robust) and ORPO (beta 0.1, on
  the same token ids): loss and TRL's logged metrics in golden.json, and the gradient of every LoRA parameter in
  golden.safetensors as `<batch>/<loss>/<adapter_model.safetensors key>`; `<batch>/input_ids`,
  `<batch>/attention_mask`, `<batch>/completion_mask` (int32). DPO's reference is the model with adapters disabled.
"""
    (out / "README.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
