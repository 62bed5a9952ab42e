#!/usr/bin/env python3
"""Writes tests/fixtures/batching/length_grouped.json: transformers' get_length_grouped_indices (the order
LengthGroupedSampler yields, --group-by-length) on given lengths, with the random permutation it drew.

slicetrain's RNG is not torch's, so its epoch permutation cannot equal torch.randperm's. What can be compared
honestly is the deterministic part: given the same permutation, the mega-batches, the stable sort by decreasing
length within each, and the swap that puts the longest example first. get_length_grouped_indices draws exactly
one torch.randperm(len(lengths), generator=g) before anything else, so a second generator with the same seed
reproduces that permutation; the script checks the output is a rearrangement of it mega-batch by mega-batch.

Each case: {"name", "batch_size", "mega_batch_mult": as passed (null: transformers' default), "megabatch": the
mega-batch size in examples (mult x batch_size; for the default, min(n // (4 x batch_size), 50), at least 1,
checked equal to the default call's output), "lengths", "permutation": the randperm drawn, "expected": the
returned indices}. Lengths are chosen after the permutation in some cases, to put the longest example (or ties
for it) where a case needs it.

Usage: tools/.venv/bin/python tools/make_batching_fixtures.py   (from any directory; byte-identical on rerun)
"""
import json
import os
import random

import torch
import transformers
from transformers.trainer_pt_utils import get_length_grouped_indices

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "batching", "length_grouped.json")


def randperm(n, seed):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def case(name, n, batch_size, seed, lengths_of, mega_batch_mult=None, first_from=None):
    """lengths_of(perm, megabatch) -> lengths; the permutation is the one transformers will draw.
    first_from: the mega-batch the first index must come from (what the case is for)."""
    perm = randperm(n, seed)
    default_mult = max(1, min(n // (batch_size * 4), 50))
    megabatch = (mega_batch_mult or default_mult) * batch_size
    lengths = lengths_of(perm, megabatch)
    got = get_length_grouped_indices(lengths, batch_size, mega_batch_mult=mega_batch_mult,
                                     generator=torch.Generator().manual_seed(seed))
    if mega_batch_mult is None:  # the default mega-batch size is the one recorded
        assert got == get_length_grouped_indices(lengths, batch_size, mega_batch_mult=default_mult,
                                                 generator=torch.Generator().manual_seed(seed)), name
    # The output rearranges the permutation within its mega-batches, except that two of them may
    # trade one example (the longest goes to the front).
    assert sorted(got) == list(range(n))
    moved = [len(set(got[g:g + megabatch]) ^ set(perm[g:g + megabatch])) for g in range(0, n, megabatch)]
    assert all(m in (0, 2) for m in moved) and sum(moved) in (0, 4), (name, moved)
    assert lengths[got[0]] == max(lengths), name
    if first_from is not None:
        assert got[0] in perm[first_from * megabatch:(first_from + 1) * megabatch], name
    return {"name": name, "batch_size": batch_size, "mega_batch_mult": mega_batch_mult, "megabatch": megabatch,
            "lengths": lengths, "permutation": perm, "expected": got}


def uniform(lo, hi, seed):
    def f(perm, mb):
        r = random.Random(seed)
        return [r.randint(lo, hi) for _ in perm]
    return f


def longest_in(groups, seed, lo=1, hi=50, top=80):
    """Uniform lengths, then the value `top` at one position of each listed mega-batch (ties if several)."""
    def f(perm, mb):
        r = random.Random(seed)
        lengths = [r.randint(lo, hi) for _ in perm]
        for g in groups:
            lengths[perm[g * mb + r.randrange(min(mb, len(perm) - g * mb))]] = top
        return lengths
    return f


def main():
    cases = [
        # Default mega-batch (100 // 16 = 6 batches of 4 = 24), a partial last mega-batch of 4.
        case("default_n100_b4", 100, 4, 1, uniform(1, 50, 11)),
        # 50 batches of 2 = 100 per mega-batch (the cap).
        case("default_cap_n1000_b2", 1000, 2, 2, uniform(1, 300, 12)),
        # n < 4 x batch: one batch per mega-batch.
        case("default_tiny_n10_b4", 10, 4, 3, uniform(1, 9, 13)),
        # 37 // 32 = 1: mega-batches of 8, the last of 5.
        case("default_n37_b8", 37, 8, 4, uniform(1, 20, 14)),
        # Many ties (lengths 1..4): the sort must be stable (Python's sorted is).
        case("ties_n200_b3_mult5", 200, 3, 5, uniform(1, 4, 15), mega_batch_mult=5),
        # The longest example alone in mega-batch 3: swapped with mega-batch 0's head.
        case("longest_in_group3", 120, 4, 6, longest_in([3], 16), mega_batch_mult=3, first_from=3),
        # The longest value tied in mega-batches 2 and 4: the first of them (torch.argmax) is swapped.
        case("longest_tied_groups2_4", 120, 4, 7, longest_in([2, 4], 17), mega_batch_mult=3, first_from=2),
        # The longest in mega-batch 0: no swap.
        case("longest_in_group0", 120, 4, 8, longest_in([0], 18), mega_batch_mult=3, first_from=0),
        # The longest in the partial last mega-batch.
        case("longest_in_last_partial", 130, 4, 9, longest_in([10], 19), mega_batch_mult=3, first_from=10),
    ]
    doc = {
        "description": "transformers.trainer_pt_utils.get_length_grouped_indices(lengths, batch_size, "
                       "mega_batch_mult, generator=torch.Generator().manual_seed(seed)); permutation = "
                       "torch.randperm(len(lengths)) from an identically seeded generator (the one it draws); "
                       "written by tools/make_batching_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{os.path.relpath(OUT)}: {len(cases)} cases, {sum(len(c['expected']) for c in cases)} indices")


if __name__ == "__main__":
    main()
