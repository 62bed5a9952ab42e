// `slicetrain info`: what a model is (config, layer table, parameter counts, memory) without
// running it.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "model/config.h"
#include "model/params.h"

namespace st::cli {

void RegisterInfoCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("info", "Describe a model: config, layers, parameter counts");
  auto model_id = std::make_shared<std::string>("gemma4-tiny");
  cmd->add_option("--model-id", *model_id,
                  "Preset (gemma4-tiny, gemma4-small, gemma4-e2b) or local HF model directory")
      ->capture_default_str();
  cmd->callback([&ctx, model_id] {
    StatusOr<Gemma4Config> cfg = std::filesystem::is_directory(*model_id)
                                     ? LoadGemma4Config(*model_id + "/config.json")
                                     : PresetConfig(*model_id);
    if (!cfg.ok()) {
      ctx.exit_code = ReportError("info", cfg.status());
      return;
    }
    const Gemma4Config& c = *cfg;
    const ParamRegistry reg = BuildParamRegistry(c);
    int64_t total = 0, ple = 0;
    for (int i = 0; i < reg.layout.size(); ++i) {
      total += reg.layout.entry(i).numel;
      if (i == reg.embed_tokens_per_layer) ple = reg.layout.entry(i).numel;
    }
    std::printf("model: %s (%s)\n", model_id->c_str(), c.model_type.c_str());
    std::printf(
        "vocab=%lld hidden=%lld layers=%lld heads=%lld kv_heads=%lld head_dim=%lld/%lld "
        "ple_dim=%lld sliding_window=%lld softcap=%.1f\n",
        (long long)c.vocab_size, (long long)c.hidden_size, (long long)c.num_hidden_layers,
        (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim,
        (long long)c.global_head_dim, (long long)c.hidden_size_per_layer_input,
        (long long)c.sliding_window, c.final_logit_softcapping);
    std::printf("layer  type     head_dim  kv_heads  mlp_width  kv_source\n");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      std::printf("%5lld  %-7s  %8lld  %8lld  %9lld  %9lld\n", (long long)i,
                  c.layer_types[i] == LayerType::kFull ? "full" : "sliding",
                  (long long)c.HeadDim(i), (long long)c.KvHeads(i), (long long)c.MlpWidth(i),
                  (long long)c.KvSourceLayer(i));
    std::printf(
        "parameters: %.3f M total, %.3f M in the per-layer embedding table, %.3f M in "
        "matrix products; fp32 weights %.1f MiB\n",
        total / 1e6, ple / 1e6, reg.MatmulParams() / 1e6, total * 4.0 / (1 << 20));
  });
}

}  // namespace st::cli
