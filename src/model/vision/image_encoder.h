// A multimodal model's images into soft tokens: its image processor (processor_config.json,
// src/data/images) and its vision tower (src/model/vision/vision_tower.h), frozen. What the data
// pipeline asks of a vision model: how many soft tokens an image becomes (the chat template
// writes that many `<|image|>` tokens) and, at each step, the soft tokens of the batch's images
// (the engine places them; model/gemma4.h's Batch::soft_tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/images/image.h"
#include "model/vision/vision_tower.h"

namespace st::vision {

// Parameters of a multimodal checkpoint's parts outside the text model, from its files' headers.
struct TowerParameters {
  int64_t vision = 0, vision_projection = 0;  // model.vision_tower.*, model.embed_vision.*
  int64_t audio = 0, audio_projection = 0;    // model.audio_tower.*, model.embed_audio.*
};
StatusOr<TowerParameters> CountTowerParameters(const std::string& model_dir);

class ImageEncoder {
 public:
  // The model directory's tower and processor: `processor` names another directory (or file)
  // holding processor_config.json; empty = the model's own, and without one Gemma 4's processor
  // with the tower's patch and pooling sizes. `max_soft_tokens` > 0 overrides the budget. NotFound
  // for a model without a vision tower (no vision_config). The tower's weights are read when
  // first needed (Tower, Encode): a text-only run of a multimodal model never holds them.
  static StatusOr<std::unique_ptr<ImageEncoder>> Load(const std::string& model_dir,
                                                      const std::string& processor = "",
                                                      int max_soft_tokens = 0);

  const VisionConfig& config() const { return config_; }
  const images::ImageProcessorConfig& processor() const { return processor_; }
  // The tower, read on first use.
  StatusOr<const VisionTower*> Tower() const;

  // The image decoded (bytes, or the file at its path).
  static StatusOr<images::RgbImage> Decode(const ImageRef& ref);
  // The soft tokens the image becomes (decodes it).
  StatusOr<int64_t> CountSoftTokens(const ImageRef& ref) const;
  // What the chat template renders an image part as, for this model.
  ImageTokens Tokens() const;
  // Every image's soft tokens, image after image: [sum of their counts, text width].
  StatusOr<std::vector<float>> Encode(std::span<const ImageRef* const> refs) const;

 private:
  ImageEncoder() = default;
  std::string model_dir_;
  VisionConfig config_;
  images::ImageProcessorConfig processor_;
  mutable std::unique_ptr<VisionTower> tower_;
};

}  // namespace st::vision
