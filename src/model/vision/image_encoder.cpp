#include "model/vision/image_encoder.h"

#include <algorithm>
#include <filesystem>

#include "io/hf_model.h"
#include "io/safetensors.h"

namespace st::vision {

StatusOr<TowerParameters> CountTowerParameters(const std::string& model_dir) {
  TowerParameters p;
  ST_ASSIGN_OR_RETURN(const std::vector<std::string> files, ModelWeightFiles(model_dir));
  for (const std::string& f : files) {
    ST_ASSIGN_OR_RETURN(const SafeTensorsFile file, SafeTensorsFile::Open(f));
    for (const SafeTensorInfo& t : file.tensors()) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      auto starts = [&](const char* prefix) { return t.name.rfind(prefix, 0) == 0; };
      if (starts("model.vision_tower.")) p.vision += n;
      if (starts("model.embed_vision.")) p.vision_projection += n;
      if (starts("model.audio_tower.")) p.audio += n;
      if (starts("model.embed_audio.")) p.audio_projection += n;
    }
  }
  return p;
}

double TowerWorkingBytes(const ImageEncoder& e, const TowerParameters& p, int64_t lora_values,
                         int64_t image_tokens) {
  const VisionConfig& c = e.config();
  const double f32 = sizeof(float), H = c.hidden_size, I = c.intermediate_size,
               pool = double(c.pooling_kernel_size) * c.pooling_kernel_size,
               P = static_cast<double>(e.processor().max_patches()),
               qkv = double(c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const double weights = f32 * static_cast<double>(p.vision + p.vision_projection);
  // One layer's values (VisionTower::Acts: norms, projections before and after their clamps,
  // per-head norms, attention, the MLP's five [P, I] values) and one head's scores, twice: the
  // backward's gradients are as large.
  const double layer = 2 * f32 * (P * (10 * H + 4 * qkv + 5 * I) + P * P);
  const double soft = f32 * static_cast<double>(image_tokens) * c.text_hidden_size;
  if (lora_values == 0) return weights + layer + soft + static_cast<double>(kSoftTokenCacheBytes);
  // Per soft token pool^2 patches, each with every layer's input, the output, the input pixels.
  const double saved = f32 * static_cast<double>(image_tokens) * pool *
                       ((c.num_hidden_layers + 2) * H + 3.0 * c.patch_size * c.patch_size);
  return weights + layer + 2 * soft + saved + 4 * f32 * static_cast<double>(lora_values);
}

StatusOr<std::unique_ptr<ImageEncoder>> ImageEncoder::Load(const std::string& model_dir,
                                                           const std::string& processor,
                                                           int max_soft_tokens) {
  std::unique_ptr<ImageEncoder> e(new ImageEncoder());
  e->model_dir_ = model_dir;
  ST_ASSIGN_OR_RETURN(e->config_, ReadVisionConfig(model_dir));
  const VisionConfig& c = e->config_;
  std::error_code ec;
  const std::filesystem::path dir(model_dir);
  const bool own = std::filesystem::exists(dir / "processor_config.json", ec) ||
                   std::filesystem::exists(dir / "preprocessor_config.json", ec);
  if (!processor.empty() || own) {
    ST_ASSIGN_OR_RETURN(
        e->processor_, images::LoadImageProcessorConfig(processor.empty() ? model_dir : processor));
  } else {  // Gemma 4's processor with the tower's own patch and pooling
    e->processor_.patch_size = c.patch_size;
    e->processor_.pooling_kernel_size = c.pooling_kernel_size;
  }
  if (c.patch_size != e->processor_.patch_size ||
      c.pooling_kernel_size != e->processor_.pooling_kernel_size)
    return InvalidArgument(StrCat("the processor's patch_size ", e->processor_.patch_size,
                                  " and pooling_kernel_size ", e->processor_.pooling_kernel_size,
                                  " differ from the vision tower's ", c.patch_size, " and ",
                                  c.pooling_kernel_size));
  if (max_soft_tokens > 0) e->processor_.max_soft_tokens = max_soft_tokens;
  ST_RETURN_IF_ERROR(
      images::ValidateImageProcessorConfig(e->processor_).WithContext("--max-soft-tokens"));
  return e;
}

StatusOr<const VisionTower*> ImageEncoder::Tower() const {
  if (!tower_) {
    ST_ASSIGN_OR_RETURN(std::unique_ptr<VisionTower> tower, VisionTower::Load(model_dir_));
    if (!adapter_dir_.empty()) {
      const StatusOr<int> adapted = tower->LoadLora(adapter_dir_);
      if (!adapted.ok()) return adapted.status().WithContext("--adapter " + adapter_dir_);
    }
    tower_ = std::move(tower);
  }
  return tower_.get();
}

StatusOr<VisionTower*> ImageEncoder::MutableTower() {
  ST_RETURN_IF_ERROR(Tower().status());
  return tower_.get();
}

StatusOr<images::RgbImage> ImageEncoder::Decode(const ImageRef& ref) {
  if (ref.bytes.empty()) return images::ReadImageFile(ref.path);
  StatusOr<images::RgbImage> img =
      images::DecodeImage(reinterpret_cast<const uint8_t*>(ref.bytes.data()), ref.bytes.size());
  if (!img.ok() && !ref.path.empty()) return img.status().WithContext(ref.path);
  return img;
}

StatusOr<int64_t> ImageEncoder::CountSoftTokens(const ImageRef& ref) const {
  ST_ASSIGN_OR_RETURN(const images::RgbImage img, Decode(ref));
  const images::ImageProcessorConfig& p = processor_;
  ST_ASSIGN_OR_RETURN(const images::Size size,
                      images::AspectRatioPreservingSize(img.height, img.width, p.patch_size,
                                                        p.max_patches(), p.pooling_kernel_size));
  const int64_t patches = int64_t(size.height / p.patch_size) * int64_t(size.width / p.patch_size);
  return patches / (int64_t(p.pooling_kernel_size) * p.pooling_kernel_size);
}

ImageTokens ImageEncoder::Tokens() const {
  ImageTokens t;
  t.boi = config().boi_token_id;
  t.image = config().image_token_id;
  t.eoi = config().eoi_token_id;
  t.count = [this](const ImageRef& ref) { return CountSoftTokens(ref); };
  return t;
}

StatusOr<std::vector<float>> ImageEncoder::Encode(std::span<const ImageRef* const> refs,
                                                  VisionSaved* saved) const {
  if (saved) saved->images.clear();
  if (refs.empty()) return std::vector<float>();
  // The images the cache does not hold run through the tower together (all of them, in order,
  // when the backward needs their values).
  std::vector<const ImageRef*> run;
  for (const ImageRef* r : refs)
    if (saved || (!cache_.count(r) && std::find(run.begin(), run.end(), r) == run.end()))
      run.push_back(r);
  std::vector<std::vector<float>> fresh(run.size());
  if (!run.empty()) {
    ST_ASSIGN_OR_RETURN(const VisionTower* tower, Tower());
    const int max_patches = processor_.max_patches(), dim = processor_.patch_dim();
    std::vector<float> pixels(run.size() * size_t(max_patches) * dim);
    std::vector<int32_t> positions(run.size() * size_t(max_patches) * 2);
    std::vector<int64_t> counts(run.size());
    for (size_t i = 0; i < run.size(); ++i) {
      ST_ASSIGN_OR_RETURN(const images::RgbImage img, Decode(*run[i]));
      StatusOr<images::ProcessedImage> p = images::ProcessImage(img, processor_);
      if (!p.ok()) return p.status().WithContext(run[i]->path);
      counts[i] = p->num_soft_tokens;
      std::copy(p->pixel_values.begin(), p->pixel_values.end(),
                pixels.begin() + std::ptrdiff_t(i * size_t(max_patches) * dim));
      std::copy(p->positions.begin(), p->positions.end(),
                positions.begin() + std::ptrdiff_t(i * size_t(max_patches) * 2));
    }
    ST_ASSIGN_OR_RETURN(const std::vector<float> soft,
                        tower->Forward(pixels.data(), positions.data(),
                                       static_cast<int>(run.size()), max_patches, nullptr, saved));
    tower_images_ += static_cast<int64_t>(run.size());
    if (saved) return soft;  // run == refs
    const size_t width = static_cast<size_t>(config_.text_hidden_size);
    size_t at = 0;
    for (size_t i = 0; i < run.size(); ++i) {
      const size_t n = static_cast<size_t>(counts[i]) * width;
      fresh[i].assign(soft.begin() + std::ptrdiff_t(at), soft.begin() + std::ptrdiff_t(at + n));
      at += n;
      if (cache_bytes_ + n * sizeof(float) <= cache_budget_ && !tower_->has_lora()) {
        cache_[run[i]] = fresh[i];
        cache_bytes_ += n * sizeof(float);
      }
    }
  }
  std::vector<float> out;
  for (const ImageRef* r : refs) {
    const auto hit = cache_.find(r);
    const std::vector<float>& rows =
        hit != cache_.end()
            ? hit->second
            : fresh[static_cast<size_t>(std::find(run.begin(), run.end(), r) - run.begin())];
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

}  // namespace st::vision
