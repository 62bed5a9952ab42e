#!/usr/bin/env python3
"""Generate golden fixtures for the slicetrain C++ tests from the installed HF transformers Gemma 4 code.

Usage (from the repository root):
    tools/.venv/bin/python tools/make_fixtures.py [--out tests/fixtures] [--only tiny_text,tiny_mm]

For each fixture <name> this writes tests/fixtures/<name>/:
    config.json             model config as written by save_pretrained
    generation_config.json  (written by save_pretrained; not needed by the C++ side)
    model.safetensors       fp32 weights as written by save_pretrained(safe_serialization=True)
    golden.safetensors      inputs, logits, loss, per-layer hidden states and gradients (see tests/fixtures/README.md)

Everything is fp32, eager attention, model.train() with dropout 0, use_cache=False, fixed seeds. The script
is deterministic: running it twice produces bit-identical golden tensors on the same torch build.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
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
        cfg = Gemma4Config(text_config=tcfg, vision_config=None, audio_config=None, tie_word_embeddings=True)
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
    model.train()
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0.0 for m in model.modules())
    assert text_cfg.attention_dropout == 0.0

    # Tied lm_head must share storage with embed_tokens.
    text_model = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    assert model.lm_head.weight is text_model.embed_tokens.weight, "lm_head is not tied"

    model.save_pretrained(out, safe_serialization=True)
    for fn in os.listdir(out):
        if fn not in ("config.json", "model.safetensors", "generation_config.json"):
            os.remove(os.path.join(out, fn))
    keys = saved_keys(os.path.join(out, "model.safetensors"))

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
    names = [n for n in FIXTURES if not args.only or n in args.only.split(",")]
    for name in names:
        spec = FIXTURES[name]
        _, meta, _ = make_fixture(name, spec, args.out)
        err, e_pad, w_pad = tied_grad_check(spec)
        assert err < 1e-6, err
        print(f"[{name}] loss={meta['loss']:.6f} valid_tokens={meta['n_valid']} tied-grad check max|diff|={err:.2e} "
              f"(lookup grad on pad row={e_pad:.1e}, lm_head grad on pad row={w_pad:.1e})")
        if args.verbose:
            print(json.dumps(meta["keys"], indent=1))
        for fn in sorted(os.listdir(os.path.join(args.out, name))):
            sz = os.path.getsize(os.path.join(args.out, name, fn))
            print(f"    {fn:24s} {sz:>10d} bytes")


if __name__ == "__main__":
    sys.exit(main())
