#!/usr/bin/env python3
"""Writes the golden files of KV-cached greedy decoding and of the sampling logits processors,
tests/fixtures/generate/{tiny_text,e2b_width,processors}.json, from transformers' own generate() and
logits-processor classes.

- tiny_text.json: Gemma4ForCausalLM tests/fixtures/tiny_text (fp32, sdpa), 4 prompts (lengths 1, 6, 13, 40; bos 2
  then ids uniform in [3, 256), torch.Generator seed 1234), 64 greedy tokens each. Per prompt: "input_ids",
  "generated", "min_margin" (smallest top1 - top2 raw logit over the 64 steps), "logits_first" / "logits_last" (the
  256 raw logits of step 1 and step 64), "top4" (per step, the 4 largest logits: {"ids", "values"}).
- e2b_width.json: slicetrain's preset "gemma4-e2b" cut to 4 layers (S S S F), no kv sharing, with slicetrain's own
  seeded initialisation (PresetWeights, seed 3) reproduced here in numpy, rounded to bf16 (as the C++ test stores
  it) and run in fp32. One prompt: bos 2 then 519 ids uniform in [3, 262144) (torch.Generator seed 5678), 64 greedy
  tokens (positions 520..583, past the 512-token sliding window). Instead of full logits: "top_first" / "top_last",
  the 16 largest logits ({"ids", "values", "values_fp64"}) of step 1 and step 64, and "top4" per step. values_fp64
  are the same logits from an fp64 forward of the same bf16 weights: fp32 rounding alone moves these logits by up to
  ~1e-3, so the C++ side needs a tolerance of ~2e-3 there (1e-4 is enough for tiny_text).
- processors.json: RepetitionPenaltyLogitsProcessor -> TemperatureLogitsWarper -> TopKLogitsWarper ->
  TopPLogitsWarper (generate()'s order, GenerationMixin._get_logits_processor) on V=64 logit vectors.

Greedy decoding: model.generate(do_sample=False, num_beams=1, max_new_tokens=64, min_new_tokens=0,
eos_token_id=None, pad_token_id=0, use_cache=True). transformers 5 fills every None field of the generation config
passed to generate() from model.generation_config (the checkpoint's, which has eos_token_id 1), so eos_token_id=None
alone would not switch eos off: the script also replaces model.generation_config by the same explicit config. It
asserts that exactly 64 tokens come out, that the processed scores equal the raw logits (no processor ran), that each
token is the argmax of its step's logits, and that one forward of the whole sequence without a cache gives the same
logits at every generated step (within 1e-4 for tiny_text, 2e-3 for e2b_width), and for e2b_width that an fp64
forward picks the same tokens.

The e2b weights: element j of registry entry e (src/model/params.cpp BuildParamRegistry order) is
float32(Normal() * 0.02) of an st::Rng (src/core/rng.h: splitmix64, Box-Muller in double) whose state starts at
seed * 0x100000001b3 + e * 0x9e3779b97f4a7c15 (mod 2^64) and is skipped by 2j draws; norms and layer_scalar are 1;
row pad_token_id (0) of both embedding tables is 0. numpy's vectorised log/cos may differ from glibc's by an ulp, so
every element whose double value lies within 2^-40 (relative) of a float32 rounding boundary is recomputed with
Python's math module (glibc, as the C++ side); the count is printed. --verify BIN checks the generator against
slicetrain itself: it runs `BIN finetune --model-id gemma4-tiny --freeze '.*' --max-steps 1` (every tensor frozen,
so the checkpoint holds the preset's initial weights: --lr 0 would mean "default lr") and compares every tensor of
the checkpoint's model.safetensors bit for bit with this generator (seed 42, the finetune default).

Usage (from any directory; ~2.5 min and ~9 GB peak memory on 2 cores, nearly all of it the 0.82 B-parameter e2b
model, loaded once in fp32 and once in fp64; --only tiny_text,processors takes 5-15 s):
    tools/.venv/bin/python tools/make_generate_fixtures.py [--only tiny_text,e2b_width,processors]
        [--verify build/slicetrain] [--threads N]
Byte-identical on rerun with the same torch/transformers (x86-64: ATEN_CPU_CAPABILITY=avx2 is pinned, as in
make_fixtures.py). -inf in processors.json is written as null.
"""

import argparse
import glob
import json
import math
import os
import platform
import resource
import subprocess
import tempfile
import time

if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "generate")
TINY_DIR = os.path.join(ROOT, "tests", "fixtures", "tiny_text")

NEW_TOKENS = 64
S, F = "sliding_attention", "full_attention"


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}


def peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write_json(name, obj):
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)", flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# slicetrain's preset configs and seeded weights (src/model/config.cpp, params.cpp, weights.cpp, core/rng.h)

def preset_config(name):
    """PresetConfig(name) as a dict of Gemma4Config fields (those ToTextJson writes)."""
    c = dict(vocab_size=262144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30, num_attention_heads=8,
             num_key_value_heads=4, head_dim=256, global_head_dim=512, hidden_size_per_layer_input=256,
             vocab_size_per_layer_input=262144, num_kv_shared_layers=0, use_double_wide_mlp=True,
             attention_k_eq_v=False, enable_moe_block=False, tie_word_embeddings=True, sliding_window=512,
             rms_norm_eps=1e-6, final_logit_softcapping=30.0, initializer_range=0.02,
             hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072, pad_token_id=0, eos_token_id=1,
             bos_token_id=2,
             rope_parameters={S: {"rope_type": "default", "rope_theta": 10000.0},
                              F: {"rope_type": "proportional", "rope_theta": 1000000.0,
                                  "partial_rotary_factor": 0.25}})
    if name == "gemma4-tiny":
        c.update(vocab_size=8192, vocab_size_per_layer_input=8192, hidden_size=128, intermediate_size=512,
                 num_hidden_layers=6, layer_types=[S, S, S, F, S, F], num_attention_heads=4, num_key_value_heads=1,
                 head_dim=32, global_head_dim=64, hidden_size_per_layer_input=32, num_kv_shared_layers=2,
                 sliding_window=64, max_position_embeddings=4096)
    elif name == "gemma4-e2b":
        c.update(vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=1536, intermediate_size=6144,
                 num_hidden_layers=35, layer_types=[S, S, S, S, F] * 7, num_attention_heads=8, num_key_value_heads=1,
                 head_dim=256, global_head_dim=512, hidden_size_per_layer_input=256, num_kv_shared_layers=20,
                 sliding_window=512, max_position_embeddings=131072)
    else:
        raise ValueError(name)
    return c


def registry(c):
    """BuildParamRegistry: [(name, shape, kind)] in entry order; kind is 'norm', 'buffer' or 'random'."""
    d, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    P, H = c["hidden_size_per_layer_input"], c["num_attention_heads"]
    first_shared = L - c["num_kv_shared_layers"]
    reg = [("embed_tokens.weight", (V, d), "random")]
    if P > 0:
        reg += [("embed_tokens_per_layer.weight", (V, L * P), "random"),
                ("per_layer_model_projection.weight", (L * P, d), "random"),
                ("per_layer_projection_norm.weight", (P,), "norm")]
    for i in range(L):
        p = f"layers.{i}."
        full = c["layer_types"][i] == F
        D = c["global_head_dim"] if full else c["head_dim"]
        kv = c["num_key_value_heads"]
        shared = i >= first_shared
        Fw = 2 * c["intermediate_size"] if c["use_double_wide_mlp"] and shared else c["intermediate_size"]
        reg += [(p + "input_layernorm.weight", (d,), "norm"),
                (p + "self_attn.q_proj.weight", (H * D, d), "random"),
                (p + "self_attn.q_norm.weight", (D,), "norm")]
        if not shared:
            reg += [(p + "self_attn.k_proj.weight", (kv * D, d), "random"),
                    (p + "self_attn.k_norm.weight", (D,), "norm"),
                    (p + "self_attn.v_proj.weight", (kv * D, d), "random")]
        reg += [(p + "self_attn.o_proj.weight", (d, H * D), "random"),
                (p + "post_attention_layernorm.weight", (d,), "norm"),
                (p + "pre_feedforward_layernorm.weight", (d,), "norm"),
                (p + "mlp.gate_proj.weight", (Fw, d), "random"),
                (p + "mlp.up_proj.weight", (Fw, d), "random"),
                (p + "mlp.down_proj.weight", (d, Fw), "random"),
                (p + "post_feedforward_layernorm.weight", (d,), "norm")]
        if P > 0:
            reg += [(p + "per_layer_input_gate.weight", (P, d), "random"),
                    (p + "per_layer_projection.weight", (d, P), "random"),
                    (p + "post_per_layer_input_norm.weight", (d,), "norm")]
        reg.append((p + "layer_scalar", (1,), "buffer"))
    reg.append(("norm.weight", (d,), "norm"))
    return reg


M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
TWO_PI = 6.283185307179586
RISK = 2.0**-40  # relative distance to a float32 rounding boundary below which an element is recomputed with libm


class NormalStats:
    def __init__(self):
        self.elements = 0
        self.recomputed = 0  # near a float32 boundary: recomputed with Python's math (glibc)
        self.double_diff = 0  # ... of which numpy's double differed from glibc's
        self.float_diff = 0  # ... of which the float32 result differed (numpy alone would have been wrong)


def preset_normals(seed, entry, begin, count, init_range, stats):
    """float32(Rng(base).Skip(2 j).Normal() * init_range) for j in [begin, begin + count)."""
    base = (seed * 0x100000001B3 + entry * GOLDEN) & M64
    g = np.uint64(GOLDEN)
    # draw k (0-based) of the stream returns mix(base + (k + 1) * GOLDEN); element j uses draws 2j and 2j + 1
    k1 = np.arange(2 * begin + 1, 2 * (begin + count) + 1, 2, dtype=np.uint64)
    out = []
    for z in (np.uint64(base) + k1 * g, np.uint64(base) + (k1 + np.uint64(1)) * g):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        out.append((z >> np.uint64(11)).astype(np.float64) * 2.0**-53)
    u1, u2 = out
    np.maximum(u1, 1e-300, out=u1)
    v = np.sqrt(-2.0 * np.log(u1)) * np.cos(TWO_PI * u2) * init_range
    f = v.astype(np.float32)
    risky = np.nonzero((v * (1 - RISK)).astype(np.float32) != (v * (1 + RISK)).astype(np.float32))[0]
    for i in risky.tolist():
        x = math.sqrt(-2.0 * math.log(u1[i])) * math.cos(TWO_PI * u2[i]) * init_range
        xf = np.float32(x)
        stats.double_diff += x != v[i]
        stats.float_diff += xf != f[i]
        f[i] = xf
    stats.elements += count
    stats.recomputed += len(risky)
    return f


def preset_tensor(c, seed, entry, name, shape, kind, stats, chunk=1 << 22):
    n = int(np.prod(shape))
    if kind != "random":
        return np.ones(shape, np.float32)
    t = np.empty(n, np.float32)
    for b in range(0, n, chunk):
        t[b:b + chunk] = preset_normals(seed, entry, b, min(chunk, n - b), c["initializer_range"], stats)
    t = t.reshape(shape)
    if name in ("embed_tokens.weight", "embed_tokens_per_layer.weight"):
        t[c["pad_token_id"]] = 0.0
    return t


def verify_generator(binary):
    """Runs slicetrain's finetune with every tensor frozen and compares its checkpoint with preset_tensor()."""
    with tempfile.TemporaryDirectory(prefix="gen_verify_") as tmp:
        cmd = [binary, "finetune", "--model-id", "gemma4-tiny", "--freeze", ".*", "--max-steps", "1",
               "--no-dashboard", "--progress", "off", "--report-to", "none", "--storage-path", tmp, "--run-name", "v",
               "--num-workers", "1", "--topology", "1", "--threads", "1", "--seed", "42"]
        print("verify:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (st_path,) = glob.glob(os.path.join(tmp, "v", "checkpoint_*", "model.safetensors"))
        c = preset_config("gemma4-tiny")
        stats = NormalStats()
        compared = mismatched = 0
        with safe_open(st_path, "np") as f:
            keys = set(f.keys())
            reg = registry(c)
            want = {"model." + name for name, _, _ in reg}
            assert keys == want, f"tensor names differ: {sorted(keys ^ want)}"
            for e, (name, shape, kind) in enumerate(reg):
                got = f.get_tensor("model." + name)
                assert got.dtype == np.float32 and got.shape == shape, (name, got.dtype, got.shape)
                mine = preset_tensor(c, 42, e, name, shape, kind, stats)
                compared += got.size
                mismatched += int(np.count_nonzero(got.view(np.uint32) != mine.view(np.uint32)))
    print(f"verify: {len(reg)} tensors, {compared} elements compared, {mismatched} not bit-identical; "
          f"{stats.recomputed} elements recomputed with libm ({stats.double_diff} numpy doubles differed, "
          f"{stats.float_diff} float32 values differed)", flush=True)
    if mismatched:
        raise SystemExit("verify: the numpy generator does not reproduce slicetrain's preset weights")
    return {"tensors": len(reg), "elements": compared, "mismatched": mismatched}


# ---------------------------------------------------------------------------------------------------------------------
# greedy decoding

def greedy_generation_config(repetition_penalty=1.0):
    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, min_new_tokens=0,
                            repetition_penalty=repetition_penalty,
                            eos_token_id=None, pad_token_id=0, bos_token_id=2, use_cache=True,
                            output_logits=True, output_scores=True, return_dict_in_generate=True)


@torch.no_grad()
def greedy(model, ids, tol, repetition_penalty=1.0):
    """Greedy-decodes NEW_TOKENS tokens. Returns (generated ids, [NEW_TOKENS, V] raw logits of each step, the same
    logits from one forward of the whole sequence without a cache, the scores the argmax was taken over), after
    checking them against each other. With a repetition penalty (the one processor greedy decoding applies) the
    scores are the penalised logits."""
    gc = greedy_generation_config(repetition_penalty)
    model.generation_config = greedy_generation_config()  # see the docstring: its None fields would otherwise leak in
    inp = torch.tensor([ids], dtype=torch.long)
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc)
    seq = out.sequences[0]
    assert seq.shape[0] == len(ids) + NEW_TOKENS, f"{seq.shape[0] - len(ids)} tokens generated, not {NEW_TOKENS}"
    assert seq[: len(ids)].tolist() == ids
    gen = seq[len(ids):]
    logits = torch.stack([x[0] for x in out.logits]).float()
    scores = torch.stack([x[0] for x in out.scores]).float()
    assert logits.shape[0] == NEW_TOKENS
    if repetition_penalty == 1.0:
        assert torch.equal(logits, scores), "a logits processor changed the scores"
    assert torch.equal(scores.argmax(-1), gen), "a generated token is not its step's argmax"
    # one forward over the whole sequence, no cache: the logits of positions len(ids)-1 .. len(ids)+62
    full = uncached_logits(model, seq)
    diff = (full - logits).abs().max().item()
    print(f"    prompt {len(ids)}: no-cache vs cached logits max |diff| {diff:.3g} (logits max |x| "
          f"{logits.abs().max().item():.3g})", flush=True)
    assert diff <= tol, f"cached and uncached logits differ by {diff}"
    if repetition_penalty == 1.0:
        assert torch.equal(full.argmax(-1), gen), "the uncached forward would pick other tokens"
    return gen.tolist(), logits, full, scores


@torch.no_grad()
def uncached_logits(model, seq):
    return model(seq[None], use_cache=False, logits_to_keep=NEW_TOKENS + 1).logits[0, :NEW_TOKENS]


def margins(logits):
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def top(row, k):
    v, i = row.topk(k)
    return {"ids": i.tolist(), "values": v.tolist()}


def make_tiny_text():
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = Gemma4ForCausalLM.from_pretrained(TINY_DIR, attn_implementation="sdpa", dtype=torch.float32).eval()
    cfg = model.config
    g = torch.Generator().manual_seed(1234)
    prompts = []
    for n in (1, 6, 13, 40):
        ids = [cfg.bos_token_id] + torch.randint(3, cfg.vocab_size, (n - 1,), generator=g).tolist()
        gen, logits, _, _ = greedy(model, ids, tol=1e-4)
        m = margins(logits)
        prompts.append({"input_ids": ids, "generated": gen, "min_margin": min(m),
                        "logits_first": logits[0].tolist(), "logits_last": logits[-1].tolist(),
                        "top4": [top(row, 4) for row in logits]})
        print(f"    prompt {n}: min_margin {min(m):.6g}", flush=True)
    # A random model repeats one token; greedy decoding with a strong repetition penalty (the one processor
    # do_sample=False applies) walks through many, so that the cache is checked on varied sequences.
    for n in (6, 40):
        ids = [cfg.bos_token_id] + torch.randint(3, cfg.vocab_size, (n - 1,), generator=g).tolist()
        gen, logits, _, scores = greedy(model, ids, tol=1e-4, repetition_penalty=3.0)
        m = margins(scores)
        prompts.append({"input_ids": ids, "generated": gen, "repetition_penalty": 3.0, "min_margin": min(m),
                        "logits_first": logits[0].tolist(), "logits_last": logits[-1].tolist(),
                        "top4": [top(row, 4) for row in logits]})
        print(f"    prompt {n} (repetition_penalty 3.0): min_margin {min(m):.6g}, "
              f"{len(set(gen))} distinct tokens", flush=True)
    write_json("tiny_text.json", {
        "description": (
            "Greedy decoding of tests/fixtures/tiny_text (Gemma4ForCausalLM, fp32, sdpa) by transformers' "
            f"model.generate(do_sample=False, max_new_tokens={NEW_TOKENS}, eos_token_id=None, use_cache=True): "
            "no logits processor, never stops early. Per prompt: input_ids (bos 2, then ids uniform in [3, 256)), "
            f"generated (the {NEW_TOKENS} new ids), min_margin (min over the steps of top1 - top2 raw logit), "
            "logits_first / logits_last (all raw, softcapped logits of the first / last generated step, fp32 "
            "values written as doubles), top4 (per step: the 4 largest logits, ids and values, descending). "
            "Cross-checked: one forward of the whole sequence without cache gives the same logits within 1e-4 "
            "(in fact < 1e-5) at every step. The last prompts carry repetition_penalty: generate(do_sample=False, "
            "repetition_penalty=3.0), whose tokens are the argmax of the penalised logits (min_margin is then "
            "over those); their logits_* and top4 are still the raw logits. "
            "Written by tools/make_generate_fixtures.py."),
        "model": "tests/fixtures/tiny_text", "attn_implementation": "sdpa", "max_new_tokens": NEW_TOKENS,
        "versions": versions(), "prompts": prompts})
    print(f"tiny_text: {time.perf_counter() - t0:.1f} s", flush=True)


def e2b_width_config_json():
    """ToTextJson of PresetConfig("gemma4-e2b") with 4 layers (S S S F) and no kv sharing."""
    c = preset_config("gemma4-e2b")
    c.update(num_hidden_layers=4, layer_types=[S, S, S, F], num_kv_shared_layers=0)
    return c


E2B_TOL = 2e-3  # fp32 vs fp64, and cached vs uncached fp32: up to ~1.2e-3 (logits up to ~7.4)


def make_e2b_width(seed=3, prompt_len=520):
    t0 = time.perf_counter()
    c = e2b_width_config_json()
    reg = registry(c)
    stats = NormalStats()
    with tempfile.TemporaryDirectory(prefix="e2b_width_") as tmp:
        tensors = {}
        for e, (name, shape, kind) in enumerate(reg):
            # bf16 round-to-nearest-even of the fp32 values, as the C++ test writes them
            tensors["model." + name] = torch.from_numpy(preset_tensor(c, seed, e, name, shape, kind, stats)).to(
                torch.bfloat16)
        n_params = sum(t.numel() for t in tensors.values())
        print(f"    e2b_width weights: {len(reg)} tensors, {n_params} elements in {time.perf_counter() - t0:.1f} s; "
              f"{stats.recomputed} recomputed with libm ({stats.double_diff} doubles, {stats.float_diff} float32 "
              f"values differed from numpy's); peak RSS {peak_rss_gib():.2f} GiB", flush=True)
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        del tensors
        hf_cfg = Gemma4TextConfig(**c, attention_bias=False, attention_dropout=0.0, use_cache=True)
        _ = hf_cfg.kv_sharing_modes  # raises if the layer types and kv sharing are inconsistent
        hf_cfg.save_pretrained(tmp)

        model = Gemma4ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=torch.float32).eval()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        sd = model.state_dict()
        for name, shape, _ in reg:
            assert tuple(sd["model." + name].shape) == shape, name
        del sd
        print(f"    loaded fp32 model ({sum(p.numel() for p in model.parameters())} parameters), "
              f"peak RSS {peak_rss_gib():.2f} GiB, {time.perf_counter() - t0:.1f} s", flush=True)
        g = torch.Generator().manual_seed(5678)
        ids = [c["bos_token_id"]] + torch.randint(3, c["vocab_size"], (prompt_len - 1,), generator=g).tolist()
        gen, logits, full, _ = greedy(model, ids, tol=E2B_TOL)
        m = margins(logits)
        print(f"    e2b_width: min_margin {min(m):.6g}, peak RSS {peak_rss_gib():.2f} GiB", flush=True)
        del model

        # fp64 reference (same bf16 weights, no cache): how far fp32 arithmetic alone moves the logits
        model = Gemma4ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=torch.float64).eval()
        ref = uncached_logits(model, torch.tensor(ids + gen))
        del model
    d_cached = (logits.double() - ref).abs().max().item()
    d_full = (full.double() - ref).abs().max().item()
    print(f"    e2b_width: fp32 vs fp64 logits max |diff|: cached {d_cached:.3g}, uncached {d_full:.3g}; "
          f"peak RSS {peak_rss_gib():.2f} GiB", flush=True)
    assert max(d_cached, d_full) <= E2B_TOL
    assert torch.equal(ref.argmax(-1), torch.tensor(gen)), "fp64 would pick other tokens"

    def top16(step):
        t = top(logits[step], 16)
        t["values_fp64"] = ref[step, t["ids"]].tolist()
        return t

    top_first, top_last = top16(0), top16(NEW_TOKENS - 1)
    top4s = [top(row, 4) for row in logits]

    def gap(t):
        return min(a - b for a, b in zip(t["values"], t["values"][1:]))

    write_json("e2b_width.json", {
        "description": (
            "Greedy decoding of slicetrain's preset gemma4-e2b cut to 4 layers (S S S F) with "
            "num_kv_shared_layers 0, weights = slicetrain's PresetWeights(seed 3) rounded to bf16 (round to nearest "
            "even), run in fp32 by transformers (Gemma4ForCausalLM, sdpa): model.generate(do_sample=False, "
            f"max_new_tokens={NEW_TOKENS}, eos_token_id=None, use_cache=True). input_ids: bos 2, then ids uniform in "
            f"[3, 262144); {prompt_len} + {NEW_TOKENS} tokens run past the 512-token sliding window. generated: the "
            "new ids; min_margin: min over the steps of top1 - top2 raw logit; top_first / top_last: the 16 largest "
            "raw fp32 logits (ids, values; descending) of the first / last generated step, and values_fp64: the "
            "logits of the same ids from an fp64 forward (same bf16 weights, no cache), the better reference; top4: per "
            "step, the 4 largest fp32 logits (ids, values). "
            "fp32 rounding alone moves these logits (max |x| ~7.4) by up to "
            f"{max(d_cached, d_full):.1e} (cached fp32 vs fp64 {d_cached:.1e}, uncached fp32 vs fp64 {d_full:.1e}; "
            f"cached vs uncached fp32 up to {(logits - full).abs().max().item():.1e}), so compare values with a "
            f"tolerance of about {E2B_TOL:g}. Only rank 1 (the generated token, margin >= min_margin) is robust: "
            "below it neighbouring logits can be closer than that noise (smallest gap between adjacent values: "
            f"top_first {gap(top_first):.1e}, top_last {gap(top_last):.1e}, top4 {min(gap(t) for t in top4s):.1e}), "
            "so compare the logit at each listed id with the listed value rather than the ranking below rank 1. "
            "config: the fields slicetrain's ToTextJson writes. "
            "Written by tools/make_generate_fixtures.py."),
        "preset": "gemma4-e2b", "seed": seed, "weights_dtype": "bfloat16", "compute_dtype": "float32",
        "config": c, "attn_implementation": "sdpa", "max_new_tokens": NEW_TOKENS, "versions": versions(),
        "input_ids": ids, "generated": gen, "min_margin": min(m), "top_first": top_first,
        "top_last": top_last, "top4": top4s})
    print(f"e2b_width: {time.perf_counter() - t0:.1f} s", flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# logits processors

def process(logits, history, penalty, temperature, top_k, top_p, min_tokens_to_keep=1):
    procs = LogitsProcessorList()
    if penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(penalty))
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k != 0:
        procs.append(TopKLogitsWarper(top_k, min_tokens_to_keep=min_tokens_to_keep))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p, min_tokens_to_keep=min_tokens_to_keep))
    scores = torch.tensor([logits], dtype=torch.float32)
    hist = torch.tensor([history], dtype=torch.long)
    return procs(hist, scores.clone())[0]


def top_p_boundary_gap(logits, history, penalty, temperature, top_p):
    """Smallest |cumulative probability (ascending) - (1 - top_p)| over the sorted tokens: how close a top-p
    decision is to flipping (computed in double from the fp32 scores top-p sees)."""
    s = process(logits, history, penalty, temperature, 0, 1.0).double()
    s = s[torch.isfinite(s)]
    cum = torch.sort(s).values.softmax(-1).cumsum(-1)
    return (cum - (1 - top_p)).abs().min().item()


def make_processors():
    V = 64
    g = torch.Generator().manual_seed(4321)
    vectors = [(torch.randn(V, generator=g) * 3).tolist() for _ in range(4)]
    histories = []
    for _ in range(4):
        h = torch.randint(0, V, (7,), generator=g).tolist()
        h = h + [h[0], h[2], h[2]]  # 10 ids with repeats
        histories.append(h)
    # one vector with ties at the top-k boundary (TopKLogitsWarper keeps every score >= the k-th largest)
    tied = list(vectors[0])
    order = sorted(range(V), key=lambda i: -tied[i])
    tied[order[5]] = tied[order[4]]
    tied[order[6]] = tied[order[4]]
    settings = [
        dict(repetition_penalty=1.3),
        dict(temperature=0.7),
        dict(top_k=5),
        dict(top_p=0.9),
        dict(repetition_penalty=1.2, temperature=0.8, top_k=20, top_p=0.95),
        dict(top_k=1),
        dict(top_p=0.0),  # nothing passes top-p: min_tokens_to_keep (1) keeps the best token
        dict(top_p=1e-4),  # below the best token's probability: likewise only min_tokens_to_keep = 1 token
        dict(top_k=64),  # k = V: nothing removed
        dict(top_k=100),  # k > V: clamped to V
        dict(repetition_penalty=0.8),  # < 1 rewards repeats
        dict(temperature=1.7, top_p=0.5),
        dict(repetition_penalty=1.5, top_k=3),  # the penalty changes which tokens are in the top 3
    ]
    cases = []
    min_gap = math.inf
    for vi, (vec, hist) in enumerate(zip(vectors, histories)):
        for s in settings:
            cases.append(dict(logits=vec, history=hist, **s))
    for s in (dict(top_k=5), dict(top_k=6), dict(temperature=0.5, top_k=5)):
        cases.append(dict(logits=tied, history=histories[0], **s))
    out = []
    for c in cases:
        p = dict(repetition_penalty=c.get("repetition_penalty", 1.0), temperature=c.get("temperature", 1.0),
                 top_k=c.get("top_k", 0), top_p=c.get("top_p", 1.0))
        logits = [float(np.float32(x)) for x in c["logits"]]
        res = process(logits, c["history"], p["repetition_penalty"], p["temperature"], p["top_k"], p["top_p"])
        if 0.0 < p["top_p"] < 1.0:
            gap = top_p_boundary_gap(logits, c["history"], p["repetition_penalty"], p["temperature"], p["top_p"])
            min_gap = min(min_gap, gap)
        expected = [x if math.isfinite(x) else None for x in res.tolist()]
        assert all(x is None or math.isfinite(x) for x in expected) and res[torch.isinf(res)].lt(0).all()
        out.append(dict(logits=logits, history=c["history"], **p, min_tokens_to_keep=1, expected=expected,
                        kept=sum(x is not None for x in expected)))
    print(f"    processors: {len(out)} cases; smallest |cumulative probability - (1 - top_p)| {min_gap:.3g}",
          flush=True)
    assert min_gap > 1e-5, "a top-p decision is too close to its threshold for a float32 comparison"
    write_json("processors.json", {
        "description": (
            "transformers' logits processors applied as generate() builds them (GenerationMixin."
            "_get_logits_processor): RepetitionPenaltyLogitsProcessor(repetition_penalty) if != 1.0, then "
            "TemperatureLogitsWarper(temperature) if != 1.0, TopKLogitsWarper(top_k, min_tokens_to_keep) if != 0, "
            "TopPLogitsWarper(top_p, min_tokens_to_keep) if < 1.0; min_tokens_to_keep is 1 (generate's value "
            "without beams), so top_p 0.0 (or below the best token's probability) keeps exactly the best token. "
            "logits: fp32 scores of one step (V = 64, N(0, 3^2), written as doubles); history: the ids so far "
            "(with repeats; the penalty applies once per distinct id: score < 0 ? score * p : score / p); expected: "
            "the processed fp32 scores, removed tokens (-inf) written as null; kept: the number of non-null scores. "
            "Top-k keeps every score >= the k-th largest (ties at the boundary are all kept; the last cases have "
            "ties). Written by tools/make_generate_fixtures.py."),
        "versions": versions(), "cases": out})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="tiny_text,e2b_width,processors")
    ap.add_argument("--verify", metavar="BIN", default=None,
                    help="slicetrain binary: check the numpy preset generator against its gemma4-tiny weights first")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    only = set(filter(None, a.only.split(",")))
    unknown = only - {"tiny_text", "e2b_width", "processors"}
    if unknown:
        ap.error(f"unknown --only names: {sorted(unknown)}")
    t0 = time.perf_counter()
    if a.verify:
        verify_generator(a.verify)
    if "tiny_text" in only:
        make_tiny_text()
    if "processors" in only:
        make_processors()
    if "e2b_width" in only:
        make_e2b_width()
    print(f"done in {time.perf_counter() - t0:.1f} s; peak RSS {peak_rss_gib():.2f} GiB; "
          f"transformers {transformers.__version__} torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
