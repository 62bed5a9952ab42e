#!/usr/bin/env python3
"""Writes tests/fixtures/vision_chat/: a tiny Gemma 4 multimodal model whose tokenizer holds Gemma 4's
image markers, an image chat data set in the layouts people train on, and the loss transformers
computes on it, for tests/test_vision_data.cpp and `slicetrain evaluate`:

  model/       config.json (image_token_id, boi_token_id, eoi_token_id = the tokenizer's ids of
               <|image|>, <|image>, <image|>), model.safetensors (text model as tools/make_fixtures.py's
               tiny_mm perturbed, vision tower as tools/make_vision_fixtures.py's), processor_config.json
               (patch 4, pooling 2, budget 70), tokenizer.json + tokenizer_config.json (Gemma-style BPE)
  data/train.parquet  TRL's vision layout as `datasets` writes it: `messages` (user content a list of
               {"type": "image"} and {"type": "text"} parts) and `images` (a list of datasets.Image:
               Parquet structs of the encoded bytes and the path)
  data/train.jsonl    the same records with `images` as paths relative to the file
  golden.json  per record the tokens, the soft tokens per image and the summed loss; the set's loss;
               12 greedy tokens after an image and a question (generate); the set's loss through
               peft_adapter/
  peft_adapter/  a LoRA adapter PEFT made and saved (all-linear, so the vision tower's linears and the
               projection too; r 4, alpha 8, every A and B drawn at random)

Each record goes through transformers as Gemma4Processor takes it, step by step: Google's Gemma 4
chat template (TRL's copy, gemma4_v5.jinja) renders the conversation with `<|image|>` per image part;
each `<|image|>` becomes `<|image>` + `<|image|>` x (the image processor's soft-token count) + `<image|>`
(Gemma4Processor.replace_image_token); the tokenizer tokenizes that; Gemma4ImageProcessorPil makes the
pixel values; Gemma4ForConditionalGeneration computes the logits. The loss covers every token but the
soft-token placeholders (slicetrain's --train-on all: a placeholder is never a target).
Gemma4Processor itself is not instantiated: it also needs an audio feature extractor and a video
processor (torchvision), which these files do not use. Rerun:
  tools/.venv/bin/python tools/make_vision_chat_fixtures.py
"""
import json
import os
import platform
import shutil
import sys

if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")  # as make_fixtures.py

import datasets
import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gemma_style_tokenizer import default_config, train_and_save  # noqa: E402
import make_vision_fixtures  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "vision_chat")
IMAGES = os.path.join(ROOT, "tests", "fixtures", "images")
TEMPLATE = os.path.join(os.path.dirname(__import__("trl").__file__), "chat_templates", "gemma4_v5.jinja")
BOI, IMAGE, EOI = "<|image>", "<|image|>", "<image|>"

RECORDS = [
    ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "A small photo, mostly red."}]}],
     ["rgb420_61x43.jpg"]),
    ([{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                   {"type": "text", "text": " with "}, {"type": "image"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "The first is tall, the second is wide."}]}],
     ["tall_5x500.png", "lossy_57x39.webp"]),
    ([{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Hello there!"}]}],
     []),
    ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  Colors?  "}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Gray."}]},
      {"role": "user", "content": [{"type": "text", "text": "And this one?"}, {"type": "image"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Green and blue."}]}],
     ["gray_33x47.png", "palette_45x31.png"]),
]


def make_tokenizer(out_dir):
    texts = []
    for messages, _ in RECORDS:
        for m in messages:
            texts += [p["text"] for p in m["content"] if p["type"] == "text"]
    texts += ["the quick brown fox jumps over the lazy dog", "picture photo image colors small wide tall"] * 3
    extra = [AddedToken(t, special=True, normalized=False) for t in (BOI, IMAGE, EOI)]
    config = default_config()
    config["extra_special_tokens"] = {"boi_token": BOI, "image_token": IMAGE, "eoi_token": EOI}
    train_and_save(texts, out_dir, vocab_size=300, word_level_merges=True, extra_added=extra, config=config)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def set_loss(model, tok, template, proc, ids, records_in=None):
    """Each record (RECORDS' (messages, image names under IMAGES or absolute paths)) through the
    template, the processor's expansion and the model: per record the tokens, soft tokens per
    image, summed loss and targets; the set's summed loss and targets."""
    records, total, count = [], 0.0, 0
    for messages, names in (RECORDS if records_in is None else records_in):
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
        pixels = positions = None
        counts = []
        if names:
            batch = proc(images=[Image.open(os.path.join(IMAGES, n)) for n in names], return_tensors="pt")
            pixels, positions = batch["pixel_values"].float(), batch["image_position_ids"]
            counts = [int(n) for n in batch["num_soft_tokens_per_image"]]
            pieces = text.split(IMAGE)
            assert len(pieces) == len(names) + 1, text
            text = pieces[0] + "".join(BOI + IMAGE * n + EOI + p for n, p in zip(counts, pieces[1:]))
        input_ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        labels = input_ids.clone()
        labels[input_ids == ids[IMAGE]] = -100
        with torch.no_grad():
            out = model(input_ids=input_ids, pixel_values=pixels, image_position_ids=positions, use_cache=False)
        logits = out.logits[0, :-1].double()
        target = labels[0, 1:]
        keep = target != -100
        loss = torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
        records.append({"input_ids": input_ids[0].tolist(), "soft_tokens": counts,
                        "loss_sum": float(loss), "targets": int(keep.sum())})
        total += float(loss)
        count += int(keep.sum())
    return records, total, count


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    model_dir = os.path.join(OUT, "model")
    os.makedirs(os.path.join(OUT, "data"))
    tok = make_tokenizer(model_dir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (BOI, IMAGE, EOI)}
    assert all(i >= 256 for i in ids.values()), ids

    model = make_vision_fixtures.build()
    model.config.boi_token_id, model.config.image_token_id, model.config.eoi_token_id = ids[BOI], ids[IMAGE], ids[EOI]
    assert len(tok) <= model.config.text_config.vocab_size, (len(tok), model.config.text_config.vocab_size)
    model.save_pretrained(model_dir, safe_serialization=True)
    proc = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
    with open(os.path.join(model_dir, "processor_config.json"), "w") as f:
        json.dump({"image_processor": proc.to_dict(), "processor_class": "Gemma4Processor"}, f, indent=2)
    template = open(TEMPLATE).read()

    model.eval()
    golden = {"records": [], "template": "trl/chat_templates/gemma4_v5.jinja",
              "generator": f"tools/make_vision_chat_fixtures.py transformers={transformers.__version__} "
                           f"torch={torch.__version__}"}
    records, total, count = set_loss(model, tok, template, proc, ids)
    golden["records"] = records
    golden["loss"] = total / count
    golden["targets"] = count

    # A PEFT adapter on every linear (all-linear: the text model's, the vision tower's inner
    # `.linear`s, its input_proj and the projection), saved by PEFT, and the set's loss through it.
    from peft import LoraConfig, get_peft_model
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    g = torch.Generator().manual_seed(782)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_((0.3 if "lora_B" in name else 1.0) * 0.2 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(os.path.join(OUT, "peft_adapter"))
    os.remove(os.path.join(OUT, "peft_adapter", "README.md"))  # PEFT's model card template
    peft.eval()
    _, peft_total, peft_count = set_loss(peft, tok, template, proc, ids)
    tower = sum(1 for n, _ in peft.named_parameters() if "lora_A" in n and "vision" in n)
    golden["peft_adapter"] = {"loss": peft_total / peft_count, "targets": peft_count,
                              "tower_modules": tower, "r": 4, "lora_alpha": 8}
    model = peft.unload()

    # Greedy generation after an image and a question (the generation prompt of the template).
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    batch = proc(images=[Image.open(os.path.join(IMAGES, "rgb420_61x43.jpg"))], return_tensors="pt")
    n = int(batch["num_soft_tokens_per_image"][0])
    text = text.replace(IMAGE, BOI + IMAGE * n + EOI)
    prompt = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=prompt, pixel_values=batch["pixel_values"].float(),
                             image_position_ids=batch["image_position_ids"], max_new_tokens=12,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    golden["generate"] = {"prompt": "Describe the image.", "image": "rgb420_61x43.jpg",
                          "prompt_ids": prompt[0].tolist(), "new_ids": out[0, prompt.shape[1]:].tolist()}
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")

    # The data set: Parquet as `datasets` writes an Image feature (bytes embedded), JSON Lines with paths.
    def encoded(name):  # as datasets stores an image it embedded (push_to_hub, save from bytes)
        with open(os.path.join(IMAGES, name), "rb") as f:
            return {"bytes": f.read(), "path": name}

    rows = {"messages": [m for m, _ in RECORDS], "images": [[encoded(n) for n in names] for _, names in RECORDS]}
    ds = datasets.Dataset.from_dict(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    ds.to_parquet(os.path.join(OUT, "data", "train.parquet"))
    with open(os.path.join(OUT, "data", "train.jsonl"), "w") as f:
        for messages, names in RECORDS:
            f.write(json.dumps({"messages": messages, "images": [f"../../images/{n}" for n in names]}) + "\n")
    print(f"wrote {OUT}: {len(RECORDS)} records, {count} targets, loss {golden['loss']:.6f}")


if __name__ == "__main__":
    main()
