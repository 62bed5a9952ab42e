#!/usr/bin/env python3
"""Generate golden fixtures for the slicetrain C++ tests from the installed HF transformers Gemma 4 code.

Usage (from the repository root):
    tools/.venv/bin/python tools/make_fixtures.py [--out tests/fixtures] [--only tiny_text,tiny_mm,...]

For each fixture <name> this writes tests/fixtures/<name>/:
    config.json             model config as written by save_pretrained
    generation_config.json  (written by save_pretrained; not needed by the C++ side)
    model.safetensors       weights as written by save_pretrained(safe_serialization=True): fp32 for tiny_text /
                            tiny_mm, bf16 for the *_bf16* fixtures; tiny_text_bf16_sharded instead has
                            model-0000K-of-0000N.safetensors shards plus model.safetensors.index.json
    golden.safetensors      inputs, logits, loss, per-layer hidden states and (fp32 fixtures only) gradients
                            (see tests/fixtures/README.md)

The golden computation is fp32, eager attention, model.train() with dropout 0, use_cache=False, fixed seeds; for
a bf16 fixture it runs on the weights read back from the bf16 files and cast to fp32. The script is deterministic:
running it twice produces byte-identical files on the same torch build. On x86-64 it pins ATEN_CPU_CAPABILITY=avx2
(unless already set) so that AVX-512 machines reproduce the committed files too (the fp32 reductions in the
backward pass round differently under the AVX-512 kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys

if platform.machine().lower() in ("x86_64", "amd64"):
    # Must be set before torch is imported. See the module docstring.
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import (
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ROPE_PARAMETERS = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

S, F = "sliding_attention", "full_attention"


def text_config(**kw) -> Gemma4TextConfig:
    base = dict(
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        final_logit_softcapping=30.0,
        rope_parameters=ROPE_PARAMETERS,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
        use_cache=False,
        use_bidirectional_attention=None,
        attention_k_eq_v=False,
        enable_moe_block=False,
        initializer_range=0.02,
    )
    base.update(kw)
    return Gemma4TextConfig(**base)


FIXTURES = {
    "tiny_text": dict(
        kind="causal_lm",
        seed=1234,
        text=dict(
            vocab_size=256,
            vocab_size_per_layer_input=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            layer_types=[S, S, F, S, S, F],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            hidden_size_per_layer_input=16,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            sliding_window=8,
        ),
        B=3,
        T=20,
        # per row: (number of left pad positions, number of right pad positions)
        padding=[(0, 0), (0, 6), (5, 0)],
    ),
    "tiny_mm": dict(
        kind="conditional_generation",
        seed=4321,
        text=dict(
            vocab_size=320,
            vocab_size_per_layer_input=320,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=5,
            layer_types=[S, F, S, S, F],
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=24,
            global_head_dim=48,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=3,
            use_double_wide_mlp=True,
            sliding_window=6,
        ),
        B=2,
        T=16,
        padding=[(0, 0), (0, 4)],
    ),
}

# Fixtures for the sharded / bf16 / multimodal-file loader paths. Each starts from an fp32 fixture above (same
# spec, seed, perturbation and batch, so the text weights are exactly the bf16 rounding of that fixture's weights),
# is converted to bfloat16 before save_pretrained, and its golden tensors are computed in fp32 by the model read
# back from the written files. No gradients (keeps each directory well under 2 MB).
#   save_dtype      dtype of the written weights
#   max_shard_size  passed to save_pretrained (None: transformers' default, i.e. one file for these sizes)
#   vision / audio  Gemma4VisionConfig / Gemma4AudioConfig kwargs (conditional_generation only)
#   grads           whether golden.safetensors gets grad.<key> tensors
FIXTURES["tiny_text_bf16_sharded"] = dict(
    FIXTURES["tiny_text"],
    save_dtype="bfloat16",
    max_shard_size="150KB",
    grads=False,
)
FIXTURES["tiny_mm_vision_bf16"] = dict(
    FIXTURES["tiny_mm"],
    vision=dict(
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=4,
        position_embedding_size=12,
        pooling_kernel_size=2,
    ),
    audio=dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[4, 8],
        conv_kernel_size=3,
        output_proj_dims=24,
    ),
    save_dtype="bfloat16",
    max_shard_size=None,
    grads=False,
)

# Module-name prefixes of the multimodal towers (Gemma4Model attributes); their weights are perturbed separately so
# that the text weights come out exactly as in the text-only fixture with the same seed.
TOWER_PREFIXES = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")

# Weight perturbation (see README): every RMSNorm weight -> 1 + 0.2*randn, every layer_scalar -> U(0.5, 1.5),
# Linear weights -> N(0, LINEAR_STD), embedding tables -> N(0, EMBED_STD) except row pad_token_id, which keeps its
# constructed value (zeros, from PreTrainedModel._init_weights with padding_idx).
NORM_STD = 0.2
LINEAR_STD = 0.1
EMBED_STD = 0.25


def build_model(spec: dict):
    torch.manual_seed(spec["seed"])
    tcfg = text_config(**spec["text"])
    if spec["kind"] == "causal_lm":
        cfg = tcfg
        cfg._attn_implementation = "eager"
        model = Gemma4ForCausalLM(cfg)
    else:
        vcfg = Gemma4VisionConfig(**spec["vision"]) if spec.get("vision") else None
        acfg = Gemma4AudioConfig(**spec["audio"]) if spec.get("audio") else None
        cfg = Gemma4Config(text_config=tcfg, vision_config=vcfg, audio_config=acfg, tie_word_embeddings=True)
        cfg._attn_implementation = "eager"
        model = Gemma4ForConditionalGeneration(cfg)
    model.set_attn_implementation("eager")
    return model


@torch.no_grad()
def perturb_weights(model, seed: int, pad_id: int):
    gen = torch.Generator().manual_seed(seed + 1)
    text_model = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    embeds = {id(text_model.embed_tokens.weight), id(text_model.embed_tokens_per_layer.weight)}
    seen = set()
    for name, module in model.named_modules():
        if (name + ".").startswith(TOWER_PREFIXES):
            continue
        for pname, p in list(module.named_parameters(recurse=False)):
            if id(p) in seen:
                continue
            seen.add(id(p))
            cls = module.__class__.__name__
            if "RMSNorm" in cls:
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            elif id(p) in embeds:
                row0 = p[pad_id].clone()
                p.copy_(EMBED_STD * torch.randn(p.shape, generator=gen))
                p[pad_id] = row0
            elif isinstance(module, torch.nn.Linear):
                p.copy_(LINEAR_STD * torch.randn(p.shape, generator=gen))
            else:
                raise RuntimeError(f"unhandled parameter {name}.{pname} ({cls})")
        for bname, b in list(module.named_buffers(recurse=False)):
            if bname == "layer_scalar":
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    perturb_towers(model, seed)


@torch.no_grad()
def perturb_towers(model, seed: int):
    """Vision/audio tower weights (if any): norm weights (RMSNorm, LayerNorm) 1 + 0.2*randn, every other parameter (linear, conv,
    bias, position table, per_dim_scale) 0.1*randn; the persistent clip bounds of Gemma4ClippableLinear become
    finite (input/output min = -(2 + U), max = 2 + U) instead of the constructed +-inf. Own generator (seed + 3)."""
    gen = torch.Generator().manual_seed(seed + 3)
    seen = set()
    for name, module in model.named_modules():
        if not (name + ".").startswith(TOWER_PREFIXES):
            continue
        cls = module.__class__.__name__
        for pname, p in list(module.named_parameters(recurse=False)):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if "Norm" in cls and pname == "weight":
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(LINEAR_STD * torch.randn(p.shape, generator=gen))
        for bname, b in list(module.named_buffers(recurse=False)):
            if bname in module._non_persistent_buffers_set:
                continue
            if bname in ("input_min", "output_min"):
                b.copy_(-(2.0 + torch.rand(b.shape, generator=gen)))
            elif bname in ("input_max", "output_max"):
                b.copy_(2.0 + torch.rand(b.shape, generator=gen))
            else:
                raise RuntimeError(f"unhandled persistent buffer {name}.{bname} ({cls})")


def make_batch(spec: dict, vocab: int, pad_id: int):
    gen = torch.Generator().manual_seed(spec["seed"] + 2)
    B, T = spec["B"], spec["T"]
    ids = torch.randint(3, vocab, (B, T), generator=gen, dtype=torch.int64)
    mask = torch.ones(B, T, dtype=torch.int64)
    for b, (left, right) in enumerate(spec["padding"]):
        if left:
            mask[b, :left] = 0
        if right:
            mask[b, T - right :] = 0
    ids = torch.where(mask == 0, torch.full_like(ids, pad_id), ids)
    labels = torch.where(mask == 0, torch.full_like(ids, -100), ids)
    return ids, mask, labels


def saved_keys(path: str) -> list[str]:
    with safe_open(path, framework="pt") as f:
        return list(f.keys())


WEIGHT_FILES_KEPT = ("config.json", "model.safetensors", "generation_config.json", "model.safetensors.index.json")


def is_shard_name(fn: str) -> bool:
    # model-00001-of-00003.safetensors
    parts = fn[: -len(".safetensors")].split("-") if fn.endswith(".safetensors") else []
    return len(parts) == 4 and parts[0] == "model" and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit()


def checkpoint_keys(out: str) -> list[str]:
    """Tensor names of the written checkpoint, in file order (shard by shard for a sharded one)."""
    index = os.path.join(out, "model.safetensors.index.json")
    if not os.path.exists(index):
        return saved_keys(os.path.join(out, "model.safetensors"))
    with open(index, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    keys = []
    for shard in sorted(set(weight_map.values())):
        shard_keys = saved_keys(os.path.join(out, shard))
        assert all(weight_map[k] == shard for k in shard_keys), shard
        keys += shard_keys
    assert sorted(keys) == sorted(weight_map), "index.json and the shards disagree"
    return keys


def reload_fp32(out: str, spec: dict, reference):
    """Read the written (bf16) checkpoint back into an fp32 model and check it holds exactly the bf16-rounded
    values of `reference` (the in-memory model that was saved)."""
    cls = Gemma4ForCausalLM if spec["kind"] == "causal_lm" else Gemma4ForConditionalGeneration
    model = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.set_attn_implementation("eager")
    ref = reference.state_dict()
    got = model.state_dict()
    assert set(ref) == set(got), sorted(set(ref) ^ set(got))
    for k, v in ref.items():
        if got[k].dtype.is_floating_point and k in set(checkpoint_keys(out)) | {"lm_head.weight"}:
            assert got[k].dtype == torch.float32, (k, got[k].dtype)
            assert torch.equal(got[k], v.to(torch.float32)), k
    return model


def make_fixture(name: str, spec: dict, out_root: str):
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    model = build_model(spec)
    text_cfg = model.config.get_text_config()
    pad_id = text_cfg.pad_token_id
    vocab = text_cfg.vocab_size
    perturb_weights(model, spec["seed"], pad_id)
    save_dtype = spec.get("save_dtype")
    with_grads = spec.get("grads", True)

    # Tied lm_head must share storage with embed_tokens.
    text_model = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    assert model.lm_head.weight is text_model.embed_tokens.weight, "lm_head is not tied"

    if save_dtype is None:
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.to(getattr(torch, save_dtype))
        kw = {} if spec.get("max_shard_size") is None else {"max_shard_size": spec["max_shard_size"]}
        model.save_pretrained(out, safe_serialization=True, **kw)
    for fn in os.listdir(out):
        if fn not in WEIGHT_FILES_KEPT and not is_shard_name(fn):
            os.remove(os.path.join(out, fn))
    keys = checkpoint_keys(out)
    if spec.get("max_shard_size") is not None:
        n_shards = len([fn for fn in os.listdir(out) if is_shard_name(fn)])
        assert n_shards >= 3 and not os.path.exists(os.path.join(out, "model.safetensors")), n_shards
    if save_dtype is not None:
        # golden tensors come from the model as a loader sees it: the bf16 files, upcast to fp32
        model = reload_fp32(out, spec, model)
        text_cfg = model.config.get_text_config()
        text_model = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        assert model.lm_head.weight is text_model.embed_tokens.weight, "lm_head is not tied after reload"

    model.train()
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0.0 for m in model.modules())
    assert text_cfg.attention_dropout == 0.0

    ids, mask, labels = make_batch(spec, vocab, pad_id)

    # Capture the raw output of every decoder layer (residual stream after layer_scalar, before the final norm).
    layer_outputs = {}
    hooks = []
    for i, layer in enumerate(text_model.layers):
        def hook(mod, args, output, i=i):
            layer_outputs[i] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        hooks.append(layer.register_forward_hook(hook))

    model.zero_grad(set_to_none=True)
    out_obj = model(
        input_ids=ids,
        attention_mask=mask,
        labels=labels,
        use_cache=False,
        output_hidden_states=True,
        return_dict=True,
    )
    for h in hooks:
        h.remove()
    loss = out_obj.loss
    logits = out_obj.logits
    if with_grads:
        loss.backward()

    # Cross-check the loss against a manual shifted CE.
    shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    tok = torch.nn.functional.cross_entropy(
        logits.detach().float().reshape(-1, vocab), shift_labels.reshape(-1), ignore_index=-100, reduction="none"
    ).reshape(labels.shape)
    n_valid = int((shift_labels != -100).sum())
    manual = tok.sum() / n_valid
    assert torch.allclose(manual, loss.detach(), rtol=1e-6, atol=1e-6), (manual, loss)

    hs = out_obj.hidden_states
    L = text_cfg.num_hidden_layers
    assert len(hs) == L + 1, len(hs)
    # hidden_states[0] = scaled embeddings (input to layer 0); [i] = output of layer i-1 for 1 <= i < L;
    # [L] = AFTER the final norm (tie_last_hidden_states), i.e. the raw output of layer L-1 is not in hidden_states.
    scaled_emb = text_model.embed_tokens(ids).detach()
    assert torch.equal(hs[0], scaled_emb)
    for i in range(L - 1):
        assert torch.equal(hs[i + 1], layer_outputs[i]), i
    assert torch.equal(hs[L], text_model.norm(layer_outputs[L - 1]).detach())

    golden = {
        "input_ids": ids.contiguous(),
        "attention_mask": mask.contiguous(),
        "labels": labels.contiguous(),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1).contiguous(),
        "token_loss": tok.float().contiguous(),
        "embeds": hs[0].detach().float().contiguous(),
        "final_hidden": hs[L].detach().float().contiguous(),
    }
    for i in range(L):
        golden[f"hidden.{i}"] = layer_outputs[i].float().contiguous()

    if with_grads:
        named = dict(model.named_parameters())
        trainable = {n: p for n, p in named.items() if p.requires_grad}
        assert set(trainable) == set(keys) - {
            k for k in keys if k.endswith("layer_scalar")
        }, sorted(set(trainable) ^ set(keys))
        for n, p in trainable.items():
            assert p.grad is not None, n
            golden[f"grad.{n}"] = p.grad.detach().float().contiguous()

    save_file(golden, os.path.join(out, "golden.safetensors"), metadata={
        # a single key keeps the header byte-identical between runs (safetensors does not order metadata keys)
        "generator": f"tools/make_fixtures.py fixture={name} transformers={transformers.__version__} "
        f"torch={torch.__version__}; see tests/fixtures/README.md",
    })

    meta = dict(
        name=name,
        keys=keys,
        loss=float(loss.detach()),
        n_valid=n_valid,
        shapes={k: list(v.shape) for k, v in golden.items()},
    )
    return model, meta, golden


def tied_grad_check(spec: dict):
    """Show that the single grad on the tied embedding equals lookup-grad + lm_head-grad."""
    model = build_model(spec)
    text_cfg = model.config.get_text_config()
    perturb_weights(model, spec["seed"], text_cfg.pad_token_id)
    model.train()
    ids, mask, labels = make_batch(spec, text_cfg.vocab_size, text_cfg.pad_token_id)
    text_model = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    E = text_model.embed_tokens.weight
    # untie: give the lm_head its own copy and check sum of both grads equals the tied grad
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
    tied = E.grad.clone()
    with torch.no_grad():
        W = torch.nn.Parameter(E.detach().clone())
    model.lm_head.weight = W
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
    total = E.grad + W.grad
    err = (total - tied).abs().max().item()
    return err, float(E.grad[text_cfg.pad_token_id].abs().max()), float(W.grad[text_cfg.pad_token_id].abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--only", default="")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(FIXTURES)}")
    names = [n for n in FIXTURES if not only or n in only]
    for name in names:
        spec = FIXTURES[name]
        _, meta, _ = make_fixture(name, spec, args.out)
        if spec.get("grads", True):
            err, e_pad, w_pad = tied_grad_check(spec)
            assert err < 1e-6, err
            print(f"[{name}] loss={meta['loss']:.6f} valid_tokens={meta['n_valid']} tied-grad check "
                  f"max|diff|={err:.2e} (lookup grad on pad row={e_pad:.1e}, lm_head grad on pad row={w_pad:.1e})")
        else:
            print(f"[{name}] loss={meta['loss']:.6f} valid_tokens={meta['n_valid']} tensors={len(meta['keys'])} "
                  f"(written as {spec.get('save_dtype') or 'float32'}; golden from the written weights in fp32)")
        if args.verbose:
            print(json.dumps(meta["keys"], indent=1))
        for fn in sorted(os.listdir(os.path.join(args.out, name))):
            sz = os.path.getsize(os.path.join(args.out, name, fn))
            print(f"    {fn:34s} {sz:>10d} bytes")


if __name__ == "__main__":
    sys.exit(main())
