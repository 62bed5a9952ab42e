// The tensors a run does not train (frozen with --freeze, every tensor in `evaluate`, and the
// layer_scalar buffers), made available to the engine without an fp32 copy of the whole set:
// - a frozen embedding table is never copied: the engine takes the rows of each batch from the
//   WeightSource, which converts them from the memory-mapped checkpoint (shared by the processes
//   of a host through the page cache); the tied LM head reads the embeddings a vocabulary block
//   at a time;
// - the frozen tensors of decoder layer l are converted to fp32 when the engine enters the layer
//   (forward or backward), into one of two slots (l % 2), and stay there until layer l + 2 needs
//   the slot, so a forward followed by the backward converts the last layer once;
// - every other frozen tensor (norms, the per-layer projection) is converted once, at
//   construction.
// - a generated source (a preset: every read recomputes the seeded initialisation) whose frozen
//   layers fit in kKeepGeneratedLayersBytes keeps each layer once converted instead of two slots
//   (a preset base under LoRA would otherwise regenerate every layer twice a step).
// Used by FsdpModel for its frozen entries and on its own (as the engine's hooks) by `evaluate`.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/gemma4.h"
#include "model/weights.h"

namespace st {

constexpr double kKeepGeneratedLayersBytes = 512.0 * (1 << 20);
// Whether FrozenWeights keeps every frozen layer: a generated source whose frozen layers take at
// most kKeepGeneratedLayersBytes in fp32 (the memory plan asks the same).
inline bool KeepsAllFrozenLayers(bool generated, double frozen_layer_bytes) {
  return generated && frozen_layer_bytes <= kKeepGeneratedLayersBytes;
}

class FrozenWeights : public ParamHooks {
 public:
  // frozen[i]: entry i is not trained (its values come from `source` unchanged). `source` and
  // `reg` must outlive this object. Entries that are not frozen are left alone.
  FrozenWeights(const ParamRegistry& reg, const WeightSource& source, std::vector<bool> frozen);

  // Points `table`'s frozen entries at their values (root copies, lookup sources); layer entries
  // are pointed at when their layer is entered. The table must stay alive while hooks fire.
  void Bind(ParamTable* table);
  // Converts layer `layer`'s frozen tensors (unless its slot holds them) and points the table at
  // them.
  void EnterLayer(int64_t layer);

  void BeforeForward(int64_t layer, Part part) override {
    if (part == Part::kLayer) EnterLayer(layer);
  }
  void BeforeBackward(int64_t layer, Part part) override {
    if (part == Part::kLayer) EnterLayer(layer);
  }

  // Bytes of fp32 this object holds: the root copies and the two layer slots (or every layer).
  size_t ResidentBytes() const {
    return (root_.size() + (keep_all_ ? all_.size() : 2 * slot_size_)) * sizeof(float);
  }
  // Frozen elements served from the source as rows and blocks (never copied whole).
  int64_t LookupElements() const { return lookup_elements_; }

 private:
  const ParamRegistry& reg_;
  const WeightSource& source_;
  std::vector<bool> frozen_;
  std::vector<std::vector<int>> layer_entries_;  // [layer] frozen entries of the layer
  std::vector<int> root_entries_, lookup_entries_;
  std::vector<int64_t> offset_;  // [entry] offset in root_ or in a slot
  AlignedBuffer root_;
  int64_t slot_size_ = 0;
  AlignedBuffer slots_[2];
  int64_t slot_layer_[2] = {-1, -1};
  bool keep_all_ = false;            // KeepsAllFrozenLayers: every layer in all_, converted once
  AlignedBuffer all_;                // [sum of the layers' frozen elements]
  std::vector<int64_t> layer_base_;  // [layer] where its tensors start in all_
  std::vector<bool> converted_;      // [layer]
  int64_t lookup_elements_ = 0;
  ParamTable* table_ = nullptr;
};

// The registry entries the engine can use straight from a WeightSource when frozen: the
// embedding tables (rows for the lookups, vocabulary blocks for the tied head).
bool IsLookupOnly(const ParamRegistry& reg, int entry);

}  // namespace st
