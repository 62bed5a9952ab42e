#include "model/weights.h"

#include <algorithm>
#include <cstring>

#include "core/rng.h"

namespace st {

void WeightSource::GatherRows(int entry, const int32_t* ids, int64_t n, float scale,
                              float* out) const {
  const ArenaEntry& e = reg_.layout.entry(entry);
  const int64_t cols = e.shape.size() == 2 ? e.shape[1] : e.numel;
#pragma omp parallel for schedule(dynamic, 16) if (n * cols > (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    float* row = out + r * cols;
    Read(entry, int64_t{ids[r]} * cols, cols, row);
    if (scale != 1.0f)
      for (int64_t c = 0; c < cols; ++c) row[c] *= scale;
  }
}

void WeightSource::ReadAll(int entry, float* dst) const {
  Read(entry, 0, reg_.layout.entry(entry).numel, dst);
}

PresetWeights::PresetWeights(const Gemma4Config& cfg, const ParamRegistry& reg, uint64_t seed)
    : WeightSource(reg),
      init_range_(cfg.initializer_range),
      pad_id_(cfg.pad_token_id),
      seed_(seed) {}

void PresetWeights::Read(int entry, int64_t begin, int64_t count, float* dst) const {
  if (reg_.is_norm[entry] || reg_.is_buffer[entry]) {
    std::fill(dst, dst + count, 1.0f);
    return;
  }
  // One stream per tensor, so adding a tensor never shifts the others' values; a normal value
  // takes two draws, so element j starts at draw 2j.
  const uint64_t base =
      seed_ * 0x100000001b3ull + static_cast<uint64_t>(entry) * 0x9e3779b97f4a7c15ull;
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (count > 2 * kChunk)
  for (int64_t c0 = 0; c0 < count; c0 += kChunk) {
    Rng rng(base);
    rng.Skip(2 * static_cast<uint64_t>(begin + c0));
    const int64_t c1 = std::min(count, c0 + kChunk);
    for (int64_t j = c0; j < c1; ++j) dst[j] = static_cast<float>(rng.Normal() * init_range_);
  }
  if (entry == reg_.embed_tokens || entry == reg_.embed_tokens_per_layer) {
    // The padding row is zero.
    const int64_t row = reg_.layout.entry(entry).shape[1];
    const int64_t p0 = std::max(begin, pad_id_ * row),
                  p1 = std::min(begin + count, (pad_id_ + 1) * row);
    for (int64_t j = p0; j < p1; ++j) dst[j - begin] = 0.0f;
  }
}

void ArenaWeights::Read(int entry, int64_t begin, int64_t count, float* dst) const {
  std::memcpy(dst, arena_ + reg_.layout.entry(entry).offset + begin,
              static_cast<size_t>(count) * sizeof(float));
}

}  // namespace st
