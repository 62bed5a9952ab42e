// `slicetrain export`: a base model with a LoRA adapter merged into its weights (PEFT's
// merge_and_unload), written as a Hugging Face model directory that transformers loads without
// PEFT, with the adapter's (or the base's) tokenizer beside it. One process, one tensor at a time.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "io/files.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"

namespace st::cli {

namespace {

namespace fs = std::filesystem;

struct ExportArgs {
  std::string model_id, adapter, output, save_dtype, max_shard_size = "5GB";
};

Status Run(const ExportArgs& a) {
  ST_ASSIGN_OR_RETURN(const uint64_t max_shard, ParseByteSize(a.max_shard_size));
  std::error_code ec;
  if (fs::exists(a.output, ec) && !fs::is_empty(a.output, ec))
    return InvalidArgument(
        StrCat("--output ", a.output, " exists and is not empty; name a new directory"));
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(model_id, 42));
  ST_RETURN_IF_ERROR(VerifyChecksumsIfListed(a.adapter, {kAdapterConfigFile, kAdapterWeightsFile})
                         .WithContext("--adapter " + a.adapter));
  ST_RETURN_IF_ERROR(AttachPeftAdapter(&m, a.adapter));
  DType dtype = m.weights->dtype();
  if (!a.save_dtype.empty()) {
    ST_ASSIGN_OR_RETURN(dtype, ParseDTypeFlag(a.save_dtype));
  }
  fs::create_directories(a.output, ec);
  if (ec) return IoError(StrCat("cannot create ", a.output, ": ", ec.message()));
  ST_RETURN_IF_ERROR(WriteMergedModel(m, a.output, dtype, max_shard));
  // The tokenizer: the adapter's (a slicetrain checkpoint has one), else the base's.
  for (const std::string& dir : {a.adapter, model_id}) {
    if (!fs::exists(fs::path(dir) / "tokenizer.json", ec) &&
        !fs::exists(fs::path(dir) / "tokenizer.model", ec))
      continue;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"})
      if (fs::exists(fs::path(dir) / f, ec))
        fs::copy_file(fs::path(dir) / f, fs::path(a.output) / f,
                      fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError(StrCat("cannot copy the tokenizer into ", a.output, ": ", ec.message()));
    break;
  }
  std::printf(
      "Exported %s with the adapter %s merged into %zu tensors (%zu more replaced by its "
      "modules_to_save): %s\n",
      model_id.c_str(), a.adapter.c_str(), m.lora.targets.size(), m.lora.full.size(),
      a.output.c_str());
  return Status::Ok();
}

}  // namespace

void RegisterExportCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand(
      "export", "Merge a LoRA adapter into its base model and write a Hugging Face model");
  cmd->add_option("--model-id", a->model_id, "The base model: HF model directory, hub id or preset")
      ->required();
  cmd->add_option("--adapter", a->adapter, "PEFT adapter directory (a LoRA checkpoint)")
      ->required();
  cmd->add_option("--output", a->output, "New directory for the merged model")->required();
  cmd->add_option("--save-dtype", a->save_dtype,
                  "dtype of the merged tensors: bf16, fp16 or fp32 (default: the base's)");
  cmd->add_option("--max-shard-size", a->max_shard_size, "Largest weight file")
      ->capture_default_str();
  cmd->callback([&ctx, a] {
    Status st = Run(*a);
    if (!st.ok()) ctx.exit_code = ReportError("export", st);
  });
}

}  // namespace st::cli
