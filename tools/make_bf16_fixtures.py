#!/usr/bin/env python3
"""Golden tensors for slicetrain's bf16 compute (--precision bf16), from transformers under PyTorch autocast.

Usage (from the repository root, after tools/make_fixtures.py has written the fp32 fixtures):
    tools/.venv/bin/python tools/make_bf16_fixtures.py [--only tiny_text,tiny_mm]

For each fp32 fixture tests/fixtures/<name>/ (tiny_text, tiny_mm) this reads the model the fixture holds
(model.safetensors, fp32) and the batch in its golden.safetensors, and runs the same forward and backward as
tools/make_fixtures.py (model.train(), dropout 0, eager attention, use_cache=False) inside
`torch.autocast("cpu", dtype=torch.bfloat16)`: fp32 master weights, every matmul on bf16 operands (PyTorch's
CPU autocast list: linear, matmul, bmm, ...), the rest as autocast leaves it. It writes
tests/fixtures/<name>/golden_autocast_bf16.safetensors with the logits, the loss, the per-token loss and the
gradient of every trainable tensor (fp32, as autocast leaves .grad on fp32 parameters).

slicetrain's bf16 recipe is not bit-identical to autocast's (autocast rounds every matmul's output to bf16,
slicetrain keeps it fp32; autocast also runs attention's products in bf16, slicetrain in fp32), so the C++ test
compares with autocast within bf16 tolerances, and also with a second golden that runs slicetrain's recipe in
torch: golden_bf16_operands.safetensors, the same model and batch with every nn.Linear's operands rounded to bf16
(x and W forward; dy and W for dx, dy and x for dW) and the products computed in fp32, everything else fp32
(torch.nn.functional.linear replaced by a custom autograd Function for the run). That one the engine must match
to within fp32 accumulation and the odd operand that rounds the other way (tests/test_bf16.cpp).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")  # as make_fixtures.py: reproducible reductions

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = {"tiny_text": Gemma4ForCausalLM, "tiny_mm": Gemma4ForConditionalGeneration}


def rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)


class BF16OperandLinear(torch.autograd.Function):
    """y = bf16(x) bf16(W)^T (+ b) in fp32; dx = bf16(dy) bf16(W); dW = bf16(dy)^T bf16(x)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return ORIGINAL_LINEAR(rounded(x), rounded(w), b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dyr = rounded(dy)
        dx = dyr @ rounded(w)
        dw = dyr.reshape(-1, dy.shape[-1]).t() @ rounded(x).reshape(-1, x.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


ORIGINAL_LINEAR = torch.nn.functional.linear


def run(name: str, root: str, mode: str):
    """Forward and backward of fixture `name` in `mode` (autocast | operands); returns (golden dict, loss)."""
    d = os.path.join(root, name)
    model = FIXTURES[name].from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.set_attn_implementation("eager")
    model.train()
    assert all(not isinstance(m, torch.nn.Dropout) or m.p == 0.0 for m in model.modules())
    with safe_open(os.path.join(d, "golden.safetensors"), "pt") as f:
        ids = f.get_tensor("input_ids")
        mask = f.get_tensor("attention_mask")
        labels = f.get_tensor("labels")
    model.zero_grad(set_to_none=True)
    if mode == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False, return_dict=True)
    else:
        torch.nn.functional.linear = lambda x, w, b=None: BF16OperandLinear.apply(x, w, b)
        try:
            out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False, return_dict=True)
        finally:
            torch.nn.functional.linear = ORIGINAL_LINEAR
    loss = out.loss
    # The backward runs outside the patch: autograd calls the Function's own backward.
    loss.backward()
    vocab = out.logits.shape[-1]
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    tok = torch.nn.functional.cross_entropy(
        out.logits.detach().float().reshape(-1, vocab), shift.reshape(-1), ignore_index=-100, reduction="none"
    ).reshape(labels.shape)
    golden = {
        "logits": out.logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1).contiguous(),
        "token_loss": tok.float().contiguous(),
    }
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.dtype == torch.float32, n
            golden[f"grad.{n}"] = p.grad.detach().float().contiguous()
    return golden, loss.item()


def make(name: str, root: str) -> None:
    d = os.path.join(root, name)
    with safe_open(os.path.join(d, "golden.safetensors"), "pt") as f:
        fp32_loss = float(f.get_tensor("loss")[0])
    for mode, fn in (("autocast", "golden_autocast_bf16.safetensors"),
                     ("operands", "golden_bf16_operands.safetensors")):
        golden, loss = run(name, root, mode)
        what = ("torch.autocast('cpu', dtype=torch.bfloat16)" if mode == "autocast" else
                "every nn.Linear on bf16-rounded operands with fp32 products (slicetrain's recipe)")
        save_file(golden, os.path.join(d, fn), metadata={
            "generator": f"tools/make_bf16_fixtures.py fixture={name} transformers={transformers.__version__} "
            f"torch={torch.__version__}; {what}",
        })
        grads = sum(k.startswith("grad.") for k in golden)
        print(f"[{name}] {mode}: loss={loss:.6f} (fp32 {fp32_loss:.6f}, rel diff "
              f"{abs(loss - fp32_loss) / fp32_loss:.2e}); {grads} gradients -> {fn}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    names = [n for n in args.only.split(",") if n] or list(FIXTURES)
    for n in names:
        if n not in FIXTURES:
            ap.error(f"unknown fixture {n}; known: {list(FIXTURES)}")
        make(n, args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
