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

and golden_text.safetensors with what Gemma4ForConditionalGeneration computes when those soft
tokens stand in the text sequence (first with the tower frozen: the soft tokens are a leaf the test
feeds in; then trained, for the tower's gradients):

  input_ids, attention_mask, labels  [2, 80]: row 0 text, an image (63 image tokens), text; row 1
                                     an image (70), text, right padding; image positions are
                                     labelled -100. boi/eoi are stand-ins inside the tiny vocabulary
  logits, loss, embeds, hidden.<i>   as tools/make_fixtures.py writes them
  grad.<text parameter>              every text parameter's gradient of the mean loss
  grad.soft_tokens                   [133, 48] the gradient that reaches the soft tokens
  grad.model.vision_tower.*,         every tower and projection parameter's gradient of the same
  grad.model.embed_vision.*          loss with the tower trained (a second pass from pixel_values)

and golden_lora.safetensors, LoRA on the tower as PEFT places it (get_peft_model with
target_modules LORA_TARGETS, r 2, alpha 4; B drawn non-zero so the adapters change the output):

  lora.<module>.lora_A.weight, ...   the adapters (PEFT's names without base_model.model./default)
  soft_tokens                        [133, 48] get_image_features' output with the adapters
  d_soft                             [133, 48] a fixed random tensor R; the loss is sum(soft * R)
  grad.<module>.lora_A.weight, ...   every adapter's gradient of that loss (the base frozen)

The text weights are perturbed as make_fixtures.py does, and the pad rows of both embedding tables
are not zero, so that the test sees which rows the image positions read.

All in fp32 (the model is built and saved in fp32; eager attention); ATEN_CPU_CAPABILITY=avx2 is pinned
on x86-64 as in make_fixtures.py; the products still go through the machine's BLAS, so a rerun on another CPU
moves the tower's values by up to ~4e-7 of their scale (an AVX-512 Xeon against the Zen 3 that wrote the
committed golden.safetensors), far inside the tests' bars. Rerun:
  tools/.venv/bin/python tools/make_vision_fixtures.py
"""
import json
import os
import platform
import sys

if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")  # as make_fixtures.py: reproducible reductions

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.numpy import save_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4VisionConfig
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import EMBED_STD, FIXTURES, LINEAR_STD, NORM_STD, text_config  # noqa: E402

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
        # The text model: perturbed as make_fixtures.py perturbs it, pad rows included.
        g = torch.Generator().manual_seed(779)
        text = model.model.language_model
        for name, p in model.named_parameters():
            if not name.startswith("model.language_model."):
                continue
            if name.endswith("norm.weight"):
                p.copy_(1 + NORM_STD * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(EMBED_STD * torch.randn(p.shape, generator=g))
            else:
                p.copy_(LINEAR_STD * torch.randn(p.shape, generator=g))
        for name, b in text.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


BOI, EOI, T = 5, 6, 80  # stand-ins for the begin and end markers inside the tiny vocabulary


def text_golden(model, pixels, positions, counts):
    """The soft tokens placed in a batch of two rows; logits, hidden states and every gradient."""
    cfg = model.config
    image = cfg.image_token_id
    g = torch.Generator().manual_seed(780)
    rows = []
    for i, n in enumerate(counts):
        words = lambda k: torch.randint(7, cfg.text_config.vocab_size, (k,), generator=g).tolist()
        if i == 0:
            row = [2] + words(3) + [BOI] + [image] * n + [EOI]
            row += words(T - len(row))
        else:
            row = [2, BOI] + [image] * n + [EOI] + words(4)
            row += [0] * (T - len(row))
        rows.append(row)
    ids = torch.tensor(rows, dtype=torch.long)
    mask = (torch.arange(T)[None, :] < torch.tensor([T, 2 + counts[1] + 1 + 4])[:, None]).long()
    labels = ids.clone()
    labels[(ids == image) | (mask == 0)] = -100

    model.train()
    with torch.no_grad():
        feats = torch.cat(list(model.model.get_image_features(pixels, positions).pooler_output), 0)
    soft = feats.clone().requires_grad_(True)
    text = model.model.language_model
    outs = {}
    hooks = [layer.register_forward_hook(
        lambda m, i, o, li=li: outs.__setitem__(li, (o[0] if isinstance(o, tuple) else o).detach().clone()))
        for li, layer in enumerate(text.layers)]
    hooks.append(text.layers[0].register_forward_pre_hook(
        lambda m, a, kw: outs.__setitem__("embeds", (a[0] if a else kw["hidden_states"]).detach().clone()),
        with_kwargs=True))
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False,
                mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=(soft,))})
    for h in hooks:
        h.remove()
    out.loss.backward()
    golden = {
        "input_ids": ids.int(), "attention_mask": mask.int(), "labels": labels.int(),
        "logits": out.logits.detach().float(), "loss": out.loss.detach().float().reshape(1),
        "embeds": outs["embeds"], "soft_tokens": soft.detach(), "grad.soft_tokens": soft.grad,
    }
    for i in range(cfg.text_config.num_hidden_layers):
        golden[f"hidden.{i}"] = outs[i]
    for name, p in model.named_parameters():
        if name.startswith("model.language_model."):
            assert p.grad is not None, name
            golden[f"grad.{name}"] = p.grad.detach().float()
        else:
            assert p.grad is None, name  # the tower is frozen: the soft tokens are a leaf

    # The tower trained: the same batch from pixel_values, every tower parameter's gradient.
    model.zero_grad(set_to_none=True)
    out2 = model(input_ids=ids, attention_mask=mask, labels=labels, pixel_values=pixels,
                 image_position_ids=positions, use_cache=False)
    out2.loss.backward()
    assert abs(float(out2.loss) - float(out.loss)) < 1e-5, (float(out2.loss), float(out.loss))
    for name, p in model.named_parameters():
        if name.startswith(("model.vision_tower.", "model.embed_vision.")):
            assert p.grad is not None, name
            golden[f"grad.{name}"] = p.grad.detach().float()
    return {k: v.contiguous().numpy() for k, v in golden.items()}, float(out.loss)


LORA_TARGETS = ["q_proj.linear", "down_proj.linear", "input_proj", "embedding_projection"]


def lora_golden(model, pixels, positions):
    """LoRA on some of the tower's linears through PEFT: the soft tokens and the adapters' gradients."""
    from peft import LoraConfig, get_peft_model
    model.eval()
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=LORA_TARGETS, lora_dropout=0.0))
    g = torch.Generator().manual_seed(781)
    adapters = {}
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" not in name:
                continue
            assert "vision" in name, name  # the targets select tower linears only
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
            adapters[name.removeprefix("base_model.model.").replace(".default", "")] = p
    soft = torch.cat(list(peft.base_model.model.model.get_image_features(pixels, positions).pooler_output), 0)
    r = torch.randn(soft.shape, generator=g)
    (soft * r).sum().backward()
    golden = {"soft_tokens": soft.detach(), "d_soft": r}
    for name, p in adapters.items():
        golden[f"lora.{name}"] = p.detach().clone()
        golden[f"grad.{name}"] = p.grad.detach().clone()
    peft.unload()  # the base model as it was
    return {k: v.float().contiguous().numpy() for k, v in golden.items()}, len(adapters) // 2


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
    text, loss = text_golden(model, pixels, positions, [int(n) for n in batch["num_soft_tokens_per_image"]])
    save_file(text, os.path.join(OUT, "golden_text.safetensors"),
              metadata={"generator": f"tools/make_vision_fixtures.py transformers={transformers.__version__} "
                                     f"torch={torch.__version__}"})
    print(f"text with soft tokens: loss {loss:.6f}")
    lora, modules = lora_golden(model, pixels, positions)
    save_file(lora, os.path.join(OUT, "golden_lora.safetensors"),
              metadata={"targets": ",".join(LORA_TARGETS), "rank": "2", "alpha": "4"})
    print(f"LoRA on {modules} tower linears")
    print(f"wrote {OUT}: soft tokens per image {meta['soft_tokens_per_image']}, "
          f"{sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT)) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
