#!/usr/bin/env python3
"""Write a randomly initialised, Gemma 4 E2B-shaped checkpoint with transformers' save_pretrained.

Usage (from the repository root):
    tools/.venv/bin/python tools/make_e2b_checkpoint.py --out DIR [--layers N] [--widths e2b|small] [--vocab V]
        [--dtype bfloat16|float32]
        [--seed S] [--multimodal] [--max-shard-size SIZE] [--kv-shared K]

Default: text-only Gemma4ForCausalLM (tensor names `model.*`), all 35 layers, bfloat16 (~9.3 GB), written with
transformers' default max_shard_size (5.x: "50GB", so the full model is ONE model.safetensors; pass e.g.
--max-shard-size 2GB for a sharded export with model.safetensors.index.json). Only config.json,
generation_config.json and the weight file(s) are written: no tokenizer.

Shapes are E2B's (docs: /work/shared/reference/gemma4.md section 2): vocab 262144, hidden 1536, 8 query heads,
1 kv head, head_dim 256 (sliding) / 512 (full), intermediate 6144 (12288 in kv-shared layers: use_double_wide_mlp),
PLE dim 256 (vocab_size_per_layer_input 262144), sliding window 512, layer types (S S S S F) x 7, 20 kv-shared layers,
final_logit_softcapping 30, tied embeddings.

--layers N keeps the widths and takes the first N entries of the E2B layer-type pattern, with the last layer made
full attention (as Gemma4TextConfig requires). The number of kv-shared layers is round(20 * N / 35), lowered until
the non-shared prefix holds a layer of every type (transformers' requirement), i.e. 0 for N <= 5; --kv-shared
overrides it. The PLE table is vocab x (N * 256), so it shrinks with N too.

--widths small takes the widths of slicetrain's gemma4-small preset instead (hidden 512, intermediate 2048, 8 query
and 2 kv heads, head_dim 64 / 128, PLE dim 64, sliding window 128, layer types (S S S F) x 2, 3 kv-shared layers for
8 layers) with the real 262144-token vocabulary (--vocab to change it): the seed's vocabulary on a small model.

--multimodal writes Gemma4ForConditionalGeneration instead (text under `model.language_model.*`, plus
`model.vision_tower.*`, `model.embed_vision.*`, `model.audio_tower.*`, `model.embed_audio.*` with the
Gemma4VisionConfig / Gemma4AudioConfig class defaults, which transformers documents as google/gemma-4-e2b-it's).

Weights: transformers' own init (PreTrainedModel.initialize_weights) under torch.manual_seed(seed): Linear / Embedding
N(0, 0.02) except the pad rows (0) of both embedding tables, norms and layer_scalar 1. The model is built on the meta device in --dtype and then materialised on the
CPU, so the full bf16 model needs its 9.3 GB plus ~1 GB (torch/transformers themselves); float32 needs twice that.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import torch

import transformers
from transformers import (
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)

S, F = "sliding_attention", "full_attention"
E2B_LAYERS = 35
E2B_KV_SHARED = 20
E2B_LAYER_TYPES = ([S] * 4 + [F]) * 7

E2B_TEXT = dict(
    vocab_size=262144,
    vocab_size_per_layer_input=262144,
    hidden_size=1536,
    hidden_size_per_layer_input=256,
    intermediate_size=6144,
    use_double_wide_mlp=True,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=None,
    attention_k_eq_v=False,
    attention_bias=False,
    attention_dropout=0.0,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    tie_word_embeddings=True,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    sliding_window=512,
    final_logit_softcapping=30.0,
    use_bidirectional_attention=None,
    enable_moe_block=False,
    initializer_range=0.02,
)


SMALL_TEXT = dict(hidden_size=512, hidden_size_per_layer_input=64, intermediate_size=2048, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, global_head_dim=128, sliding_window=128,
                  max_position_embeddings=8192)
SMALL_LAYER_TYPES = [S, S, S, F] * 2


def layer_types_for(n: int, small: bool = False) -> list[str]:
    pattern = SMALL_LAYER_TYPES * ((n + 7) // 8) if small else E2B_LAYER_TYPES
    types = list(pattern[:n])
    types[-1] = F
    return types


def kv_shared_for(n: int, types: list[str]) -> int:
    k = round(E2B_KV_SHARED * n / E2B_LAYERS)
    while k > 0 and set(types[: n - k]) != set(types):
        k -= 1
    return k


def text_config(n_layers: int, kv_shared: int | None, small: bool = False, vocab: int = 262144) -> Gemma4TextConfig:
    types = layer_types_for(n_layers, small)
    if kv_shared is None and small:
        kv_shared = 3 if n_layers == 8 else 0
    k = kv_shared_for(n_layers, types) if kv_shared is None else kv_shared
    if not 0 <= k < n_layers or (k and set(types[: n_layers - k]) != set(types)):
        raise SystemExit(f"--kv-shared {k}: the first {n_layers - k} layers must contain every layer type {sorted(set(types))}")
    fields = dict(E2B_TEXT, **(SMALL_TEXT if small else {}), vocab_size=vocab, vocab_size_per_layer_input=vocab)
    cfg = Gemma4TextConfig(**fields, num_hidden_layers=n_layers, layer_types=types, num_kv_shared_layers=k)
    _ = cfg.kv_sharing_modes  # raises if inconsistent
    return cfg


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=None, help="default: 35 (e2b widths), 8 (small widths)")
    ap.add_argument("--widths", choices=["e2b", "small"], default="e2b")
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--multimodal", action="store_true")
    ap.add_argument("--max-shard-size", default=None,
                    help="passed to save_pretrained (e.g. 2GB); default: transformers' default")
    ap.add_argument("--kv-shared", type=int, default=None, help="override num_kv_shared_layers")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.layers is None:
        a.layers = 8 if a.widths == "small" else E2B_LAYERS
    if a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.threads:
        torch.set_num_threads(a.threads)

    t0 = time.perf_counter()
    tcfg = text_config(a.layers, a.kv_shared, a.widths == "small", a.vocab)
    if a.multimodal:
        cfg = Gemma4Config(text_config=tcfg, vision_config=Gemma4VisionConfig(), audio_config=Gemma4AudioConfig(),
                           tie_word_embeddings=True)
        cls = Gemma4ForConditionalGeneration
    else:
        cfg = tcfg
        cls = Gemma4ForCausalLM

    dtype = getattr(torch, a.dtype)
    torch.manual_seed(a.seed)
    old_default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in this dtype: no fp32 copy at any point
    try:
        # Build on the meta device (no memory, no torch default init), then allocate uninitialised CPU storage and
        # run transformers' own init once. Untouched pages cost no RSS, so the untied lm_head that to_empty()
        # allocates before tie_weights() re-ties it never counts.
        with torch.device("meta"):
            model = cls(cfg)
        model.to_empty(device="cpu")
        model.tie_weights()
        model.initialize_weights()
        with torch.no_grad():
            # the tied lm_head's Linear init re-draws the shared table after the Embedding init zeroed the pad row
            text = model.model.language_model if a.multimodal else model.model
            for table in (text.embed_tokens, text.embed_tokens_per_layer):
                table.weight[tcfg.pad_token_id].zero_()
    finally:
        torch.set_default_dtype(old_default)
    emb = model.get_input_embeddings().weight
    assert model.lm_head.weight is emb, "lm_head is not tied to embed_tokens"
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    bad = sorted({str(p.dtype) for p in model.parameters()} - {str(dtype)})
    assert not bad, f"parameters not in {dtype}: {bad}"
    n_params = sum(p.numel() for p in model.parameters())
    t1 = time.perf_counter()
    print(f"built {cls.__name__}: layers={a.layers} kv_shared={tcfg.num_kv_shared_layers} "
          f"params={n_params / 1e9:.3f} B dtype={a.dtype} in {t1 - t0:.1f} s (peak RSS {peak_rss_gib():.2f} GiB)",
          flush=True)

    os.makedirs(a.out, exist_ok=True)
    kw = {} if a.max_shard_size is None else {"max_shard_size": a.max_shard_size}
    model.save_pretrained(a.out, safe_serialization=True, **kw)
    t2 = time.perf_counter()

    total = 0
    for fn in sorted(os.listdir(a.out)):
        sz = os.path.getsize(os.path.join(a.out, fn))
        total += sz
        print(f"    {fn:40s} {sz:>14d} bytes")
    weights = sum(os.path.getsize(os.path.join(a.out, fn)) for fn in os.listdir(a.out) if fn.endswith(".safetensors"))
    print(f"wrote {a.out}: {total} bytes in all ({weights / 1e9:.3f} GB of .safetensors); "
          f"build {t1 - t0:.1f} s + save {t2 - t1:.1f} s = {t2 - t0:.1f} s; peak RSS {peak_rss_gib():.2f} GiB; "
          f"transformers {transformers.__version__} torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
