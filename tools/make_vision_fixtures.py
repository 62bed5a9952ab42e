#!/usr/bin/env python3
"""Writes tests/fixtures/vision_tiny/: a tiny Gemma 4 multimodal model whose vision tower uses every
feature of transformers' Gemma4VisionModel (clipped linears with finite bounds, standardization,
grouped key/value heads, 2x2 pooling), and golden.safetensors with what transformers computes from
two images of different sizes, for tests/test_vision.cpp:

  pixel_values, image_position_ids   [2, 280, 48] / [2, 280, 2]: the processor's output (patch 4,
                                     pooling 2, budget 70) for tests/fixtures/images files
  patch_embeddings                   [2, 280, 16]: Gemma4VisionPatchEmbedder's output
  layer.<i>                          [2, 280, 16]: each encoder layer's output
  tower                              [soft tokens, 16]: Gemma4VisionModel's last_hidden_state
                                     (pooled, scaled, padding stripped, standardized)
  soft_tokens                        [soft tokens, 48]: get_image_features' pooler_output (the
                                     tower's output embedded into the text width), images in order

All in fp32 (the model is built and saved in fp32; eager attention). Rerun:
  tools/.venv/bin/python tools/make_vision_fixtures.py
"""
import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.numpy import save_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4VisionConfig
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import FIXTURES, text_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "vision_tiny")
IMAGES = ("rgb420_61x43.jpg", "tall_5x500.png")
VISION = dict(hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=200,
              pooling_kernel_size=2, use_clipped_linears=True, standardize=True)


def build():
    torch.manual_seed(777)
    tcfg = text_config(**FIXTURES["tiny_mm"]["text"])
    cfg = Gemma4Config(text_config=tcfg, vision_config=Gemma4VisionConfig(**VISION), audio_config=None,
                       tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    model = Gemma4ForConditionalGeneration(cfg).eval()
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(778)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("model.vision_tower.", "model.embed_vision.")):
                continue
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "position_embedding_table" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        # Finite clipping bounds that bind for some values, and a standardization that moves them.
        for name, b in model.named_buffers():
            if not name.startswith("model.vision_tower."):
                continue
            if name.endswith("input_min"):
                b.fill_(-1.5)
            elif name.endswith("input_max"):
                b.fill_(1.25)
            elif name.endswith("output_min"):
                b.fill_(-2.0)
            elif name.endswith("output_max"):
                b.fill_(1.75)
            elif name.endswith("std_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))
            elif name.endswith("std_scale"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


def main():
    model = build()
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    proc = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
    with open(os.path.join(OUT, "processor_config.json"), "w") as f:
        json.dump({"image_processor": proc.to_dict(), "processor_class": "Gemma4Processor"}, f, indent=2)
    imgs = [Image.open(os.path.join(ROOT, "tests", "fixtures", "images", n)) for n in IMAGES]
    batch = proc(images=imgs, return_tensors="pt")
    pixels, positions = batch["pixel_values"].float(), batch["image_position_ids"]

    captured = {}
    tower = model.model.vision_tower
    hooks = [tower.patch_embedder.register_forward_hook(
        lambda m, i, o: captured.__setitem__("patch_embeddings", o.detach().clone()))]
    for li, layer in enumerate(tower.encoder.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, li=li: captured.__setitem__(f"layer.{li}", (o[0] if isinstance(o, tuple) else o)
                                                        .detach().clone())))
    with torch.no_grad():
        out = model.model.get_image_features(pixels, positions)
    for h in hooks:
        h.remove()
    soft = torch.cat(list(out.pooler_output), 0)
    goldens = {
        "pixel_values": pixels.numpy().astype(np.float32),
        "image_position_ids": positions.numpy().astype(np.int64),
        "tower": out.last_hidden_state.numpy().astype(np.float32),
        "soft_tokens": soft.numpy().astype(np.float32),
    }
    for k, v in captured.items():
        goldens[k] = v.numpy().astype(np.float32)
    meta = {"images": ",".join(IMAGES),
            "soft_tokens_per_image": ",".join(str(int(n)) for n in batch["num_soft_tokens_per_image"])}
    save_file(goldens, os.path.join(OUT, "golden.safetensors"), metadata=meta)
    print(f"wrote {OUT}: soft tokens per image {meta['soft_tokens_per_image']}, "
          f"{sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT)) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
