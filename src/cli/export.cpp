// `slicetrain export`: a model, or a base with a LoRA adapter merged into its weights (PEFT's
// merge_and_unload), written as a Hugging Face model directory that transformers loads without
// PEFT (--format hf, with the adapter's or the base's tokenizer beside it) or as one GGUF file for
// llama.cpp and Ollama (--format gguf, io/gguf_export.h). One process, one tensor at a time.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "io/files.h"
#include "io/gguf_export.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "model/vision/vision_tower.h"
#include "train/step_metrics.h"

namespace st::cli {

namespace {

// An adapter that also trained the vision tower (LoRA on its linears): a GGUF file holds the
// text model only (llama.cpp keeps a vision tower in a separate mmproj file, which slicetrain
// does not write), so say that those adapters stay behind.
void NoteTowerAdapters(const std::string& model_id, const std::string& adapter) {
  if (adapter.empty()) return;
  StatusOr<vision::VisionConfig> c = vision::ReadVisionConfig(model_id);
  StatusOr<PeftAdapterConfig> a = ReadPeftAdapterConfig(adapter);
  if (!c.ok() || !a.ok()) return;
  StatusOr<vision::VisionTower::AdaptedParts> parts =
      vision::VisionTower::PartsOf(*c, a->targets, a->modules_to_save);
  if (!parts.ok() || !parts->any()) return;
  const std::string what =
      parts->slots.empty() ? std::string("trained vision projection")
                           : StrCat("LoRA on ", parts->slots.size(), " vision tower linears",
                                    parts->projection ? " and its trained vision projection" : "");
  std::fprintf(stderr,
               "Note: the adapter's %s is not in this GGUF file: it holds the text model "
               "(llama.cpp reads a vision tower from a separate mmproj file); --format hf exports "
               "the whole model with them merged\n",
               what.c_str());
}

namespace fs = std::filesystem;

struct ExportArgs {
  // Empty means not given: each format refuses the other's options rather than ignore them.
  std::string model_id, adapter, output, save_dtype, max_shard_size;
  std::string format = "hf", quant, tokenizer, data_dir, name;
  bool ollama = false;
};

// The directory whose tokenizer goes into a GGUF file: --tokenizer, the adapter's (a slicetrain
// checkpoint carries one), the model's, else the bundled one (a preset).
StatusOr<std::string> GgufTokenizerDir(const ExportArgs& a, const std::string& model_dir) {
  std::error_code ec;
  if (!a.tokenizer.empty())
    return fs::is_directory(a.tokenizer, ec) ? a.tokenizer
                                             : fs::path(a.tokenizer).parent_path().string();
  for (const std::string& dir : {a.adapter, model_dir})
    if (!dir.empty() && fs::exists(fs::path(dir) / "tokenizer.json", ec)) return dir;
  ST_ASSIGN_OR_RETURN(const std::string data_dir, BundledDataDir(a.data_dir, true));
  return (fs::path(data_dir) / "tokenizer").string();
}

Status RunGguf(const ExportArgs& a) {
  const bool lora = a.format == "gguf-lora";
  if (lora && a.adapter.empty())
    return InvalidArgument(
        "--format gguf-lora writes an adapter: give --adapter (and its base as "
        "--model-id)");
  if (lora && a.ollama)
    return InvalidArgument(
        "--ollama writes a Modelfile for a model: use it with --format gguf "
        "(Ollama takes an adapter through ADAPTER in the base's Modelfile)");
  if (!a.save_dtype.empty() || !a.max_shard_size.empty())
    return InvalidArgument(StrCat("--save-dtype and --max-shard-size are for --format hf; a ",
                                  a.format, " file's format is --quant"));
  ST_ASSIGN_OR_RETURN(const GgufQuant quant, ParseGgufQuant(a.quant.empty() ? "bf16" : a.quant));
  if (lora && quant.q4_k_m)
    return InvalidArgument(
        "--quant q4_k_m is llama-quantize's mixture for a whole model; give a LoRA GGUF one "
        "type (bf16, the default, or f32, f16, q8_0)");
  std::error_code ec;
  if (fs::exists(a.output, ec))
    return InvalidArgument(
        StrCat("--output ", a.output, " exists; name a new file (or remove it first)"));
  const fs::path out(a.output);
  const fs::path modelfile = out.parent_path() / "Modelfile";
  if (a.ollama && fs::exists(modelfile, ec))
    return InvalidArgument(StrCat(modelfile.string(),
                                  " exists; remove it or write the file "
                                  "into another directory"));
  if (out.has_parent_path()) {
    fs::create_directories(out.parent_path(), ec);
    if (ec)
      return IoError(StrCat("cannot create ", out.parent_path().string(), ": ", ec.message()));
  }
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModelWithAdapter(model_id, a.adapter));
  NoteTowerAdapters(model_id, a.adapter);
  GgufExportOptions o;
  o.output = a.output;
  o.weight_type = quant.type;
  o.q4_k_m = quant.q4_k_m;
  const bool is_dir = fs::is_directory(model_id, ec);
  if (!lora) {
    ST_ASSIGN_OR_RETURN(o.tokenizer_dir, GgufTokenizerDir(a, is_dir ? model_id : ""));
  }
  o.name = a.name;
  if (o.name.empty()) {  // the directory's name; for a checkpoint_<time> directory, its run's
    fs::path named = fs::path(a.adapter.empty() ? model_id : a.adapter).lexically_normal();
    if (!named.has_filename()) named = named.parent_path();
    if (named.filename().string().rfind("checkpoint_", 0) == 0 && named.has_parent_path())
      named = named.parent_path();
    o.name = named.filename().string();
  }
  if (lora) {
    ST_ASSIGN_OR_RETURN(const GgufExportReport r, ExportGgufLora(m, o));
    std::printf(
        "Exported the adapter %s (rank %lld, %zu adapted matrices, alpha %g for llama.cpp's "
        "alpha / rank) to %s: a llama.cpp LoRA GGUF, %.2f MB\n",
        a.adapter.c_str(), static_cast<long long>(m.registry.lora_rank), m.lora.targets.size(),
        m.registry.lora_scaling * static_cast<double>(m.registry.lora_rank), a.output.c_str(),
        static_cast<double>(r.file_bytes) / 1e6);
    std::printf(
        "Checked after reload: every tensor within its format's bound; largest RMS error "
        "%.3g %% of the tensor's RMS (%s)\n",
        100 * r.worst_relative_rms_error, r.worst_tensor.c_str());
    std::printf("Run it on the base's GGUF: llama-cli -m <base>.gguf --lora %s\n",
                a.output.c_str());
    return Status::Ok();
  }
  ST_ASSIGN_OR_RETURN(const GgufExportReport r, ExportGguf(m, o));
  std::string types;
  for (const auto& [t, n] : r.tensors_per_type)
    types += StrCat(types.empty() ? "" : ", ", n, " ", GgmlTypeOf(t).name);
  std::printf("Exported %s%s to %s: GGUF gemma4, %lld tensors (%s), %.1f MB\n", m.source.c_str(),
              a.adapter.empty() ? "" : StrCat(" with the adapter ", a.adapter, " merged").c_str(),
              a.output.c_str(), static_cast<long long>(r.tensors), types.c_str(),
              static_cast<double>(r.file_bytes) / 1e6);
  std::printf(
      "Tokenizer: %zu tokens from %s (%lld padding entries up to the model's rows), "
      "chat template: %s\n",
      r.vocab.tokens.size(), o.tokenizer_dir.c_str(),
      static_cast<long long>(r.vocab.padding_tokens),
      r.vocab.chat_template.empty() ? "none" : r.vocab.chat_template_source.c_str());
  if (r.vocab.newline_joining_tokens > 0)
    std::printf(
        "Warning: %lld tokens of this tokenizer join a newline with other text; llama.cpp's "
        "gemma4 tokenizer splits text at newlines first, so it tokenizes text around "
        "newlines differently (Gemma 4's own vocabulary has no such tokens)\n",
        static_cast<long long>(r.vocab.newline_joining_tokens));
  std::printf(
      "Checked after reload: every tensor within its format's bound; largest RMS error "
      "%.3g %% of the tensor's RMS (%s)\n",
      100 * r.worst_relative_rms_error, r.worst_tensor.c_str());
  std::printf("Time: %.1f s, peak RSS %.0f MiB\n", r.seconds, ReadProcessMemory().peak_mib);
  if (a.ollama) {
    ST_RETURN_IF_ERROR(
        WriteFileDurably(modelfile.string(), OllamaModelfile(out.filename().string(), r.vocab)));
    std::printf("Ollama: %s (ollama create %s -f %s)\n", modelfile.string().c_str(), o.name.c_str(),
                modelfile.string().c_str());
  }
  std::printf("Run it: llama-cli -m %s  (or llama-server -m %s)\n", a.output.c_str(),
              a.output.c_str());
  return Status::Ok();
}

Status Run(const ExportArgs& a) {
  if (a.format == "gguf" || a.format == "gguf-lora") return RunGguf(a);
  if (a.format != "hf")
    return InvalidArgument(StrCat("--format ", a.format,
                                  ": use hf (a Hugging Face directory), gguf (one file for "
                                  "llama.cpp and Ollama) or gguf-lora (the adapter alone)"));
  if (a.adapter.empty())
    return InvalidArgument(
        "--format hf merges an adapter: give --adapter (a model without one is "
        "a Hugging Face directory already)");
  if (!a.quant.empty() || !a.tokenizer.empty() || !a.name.empty() || a.ollama)
    return InvalidArgument(
        "--quant, --tokenizer, --name and --ollama are for --format gguf; --format hf writes the "
        "merged tensors in --save-dtype");
  ST_ASSIGN_OR_RETURN(const uint64_t max_shard,
                      ParseByteSize(a.max_shard_size.empty() ? "5GB" : a.max_shard_size));
  std::error_code ec;
  if (fs::exists(a.output, ec) && !fs::is_empty(a.output, ec))
    return InvalidArgument(
        StrCat("--output ", a.output, " exists and is not empty; name a new directory"));
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModelWithAdapter(model_id, a.adapter));
  DType dtype = m.weights->dtype();
  if (!a.save_dtype.empty()) {
    ST_ASSIGN_OR_RETURN(dtype, ParseDTypeFlag(a.save_dtype));
  }
  fs::create_directories(a.output, ec);
  if (ec) return IoError(StrCat("cannot create ", a.output, ": ", ec.message()));
  ST_ASSIGN_OR_RETURN(const MergedTowers towers,
                      WriteMergedModel(m, a.output, dtype, max_shard, a.adapter));
  // The tokenizer: the adapter's (a slicetrain checkpoint has one), else the base's.
  for (const std::string& dir : {a.adapter, model_id}) {
    if (!HasTokenizerFiles(dir)) continue;
    for (const std::string& f : kTokenizerFiles)
      if (fs::exists(fs::path(dir) / f, ec))
        fs::copy_file(fs::path(dir) / f, fs::path(a.output) / f,
                      fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError(StrCat("cannot copy the tokenizer into ", a.output, ": ", ec.message()));
    break;
  }
  // The base's generation and processor files, then the adapter's where it has its own.
  ST_RETURN_IF_ERROR(CopyModelSideFiles(model_id, a.output));
  ST_RETURN_IF_ERROR(CopyModelSideFiles(a.adapter, a.output));
  std::printf(
      "Exported %s with the adapter %s merged into %zu tensors (%zu more replaced by its "
      "modules_to_save): %s\n",
      model_id.c_str(), a.adapter.c_str(), m.lora.targets.size() + towers.merged_vision_linears,
      m.lora.full.size(), a.output.c_str());
  if (towers.tensors > 0)
    std::printf(
        "Towers: %lld tensors (vision, audio, their projections) beside the text model, %d of "
        "them vision tower linears with the adapter merged%s: a "
        "Gemma4ForConditionalGeneration directory\n",
        static_cast<long long>(towers.tensors), towers.merged_vision_linears,
        towers.projection_from_adapter ? ", the vision projection the adapter's (modules_to_save)"
                                       : "");
  return Status::Ok();
}

}  // namespace

void RegisterExportCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand(
      "export",
      "Write a model (with a LoRA adapter merged) as a Hugging Face directory or a GGUF file");
  cmd->add_option("--model-id", a->model_id,
                  "The model: checkpoint or HF model directory, hub id or preset")
      ->required();
  cmd->add_option("--adapter", a->adapter,
                  "PEFT adapter directory (a LoRA checkpoint) merged into the model (required "
                  "with --format hf)");
  cmd->add_option("--output", a->output,
                  "New directory (--format hf) or new .gguf file (--format gguf)")
      ->required();
  cmd->add_option("--format", a->format,
                  "hf: a Hugging Face model directory; gguf: one GGUF file for llama.cpp, Ollama "
                  "and LM Studio; gguf-lora: --adapter alone as a llama.cpp LoRA GGUF")
      ->capture_default_str();
  cmd->add_option(
      "--quant", a->quant,
      "GGUF: the matrices' format: f32, f16, bf16, q8_0, q6_k, q4_k_m (llama-quantize's "
      "mixture) or q4_0 (norms stay f32; default bf16)");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "GGUF: tokenizer.json / directory (default: the adapter's, the model's, else "
                  "the bundled one)");
  cmd->add_option("--name", a->name,
                  "GGUF: general.name (default: the directory's name, the run's for a checkpoint)");
  cmd->add_flag(
      "--ollama", a->ollama,
      "GGUF: also write an Ollama Modelfile beside the file (chat template, stop tokens)");
  cmd->add_option("--data-dir", a->data_dir,
                  "Bundled data directory (for a preset's tokenizer; default: found as finetune "
                  "finds it)");
  cmd->add_option("--save-dtype", a->save_dtype,
                  "--format hf: dtype of the merged tensors: bf16, fp16 or fp32 (default: the "
                  "base's)");
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "--format hf: largest weight file (default 5GB)");
  cmd->callback([&ctx, a] {
    Status st = Run(*a);
    if (!st.ok()) ctx.exit_code = ReportError("export", st);
  });
}

}  // namespace st::cli
