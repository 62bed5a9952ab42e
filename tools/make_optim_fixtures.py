#!/usr/bin/env python3
"""Golden data for slicetrain's AdamW: torch.optim.AdamW over a few steps on fixed tensors.

Writes tests/fixtures/adamw/golden.safetensors with
  param0, grad.<k> (k = 1..STEPS), param.<k> (after step k), and the hyper-parameters in metadata.
Run: tools/.venv/bin/python tools/make_optim_fixtures.py
"""
import pathlib

import torch
from safetensors.torch import save_file

STEPS = 4
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.01
MAX_NORM = 0.5


def main() -> None:
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "adamw"
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    p = torch.nn.Parameter(torch.randn(1031, generator=gen))
    opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    tensors = {"param0": p.detach().clone()}
    for k in range(1, STEPS + 1):
        g = torch.randn(1031, generator=gen) * (10.0 ** (k - 2))  # grads from 0.1x to 100x
        tensors[f"grad.{k}"] = g.clone()
        p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_([p], MAX_NORM)
        tensors[f"clipped_norm.{k}"] = norm.reshape(1).float()
        tensors[f"grad_clipped.{k}"] = p.grad.detach().clone()
        opt.step()
        tensors[f"param.{k}"] = p.detach().clone()
    meta = {"lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS),
            "weight_decay": str(WD), "max_norm": str(MAX_NORM), "steps": str(STEPS),
            "torch": torch.__version__}
    save_file(tensors, str(out / "golden.safetensors"), metadata=meta)
    print(f"wrote {out / 'golden.safetensors'}")


if __name__ == "__main__":
    main()
