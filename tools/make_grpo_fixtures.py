#!/usr/bin/env python3
"""Generate golden GRPO fixtures (advantages, loss, gradient, logged metrics) with TRL's own GRPOTrainer code.

Usage (from any directory; offline, ~10 s on 2 cores):
    tools/.venv/bin/python tools/make_grpo_fixtures.py [--out tests/fixtures/grpo]

Needs tools/.venv (transformers 5.24, torch 2.15, trl 1.16.0, datasets) and the tiny model of
tests/fixtures/dpo/model/ (written by tools/make_dpo_fixtures.py; its weights do not matter here: no forward pass of
it is used by any golden). Writes golden.json and README.md into the output directory (both rewritten on every run).
Everything is float32 on the CPU, one process, as TRL computes it by default.

How the goldens are produced (TRL's code, not a re-implementation):
  - a trl.GRPOTrainer is built for every case on AutoModelForCausalLM.from_pretrained(tests/fixtures/dpo/model) (a
    tiny Gemma4ForCausalLM, fp32) with its tokenizer, GRPOConfig(use_cpu=True, bf16=False, report_to=[], seed=0,
    gradient_accumulation_steps=1, logging_strategy="no", save_strategy="no", max_completion_length=10, + the
    case's settings below), reward_funcs = plain python functions named f0 (and f1). The case's settings go through
    GRPOConfig (the trainer is rebuilt per case; no trainer attribute is overwritten except
    current_gradient_accumulation_steps, see below). The trainer's model is put in train mode (mode == "train").
  - advantages: GRPOConfig(num_generations=G, per_device_train_batch_size=N, scale_rewards=..., reward_weights=...,
    beta=0, multi_objective_aggregation="sum_then_normalize" (the default)). trainer._generate_single_turn is
    replaced by a function returning fixed completion ids (completion i = [10 + i, 11 + i % 3, eos(1)], logprobs
    None), every other line of trainer._generate_and_score_completions runs as is on N inputs {"prompt": "Question
    <i // G>:"} (each prompt repeated G times, as TRL's RepeatSampler yields them). Reward function f<k> returns
    column k of rewards_per_func, with None where the fixture has null. No model forward runs (beta = 0 and
    gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0, so no old/ref log-probs).
    "advantages" is the returned output["advantages"]; "metrics" are the values appended to
    trainer._metrics["train"] under reward, reward_std, frac_reward_zero_std, rewards/<f>/mean, rewards/<f>/std.
  - losses: GRPOConfig(loss_type=..., beta=..., epsilon=0.2, epsilon_high=..., max_completion_length=10,
    num_generations=2, per_device_train_batch_size=B, num_iterations=2 when old_per_token_logps is given, else 1).
    trainer._get_per_token_logps_and_entropies is replaced by a function returning (leaf, zeros [B,T], None), where
    leaf = per_token_logps (float32, requires_grad=True) and the zeros stand in for the entropies (TRL's return
    signature is (logps, entropies, aux_loss)). trainer.current_gradient_accumulation_steps, which transformers only
    sets inside its training loop, is set to 1. Then loss = trainer._compute_loss(trainer.model, inputs) with
    inputs = {prompt_ids [B,3] (ids 2, 20, 21), prompt_mask (ones), completion_ids [B,T] (ids 30 + t, 0 where
    completion_mask is 0), completion_mask (int64), advantages [B], num_items_in_batch (int64 scalar tensor =
    completion_mask.sum(), as TRL computes it with one process), old_per_token_logps (only when the case has it;
    absent -> TRL uses per_token_logps.detach()), ref_per_token_logps (only when beta != 0)}; loss.backward();
    "grad" = leaf.grad. "metrics" are what _compute_loss appends to trainer._metrics["train"] minus "entropy"
    (always 0 here since the entropies are injected zeros).
  - settings that stay at TRL's defaults (recorded in golden.json "settings"): importance_sampling_level "token",
    delta None, top_entropy_quantile 1.0, off_policy_mask_threshold None, entropy_coef 0, use_vllm False,
    mask_truncated_completions False, one process. use_bias_correction_kl is TRL's default (True: the per-token KL
    is multiplied by the differentiable ratio exp(logp - old), which changes the KL gradient even on-policy, and the
    logged "kl" is the mean of that product) except in the "*_nobc" cases (False).
  - the off-policy cases draw old = logp - 0.45 N(0,1), so with advantages of both signs both clip branches fire;
    "bnpo_negative_adv_low_clip" has every advantage < 0 and old shifted by +0.5, so every row clips low
    (clip_ratio/low_min > 0; elsewhere low_min is 0 because some row has A >= 0).
  - check: every advantage and loss golden is recomputed independently (float64, the formulas of README.md) and
    compared (rel/abs 1e-5); for loss_type dapo, beta 0 and no old_per_token_logps, grad must equal
    -advantages[i] / num_items_in_batch on the tokens where completion_mask is 1 and 0 elsewhere; every off-policy
    case with advantages of both signs must clip low and high at least once.

golden.json layout (every tensor value and metric is the exact value of a float32, written as a JSON double;
NaN is written null; config scalars such as beta or epsilon are the Python doubles given to GRPOConfig):
    "versions":  {"torch", "transformers", "trl", "python"}
    "settings":  the TRL settings common to all cases (see above)
    "advantages": list of cases {
        "name":             str
        "G":                num_generations (N is a multiple of G; groups are consecutive runs of G completions)
        "scale_rewards":    "group" | "batch" | "none"
        "reward_weights":   [F] floats
        "reward_funcs":     [F] names ("f0", "f1")
        "rewards_per_func": [N][F] floats, null = the reward function returned None
        "advantages":       [N] TRL's advantages (sum_then_normalize)
        "metrics":          {"reward", "reward_std", "frac_reward_zero_std", "rewards/<f>/mean", "rewards/<f>/std"}
    }
    "losses": list of cases {
        "name", "loss_type" ("grpo" | "bnpo" | "dr_grpo" | "dapo"), "beta", "epsilon" (= epsilon_low),
        "epsilon_high" (the GRPOConfig value, null = epsilon), "epsilon_low_eff", "epsilon_high_eff" (trainer
        attributes), "use_bias_correction_kl", "max_completion_length", "num_items_in_batch" (int),
        "gradient_accumulation_steps" (1), "steps_per_generation" (1), "num_iterations" (2 with old, else 1),
        "per_token_logps":     [B][T] floats (negative)
        "old_per_token_logps": [B][T] floats or null (null = absent from inputs -> per_token_logps.detach())
        "ref_per_token_logps": [B][T] floats or null (null when beta == 0)
        "completion_mask":     [B][T] 0/1 ints (right padded; case "*_truncated_row" has an all-zero row, as
                               mask_truncated_completions=True produces)
        "advantages":          [B] floats
        "loss":                float (the returned loss)
        "grad":                [B][T] d loss / d per_token_logps
        "metrics":             {"clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean",
                                "clip_ratio/high_max", "clip_ratio/region_mean"} + "kl" when beta != 0
    }

Deterministic: inputs come from torch.Generator().manual_seed(1000 + case index) (losses) and fixed tables
(advantages); a rerun produces a byte-identical golden.json on the same torch build.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import datasets  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_DIR = ROOT / "tests" / "fixtures" / "dpo" / "model"
OUT = ROOT / "tests" / "fixtures" / "grpo"

MAX_COMPLETION_LENGTH = 10
EPSILON = 0.2
B, T = 6, 7
PROMPT_IDS = [2, 20, 21]
NAN = float("nan")

# ---------------------------------------------------------------------------------------------------------------
# Advantage cases: rewards_per_func [N][F] (NAN = the reward function returns None)
# ---------------------------------------------------------------------------------------------------------------

R_F1_G4 = [  # group 1 has identical rewards (std 0)
    [1.0], [0.0], [0.5], [0.25],
    [0.5], [0.5], [0.5], [0.5],
    [2.0], [-1.0], [0.3], [0.9],
]
R_F2_NAN_G4 = [  # completion 5: every function None; f1 None for some others; group 2 identical after weighting
    [1.0, 0.2], [0.0, NAN], [0.5, 0.8], [0.75, 0.1],
    [0.3, 0.6], [NAN, NAN], [0.9, NAN], [0.1, 0.4],
    [0.5, 1.0], [1.0, 0.0], [0.25, 1.5], [0.75, 0.5],
]
R_F2_EDGE_G3 = [  # group 0: one scorable completion; group 1: none scorable; group 2: f0 None once
    [NAN, NAN], [0.4, -0.5], [NAN, NAN],
    [NAN, NAN], [NAN, NAN], [NAN, NAN],
    [NAN, 1.0], [0.6, 0.2], [-0.3, 0.6],
]
ADV_CASES = [
    dict(name="f1_g4_group", G=4, scale_rewards="group", reward_weights=[1.0], rewards=R_F1_G4),
    dict(name="f1_g4_batch", G=4, scale_rewards="batch", reward_weights=[1.0], rewards=R_F1_G4),
    dict(name="f1_g4_none", G=4, scale_rewards="none", reward_weights=[1.0], rewards=R_F1_G4),
    dict(name="f2_nan_g4_group", G=4, scale_rewards="group", reward_weights=[1.0, 0.5], rewards=R_F2_NAN_G4),
    dict(name="f2_nan_g4_batch", G=4, scale_rewards="batch", reward_weights=[1.0, 0.5], rewards=R_F2_NAN_G4),
    dict(name="f2_nan_g4_none", G=4, scale_rewards="none", reward_weights=[1.0, 0.5], rewards=R_F2_NAN_G4),
    dict(name="f2_edge_g3_group", G=3, scale_rewards="group", reward_weights=[2.0, -1.0], rewards=R_F2_EDGE_G3),
    dict(name="f2_edge_g3_batch", G=3, scale_rewards="batch", reward_weights=[2.0, -1.0], rewards=R_F2_EDGE_G3),
]

# ---------------------------------------------------------------------------------------------------------------
# Loss cases
# ---------------------------------------------------------------------------------------------------------------

LENGTHS = [7, 5, 3, 7, 1, 6]  # completion_mask row lengths (right padding)
ADVANTAGES = [1.25, -0.8, 0.5, -1.5, 0.0, 0.9]


def loss_cases() -> list[dict]:
    cases = []
    for lt in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        cases += [
            dict(name=f"{lt}_onpolicy", loss_type=lt, beta=0.0, epsilon_high=None, old=False, lengths=LENGTHS),
            dict(name=f"{lt}_onpolicy_kl", loss_type=lt, beta=0.04, epsilon_high=None, old=False, lengths=LENGTHS),
            dict(name=f"{lt}_offpolicy", loss_type=lt, beta=0.0, epsilon_high=None, old=True, lengths=LENGTHS),
            dict(name=f"{lt}_offpolicy_kl_eh028", loss_type=lt, beta=0.04, epsilon_high=0.28, old=True,
                 lengths=LENGTHS),
            dict(name=f"{lt}_offpolicy_kl_eh028_nobc", loss_type=lt, beta=0.04, epsilon_high=0.28, old=True,
                 lengths=LENGTHS, bias_correction_kl=False),
        ]
    cases += [
        dict(name="grpo_full_mask_kl_eh028", loss_type="grpo", beta=0.04, epsilon_high=0.28, old=True,
             lengths=[T] * B),
    ]
    cases.append(dict(name="bnpo_negative_adv_low_clip", loss_type="bnpo", beta=0.0, epsilon_high=0.28, old=True,
                      lengths=LENGTHS, old_shift=0.5, advantages=[-1.0, -0.5, -2.0, -0.25, -1.5, -0.75]))
    for lt in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        cases.append(dict(name=f"{lt}_truncated_row", loss_type=lt, beta=0.04, epsilon_high=0.28, old=True,
                          lengths=[7, 0, 4, 7, 2, 6]))
    return cases


def f32(x) -> list:
    """Round python floats (nested lists) to float32 values (kept as python floats)."""
    return torch.tensor(x, dtype=torch.float32).tolist()


def nan_to_none(x):
    if isinstance(x, list):
        return [nan_to_none(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def make_loss_inputs(idx: int, case: dict) -> dict:
    g = torch.Generator().manual_seed(1000 + idx)
    logps = -(0.05 + 2.95 * torch.rand(B, T, generator=g))
    # off-policy: |log ratio| often > log(1.28), so both clip branches fire for both signs of A
    old = logps - 0.45 * torch.randn(B, T, generator=g) if case["old"] else None
    if "old_shift" in case:  # every advantage < 0 and ratios mostly < 1 - epsilon: every row clips low
        old = old + case["old_shift"]
    ref = logps + 0.3 * torch.randn(B, T, generator=g) if case["beta"] != 0.0 else None
    mask = torch.zeros(B, T, dtype=torch.int64)
    for i, n in enumerate(case["lengths"]):
        mask[i, :n] = 1
    adv = torch.tensor(case.get("advantages", ADVANTAGES), dtype=torch.float32)
    return dict(per_token_logps=logps.float(), old_per_token_logps=None if old is None else old.float(),
                ref_per_token_logps=None if ref is None else ref.float(), completion_mask=mask, advantages=adv)


# ---------------------------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------------------------

def make_reward_func(name: str, column: list[float]):
    def reward(prompts, completions, **kwargs):
        assert len(prompts) == len(column)
        return [None if math.isnan(v) else v for v in column]

    reward.__name__ = name
    return reward


def build_trainer(model, tokenizer, tmp: str, reward_funcs, n_prompts: int, **cfg_kwargs) -> GRPOTrainer:
    cfg = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, report_to=[], seed=0, logging_strategy="no",
                     save_strategy="no", gradient_accumulation_steps=1, max_completion_length=MAX_COMPLETION_LENGTH,
                     **cfg_kwargs)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=cfg, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": f"Question {i}:"} for i in range(n_prompts)]))
    trainer.model.train()
    assert trainer.model.training
    assert trainer.args.steps_per_generation == 1 and trainer.accelerator.num_processes == 1
    assert trainer.multi_objective_aggregation == "sum_then_normalize"
    assert trainer.importance_sampling_level == "token" and trainer.args.delta is None
    assert trainer.top_entropy_quantile == 1.0 and trainer.off_policy_mask_threshold is None
    assert not trainer._entropy_bonus_enabled
    assert not trainer.aux_loss_enabled and not trainer.use_vllm and not trainer.mask_truncated_completions
    trainer._metrics["train"].clear()
    return trainer


def metrics_of(trainer, drop=()) -> dict:
    out = {}
    for k, v in trainer._metrics["train"].items():
        if k in drop:
            continue
        assert len(v) == 1, (k, v)
        out[k] = float(v[0])
    return out


def run_advantages(model, tokenizer, tmp: str, case: dict) -> dict:
    rewards = f32(case["rewards"])
    n, G = len(rewards), case["G"]
    n_funcs = len(case["reward_weights"])
    funcs = [make_reward_func(f"f{k}", [r[k] for r in rewards]) for k in range(n_funcs)]
    trainer = build_trainer(model, tokenizer, tmp, funcs, n // G, num_generations=G, per_device_train_batch_size=n,
                            scale_rewards=case["scale_rewards"], reward_weights=case["reward_weights"], beta=0.0)
    eos = trainer.eos_token_ids[0]

    def fixed_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        assert len(prompt_ids) == n and num_generations == G
        return [[10 + i, 11 + i % 3, eos] for i in range(n)], None

    trainer._generate_single_turn = fixed_generation
    inputs = [{"prompt": f"Question {i // G}:"} for i in range(n)]
    with torch.no_grad():
        out = trainer._generate_and_score_completions(inputs)
    assert "old_per_token_logps" not in out and "ref_per_token_logps" not in out
    adv = out["advantages"]
    assert adv.dtype == torch.float32 and adv.shape == (n,)
    metrics = metrics_of(trainer)
    keep = ["reward", "reward_std", "frac_reward_zero_std"]
    keep += [f"rewards/f{k}/{s}" for k in range(n_funcs) for s in ("mean", "std")]
    assert set(keep) <= set(metrics), sorted(metrics)
    return {
        "name": case["name"], "G": G, "scale_rewards": case["scale_rewards"],
        "reward_weights": f32(case["reward_weights"]), "reward_funcs": [f"f{k}" for k in range(n_funcs)],
        "rewards_per_func": nan_to_none(rewards), "advantages": adv.tolist(),
        "metrics": {k: nan_to_none(metrics[k]) for k in keep},
    }


def run_loss(model, tokenizer, tmp: str, idx: int, case: dict) -> dict:
    x = make_loss_inputs(idx, case)
    num_iterations = 2 if case["old"] else 1
    funcs = [make_reward_func("f0", [0.0] * B)]
    trainer = build_trainer(model, tokenizer, tmp, funcs, B // 2, num_generations=2, per_device_train_batch_size=B,
                            loss_type=case["loss_type"], beta=case["beta"], epsilon=EPSILON,
                            epsilon_high=case["epsilon_high"], num_iterations=num_iterations,
                            use_bias_correction_kl=case.get("bias_correction_kl", True))
    assert trainer.loss_type == case["loss_type"] and trainer.beta == case["beta"]
    assert trainer.max_completion_length == MAX_COMPLETION_LENGTH
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' training loop only

    leaf = x["per_token_logps"].clone().requires_grad_(True)

    def injected(model_, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                 compute_aux_loss=False, **kwargs):
        assert logits_to_keep == T and input_ids.shape == (B, len(PROMPT_IDS) + T)
        assert not compute_aux_loss
        return leaf, (torch.zeros(B, T) if compute_entropy else None), None

    trainer._get_per_token_logps_and_entropies = injected
    mask = x["completion_mask"]
    inputs = {
        "prompt_ids": torch.tensor([PROMPT_IDS] * B),
        "prompt_mask": torch.ones(B, len(PROMPT_IDS), dtype=torch.int64),
        "completion_ids": (30 + torch.arange(T)).expand(B, T) * mask,
        "completion_mask": mask,
        "advantages": x["advantages"],
        "num_items_in_batch": mask.sum(),
    }
    if x["old_per_token_logps"] is not None:
        inputs["old_per_token_logps"] = x["old_per_token_logps"]
    if x["ref_per_token_logps"] is not None:
        inputs["ref_per_token_logps"] = x["ref_per_token_logps"]
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    assert loss.dtype == torch.float32 and leaf.grad.dtype == torch.float32
    metrics = metrics_of(trainer, drop=("entropy",))
    expected = {"clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
                "clip_ratio/region_mean"} | ({"kl"} if case["beta"] != 0.0 else set())
    assert set(metrics) == expected, sorted(metrics)

    def lst(t):
        return None if t is None else t.tolist()

    return {
        "name": case["name"], "loss_type": case["loss_type"], "beta": case["beta"], "epsilon": EPSILON,
        "epsilon_high": case["epsilon_high"], "epsilon_low_eff": trainer.epsilon_low,
        "epsilon_high_eff": trainer.epsilon_high, "use_bias_correction_kl": trainer.args.use_bias_correction_kl,
        "max_completion_length": MAX_COMPLETION_LENGTH,
        "num_items_in_batch": int(mask.sum()), "gradient_accumulation_steps": 1, "steps_per_generation": 1,
        "num_iterations": num_iterations,
        "per_token_logps": lst(x["per_token_logps"]), "old_per_token_logps": lst(x["old_per_token_logps"]),
        "ref_per_token_logps": lst(x["ref_per_token_logps"]), "completion_mask": lst(mask),
        "advantages": lst(x["advantages"]), "loss": float(loss), "grad": lst(leaf.grad),
        "metrics": {k: nan_to_none(v) for k, v in metrics.items()},
    }


# ---------------------------------------------------------------------------------------------------------------
# Independent checks (float64)
# ---------------------------------------------------------------------------------------------------------------

def close(a: float | None, b: float, tol: float = 1e-5) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return math.isnan(b)
    return abs(a - b) <= tol * max(1.0, abs(b))


def std1(v: list[float]) -> float:
    """Sample std (Bessel), NaN when fewer than 2 values: TRL's nanstd on the non-NaN values."""
    if len(v) < 2:
        return NAN
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else NAN


def check_advantages(g: dict):
    rpf = [[NAN if v is None else v for v in row] for row in g["rewards_per_func"]]
    w, G, mode = g["reward_weights"], g["G"], g["scale_rewards"]
    n = len(rpf)
    r = []
    for row in rpf:
        if all(math.isnan(v) for v in row):
            r.append(NAN)
        else:
            r.append(sum(wk * v for wk, v in zip(w, row) if not math.isnan(v)))
    valid = [v for v in r if not math.isnan(v)]
    adv, zero_std = [], []
    for i in range(n):
        grp = [v for v in r[i // G * G:(i // G + 1) * G] if not math.isnan(v)]
        std = std1(grp) if mode in ("group", "none") else std1(valid)
        a = r[i] - mean(grp)
        if mode != "none":
            a = a / (std + 1e-4)
        adv.append(0.0 if math.isnan(a) else a)
        zero_std.append(not math.isnan(std) and abs(std) <= 1e-8)
    for a, b in zip(g["advantages"], adv):
        assert close(a, b), (g["name"], g["advantages"], adv)
    exp = {"reward": mean(valid), "reward_std": std1(valid), "frac_reward_zero_std": sum(zero_std) / n}
    for k in range(len(w)):
        col = [row[k] for row in rpf if not math.isnan(row[k])]
        exp[f"rewards/f{k}/mean"], exp[f"rewards/f{k}/std"] = mean(col), std1(col)
    for k, v in exp.items():
        assert close(g["metrics"][k], v), (g["name"], k, g["metrics"][k], v)


def check_loss(c: dict):
    lp = torch.tensor(c["per_token_logps"], dtype=torch.float64, requires_grad=True)
    old = lp.detach() if c["old_per_token_logps"] is None else torch.tensor(c["old_per_token_logps"],
                                                                           dtype=torch.float64)
    m = torch.tensor(c["completion_mask"], dtype=torch.float64)
    A = torch.tensor(c["advantages"], dtype=torch.float64)[:, None]
    lo, hi = 1 - c["epsilon_low_eff"], 1 + c["epsilon_high_eff"]
    ratio = torch.exp(lp - old)
    ptl = -torch.min(ratio * A, torch.clamp(ratio, lo, hi) * A)
    if c["beta"] != 0.0:
        d = torch.tensor(c["ref_per_token_logps"], dtype=torch.float64) - lp
        kl = torch.exp(d) - d - 1
        if c["use_bias_correction_kl"]:
            kl = kl * ratio
        ptl = ptl + c["beta"] * kl
    lt, n_rows = c["loss_type"], m.shape[0]
    if lt == "grpo":
        loss = ((ptl * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    elif lt == "bnpo":
        loss = (ptl * m).sum() / m.sum().clamp(min=1)
    elif lt == "dr_grpo":
        loss = (ptl * m).sum() / (n_rows * c["max_completion_length"])
    else:
        loss = (ptl * m).sum() / max(c["num_items_in_batch"], 1)
    loss.backward()
    assert close(c["loss"], float(loss)), (c["name"], c["loss"], float(loss))
    for a, b in zip(sum(c["grad"], []), lp.grad.flatten().tolist()):
        assert close(a, b), (c["name"], a, b)
    with torch.no_grad():
        r = torch.exp(lp - old)
        low = ((r < lo) & (A < 0)).double()
        high = ((r > hi) & (A > 0)).double()
        rows = m.sum(1) > 0
        exp = {"clip_ratio/low_mean": float((low * m).sum() / m.sum()),
               "clip_ratio/high_mean": float((high * m).sum() / m.sum()),
               "clip_ratio/region_mean": float((((low + high) > 0).double() * m).sum() / m.sum()),
               "clip_ratio/low_min": float(((low * m).sum(1)[rows] / m.sum(1)[rows]).min()),
               "clip_ratio/high_max": float(((high * m).sum(1)[rows] / m.sum(1)[rows]).max())}
        if c["beta"] != 0.0:
            exp["kl"] = float((kl * m).sum() / m.sum())
    for k, v in exp.items():
        assert close(c["metrics"][k], v), (c["name"], k, c["metrics"][k], v)
    if c["old_per_token_logps"] is not None and min(c["advantages"]) < 0 < max(c["advantages"]):
        assert c["metrics"]["clip_ratio/low_mean"] > 0 and c["metrics"]["clip_ratio/high_mean"] > 0, c["name"]
    if c["name"] == "bnpo_negative_adv_low_clip":
        assert c["metrics"]["clip_ratio/low_min"] > 0 and c["metrics"]["clip_ratio/high_mean"] == 0
    if lt == "dapo" and c["beta"] == 0.0 and c["old_per_token_logps"] is None:
        for i, row in enumerate(c["grad"]):
            for t, gv in enumerate(row):
                want = -c["advantages"][i] / c["num_items_in_batch"] if c["completion_mask"][i][t] else 0.0
                assert abs(gv - want) <= 1e-7, (c["name"], i, t, gv, want)


# ---------------------------------------------------------------------------------------------------------------

def write_readme(out: Path, golden: dict):
    v = golden["versions"]
    text = f"""# GRPO fixtures

Written by `tools/make_grpo_fixtures.py` (TRL {v['trl']}, transformers {v['transformers']}, torch {v['torch']}) from
TRL's own `GRPOTrainer` code; see its docstring for every detail. Regenerate with
`tools/.venv/bin/python tools/make_grpo_fixtures.py` (deterministic; needs `tests/fixtures/dpo/model/`).

`golden.json` (floats are exact float32 values as JSON doubles; null = NaN, or None from a reward function):

- `advantages` ({len(golden['advantages'])} cases): `rewards_per_func` [N][F], `reward_weights`, `G`,
  `scale_rewards` (group / batch / none) -> TRL's `advantages` [N] (multi_objective_aggregation
  sum_then_normalize) and logged `metrics` (reward, reward_std, frac_reward_zero_std, rewards/f<k>/mean, /std), from
  `_generate_and_score_completions` with generation and reward functions stubbed.
- `losses` ({len(golden['losses'])} cases, B={B} x T={T}): loss_type grpo / bnpo / dr_grpo / dapo, beta 0 / 0.04,
  epsilon 0.2, epsilon_high null (= 0.2) / 0.28, on-policy (`old_per_token_logps` null) and off-policy;
  `per_token_logps`, `old_per_token_logps`, `ref_per_token_logps`, `completion_mask`, `advantages`,
  `max_completion_length` = {MAX_COMPLETION_LENGTH}, `num_items_in_batch` = mask sum -> `loss`, `grad` = d loss / d
  per_token_logps [B][T], and the clip_ratio/* (+ kl) metrics from `_compute_loss` (log-probs injected).
  `*_truncated_row` cases have an all-zero mask row.

Formulas TRL uses (float32; A_i advantage, m mask, r = exp(logp - old), e_lo/e_hi epsilons):

- rewards R_i = nansum_k w_k r_ik, NaN when every r_ik is None; group mean = nanmean; std = nanstd with Bessel
  correction (n-1; NaN when fewer than 2 values); group/batch: A = (R - mean_group) / (std + 1e-4) with std over
  the group / the whole batch; none: A = R - mean_group; NaN advantages -> 0.
- frac_reward_zero_std = fraction of completions whose std (group std for group/none, batch std for batch) is
  isclose to 0; reward / reward_std = nanmean / nanstd of R over the batch; rewards/f/mean, /std over non-None.
- per-token loss L = -min(r A, clamp(r, 1 - e_lo, 1 + e_hi) A) + beta kl_t, kl_t = (exp(ref - logp) - (ref - logp)
  - 1) * r when `use_bias_correction_kl` (TRL's default; r is differentiable, so even on-policy (r = 1) the KL
  gradient is beta (1 - exp(ref - logp) + kl)), without the factor r in the `*_nobc` cases.
- grpo: mean_i (sum_t L m / max(1, sum_t m)) (a row with no masked token counts as 0 in the mean over B); bnpo:
  sum L m / max(1, sum m); dr_grpo: sum L m / (B * max_completion_length); these three are then divided by the
  gradient accumulation steps (1 here). dapo: sum L m / (max(1, num_items_in_batch) / num_processes * grad_acc /
  steps_per_generation), num_items_in_batch = the mask sum over the whole generation batch and all processes.
- the gradient: min() splits a tie (r inside the clip range, e.g. on-policy) half/half between its two arguments
  and clamp() passes it through inside the range, so on-policy d L / d logp = -A; a clipped branch (r > 1 + e_hi
  with A > 0, r < 1 - e_lo with A < 0) gets no policy gradient. The clip bounds are compared in float32.
- kl = sum(kl_t m) / sum m; clip_ratio/low = r < 1 - e_lo and A < 0; high = r > 1 + e_hi and A > 0; *_mean over all
  masked tokens; low_min / high_max = min / max over rows (rows with no masked token skipped) of the row fraction.
"""
    (out / "README.md").write_text(text, encoding="utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    out = Path(args.out)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1

    golden = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "python": platform.python_version()},
        "settings": {"dtype": "float32", "num_processes": 1, "gradient_accumulation_steps": 1,
                     "steps_per_generation": 1, "multi_objective_aggregation": "sum_then_normalize",
                     "importance_sampling_level": "token", "delta": None, "top_entropy_quantile": 1.0,
                     "off_policy_mask_threshold": None, "entropy_coef": 0.0,
                     "use_vllm": False, "mask_truncated_completions": False, "advantage_std_eps": 1e-4,
                     "max_completion_length": MAX_COMPLETION_LENGTH},
        "advantages": [],
        "losses": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for case in ADV_CASES:
            g = run_advantages(model, tokenizer, tmp, case)
            check_advantages(g)
            golden["advantages"].append(g)
        for idx, case in enumerate(loss_cases()):
            c = run_loss(model, tokenizer, tmp, idx, case)
            check_loss(c)
            golden["losses"].append(c)

    if out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    text = json.dumps(golden, indent=1, sort_keys=True, allow_nan=False) + "\n"
    (out / "golden.json").write_text(text, encoding="utf-8")
    write_readme(out, golden)
    print(f"wrote {out}/golden.json ({len(text)} bytes): {len(golden['advantages'])} advantage cases, "
          f"{len(golden['losses'])} loss cases")


if __name__ == "__main__":
    main()
