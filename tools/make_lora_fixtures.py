#!/usr/bin/env python3
"""Generate golden LoRA-adapter fixtures for the slicetrain C++ tests with PEFT on top of the tiny Gemma 4 fixtures.

Usage (from the repository root; needs tests/fixtures/tiny_text and tiny_mm from tools/make_fixtures.py):
    tools/.venv/bin/python tools/make_lora_fixtures.py [--out tests/fixtures] [--only lora_tiny_text,lora_tiny_mm]

For each fixture <name> this writes tests/fixtures/<name>/:
    adapter_config.json           as written by PeftModel.save_pretrained, except that base_model_name_or_path is
                                  the base fixture's directory name ("tiny_text" / "tiny_mm", relative to
                                  tests/fixtures/) instead of an absolute path, and a target_modules *list* (PEFT
                                  writes list(set), whose order depends on the string hash seed) is sorted
    adapter_model.safetensors     exactly as written by PeftModel.save_pretrained (fp32 lora_A / lora_B tensors)
    golden.safetensors            batch, loss, logits, LoRA gradients, merged weights, merged logits
                                  (see tests/fixtures/README.md, section "LoRA adapter fixtures")
PEFT's save_pretrained also writes a model card (README.md, which names the absolute base path); it is deleted.

Adapter weights: torch.manual_seed(0) right before get_peft_model, so lora_A gets PEFT's own init (kaiming-uniform);
then every lora_B (PEFT init: zeros) is overwritten with 0.05*N(0,1) from a seeded generator so that the adapter
changes the output and lora_A gets a non-zero gradient.

The golden computation is fp32, eager attention, train() mode with dropout 0, use_cache=False, on the batch of the
base fixture's golden.safetensors. The merged weights come from merge_and_unload() on a deep copy of the PEFT model.
The script is deterministic: running it twice produces byte-identical files on the same torch build. On x86-64 it
pins ATEN_CPU_CAPABILITY=avx2 (unless already set) so that AVX-512 machines reproduce the committed files too (the
fp32 reductions in the backward pass round differently under the AVX-512 kernels).
"""

from __future__ import annotations

import argparse
import copy
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

import peft
import transformers
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# base        base fixture directory (sibling of the output directory)
# loader      transformers auto class that loads it; cls: the class it must produce
# lora        LoraConfig kwargs. lora_tiny_mm leaves target_modules at PEFT's default for model_type "gemma4"
#             (peft.utils.constants: r".*language_model\..*\.(q_proj|v_proj)")
# b_seed      seed of the generator for the lora_B weights
FIXTURES = {
    "lora_tiny_text": dict(
        base="tiny_text",
        loader=AutoModelForCausalLM,
        cls=Gemma4ForCausalLM,
        lora=dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                  use_rslora=False),
        b_seed=101,
    ),
    "lora_tiny_mm": dict(
        base="tiny_mm",
        loader=AutoModelForImageTextToText,
        cls=Gemma4ForConditionalGeneration,
        lora=dict(r=2, lora_alpha=3, use_rslora=True, task_type="CAUSAL_LM"),
        b_seed=102,
    ),
    # modules_to_save: base modules trained in full beside the adapters (PEFT matches them by plain
    # suffix: "input_layernorm" is every layer's, "per_layer_projection_norm" the top-level one).
    "lora_tiny_text_mts": dict(
        base="tiny_text",
        loader=AutoModelForCausalLM,
        cls=Gemma4ForCausalLM,
        lora=dict(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "down_proj"],
                  modules_to_save=["input_layernorm", "per_layer_projection_norm"], task_type="CAUSAL_LM"),
        b_seed=103,
    ),
}

B_STD = 0.05
ADAPTER = "default"  # PEFT's adapter name; it appears in parameter names but not in the saved keys
KEPT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def load_base(spec: dict, base_dir: str):
    model = spec["loader"].from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    assert type(model) is spec["cls"], type(model)
    model.set_attn_implementation("eager")
    return model


def read_batch(base_dir: str):
    with safe_open(os.path.join(base_dir, "golden.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in ("input_ids", "attention_mask", "labels", "logits", "loss")}


def saved_key(param_name: str) -> str:
    """PEFT parameter name -> key in adapter_model.safetensors (the adapter name is dropped; a
    modules_to_save copy is saved under the module's own name)."""
    key = param_name.replace(f".modules_to_save.{ADAPTER}.", ".").replace(f".{ADAPTER}.", ".")
    assert key != param_name, param_name
    return key


def fix_adapter_config(out: str, base_name: str):
    """Relative base_model_name_or_path; sorted target_modules when PEFT wrote a list (from a set). Everything
    else stays as PEFT wrote it (same json.dumps(indent=2, sort_keys=True) formatting, checked)."""
    path = os.path.join(out, "adapter_config.json")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    cfg = json.loads(text)
    assert json.dumps(cfg, indent=2, sort_keys=True) == text, "adapter_config.json is not in PEFT's format"
    assert os.path.isabs(cfg["base_model_name_or_path"]), cfg["base_model_name_or_path"]
    cfg["base_model_name_or_path"] = base_name
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True))
    return cfg


def forward(model, batch):
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
        use_cache=False,
        return_dict=True,
    )


def make_fixture(name: str, spec: dict, out_root: str):
    base_dir = os.path.join(out_root, spec["base"])
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    base = load_base(spec, base_dir)
    batch = read_batch(base_dir)
    base_state = {k: v.detach().clone() for k, v in base.state_dict().items()}

    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(**spec["lora"]))
    cfg = model.peft_config[ADAPTER]
    assert cfg.lora_dropout == 0.0
    model.train()
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0.0 for m in model.modules())

    # With PEFT's lora_B = 0 the adapter is a no-op: the base fixture's golden logits come out.
    with torch.no_grad():
        out0 = forward(model, batch)
    assert torch.allclose(out0.logits, batch["logits"], rtol=0, atol=1e-5), (out0.logits - batch["logits"]).abs().max()

    gen = torch.Generator().manual_seed(spec["b_seed"])
    lora_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert lora_params and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n
                               for n in lora_params), sorted(lora_params)
    with torch.no_grad():
        for n, p in lora_params.items():
            if ".lora_B." in n:
                assert not p.any(), n
                p.copy_(B_STD * torch.randn(p.shape, generator=gen))
            elif ".modules_to_save." in n:  # trained copies that differ from the base
                p.add_(0.1 * torch.randn(p.shape, generator=gen))

    model.save_pretrained(out)
    for fn in os.listdir(out):
        if fn not in KEPT_FILES:
            os.remove(os.path.join(out, fn))
    assert sorted(os.listdir(out)) == sorted(KEPT_FILES), os.listdir(out)
    adapter_cfg = fix_adapter_config(out, spec["base"])
    with safe_open(os.path.join(out, "adapter_model.safetensors"), framework="pt") as f:
        adapter = {k: f.get_tensor(k) for k in f.keys()}
    assert set(adapter) == {saved_key(n) for n in lora_params}, sorted(set(adapter) ^ {saved_key(n) for n in lora_params})
    for n, p in lora_params.items():
        assert adapter[saved_key(n)].dtype == torch.float32 and torch.equal(adapter[saved_key(n)], p.detach()), n

    # Golden forward / backward.
    model.zero_grad(set_to_none=True)
    out_obj = forward(model, batch)
    loss, logits = out_obj.loss, out_obj.logits
    loss.backward()
    vocab = logits.shape[-1]
    labels = batch["labels"]
    shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    manual = torch.nn.functional.cross_entropy(
        logits.detach().reshape(-1, vocab), shift_labels.reshape(-1), ignore_index=-100, reduction="sum"
    ) / int((shift_labels != -100).sum())
    assert torch.allclose(manual, loss.detach(), rtol=1e-6, atol=1e-6), (manual, loss)

    golden = {
        "input_ids": batch["input_ids"].to(torch.int32).contiguous(),
        "attention_mask": batch["attention_mask"].to(torch.int32).contiguous(),
        "labels": labels.to(torch.int32).contiguous(),
        "loss": loss.detach().float().reshape(1).contiguous(),
        "logits": logits.detach().float().contiguous(),
    }
    for n, p in lora_params.items():
        assert p.grad is not None and p.grad.abs().max() > 0, n
        golden["grad." + saved_key(n)] = p.grad.detach().float().contiguous()
    for n, p in model.named_parameters():
        assert p.requires_grad or p.grad is None, n

    # Adapted modules: PEFT module name "base_model.model.<base name>" -> base weight "<base name>.weight".
    prefix = "base_model.model."
    adapted = {}
    for mname, m in model.named_modules():
        if isinstance(m, LoraLayer):
            assert mname.startswith(prefix), mname
            scale = m.scaling[ADAPTER]
            want = cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
            assert scale == want, (mname, scale, want)
            A, B = m.lora_A[ADAPTER].weight.detach(), m.lora_B[ADAPTER].weight.detach()
            adapted[mname[len(prefix):] + ".weight"] = (A, B, scale)

    merged_model = copy.deepcopy(model).merge_and_unload()
    assert type(merged_model) is spec["cls"], type(merged_model)
    merged_model.train()
    merged_state = merged_model.state_dict()
    assert set(merged_state) == set(base_state), sorted(set(merged_state) ^ set(base_state))
    saved_modules = {saved_key(n)[len("base_model.model."):] for n in lora_params if ".modules_to_save." in n}
    for k, v in merged_state.items():
        if k in saved_modules:  # merge_and_unload keeps the trained copy
            assert not torch.equal(v, base_state[k]), k
            golden["merged." + k] = v.detach().float().contiguous()
        elif k in adapted:
            A, B, scale = adapted[k]
            assert torch.allclose(v, base_state[k] + scale * (B @ A), rtol=0, atol=1e-6), k
            assert not torch.equal(v, base_state[k]), k
            golden["merged." + k] = v.detach().float().contiguous()
        else:
            assert torch.equal(v, base_state[k]), k
    with torch.no_grad():
        logits_merged = forward(merged_model, batch).logits
    merge_err = float((logits_merged - logits.detach()).abs().max())
    assert merge_err < 1e-4, merge_err
    golden["logits_merged"] = logits_merged.detach().float().contiguous()

    save_file(golden, os.path.join(out, "golden.safetensors"), metadata={
        # a single key keeps the header byte-identical between runs (safetensors does not order metadata keys)
        "generator": f"tools/make_lora_fixtures.py fixture={name} peft={peft.__version__} "
        f"transformers={transformers.__version__} torch={torch.__version__}; see tests/fixtures/README.md",
    })

    return dict(
        name=name,
        loss=float(loss.detach()),
        base_loss=float(batch["loss"]),
        scale=next(iter(adapted.values()))[2],
        merge_err=merge_err,
        adapter={k: list(v.shape) for k, v in adapter.items()},
        n_merged=len(adapted),
        adapter_config=adapter_cfg,
    )


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
    for name in [n for n in FIXTURES if not only or n in only]:
        meta = make_fixture(name, FIXTURES[name], args.out)
        print(f"[{name}] loss={meta['loss']:.6f} (base {meta['base_loss']:.6f}) scale={meta['scale']:.6g} "
              f"adapter tensors={len(meta['adapter'])} merged weights={meta['n_merged']} "
              f"max|logits_merged - logits|={meta['merge_err']:.2e}")
        if args.verbose:
            print(json.dumps(meta["adapter"], indent=1))
            print(json.dumps(meta["adapter_config"], indent=1, sort_keys=True))
        for fn in sorted(os.listdir(os.path.join(args.out, name))):
            sz = os.path.getsize(os.path.join(args.out, name, fn))
            print(f"    {fn:34s} {sz:>10d} bytes")


if __name__ == "__main__":
    sys.exit(main())
