// Which examples each rank trains on at each step of an epoch, and how they become rows
// (--padding, --group-by-length, --packing). Every choice is a function of (seed, epoch), the same
// on every rank, so a resumed run redoes exactly the steps it lost.
//
// - max_length (the seed's): DistributedSampler(shuffle) + DataLoader(drop_last): the permutation
//   padded with its head to a multiple of the world, the last partial batch dropped; every row
//   padded to --max-seq-len.
// - longest: every example exactly once an epoch (the last step may be partial; a rank left
//   without an example runs one padding row with no target, so that the collectives line up);
//   each rank's batch padded to its longest example, rounded up to a multiple of 8.
//   --group-by-length orders the permutation as transformers' LengthGroupedSampler does: mega
//   batches of up to 50 steps' examples, each sorted by length (longest first), the longest batch
//   first; a step's examples go to the ranks in turn, so ranks wait little for each other.
// - packing: examples packed into rows of --max-seq-len tokens by greedy first-fit-decreasing
//   (examples in the epoch's order, stably sorted by length) and the rows shuffled; each packed
//   example keeps its own positions and attention (Batch::position_ids), so its loss and gradients
//   are those of the example alone. Every example exactly once an epoch.
#pragma once

#include <cstdint>
#include <vector>

#include "data/collate.h"

namespace st {

enum class PaddingMode { kMaxLength, kLongest };

struct BatchingOptions {
  int64_t max_seq_len = 512;
  int64_t batch_size = 1;  // rows per rank and step
  bool packing = false;
  PaddingMode padding = PaddingMode::kLongest;  // without packing
  bool group_by_length = false;
  bool pad_left = false;  // max_length only
  int32_t pad_id = 0;
  uint64_t seed = 0;
};

// One rank's rows of one step; a row lists the examples laid one after another in it (one unless
// packing). No row: the rank has no example this step.
using StepRows = std::vector<std::vector<int64_t>>;

// DistributedSampler(shuffle=True, drop_last=False) + DataLoader(drop_last=True): the example
// indices of rank's batches in an epoch, reshuffled from (seed, epoch); the permutation is padded
// with its head to a multiple of world, and the last partial batch is dropped.
std::vector<std::vector<int64_t>> EpochBatches(int64_t num_examples, int world, int rank,
                                               int64_t batch, uint64_t seed, int64_t epoch);

// The epoch's permutation of n examples (what EpochBatches deals out).
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// transformers' get_length_grouped_indices over `order`: mega batches of `megabatch` examples,
// each sorted by decreasing length (stable), the mega batch holding the longest example first.
std::vector<int64_t> LengthGroupedOrder(const std::vector<int64_t>& order,
                                        const std::vector<int64_t>& lengths, int64_t megabatch);

// Greedy first-fit-decreasing: the examples of `order` (stably sorted by decreasing length) into
// bins of `capacity` tokens, each bin in placement order. Lengths must be <= capacity.
std::vector<std::vector<int64_t>> PackFirstFitDecreasing(const std::vector<int64_t>& order,
                                                         const std::vector<int64_t>& lengths,
                                                         int64_t capacity);

// Rank's steps of the epoch.
std::vector<StepRows> PlanEpoch(const TokenizedSet& set, const BatchingOptions& options, int world,
                                int rank, int64_t epoch);

// The batch of one step's rows: padded per the options (one padding row when `rows` is empty);
// packed rows get position ids that restart with each example, and the first token of each
// example after the first is not a target of the token before it.
TokenBatch CollateStep(const TokenizedSet& set, const StepRows& rows,
                       const BatchingOptions& options);

const char* PaddingModeName(PaddingMode mode);

}  // namespace st
