// `slicetrain images`: what Gemma 4's image processor makes of image files (src/data/images): the
// decoded size, the size the soft-token budget resizes it to, and its soft tokens, as transformers'
// processor counts them. Checks a data set's images before a run; a file that does not decode is
// the one error line.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/images/image.h"

namespace st::cli {
namespace {

struct ImagesArgs {
  std::vector<std::string> files;
  std::string processor;
  int max_soft_tokens = 0;
  bool json = false;
};

Status Run(const ImagesArgs& a) {
  images::ImageProcessorConfig config;
  if (!a.processor.empty()) {
    ST_ASSIGN_OR_RETURN(config, images::LoadImageProcessorConfig(a.processor));
  }
  if (a.max_soft_tokens > 0) config.max_soft_tokens = a.max_soft_tokens;
  ST_RETURN_IF_ERROR(images::ValidateImageProcessorConfig(config).WithContext("--max-soft-tokens"));
  int64_t total = 0;
  for (const std::string& file : a.files) {
    ST_ASSIGN_OR_RETURN(const images::RgbImage img, images::ReadImageFile(file));
    StatusOr<images::ProcessedImage> out = images::ProcessImage(img, config);
    if (!out.ok()) return out.status().WithContext(file);
    total += out->num_soft_tokens;
    if (a.json) {
      nlohmann::json j = {{"file", file},
                          {"width", img.width},
                          {"height", img.height},
                          {"resized_width", out->width},
                          {"resized_height", out->height},
                          {"patches", out->num_patches},
                          {"soft_tokens", out->num_soft_tokens},
                          {"max_soft_tokens", config.max_soft_tokens}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s: %dx%d -> %dx%d, %d soft tokens of %d (%d patches of %dx%d)\n", file.c_str(),
                  img.width, img.height, out->width, out->height, out->num_soft_tokens,
                  config.max_soft_tokens, out->num_patches, config.patch_size, config.patch_size);
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
