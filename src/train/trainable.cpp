#include "train/trainable.h"

#include <regex>

namespace st {

StatusOr<Trainable> TrainableTensors(const ParamRegistry& registry, const std::string& regex) {
  Trainable t;
  t.mask.resize(registry.layout.size());
  if (registry.HasAdapters()) {  // LoRA: the adapters train, the whole base is frozen
    for (int i = 0; i < registry.layout.size(); ++i) {
      t.mask[i] = i >= registry.base_entries || registry.lora_full[static_cast<size_t>(i)];
      if (!t.mask[i]) t.frozen += registry.layout.entry(i).numel;
    }
    return t;
  }
  std::regex freeze;
  try {
    if (!regex.empty()) freeze = std::regex(regex);
  } catch (const std::regex_error&) {
    return InvalidArgument("--freeze '" + regex + "' is not a valid regular expression");
  }
  for (int i = 0; i < registry.layout.size(); ++i) {
    const bool match = !regex.empty() && std::regex_search(registry.layout.entry(i).name, freeze);
    t.mask[i] = !registry.is_buffer[i] && !match;
    if (match) t.frozen += registry.layout.entry(i).numel;
  }
  return t;
}

}  // namespace st
