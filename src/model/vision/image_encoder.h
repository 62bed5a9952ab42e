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
#include <unordered_map>
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

// The soft tokens a frozen tower's run keeps per worker (ImageEncoder::EnableCache).
constexpr size_t kSoftTokenCacheBytes = size_t{512} << 20;

class ImageEncoder;
// What a worker holds for the tower once a batch has an image (the memory plan's term,
// train/memory_estimate.h): the tower's and projection's fp32 weights (`p`), one encoder layer's
// forward and backward values for the processor's largest image, the step's soft tokens, and
// either a frozen tower's soft-token cache (its cap) or, with `lora_values` trained values
// (VisionTower::LoraValues, plus the projection's when it trains in full), those values with
// their gradients and two AdamW moments and the
// saved layer inputs of up to `image_tokens` soft tokens (a step's tokens bound them).
double TowerWorkingBytes(const ImageEncoder& e, const TowerParameters& p, int64_t lora_values,
                         int64_t image_tokens);

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
  // The tower, read on first use; mutable for a run that trains adapters on it.
  StatusOr<const VisionTower*> Tower() const;
  StatusOr<VisionTower*> MutableTower();

  // The image decoded (bytes, or the file at its path).
  static StatusOr<images::RgbImage> Decode(const ImageRef& ref);
  // The soft tokens the image becomes (decodes it).
  StatusOr<int64_t> CountSoftTokens(const ImageRef& ref) const;
  // What the chat template renders an image part as, for this model.
  ImageTokens Tokens() const;
  // Every image's soft tokens, image after image: [sum of their counts, text width]. With
  // `saved` (a tower that trains) every ref runs through the tower, repeats and cached ones too,
  // and `saved` receives what VisionTower::Backward needs, in the refs' order.
  StatusOr<std::vector<float>> Encode(std::span<const ImageRef* const> refs,
                                      VisionSaved* saved = nullptr) const;
  // Keeps the soft tokens of up to `bytes` of images, by address, so that a later epoch's batch
  // skips the tower (frozen: the same values). Only for refs that stay where they are while the
  // encoder is used (a TokenizedSet's); 0 (the default) keeps none.
  void EnableCache(size_t bytes) { cache_budget_ = bytes; }
  // A PEFT adapter directory whose tower adapters (if any) the tower takes when it is read
  // (evaluate, generate and chat with --adapter).
  void UseAdapter(const std::string& adapter_dir) { adapter_dir_ = adapter_dir; }
  // Images the tower has run on so far (those the cache served are not counted).
  int64_t tower_images() const { return tower_images_; }

 private:
  ImageEncoder() = default;
  std::string model_dir_, adapter_dir_;
  VisionConfig config_;
  images::ImageProcessorConfig processor_;
  mutable std::unique_ptr<VisionTower> tower_;
  size_t cache_budget_ = 0;
  mutable size_t cache_bytes_ = 0;
  mutable std::unordered_map<const ImageRef*, std::vector<float>> cache_;
  mutable int64_t tower_images_ = 0;
};

}  // namespace st::vision
