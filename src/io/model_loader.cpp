#include "io/model_loader.h"

#include <filesystem>

#include "io/files.h"
#include "io/gguf_model.h"
#include "io/hf_model.h"

namespace st {

StatusOr<LoadedModel> LoadModel(const std::string& model_id, uint64_t seed, bool verify_checksums) {
  LoadedModel m;
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_id, ec) && IsGgufFile(model_id))
    return LoadGgufModel(model_id);
  if (std::filesystem::is_directory(model_id, ec)) {
    if (!std::filesystem::exists(std::filesystem::path(model_id) / "config.json", ec) &&
        std::filesystem::exists(std::filesystem::path(model_id) / "adapter_config.json", ec))
      return InvalidArgument(StrCat(
          model_id,
          " is a LoRA adapter (adapter_config.json), not a model: pass its base model as "
          "--model-id and this directory as --adapter (its adapter_config.json names the base "
          "as base_model_name_or_path)"));
    ST_ASSIGN_OR_RETURN(std::vector<std::string> files, ModelWeightFiles(model_id));
    // A slicetrain checkpoint lists the SHA-256 of its files: an altered or truncated one is
    // refused here, before its bytes become weights (a flipped bit inside a tensor still parses).
    std::vector<std::string> listed = {"config.json", "model.safetensors.index.json"};
    for (const std::string& f : files)
      listed.push_back(std::filesystem::path(f).lexically_relative(model_id).string());
    // (Deleting checksums.sha256 is how to use a checkpoint whose files were changed on purpose.)
    if (Status st = verify_checksums ? VerifyChecksumsIfListed(model_id, listed) : Status::Ok();
        !st.ok())
      return Status(st.code(),
                    st.message() + "; --model-id names a damaged checkpoint: use another");
    ST_ASSIGN_OR_RETURN(m.config, LoadGemma4Config(model_id + "/config.json"));
    m.registry = BuildParamRegistry(m.config);
    // Weights take at least a byte each: files far smaller than the config's parameter count
    // cannot hold the model, so say that first (an absurd config would otherwise be reported as
    // its first misshapen tensor, or fail later as an allocation). Small models go on to
    // CheckpointWeights::Open, which names the first missing or misshapen tensor.
    const int64_t total = m.registry.layout.total();
    if (total > (int64_t{1} << 28)) {
      uintmax_t bytes = 0;
      for (const std::string& f : files) {
        const uintmax_t n = std::filesystem::file_size(f, ec);
        if (!ec) bytes += n;
      }
      if (static_cast<uintmax_t>(total) > bytes)
        return DataLoss(StrCat(model_id, "/config.json describes ", total,
                               " parameters but the weight files hold only ", bytes,
                               " bytes; config.json does not match the weights"));
    }
    const std::string index =
        (std::filesystem::path(model_id) / "model.safetensors.index.json").string();
    ST_ASSIGN_OR_RETURN(
        std::unique_ptr<CheckpointWeights> weights,
        CheckpointWeights::Open(files, m.registry,
                                std::filesystem::exists(index, ec) ? index : std::string()));
    m.report = weights->report();
    m.weights = std::move(weights);
    m.source = model_id;
    return m;
  }
  StatusOr<Gemma4Config> preset = PresetConfig(model_id);
  if (!preset.ok()) {
    return NotFound("--model-id '" + model_id +
                    "' is neither a local model directory, a GGUF file nor a preset; " +
                    preset.status().message());
  }
  m.config = std::move(preset).value();
  m.registry = BuildParamRegistry(m.config);
  m.weights = std::make_unique<PresetWeights>(m.config, m.registry, seed);
  m.source = "preset " + model_id + " (seed " + std::to_string(seed) + ")";
  return m;
}

AlignedBuffer MaterializeParams(const LoadedModel& m) {
  AlignedBuffer params(m.registry.layout.total(), "the model's fp32 weights");
  for (int i = 0; i < m.registry.layout.size(); ++i)
    m.weights->ReadAll(i, params.data() + m.registry.layout.entry(i).offset);
  return params;
}

StatusOr<std::string> ResolveModelSource(const std::string& model_id, const HubOptions& hub) {
  std::error_code ec;
  if (std::filesystem::is_directory(model_id, ec) || PresetConfig(model_id).ok() ||
      std::filesystem::is_regular_file(model_id, ec))  // a GGUF file (or a file LoadModel refuses)
    return model_id;
  if (model_id.find('/') == std::string::npos || !ValidateRepoId(model_id).ok()) return model_id;
  HubClient client(hub);
  StatusOr<std::string> snapshot = client.DownloadModel(model_id);
  if (!snapshot.ok()) return snapshot.status().WithContext("--model-id " + model_id);
  return snapshot;
}

}  // namespace st
