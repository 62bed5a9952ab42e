#include "data/batching.h"

#include <algorithm>
#include <numeric>

#include "core/rng.h"

namespace st {

namespace {

uint64_t EpochSeed(uint64_t seed, int64_t epoch) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1;
}

void Shuffle(std::vector<int64_t>& v, Rng& rng) {
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i)
    std::swap(v[static_cast<size_t>(i)], v[rng.Below(static_cast<uint64_t>(i + 1))]);
}

int64_t RoundUp8(int64_t n, int64_t cap) {
  return std::min(cap, std::max<int64_t>(8, (n + 7) / 8 * 8));
}

}  // namespace

const char* PaddingModeName(PaddingMode mode) {
  return mode == PaddingMode::kMaxLength ? "max_length" : "longest";
}

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  Rng rng(EpochSeed(seed, epoch));
  Shuffle(perm, rng);
  return perm;
}

std::vector<std::vector<int64_t>> EpochBatches(int64_t n, int world, int rank, int64_t batch,
                                               uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm = EpochPermutation(n, seed, epoch);
  const int64_t total = (n + world - 1) / world * world;
  for (int64_t i = n; i < total; ++i) perm.push_back(perm[i - n]);  // pad with the head
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total; i += world) mine.push_back(perm[i]);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s + batch <= static_cast<int64_t>(mine.size()); s += batch)
    out.emplace_back(mine.begin() + s, mine.begin() + s + batch);
  return out;
}

std::vector<int64_t> LengthGroupedOrder(const std::vector<int64_t>& order,
                                        const std::vector<int64_t>& lengths, int64_t megabatch) {
  ST_CHECK_GE(megabatch, 1);
  std::vector<int64_t> out = order;
  const int64_t n = static_cast<int64_t>(out.size());
  auto longer = [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; };
  int64_t longest_group = -1, longest = -1;
  for (int64_t g = 0; g < n; g += megabatch) {
    const auto first = out.begin() + g, last = out.begin() + std::min(n, g + megabatch);
    std::stable_sort(first, last, longer);
    if (lengths[*first] > longest) longest = lengths[*first], longest_group = g;
  }
  // The longest batch first: a run that does not fit fails at its first step.
  if (longest_group > 0) std::swap(out[0], out[static_cast<size_t>(longest_group)]);
  return out;
}

std::vector<std::vector<int64_t>> PackFirstFitDecreasing(const std::vector<int64_t>& order,
                                                         const std::vector<int64_t>& lengths,
                                                         int64_t capacity) {
  std::vector<int64_t> items = order;
  std::stable_sort(items.begin(), items.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  // A max tree over the bins' free space: the first bin with room is found in O(log n). Bins are
  // opened left to right, so the unopened ones (all free) are right of every open one.
  int64_t leaves = 1;
  while (leaves < static_cast<int64_t>(items.size())) leaves *= 2;
  std::vector<int64_t> tree(static_cast<size_t>(2 * leaves), capacity);
  std::vector<std::vector<int64_t>> bins;
  for (int64_t item : items) {
    const int64_t len = lengths[item];
    ST_CHECK(len >= 0 && len <= capacity)
        << "example of " << len << " tokens, rows of " << capacity;
    int64_t node = 1;
    while (node < leaves) node = tree[2 * node] >= len ? 2 * node : 2 * node + 1;
    const int64_t bin = node - leaves;
    if (bin == static_cast<int64_t>(bins.size())) bins.emplace_back();
    bins[static_cast<size_t>(bin)].push_back(item);
    tree[node] -= len;
    for (node /= 2; node >= 1; node /= 2) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
  }
  return bins;
}

std::vector<StepRows> PlanEpoch(const TokenizedSet& set, const BatchingOptions& o, int world,
                                int rank, int64_t epoch) {
  const int64_t n = set.size();
  std::vector<StepRows> steps;
  if (!o.packing && o.padding == PaddingMode::kMaxLength) {
    for (const std::vector<int64_t>& b :
         EpochBatches(n, world, rank, o.batch_size, o.seed, epoch)) {
      StepRows rows;
      for (int64_t i : b) rows.push_back({i});
      steps.push_back(std::move(rows));
    }
    return steps;
  }
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) lengths[static_cast<size_t>(i)] = set.length(i);
  const std::vector<int64_t> perm = EpochPermutation(n, o.seed, epoch);
  const int64_t per_step = o.batch_size * world;
  std::vector<std::vector<int64_t>> units;
  if (o.packing) {
    units = PackFirstFitDecreasing(perm, lengths, o.max_seq_len);
    // Rows in a random order (FFD leaves them longest-first); a stream apart from the
    // permutation's.
    std::vector<int64_t> order(units.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng rng(EpochSeed(o.seed, epoch) ^ 0x5bd1e9955bd1e995ull);
    Shuffle(order, rng);
    std::vector<std::vector<int64_t>> shuffled;
    shuffled.reserve(units.size());
    for (int64_t u : order) shuffled.push_back(std::move(units[static_cast<size_t>(u)]));
    units = std::move(shuffled);
  } else {
    std::vector<int64_t> order = perm;
    if (o.group_by_length) {
      const int64_t mult = std::clamp<int64_t>(n / (per_step * 4), 1, 50);
      order = LengthGroupedOrder(perm, lengths, mult * per_step);
    }
    for (int64_t i : order) units.push_back({i});
  }
  // A step's units go to the ranks in turn: rank r takes units r, r + world, ... of the step.
  const int64_t U = static_cast<int64_t>(units.size());
  for (int64_t s0 = 0; s0 < U; s0 += per_step) {
    StepRows rows;
    for (int64_t k = 0; k < o.batch_size; ++k) {
      const int64_t j = s0 + k * world + rank;
      if (j < U) rows.push_back(units[static_cast<size_t>(j)]);
    }
    steps.push_back(std::move(rows));
  }
  return steps;
}

TokenBatch CollateStep(const TokenizedSet& set, const StepRows& rows, const BatchingOptions& o) {
  if (rows.empty()) {  // a padding row: no token is real, nothing is a target
    TokenBatch b;
    b.B = 1;
    b.T = std::min<int64_t>(8, o.max_seq_len);
    b.input_ids.assign(b.T, o.pad_id);
    b.attention_mask.assign(b.T, 0);
    b.labels.assign(b.T, kIgnoreIndex);
    if (o.packing)
      for (int64_t t = 0; t < b.T; ++t) b.position_ids.push_back(static_cast<int32_t>(t));
    return b;
  }
  if (!o.packing) {
    std::vector<int64_t> flat;
    int64_t longest = 0;
    for (const std::vector<int64_t>& r : rows) {
      ST_CHECK(r.size() == 1) << "a row of " << r.size() << " examples without packing";
      flat.push_back(r[0]);
      longest = std::max(longest, set.length(r[0]));
    }
    const bool max_length = o.padding == PaddingMode::kMaxLength;
    return Collate(set, flat, o.pad_id, max_length && o.pad_left,
                   max_length ? o.max_seq_len : RoundUp8(longest, o.max_seq_len));
  }
  int64_t fullest = 0;
  for (const std::vector<int64_t>& r : rows) {
    int64_t fill = 0;
    for (int64_t i : r) fill += set.length(i);
    fullest = std::max(fullest, fill);
  }
  ST_CHECK(fullest <= o.max_seq_len) << "a packed row of " << fullest << " tokens";
  TokenBatch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = RoundUp8(fullest, o.max_seq_len);
  b.input_ids.assign(b.B * b.T, o.pad_id);
  b.attention_mask.assign(b.B * b.T, 0);
  b.labels.assign(b.B * b.T, kIgnoreIndex);
  b.position_ids.assign(b.B * b.T, 0);
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t t = r * b.T;
    int32_t pos = 0;
    for (int64_t i : rows[static_cast<size_t>(r)]) {
      const int64_t src = set.offsets[i], n = set.length(i);
      for (int64_t k = 0; k < n; ++k, ++t) {
        const int32_t id = set.ids[src + k];
        b.input_ids[t] = id;
        b.attention_mask[t] = 1;
        // The first token of an example is nobody's target: the token before it is another
        // example's last.
        b.labels[t] = k > 0 && set.trained[src + k] ? id : kIgnoreIndex;
        b.position_ids[t] = static_cast<int32_t>(k);
      }
      b.real_tokens += n;
      pos = static_cast<int32_t>(n);
      if (set.has_images())
        for (int64_t k = set.image_offsets[i]; k < set.image_offsets[i + 1]; ++k)
          b.images.push_back(&set.images[static_cast<size_t>(k)]);
    }
    // Padding after the last example continues its positions (it is masked as a key, and its
    // outputs feed nothing a real token sees).
    for (; t < (r + 1) * b.T; ++t) b.position_ids[t] = pos++;
  }
  return b;
}

}  // namespace st
