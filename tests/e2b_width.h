// The E2B-width test model: Gemma 4 E2B's widths with 4 layers, written from the preset's seeded
// generator (shared by the load tests and the generation parity test, whose golden file
// tools/make_generate_fixtures.py builds from the same generator).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_model.h"
#include "model/config.h"
#include "model/params.h"
#include "model/weights.h"

namespace st::test {

// A checkpoint at Gemma 4 E2B's widths (vocabulary 262144, hidden 1536, MLP 6144, 8 heads of
// 256/512, per-layer inputs 256) but 4 layers, written in bf16 tensor by tensor from the preset's
// generator (the 1.6 GB file is never whole in memory).
inline std::string WriteE2bWidthCheckpoint(const std::string& dir, Gemma4Config* out) {
  StatusOr<Gemma4Config> c = PresetConfig("gemma4-e2b");
  if (!c.ok()) return c.status().message();
  c->num_hidden_layers = 4;
  c->layer_types = {LayerType::kSliding, LayerType::kSliding, LayerType::kSliding,
                    LayerType::kFull};
  c->num_kv_shared_layers = 0;
  if (Status v = c->Validate(); !v.ok()) return v.message();
  const ParamRegistry reg = BuildParamRegistry(*c);
  const PresetWeights weights(*c, reg, 3);
  auto w = HfModelWriter::Create(dir, *c, reg, std::vector<DType>(reg.layout.size(), DType::kBF16),
                                 DType::kBF16, kDefaultMaxShardBytes);
  if (!w.ok()) return w.status().message();
  AlignedBuffer chunk(int64_t{1} << 24);
  for (int i = 0; i < reg.layout.size(); ++i) {
    const int64_t numel = reg.layout.entry(i).numel;
    for (int64_t j = 0; j < numel; j += chunk.size()) {
      const int64_t n = std::min(chunk.size(), numel - j);
      weights.Read(i, j, n, chunk.data());
      if (Status s = (*w)->AppendF32(i, chunk.data(), n); !s.ok()) return s.message();
    }
  }
  if (Status s = (*w)->Finish(); !s.ok()) return s.message();
  *out = *c;
  return "";
}

}  // namespace st::test
