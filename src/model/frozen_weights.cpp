#include "model/frozen_weights.h"

#include <algorithm>
#include <string>

namespace st {

bool IsLookupOnly(const ParamRegistry& reg, int entry) {
  return entry >= 0 && (entry == reg.embed_tokens_per_layer || entry == reg.embed_tokens);
}

FrozenWeights::FrozenWeights(const ParamRegistry& reg, const WeightSource& source,
                             std::vector<bool> frozen)
    : reg_(reg),
      source_(source),
      frozen_(std::move(frozen)),
      layer_entries_(reg.layers.size()),
      offset_(reg.layout.size(), -1) {
  ST_CHECK(static_cast<int>(frozen_.size()) == reg.layout.size()) << "frozen has the wrong size";
  int64_t root_total = 0;
  std::vector<int64_t> layer_total(reg.layers.size(), 0);
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (!frozen_[i]) continue;
    const ArenaEntry& e = reg.layout.entry(i);
    if (IsLookupOnly(reg, i)) {
      lookup_entries_.push_back(i);
      lookup_elements_ += e.numel;
      continue;
    }
    const int64_t l = LayerOfName(e.name);
    if (l < 0) {
      root_entries_.push_back(i);
      offset_[i] = root_total;
      root_total += AlignElements(e.numel);
    } else {
      layer_entries_[l].push_back(i);
      offset_[i] = layer_total[l];
      layer_total[l] += AlignElements(e.numel);
    }
  }
  for (int64_t t : layer_total) slot_size_ = std::max(slot_size_, t);
  int64_t all_total = 0;
  for (int64_t t : layer_total) {
    layer_base_.push_back(all_total);
    all_total += t;
  }
  keep_all_ = KeepsAllFrozenLayers(source.Generated(), static_cast<double>(all_total) * 4);
  converted_.assign(reg.layers.size(), false);
  root_ = AlignedBuffer(root_total, "the frozen tensors outside the decoder layers (fp32)");
  for (int i : root_entries_) {
    source_.ReadAll(i, root_.data() + offset_[i]);
    source_.Release(i);
  }
  if (keep_all_ && all_total > 0)
    all_ = AlignedBuffer(all_total, "the decoder layers' frozen tensors (fp32)");
  else if (!keep_all_ && slot_size_ > 0)
    for (AlignedBuffer& s : slots_)
      s = AlignedBuffer(slot_size_, "a decoder layer's frozen tensors (fp32)");
}

void FrozenWeights::Bind(ParamTable* table) {
  table_ = table;
  if (table_->rows.size() != static_cast<size_t>(reg_.layout.size()))
    table_->rows.assign(reg_.layout.size(), nullptr);
  for (int i : root_entries_) table_->param[i] = root_.data() + offset_[i];
  for (int i : lookup_entries_) {
    table_->param[i] = nullptr;
    table_->rows[i] = &source_;
  }
  slot_layer_[0] = slot_layer_[1] = -1;
}

void FrozenWeights::EnterLayer(int64_t layer) {
  const std::vector<int>& entries = layer_entries_[static_cast<size_t>(layer)];
  if (entries.empty() || table_ == nullptr) return;
  if (keep_all_) {
    float* base = all_.data() + layer_base_[static_cast<size_t>(layer)];
    if (!converted_[static_cast<size_t>(layer)])
      for (int i : entries) source_.ReadAll(i, base + offset_[i]);
    converted_[static_cast<size_t>(layer)] = true;
    for (int i : entries) table_->param[i] = base + offset_[i];
    return;
  }
  const int s = static_cast<int>(layer % 2);
  float* slot = slots_[s].data();
  if (slot_layer_[s] != layer) {
    for (int i : entries) {
      source_.ReadAll(i, slot + offset_[i]);
      source_.Release(i);
    }
    slot_layer_[s] = layer;
  }
  for (int i : entries) table_->param[i] = slot + offset_[i];
}

}  // namespace st
