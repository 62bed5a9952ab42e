// Gemma 4's vision tower, forward and backward: patches from the image processor
// (src/data/images) to soft tokens in the text model's width, as transformers'
// Gemma4VisionModel + Gemma4MultimodalEmbedder compute them (get_image_features), and the
// gradient of every tower parameter from the soft tokens' gradient (the text engine's
// Batch::soft_tokens_grad). See docs/vision.md, "The vision tower".
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
// only an image's real patches are computed, forward and backward.
//
// LoRA adapters on the tower's linears sit where PEFT puts them: on each Gemma4ClippableLinear's
// inner `.linear` (between its clamps), on the patch embedder's input_proj and on the projection
// (model.embed_vision.embedding_projection); y = x W^T + s (x A^T) B^T. Not the optimizer, the
// adapter files or the tower's sharding (docs/vision.md, "Not done yet").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/lora.h"

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
  bool audio_tower = false;  // the model has an audio tower too (config.json's audio_config)
  // The top level's token ids (Gemma4Config's defaults when absent): the begin marker `<|image>`,
  // the soft-token placeholder `<|image|>` and the end marker `<image|>`.
  int32_t boi_token_id = 255999, image_token_id = 258880, eoi_token_id = 258882;
};

// From a model directory's config.json: NotFound when it has no vision tower (a text-only model,
// or "vision_config": null); errors name the key.
StatusOr<VisionConfig> ReadVisionConfig(const std::string& model_dir);

// The LoRA-able modules of a model directory's vision tower (VisionTower::LinearModules); none
// when it has none (or `model_dir` is not a model directory).
std::vector<std::string> LoraModulesOf(const std::string& model_dir);

// The per-layer intermediate values the tests compare with transformers' (real patches only).
struct VisionTrace {
  std::vector<std::vector<float>> patch_embeddings;     // per image [patches, hidden]
  std::vector<std::vector<std::vector<float>>> layers;  // per layer, per image [patches, hidden]
  std::vector<float> tower;                             // [soft tokens, hidden], all images
};

// The tower's trainable tensors (the clipping bounds and the standardization are buffers), in
// the layout the checkpoint stores them; the weights and, sized alike, their gradients.
struct VisionLayerTensors {
  std::vector<float> input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
  std::vector<float> q, k, v, o, gate, up, down;  // [out, in] as stored
};
struct VisionTensors {
  std::vector<float> input_proj;      // [hidden, 3 * patch^2]
  std::vector<float> position_table;  // [2, position_embedding_size, hidden]
  std::vector<VisionLayerTensors> layers;
  std::vector<float> projection;  // [text hidden, hidden] (model.embed_vision)
  // LoRA per linear (VisionTower::LinearModules' order): A [rank, in], B [out, rank]; empty = none.
  std::vector<std::vector<float>> lora_a, lora_b;
  // Every base tensor with its checkpoint name and shape, in a fixed order, then each adapter
  // ("<module>.lora_A.weight", "<module>.lora_B.weight"), a module's A before its B.
  void ForEach(const VisionConfig& c,
               const std::function<void(const std::string& name, const std::vector<int64_t>& shape,
                                        std::vector<float>& t)>& fn);
  // The same tensors, every one zero (gradients to accumulate into); `base` false leaves the
  // base tensors empty (frozen: Backward computes no gradient for them).
  VisionTensors ZerosLike(bool base = true) const;
};

// What Backward needs of a Forward: per image its real patches' positions and inputs, each
// encoder layer's input, and the pooled values before the projection's norm. Per image about
// (layers + 2) x patches x hidden floats; a layer's other values are recomputed in the backward
// (activation checkpointing per layer).
struct VisionSaved {
  struct Image {
    int64_t patches = 0, columns = 0;
    std::vector<int32_t> positions;            // [patches, 2]
    std::vector<float> input;                  // [patches, 3 * patch^2]: 2 * (pixel - 0.5)
    std::vector<std::vector<float>> layer_in;  // [layers + 1][patches, hidden]: the last is the
                                               // encoder's output
    std::vector<float> pooled;                 // [soft tokens, hidden] before the norm
  };
  std::vector<Image> images;
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
  // `saved` (optional) receives what Backward needs.
  StatusOr<std::vector<float>> Forward(const float* pixel_values, const int32_t* positions,
                                       int images, int max_patches, VisionTrace* trace = nullptr,
                                       VisionSaved* saved = nullptr) const;

  // Adds d(loss)/d(tensor) for every tower tensor into `grads` (VisionTensors::Zeros to start),
  // given d_soft = d(loss)/d(soft tokens) [the Forward's soft tokens, text width]. Clipped
  // linears pass gradient where the clamp did not bind (bounds included, as torch.clamp).
  Status Backward(const VisionSaved& saved, const float* d_soft, VisionTensors* grads) const;

  const VisionTensors& weights() const { return w_; }
  VisionTensors& mutable_weights() { return w_; }

  // The modules LoRA can adapt, in slot order: the patch embedder's input_proj, per layer the
  // seven `.linear`s (q, k, v, o, gate, up, down), the projection. Names as in the checkpoint
  // without ".weight".
  static std::vector<std::string> LinearModules(const VisionConfig& c);
  // Adds adapters of `rank` with scaling s to every module `targets` selects (PEFT's rules: a
  // name matches the end of a module's name at a dot, "all-linear" every one, a regex the whole
  // name): A drawn as PEFT's kaiming_uniform_(a = sqrt(5)) from `seed`, B zero. Returns the
  // selected modules; InvalidArgument when nothing matches (a name of the wrapper such as
  // "q_proj" selects nothing here: its Linear is "q_proj.linear").
  StatusOr<std::vector<std::string>> EnableLora(const LoraTargets& targets, int64_t rank,
                                                double scaling, uint64_t seed);
  // The slots (LinearModules' indices) `targets` select by those rules; none is not an error
  // here. InvalidArgument for a regex that does not compile.
  static StatusOr<std::vector<int>> SelectLoraSlots(const VisionConfig& c,
                                                    const LoraTargets& targets);
  // Whether PEFT's modules_to_save `names` (a name selects each module whose name ends with it)
  // select the projection (model.embed_vision.embedding_projection), the one module of the tower
  // trained in full; InvalidArgument when one selects another tower linear or the audio tower's
  // projection (which PEFT would train too).
  static StatusOr<bool> SavesProjection(const VisionConfig& c,
                                        const std::vector<std::string>& names);
  // What of the tower a PEFT adapter config trains: LoRA on `slots` (SelectLoraSlots of its
  // target_modules) and the projection in full (SavesProjection of its modules_to_save); the
  // errors are theirs.
  struct AdaptedParts {
    std::vector<int> slots;
    bool projection = false;
    bool any() const { return !slots.empty() || projection; }
  };
  static StatusOr<AdaptedParts> PartsOf(const VisionConfig& c, const LoraTargets& targets,
                                        const std::vector<std::string>& modules_to_save);
  // The projection's module name and its tensor in a PEFT adapter file (modules_to_save).
  static constexpr const char* kProjectionModule = "model.embed_vision.embedding_projection";
  // Whether LoadLora replaced the projection with an adapter's trained copy (modules_to_save).
  bool projection_from_adapter() const { return projection_from_adapter_; }
  // Values of rank-`rank` adapters on `slots`: rank x (in + out) each.
  static int64_t LoraValues(const VisionConfig& c, const std::vector<int>& slots, int64_t rank);
  bool has_lora() const { return lora_rank_ > 0; }
  // The tower's adapters of a PEFT adapter directory (what its adapter_config.json targets in the
  // tower, with its rank and scaling, read from adapter_model.safetensors as
  // "base_model.model.<module>.lora_A.weight"), and the projection's trained copy where its
  // modules_to_save selects it ("base_model.model.model.embed_vision.embedding_projection.weight").
  // Returns how many modules it adapts (0: no LoRA in the tower). DataLoss for a targeted module
  // without its tensors.
  StatusOr<int> LoadLora(const std::string& adapter_dir);
  // The slots that carry adapters, in order (none before EnableLora or LoadLora).
  std::vector<int> LoraSlots() const;
  // Linear `slot`'s weight [out, in] with its adapter merged, W + s B A (PEFT's merge): what a
  // merged export writes; W itself where the slot has no adapter.
  std::vector<float> MergedWeight(int slot) const;
  float lora_scaling() const { return lora_scaling_; }
  int64_t lora_rank() const { return lora_rank_; }

 private:
  struct Clip {
    float in_min, in_max, out_min, out_max;
    bool active = false;  // use_clipped_linears (the patch embedder and projection never clip)
  };
  struct LayerClips {
    Clip q, k, v, o, gate, up, down;
  };
  struct Acts;  // one encoder layer's forward values (vision_tower.cpp)
  struct Rope;  // an image's axial RoPE tables
  VisionTower() = default;
  int ProjectionSlot() const { return 7 * cfg_.num_hidden_layers + 1; }
  const std::vector<float>& SlotWeight(int slot) const;  // the base weight of linear `slot`
  // Linear `slot` (LinearModules' order) with its weight w: pre [rows, n_out] = c(x) W^T
  // [+ s (c(x) A^T) B^T], c = clip_in; out = clip_out(pre) (pre may be out).
  void Linear(int slot, const float* x, int64_t rows, int64_t n_in, const std::vector<float>& w,
              int64_t n_out, const Clip& clip, float* pre, float* out) const;
  // dx (= or +=; null: not needed) and the slot's gradients in g (+=; empty tensors skipped) from
  // dy (masked in place by the output clip), given the forward's x and pre.
  void LinearBackward(int slot, const float* x, const float* pre, float* dy, int64_t rows,
                      int64_t n_in, const std::vector<float>& w, int64_t n_out, const Clip& clip,
                      std::vector<float>& dw, VisionTensors& g, float* dx,
                      bool accumulate_dx) const;
  // One encoder layer on h [n, hidden] in place, its values into a.
  void LayerForward(size_t l, const Rope& rope, int64_t n, std::vector<float>& h, Acts& a) const;
  // dh [n, hidden]: d(layer output) in, d(layer input) out; the layer's gradients added into g.
  // h_in is the layer's input, a its LayerForward values.
  void LayerBackward(size_t l, const Rope& rope, int64_t n, const std::vector<float>& h_in,
                     const Acts& a, std::vector<float>& dh, VisionTensors& g) const;

  VisionConfig cfg_;
  VisionTensors w_;
  std::vector<LayerClips> clips_;
  std::vector<float> std_bias_, std_scale_;
  std::vector<float> inv_freq_;  // head_dim / 4 frequencies of the axial RoPE
  int64_t lora_rank_ = 0;
  float lora_scaling_ = 0;
  bool projection_from_adapter_ = false;
};

}  // namespace st::vision
