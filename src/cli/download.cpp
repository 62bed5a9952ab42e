// `slicetrain download`: fetches a model's config, tokenizer and safetensors from the Hugging Face
// hub into the huggingface_hub cache (HF_HOME / HF_HUB_CACHE) and prints the snapshot directory.
#include <cstdio>

#include "cli/commands.h"
#include "io/hub.h"

namespace st::cli {

void RegisterDownloadCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "download",
      "Download a model from the Hugging Face hub into the local cache (honours HF_ENDPOINT, "
      "HF_TOKEN, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE)");
  auto model_id = std::make_shared<std::string>();
  auto revision = std::make_shared<std::string>("main");
  auto cache_dir = std::make_shared<std::string>();
  cmd->add_option("--model-id", *model_id, "Hub model id, org/name")->required();
  cmd->add_option("--revision", *revision, "Branch, tag or commit")->capture_default_str();
  cmd->add_option("--cache-dir", *cache_dir,
                  "Cache directory (default: HF_HUB_CACHE or $HF_HOME/hub)");
  cmd->callback([&ctx, model_id, revision, cache_dir] {
    HubOptions o = HubOptions::FromEnvironment();
    if (!cache_dir->empty()) o.cache_dir = *cache_dir;
    o.log = [](const std::string& line) { std::fprintf(stderr, "download: %s\n", line.c_str()); };
    HubClient client(o);
    auto snap = client.DownloadModel(*model_id, *revision);
    if (!snap.ok()) {
      ctx.exit_code = ReportError("download", snap.status());
      return;
    }
    std::printf("%s\n", snap->c_str());
  });
}

}  // namespace st::cli
