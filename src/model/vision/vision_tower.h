// Gemma 4's vision tower, forward (inference): patches from the image processor
// (src/data/images) to soft tokens in the text model's width, as transformers'
// Gemma4VisionModel + Gemma4MultimodalEmbedder compute them (get_image_features). See
// docs/vision.md, "The vision tower".
//
//   patch embedding  Linear(2 * (pixels - 0.5)) + a learned x and y position embedding
//   encoder layers   pre/post RMSNorm around bidirectional attention (scale 1, per-head RMSNorm
//                    of q and k with weights and of v without, axial 2-D RoPE: the first half of
//                    each head rotated by the patch's column, the second by its row; padding
//                    patches masked as keys) and a gelu-tanh gated MLP; every linear optionally
//                    clamps its input and output (use_clipped_linears)
//   pooling          the mean of each pooling x pooling block of patches, times sqrt(hidden);
//                    then (h - std_bias) * std_scale when `standardize`
//   projection       RMSNorm without weights, then Linear into the text width
//
// Padding patches never reach a real patch (they are masked keys, and pooling drops them), so
// only an image's real patches are computed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace st::vision {

// config.json's "vision_config" (Gemma4VisionConfig), plus the text width it projects into.
struct VisionConfig {
  int hidden_size = 768;
  int intermediate_size = 3072;
  int num_hidden_layers = 16;
  int num_attention_heads = 12;
  int num_key_value_heads = 12;
  int head_dim = 64;
  int patch_size = 16;
  int position_embedding_size = 10240;
  int pooling_kernel_size = 3;
  double rms_norm_eps = 1e-6;
  double rope_theta = 100.0;
  bool use_clipped_linears = false;
  bool standardize = false;
  int text_hidden_size = 0;
  // The top level's token ids (Gemma4Config's defaults when absent): the begin marker `<|image>`,
  // the soft-token placeholder `<|image|>` and the end marker `<image|>`.
  int32_t boi_token_id = 255999, image_token_id = 258880, eoi_token_id = 258882;
};

// From a model directory's config.json: NotFound when it has no vision tower (a text-only model,
// or "vision_config": null); errors name the key.
StatusOr<VisionConfig> ReadVisionConfig(const std::string& model_dir);

// The per-layer intermediate values the tests compare with transformers' (real patches only).
struct VisionTrace {
  std::vector<std::vector<float>> patch_embeddings;     // per image [patches, hidden]
  std::vector<std::vector<std::vector<float>>> layers;  // per layer, per image [patches, hidden]
  std::vector<float> tower;                             // [soft tokens, hidden], all images
};

class VisionTower {
 public:
  // Reads the tower's and the projection's tensors (model.vision_tower.*, model.embed_vision.*)
  // from the directory's safetensors files as fp32.
  static StatusOr<std::unique_ptr<VisionTower>> Load(const std::string& model_dir);

  const VisionConfig& config() const { return cfg_; }

  // pixel_values [images, max_patches, 3 * patch^2] and positions [images, max_patches, 2]
  // ((column, row), (-1, -1) for padding) as the processor makes them. Returns the soft tokens
  // [sum over images of real patches / pooling^2, text width], image after image; `trace`
  // (optional) receives the intermediate values.
  StatusOr<std::vector<float>> Forward(const float* pixel_values, const int32_t* positions,
                                       int images, int max_patches,
                                       VisionTrace* trace = nullptr) const;

 private:
  struct Clip {
    float in_min, in_max, out_min, out_max;
  };
  struct Layer {
    std::vector<float> input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
    std::vector<float> q, k, v, o, gate, up, down;  // [out, in] as stored
    Clip clip_q, clip_k, clip_v, clip_o, clip_gate, clip_up, clip_down;
  };
  VisionTower() = default;
  // out [rows, n_out] = clip(clip(x [rows, n_in]) W^T)
  void Linear(const float* x, int64_t rows, int64_t n_in, const std::vector<float>& w,
              int64_t n_out, const Clip& clip, float* out) const;
  void Encode(std::vector<float>& h, const std::vector<int32_t>& pos, int64_t n, VisionTrace* trace,
              int image) const;

  VisionConfig cfg_;
  std::vector<float> input_proj_;      // [hidden, 3 * patch^2]
  std::vector<float> position_table_;  // [2, position_embedding_size, hidden]
  std::vector<Layer> layers_;
  std::vector<float> std_bias_, std_scale_;
  std::vector<float> projection_;  // [text hidden, hidden]
  std::vector<float> inv_freq_;    // head_dim / 4 frequencies of the axial RoPE
};

}  // namespace st::vision
