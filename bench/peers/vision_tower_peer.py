#!/usr/bin/env python3
"""transformers' side of bench/vision_tower.sh: Gemma4Model.get_image_features (the vision tower and
the projection into the text width) on the images given, with the model's processor, timed per
image (median of --repeats after one warm-up). Prints one JSON object per (image, dtype): seconds,
soft tokens, and the max relative difference of its soft tokens from --compare's fp32 values if given.
  vision_tower_peer.py --model DIR --images a.jpg b.png [--dtypes float32,bfloat16] [--attn sdpa]
With --write-e2b DIR it instead writes a checkpoint whose vision tower has E2B's widths (transformers'
Gemma4VisionConfig defaults: 16 layers of 768, 12 heads, patch 16, pooling 3) and a one-layer text
model of E2B's width (1536), random weights, plus E2B's processor_config.json."""
import argparse
import json
import os
import statistics
import time

import torch
from PIL import Image
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil


def write_e2b(out):
    torch.manual_seed(0)
    text = Gemma4TextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=1536,
                            intermediate_size=256, num_hidden_layers=1, layer_types=["full_attention"],
                            num_attention_heads=2, num_key_value_heads=1, head_dim=64, global_head_dim=64,
                            hidden_size_per_layer_input=8, num_kv_shared_layers=0)
    cfg = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig(), audio_config=None)
    model = Gemma4ForConditionalGeneration(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("model.vision_tower.", "model.embed_vision.")) and p.dim() >= 2:
                p.normal_(0, 0.02)
    model.save_pretrained(out, safe_serialization=True)
    proc = Gemma4ImageProcessorPil()
    with open(os.path.join(out, "processor_config.json"), "w") as f:
        json.dump({"image_processor": proc.to_dict(), "processor_class": "Gemma4Processor"}, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--images", nargs="*", default=[])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--write-e2b")
    a = ap.parse_args()
    if a.write_e2b:
        write_e2b(a.write_e2b)
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    model = Gemma4ForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32,
                                                           attn_implementation=a.attn).eval()
    with open(os.path.join(a.model, "processor_config.json")) as f:
        proc = Gemma4ImageProcessorPil(**{k: v for k, v in json.load(f)["image_processor"].items()
                                          if k in ("patch_size", "max_soft_tokens", "pooling_kernel_size")})
    for path in a.images:
        batch = proc(images=[Image.open(path)], return_tensors="pt")
        for dtype in a.dtypes.split(","):
            times = []
            for r in range(a.repeats + 1):
                t0 = time.perf_counter()
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                    out = model.model.get_image_features(batch["pixel_values"], batch["image_position_ids"])
                if r:
                    times.append(time.perf_counter() - t0)
            soft = out.pooler_output[0]
            print(json.dumps({"image": os.path.basename(path), "dtype": dtype, "attn": a.attn,
                              "seconds": statistics.median(times), "soft_tokens": int(soft.shape[0]),
                              "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
