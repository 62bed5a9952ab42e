// `slicetrain images`: what Gemma 4's image processor makes of image files (src/data/images): the
// decoded size, the size the soft-token budget resizes it to, and its soft tokens, as transformers'
// processor counts them. Checks a data set's images before a run; a file that does not decode is
// the one error line. With --model-id (a model directory with a vision tower) each image also runs
// through the tower (src/model/vision), timed.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/images/image.h"
#include "model/vision/image_encoder.h"

namespace st::cli {
namespace {

struct ImagesArgs {
  std::vector<std::string> files;
  std::string processor, model;
  int max_soft_tokens = 0;
  bool json = false;
};

// Multiply-adds x 2 of one image through the tower and the projection.
double TowerFlops(const vision::VisionConfig& c, int64_t n) {
  const double H = c.hidden_size, D = c.head_dim, heads = c.num_attention_heads,
               kv = c.num_key_value_heads, I = c.intermediate_size;
  const double P = 3.0 * c.patch_size * c.patch_size,
               tokens = double(n) / (c.pooling_kernel_size * c.pooling_kernel_size);
  const double layer =
      2.0 * n * H * (2 * heads * D + 2 * kv * D) + 4.0 * n * n * D * heads + 6.0 * n * H * I;
  return 2.0 * n * P * H + c.num_hidden_layers * layer + 2.0 * tokens * H * c.text_hidden_size;
}

Status Run(const ImagesArgs& a) {
  images::ImageProcessorConfig config;
  std::unique_ptr<vision::ImageEncoder> encoder;
  const vision::VisionTower* tower = nullptr;
  if (!a.model.empty()) {  // the model's tower and processor (or --processor's)
    ST_ASSIGN_OR_RETURN(encoder,
                        vision::ImageEncoder::Load(a.model, a.processor, a.max_soft_tokens));
    ST_ASSIGN_OR_RETURN(tower, encoder->Tower());
    config = encoder->processor();
  } else {
    if (!a.processor.empty()) {
      ST_ASSIGN_OR_RETURN(config, images::LoadImageProcessorConfig(a.processor));
    }
    if (a.max_soft_tokens > 0) config.max_soft_tokens = a.max_soft_tokens;
    ST_RETURN_IF_ERROR(
        images::ValidateImageProcessorConfig(config).WithContext("--max-soft-tokens"));
  }
  int64_t total = 0;
  for (const std::string& file : a.files) {
    ST_ASSIGN_OR_RETURN(const images::RgbImage img, images::ReadImageFile(file));
    StatusOr<images::ProcessedImage> out = images::ProcessImage(img, config);
    if (!out.ok()) return out.status().WithContext(file);
    total += out->num_soft_tokens;
    double seconds = 0, flops = 0, rms = 0;
    if (tower) {
      const auto t0 = std::chrono::steady_clock::now();
      ST_ASSIGN_OR_RETURN(
          const std::vector<float> soft,
          tower->Forward(out->pixel_values.data(), out->positions.data(), 1, out->max_patches));
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      flops = TowerFlops(tower->config(), out->num_patches);
      for (float v : soft) rms += double(v) * v;
      rms = std::sqrt(rms / std::max<size_t>(soft.size(), 1));
    }
    if (a.json) {
      nlohmann::json j = {{"file", file},
                          {"width", img.width},
                          {"height", img.height},
                          {"resized_width", out->width},
                          {"resized_height", out->height},
                          {"patches", out->num_patches},
                          {"soft_tokens", out->num_soft_tokens},
                          {"max_soft_tokens", config.max_soft_tokens}};
      if (tower) {
        j["tower_seconds"] = seconds;
        j["tower_gflops_per_s"] = flops / seconds / 1e9;
        j["soft_token_rms"] = rms;
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s: %dx%d -> %dx%d, %d soft tokens of %d (%d patches of %dx%d)\n", file.c_str(),
                  img.width, img.height, out->width, out->height, out->num_soft_tokens,
                  config.max_soft_tokens, out->num_patches, config.patch_size, config.patch_size);
      if (tower)
        std::printf(
            "  vision tower: %d soft tokens of width %d in %.3f s (%.1f GFLOP/s), rms %.4g\n",
            out->num_soft_tokens, tower->config().text_hidden_size, seconds, flops / seconds / 1e9,
            rms);
    }
  }
  if (!a.json && a.files.size() > 1)
    std::printf("%zu images, %lld soft tokens\n", a.files.size(), static_cast<long long>(total));
  return Status::Ok();
}

}  // namespace

void RegisterImagesCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "images",
      "Decode image files as Gemma 4's processor does and print their resized sizes and soft "
      "tokens");
  auto a = std::make_shared<ImagesArgs>();
  cmd->add_option("files", a->files, "JPEG, PNG or WebP files")->required();
  cmd->add_option("--processor", a->processor,
                  "A model directory (its processor_config.json or preprocessor_config.json) or "
                  "one of those files (default: Gemma 4's processor: patch 16, pooling 3, 280 "
                  "soft tokens)");
  cmd->add_option("--model-id", a->model,
                  "A model directory with a vision tower: its processor config, and each image "
                  "also runs through the tower into soft tokens (timed)");
  cmd->add_option("--max-soft-tokens", a->max_soft_tokens,
                  "The soft-token budget per image: 70, 140, 280, 560 or 1120 (default: the "
                  "processor's)");
  cmd->add_flag("--json", a->json, "One JSON object per image");
  cmd->callback([&ctx, a] {
    Status s = Run(*a);
    if (!s.ok()) ctx.exit_code = ReportError("images", s);
  });
}

}  // namespace st::cli
