#!/usr/bin/env python3
"""Writes tests/fixtures/images/: small JPEG, PNG and WebP files of odd sizes and colour layouts, and
goldens.safetensors with what transformers makes of them, for tests/test_images.cpp.

The reference is transformers' Gemma 4 image processor on its PIL backend
(`Gemma4ImageProcessorPil`, the one transformers runs where torchvision is not installed): PIL decodes
the file, `convert_to_rgb` composites transparency over white, PIL's bicubic resize brings the
image to the soft-token budget, `rescale` multiplies by 1/255, the patches are laid out
row-major. Goldens per image:
  decoded/<name>            uint8 [H, W, 3]: the image as the processor sees it before resizing
  resized/<name>/70         uint8 [patches, 3 * p * p]: the real patches (padding is left out:
                            zeros, position -1) for the small processor (patch_size 4) times 255,
                            which gives back the resized image's bytes exactly
  positions/<name>/70       int64 [patches, 2]
and in the metadata, for the small processor and for the E2B one (patch_size 16), each budget's
resized size, soft-token count and the SHA-256 of the real patches' float32 bytes.

Rerun: tools/.venv/bin/python tools/make_image_fixtures.py (tools/setup_venv.sh makes the venv).
"""
import hashlib
import io
import json
import os
import struct
import zlib

import numpy as np
from PIL import Image
from safetensors.numpy import save_file
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.image_transforms import convert_to_rgb

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "images")
BUDGETS = (70, 140, 280, 560, 1120)
SMALL = dict(patch_size=4, pooling_kernel_size=3)  # the tiny model's processor
E2B = dict(patch_size=16, pooling_kernel_size=3)  # google/gemma-4-E2B-it's processor_config.json


def picture(h, w, seed):
    """Gradients, a sharp-edged disc and noise: smooth areas and edges both exercise the filter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 127 + 120 * np.sin(x / 3.0 + y / 5.0)
    disc = (x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(h, w) / 3) ** 2
    img = np.stack([r, g, b], -1)
    img[disc] = [250, 30, 200]
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png16(path, arr, color_type):
    """A 16-bit PNG (PIL writes 16-bit grayscale only): big-endian samples, filter 0 per row."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\0" + arr[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) +
                chunk(b"IEND", b""))


def write_images():
    os.makedirs(OUT, exist_ok=True)
    made = []

    def save(name, img, **kw):
        img.save(os.path.join(OUT, name), **kw)
        made.append(name)

    rgb = picture(23, 37, 1)
    save("rgb_37x23.png", Image.fromarray(rgb))
    alpha = np.tile(np.linspace(0, 255, 41).astype(np.uint8), (29, 1))
    alpha[:3] = 0
    alpha[-3:] = 255
    save("rgba_41x29.png", Image.fromarray(np.dstack([picture(29, 41, 2), alpha]), "RGBA"))
    save("gray_33x47.png", Image.fromarray(picture(47, 33, 3)[..., 1]))
    gray_alpha = np.dstack([picture(20, 30, 4)[..., 0], np.tile(np.arange(0, 240, 8, dtype=np.uint8),
                                                                (20, 1))])
    save("graya_30x20.png", Image.fromarray(gray_alpha, "LA"))
    pal = Image.fromarray(picture(31, 45, 5)).quantize(colors=16)
    save("palette_45x31.png", pal, transparency=3)
    save("palette_opaque_45x31.png", Image.fromarray(picture(31, 45, 5)).quantize(colors=64))
    png16(os.path.join(OUT, "rgb16_29x37.png"),
          picture(37, 29, 6).astype(np.uint16) * 257 + np.arange(29, dtype=np.uint16)[None, :, None],
          2)
    made.append("rgb16_29x37.png")
    # PIL holds 16-bit gray as I;16 and converts it to RGB by clipping at 255, not scaling.
    save("gray16_31x26.png", Image.fromarray((picture(26, 31, 17)[..., 0].astype(np.uint16) * 2)))
    save("bw_1bit_35x22.png", Image.fromarray(picture(22, 35, 18)[..., 1] > 128))
    # Not 3 (or 1) rows or columns: transformers takes such an array's channel axis to be first.
    save("wide_500x5.png", Image.fromarray(picture(5, 500, 7)))
    save("tall_5x500.png", Image.fromarray(picture(500, 5, 8)))
    save("big_170x130.jpg", Image.fromarray(picture(130, 170, 9)), quality=90)  # shrunk by both

    save("rgb420_61x43.jpg", Image.fromarray(picture(43, 61, 10)), quality=90)
    save("rgb444_50x38.jpg", Image.fromarray(picture(38, 50, 11)), quality=95, subsampling=0)
    save("progressive_47x35.jpg", Image.fromarray(picture(35, 47, 12)), quality=85,
         progressive=True)
    save("gray_39x27.jpg", Image.fromarray(picture(27, 39, 13)[..., 2]), quality=90)

    save("lossy_57x39.webp", Image.fromarray(picture(39, 57, 14)), quality=80)
    save("lossless_35x33.webp", Image.fromarray(picture(33, 35, 15)), lossless=True)
    a = np.tile(np.linspace(0, 255, 43).astype(np.uint8), (31, 1))
    save("alpha_43x31.webp", Image.fromarray(np.dstack([picture(31, 43, 16), a]), "RGBA"),
         quality=80)
    return made


def main():
    names = write_images()
    tensors, meta = {}, {}
    procs = {(c, b): Gemma4ImageProcessorPil(max_soft_tokens=b, **cfg)
             for c, cfg in (("small", SMALL), ("e2b", E2B)) for b in BUDGETS}
    for name in names:
        img = Image.open(os.path.join(OUT, name))
        tensors[f"decoded/{name}"] = np.ascontiguousarray(convert_to_rgb(img, return_numpy=True))
        for (which, budget), proc in procs.items():
            out = proc(images=img, return_tensors="np")
            soft = int(out["num_soft_tokens_per_image"][0])
            patch = proc.patch_size
            real = soft * proc.pooling_kernel_size ** 2
            pixels = out["pixel_values"][0][:real].astype(np.float32)
            pos = out["image_position_ids"][0][:real].astype(np.int64)
            assert (out["pixel_values"][0][real:] == 0).all() and (out["image_position_ids"][0][real:] == -1).all()
            cols = int(pos[:, 0].max()) + 1
            rows = int(pos[:, 1].max()) + 1
            meta[f"{which}/{name}/{budget}"] = json.dumps({
                "height": rows * patch, "width": cols * patch, "soft_tokens": soft,
                "sha256": hashlib.sha256(pixels.tobytes()).hexdigest()})
            if which == "small" and budget == 70:
                resized = np.rint(pixels.astype(np.float64) * 255).astype(np.uint8)
                assert ((resized.astype(np.float64) * (1 / 255)).astype(np.float32) == pixels).all()
                tensors[f"resized/{name}/{budget}"] = resized
                tensors[f"positions/{name}/{budget}"] = pos
    meta["budgets"] = json.dumps(BUDGETS)
    meta["images"] = json.dumps(names)
    save_file(tensors, os.path.join(OUT, "goldens.safetensors"), metadata=meta)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(names)} images and goldens.safetensors to {OUT} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
