// Where a model's parameter values come from, tensor by tensor and range by range, so that nothing
// ever has to hold the whole model: an FSDP rank reads only the rows of each tensor its shard owns,
// a frozen tensor is converted one layer at a time, and an embedding table used only as a lookup
// (the per-layer table, 2.35 B of E2B's 4.65 B parameters) gives the rows a batch needs.
// Implementations: PresetWeights (the seeded initialisation, element by element the same values
// for any range), ArenaWeights (an fp32 arena in memory) and, in io/, CheckpointWeights (the
// memory-mapped safetensors files of a model directory, converted on the fly) and GgufWeights (a
// GGUF file's tensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "kernels/cpu/quant.h"
#include "model/config.h"
#include "model/params.h"

namespace st {

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // Elements [begin, begin + count) of registry entry `entry` (row-major), as fp32 into dst.
  // Every range inside the entry is valid: a source checks its whole content when it is built.
  virtual void Read(int entry, int64_t begin, int64_t count, float* dst) const = 0;
  // Rows ids[0..n) of a 2-D entry, each multiplied by `scale`, into out [n, columns].
  virtual void GatherRows(int entry, const int32_t* ids, int64_t n, float scale, float* out) const;

  // An entry's bytes exactly as stored, for copying a tensor that was never trained into a saved
  // checkpoint without converting it; none when the source does not store it (a preset).
  struct Stored {
    const void* data = nullptr;
    size_t bytes = 0;
    DType dtype = DType::kF32;
  };
  virtual std::optional<Stored> StoredBytes(int /*entry*/) const { return std::nullopt; }

  // A hint that elements [begin, begin + count) of `entry` (count < 0: to its end) will not be
  // read again soon: a memory-mapped source drops their pages from this process (they stay in the
  // page cache, shared and reclaimable), so that RSS counts what the process holds, not the file
  // it read from. Default: nothing.
  virtual void Release(int /*entry*/, int64_t /*begin*/ = 0, int64_t /*count*/ = -1) const {}

  // True when values are computed on every read (a preset's seeded initialisation), not converted
  // from stored bytes: reading again costs far more than keeping them (FrozenWeights).
  virtual bool Generated() const { return false; }

  // The element type of most stored weights (F32 for presets): the default save dtype.
  virtual DType dtype() const = 0;
  // An entry stored as rows of one of ggml's types (a GGUF file's tensor), for holding its blocks
  // as they are (DecodeWeights); none when the source does not store ggml rows.
  struct StoredBlocks {
    const uint8_t* data = nullptr;
    GgmlType type = GgmlType::kF32;
  };
  virtual std::optional<StoredBlocks> StoredGgml(int /*entry*/) const { return std::nullopt; }

  // The whole entry (a convenience for small tensors and tests).
  void ReadAll(int entry, float* dst) const;

 protected:
  explicit WeightSource(ParamRegistry reg) : reg_(std::move(reg)) {}
  const ParamRegistry reg_;  // a copy: a source moves with the model that holds it
};

// transformers' initialisation as InitParams describes it, computed for any element range: each
// tensor has its own counter-based random stream, so the value of an element does not depend on
// which range it is read in (a rank's shard gets exactly the values of the full initialisation).
class PresetWeights : public WeightSource {
 public:
  PresetWeights(const Gemma4Config& cfg, const ParamRegistry& reg, uint64_t seed);
  void Read(int entry, int64_t begin, int64_t count, float* dst) const override;
  DType dtype() const override { return DType::kF32; }
  bool Generated() const override { return true; }

 private:
  double init_range_;
  int64_t pad_id_;
  uint64_t seed_;
};

// An fp32 arena in the registry layout, owned elsewhere.
class ArenaWeights : public WeightSource {
 public:
  ArenaWeights(const ParamRegistry& reg, const float* arena) : WeightSource(reg), arena_(arena) {}
  void Read(int entry, int64_t begin, int64_t count, float* dst) const override;
  DType dtype() const override { return DType::kF32; }

 private:
  const float* arena_;
};

}  // namespace st
