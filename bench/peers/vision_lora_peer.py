#!/usr/bin/env python3
"""transformers + PEFT's side of bench/vision_lora.sh: image SFT with LoRA on every linear
(all-linear: the text model's, the vision tower's and the projection, as PEFT's all-linear reaches
them) on Gemma4ForConditionalGeneration, one record a step (batch 1), AdamW, each step from the
record's chat messages through Google's template (TRL's copy), the image processor and the model, as
tools/make_vision_chat_fixtures.py computes a record's loss (every token but the placeholders a
target). Prints one JSON line per dtype: steps timed (after one warm-up step), samples/s.

  vision_lora_peer.py --write DIR --widths tiny|e2b [--records 8] [--budget 70]
      writes DIR/model (the vision_chat fixture's tokenizer; a tower of the tiny fixture's widths or
      of E2B's: 16 layers of 768, patch 16, pooling 3; a small text model; random weights) and
      DIR/train.parquet (records of one 640x480 image and a question, `datasets`' Image structs)
  vision_lora_peer.py --model DIR/model --data DIR/train.parquet [--dtypes float32,bfloat16]
      [--attn sdpa] [--rank 16] [--threads N]
"""
import argparse
import io
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_vision_chat_fixtures as fx  # noqa: E402
import make_vision_fixtures  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import (Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig,  # noqa: E402
                          Gemma4VisionConfig, PreTrainedTokenizerFast)
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil  # noqa: E402


def write(out, widths, records, budget):
    model_dir = os.path.join(out, "model")
    os.makedirs(model_dir, exist_ok=True)
    src = os.path.join(fx.OUT, "model")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), model_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    torch.manual_seed(0)
    if widths == "tiny":
        vision = Gemma4VisionConfig(**make_vision_fixtures.VISION)
        text = make_vision_fixtures.text_config(**make_vision_fixtures.FIXTURES["tiny_mm"]["text"])
        patch, pooling = 4, 2
    else:
        vision = Gemma4VisionConfig()
        text = Gemma4TextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=1536,
                                intermediate_size=1024, num_hidden_layers=2,
                                layer_types=["sliding_attention", "full_attention"],
                                num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                global_head_dim=512, hidden_size_per_layer_input=256, num_kv_shared_layers=0)
        patch, pooling = vision.patch_size, vision.pooling_kernel_size
    cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (fx.BOI, fx.IMAGE, fx.EOI)}
    cfg.boi_token_id, cfg.image_token_id, cfg.eoi_token_id = ids[fx.BOI], ids[fx.IMAGE], ids[fx.EOI]
    assert len(tok) <= text.vocab_size
    model = Gemma4ForConditionalGeneration(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.endswith("norm.weight"):
                p.normal_(0, 0.02)
    model.save_pretrained(model_dir, safe_serialization=True)
    proc = Gemma4ImageProcessorPil(patch_size=patch, pooling_kernel_size=pooling, max_soft_tokens=budget)
    with open(os.path.join(model_dir, "processor_config.json"), "w") as f:
        json.dump({"image_processor": proc.to_dict(), "processor_class": "Gemma4Processor"}, f, indent=2)
    import datasets
    rng = np.random.default_rng(0)
    rows = {"messages": [], "images": []}
    for i in range(records):
        y, x = np.mgrid[0:480, 0:640]
        img = np.stack([(x + 7 * i) % 256, (y * 3 + i) % 256, rng.integers(0, 256, x.shape)], -1).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        rows["messages"].append([
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"Stripes, pattern {i % 5}."}]}])
        rows["images"].append([{"bytes": buf.getvalue(), "path": f"img{i}.png"}])
    ds = datasets.Dataset.from_dict(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    ds.to_parquet(os.path.join(out, "train.parquet"))


def train(model_dir, data, dtypes, attn, rank, steps_cap):
    import datasets
    from peft import LoraConfig, get_peft_model
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (fx.BOI, fx.IMAGE, fx.EOI)}
    with open(os.path.join(model_dir, "processor_config.json")) as f:
        p = json.load(f)["image_processor"]
    proc = Gemma4ImageProcessorPil(patch_size=p["patch_size"], pooling_kernel_size=p["pooling_kernel_size"],
                                   max_soft_tokens=p["max_soft_tokens"])
    template = open(fx.TEMPLATE).read()
    ds = datasets.Dataset.from_parquet(data)
    records = [(r["messages"], r["images"]) for r in ds]
    if steps_cap:
        records = records[:steps_cap + 1]
    for dtype in dtypes:
        model = Gemma4ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation=attn)
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                                 lora_dropout=0.0))
        model.train()
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
        times = []
        for messages, images in records:
            t0 = time.perf_counter()
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
            batch = proc(images=images, return_tensors="pt")
            counts = [int(n) for n in batch["num_soft_tokens_per_image"]]
            pieces = text.split(fx.IMAGE)
            text = pieces[0] + "".join(fx.BOI + fx.IMAGE * n + fx.EOI + q for n, q in zip(counts, pieces[1:]))
            input_ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            labels = input_ids.clone()
            labels[input_ids == ids[fx.IMAGE]] = -100
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                out = model(input_ids=input_ids, pixel_values=batch["pixel_values"].float(),
                            image_position_ids=batch["image_position_ids"], labels=labels, use_cache=False)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        timed = times[1:]  # the first step warms up
        print(json.dumps({"dtype": dtype, "attn": attn, "steps": len(timed), "seconds_per_step": sum(timed) / len(timed),
                          "samples_per_s": len(timed) / sum(timed), "loss_last": float(out.loss)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write")
    ap.add_argument("--widths", default="tiny", choices=["tiny", "e2b"])
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--budget", type=int, default=70)
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=0, help="at most this many timed steps (0: every record but the first)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.write:
        write(a.write, a.widths, a.records, a.budget)
    else:
        train(a.model, a.data, a.dtypes.split(","), a.attn, a.rank, a.steps)


if __name__ == "__main__":
    main()
