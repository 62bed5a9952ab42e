// LoRA adapters on a vision tower, trained beside the text model's (docs/vision.md, "Training the
// tower: LoRA on its linears"). The tower's adapters are small (rank x (in + out) per linear: 4.6 M
// values on E2B's tower at rank 16), so every rank holds all of them rather than a shard: each step
// their gradients are summed across ranks with one all-reduce (the step's image count rides along),
// clipped with the text shards' global norm, and stepped by the same AdamW, which skips a step in
// which no rank had an image (torch skips a parameter without a gradient). Not the tower's
// forward and backward (model/vision) nor the PEFT adapter file (train/checkpoint.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "model/vision/vision_tower.h"
#include "optim/adamw.h"

namespace st {

class VisionLoraTrainer {
 public:
  // Trains the tower's adapters (enabled with VisionTower::EnableLora, or none) and, with
  // `train_projection`, the projection (model.embed_vision.embedding_projection) in full, as
  // PEFT's modules_to_save: at least one of them. The tower outlives this.
  VisionLoraTrainer(vision::VisionTower* tower, bool train_projection);

  vision::VisionTower& tower() { return *tower_; }
  bool trains_projection() const { return train_projection_; }
  // Trained values (A and B of every adapted linear, the projection's when it trains).
  int64_t parameters() const;
  // Of them, the adapters'.
  int64_t adapter_parameters() const;

  // Every step: ZeroGrad, Backward per micro-batch with images, AllReduce once on every rank,
  // then (after the clipping, which reads SumOfSquares and may Scale) Step.
  void ZeroGrad();
  // Adds the gradients of a micro-batch's images (`saved` by ImageEncoder::Encode) from the
  // soft tokens' gradient d_soft [their soft tokens, text width].
  Status Backward(const vision::VisionSaved& saved, const float* d_soft);
  Status AllReduce(comm::ProcessGroup& pg, const comm::CollectiveOptions& options);
  double SumOfSquares() const;
  void Scale(float coef);
  // AdamW on every adapter when some rank had an image this step; returns whether it stepped.
  bool Step(const AdamWConfig& cfg);
  int64_t steps() const { return steps_; }

  // The trained tensors under PEFT's names ("base_model.model.<module>.lora_A.weight", the
  // projection as "base_model.model.model.embed_vision.embedding_projection.weight"), for
  // adapter_model.safetensors: name, shape, values.
  struct Named {
    std::string name;
    std::vector<int64_t> shape;
    const std::vector<float>* values;
  };
  std::vector<Named> PeftTensors() const;

  // The training state beside a checkpoint's shards (one file, written by rank 0, read by every
  // rank on resume): each adapter with its AdamW moments and the steps taken.
  Status SaveState(const std::string& path) const;
  Status LoadState(const std::string& path);

 private:
  // fn(name, shape, weight, grad, exp_avg, exp_avg_sq) for each trained tensor, its name as
  // PEFT's without "base_model.model." ("<module>.lora_A.weight").
  template <typename Fn>
  void ForEachTrained(Fn&& fn);
  // fn(gradient) for each trained tensor.
  template <typename Fn>
  void ForEachGrad(Fn&& fn) const;

  vision::VisionTower* tower_;
  bool train_projection_ = false;
  vision::VisionTensors grads_, exp_avg_, exp_avg_sq_;
  int64_t images_ = 0;  // this rank's images since ZeroGrad
  bool had_images_ = false;
  int64_t steps_ = 0;
};

// Where a checkpoint keeps VisionLoraTrainer::SaveState's file (rank 0 writes it; the manifest
// lists it).
constexpr const char* kVisionLoraStateFile = "vision_lora_state.safetensors";

}  // namespace st
