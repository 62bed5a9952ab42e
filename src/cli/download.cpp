// `slicetrain download`: fetches a model's config, tokenizer and safetensors, or a data set split's
// files, from the Hugging Face hub into the huggingface_hub cache (HF_HOME / HF_HUB_CACHE) and
// prints the snapshot directory (for a machine that will run offline, HF_HUB_OFFLINE=1).
#include <cstdio>

#include "cli/commands.h"
#include "data/hub_dataset.h"
#include "io/hub.h"

namespace st::cli {

void RegisterDownloadCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "download",
      "Download a model, or a data set's split, from the Hugging Face hub into the local cache "
      "(honours HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE)");
  struct Args {
    std::string model_id, dataset, config, split = "train", revision = "main", cache_dir;
  };
  auto a = std::make_shared<Args>();
  auto* model = cmd->add_option("--model-id", a->model_id, "Hub model id, org/name");
  auto* dataset = cmd->add_option("--dataset", a->dataset, "Hub data set id, org/name");
  model->excludes(dataset);
  cmd->add_option("--dataset-config", a->config, "The data set's config (default: its default)");
  cmd->add_option("--dataset-split", a->split, "The data set split whose files are fetched")
      ->capture_default_str();
  cmd->add_option("--revision", a->revision, "Branch, tag or commit")->capture_default_str();
  cmd->add_option("--cache-dir", a->cache_dir,
                  "Cache directory (default: HF_HUB_CACHE or $HF_HOME/hub)");
  cmd->callback([&ctx, a] {
    HubOptions o = HubFromEnvironment();
    if (!a->cache_dir.empty()) o.cache_dir = a->cache_dir;
    if (a->model_id.empty() == a->dataset.empty()) {
      ctx.exit_code = ReportError("download", InvalidArgument("give --model-id or --dataset"));
      return;
    }
    if (!a->dataset.empty()) {
      if (!IsHubDatasetId(a->dataset)) {
        ctx.exit_code = ReportError(
            "download", InvalidArgument(StrCat("--dataset ", a->dataset,
                                               " is a local path or not a hub id (org/name)")));
        return;
      }
      auto src = ResolveDatasetSource(a->dataset, a->config, a->revision, a->split, o);
      if (!src.ok()) {
        ctx.exit_code = ReportError("download", src.status());
        return;
      }
      std::printf("%s\n", src->path.c_str());
      return;
    }
    HubClient client(o);
    auto snap = client.DownloadModel(a->model_id, a->revision);
    if (!snap.ok()) {
      ctx.exit_code = ReportError("download", snap.status());
      return;
    }
    std::printf("%s\n", snap->c_str());
  });
}

}  // namespace st::cli
