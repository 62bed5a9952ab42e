#include "io/hf_model.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors.h"

namespace st {

namespace fs = std::filesystem;

std::string TextPrefixFor(const Gemma4Config& cfg) {
  return cfg.model_type == "gemma4" ? "model.language_model." : "model.";
}

StatusOr<std::vector<std::string>> ModelWeightFiles(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      return DataLoss(index.string() + ": not a valid safetensors index (no weight_map object)");
    std::set<std::string> files;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return DataLoss(index.string() + ": weight_map entry " + name + " is not a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        return DataLoss(index.string() + ": shard name '" + f + "' is not a plain file name");
      files.insert(f);
    }
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back((fs::path(dir) / f).string());
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) return std::vector<std::string>{single.string()};
  return NotFound(dir + ": no model.safetensors or model.safetensors.index.json in this directory");
}

StatusOr<LoadReport> LoadParams(const std::vector<std::string>& files, const Gemma4Config& cfg,
                                const ParamRegistry& reg, float* params) {
  std::vector<std::unique_ptr<SafeTensorsFile>> opened;
  for (const auto& f : files) {
    StatusOr<SafeTensorsFile> sf = SafeTensorsFile::Open(f);
    if (!sf.ok()) return sf.status();
    opened.push_back(std::make_unique<SafeTensorsFile>(std::move(sf).value()));
  }
  auto find =
      [&](const std::string& name) -> std::pair<const SafeTensorsFile*, const SafeTensorInfo*> {
    for (const auto& f : opened)
      if (const SafeTensorInfo* t = f->Find(name)) return {f.get(), t};
    return {nullptr, nullptr};
  };
  LoadReport report;
  // The prefix: whichever spelling holds embed_tokens.
  const std::string anchor = reg.layout.entry(reg.embed_tokens).name;
  for (const char* p : {"model.language_model.", "model.", "language_model.model.", ""}) {
    if (find(p + anchor).second) {
      report.prefix = p;
      break;
    }
  }
  if (!find(report.prefix + anchor).second)
    return NotFound(StrCat(files.empty() ? std::string("model") : files[0],
                           ": no Gemma 4 text weights found (looked for ", anchor,
                           " under the prefixes model.language_model., model. and none)"));
  std::set<std::string> used;
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    const std::string name = report.prefix + e.name;
    auto [file, info] = find(name);
    if (!info) {
      if (reg.is_buffer[i]) {  // layer_scalar: transformers initialises a missing one to 1
        for (int64_t j = 0; j < e.numel; ++j) params[e.offset + j] = 1.0f;
        ++report.scalars_defaulted;
        continue;
      }
      return NotFound(StrCat("tensor ", name, " ", ShapeString(e.shape),
                             " is missing from the checkpoint (", files.size(),
                             " file(s); does config.json match the weights?)"));
    }
    ST_RETURN_IF_ERROR(
        file->ReadF32(name, params + e.offset, e.shape)
            .WithContext(StrCat("config.json expects ", name, " ", ShapeString(e.shape))));
    used.insert(name);
    ++report.tensors_loaded;
  }
  for (const auto& f : opened)
    for (const auto& t : f->tensors())
      if (!used.count(t.name)) ++report.tensors_ignored;
  (void)cfg;
  return report;
}

Status SaveHfModel(const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
                   const float* params, DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create directory " + dir + ": " + ec.message());
  nlohmann::json config = cfg.original.is_object() ? cfg.original : cfg.ToTextJson();
  if (!cfg.original.is_object() || config.value("model_type", "") != cfg.model_type)
    config = cfg.ToTextJson();
  config["torch_dtype"] =
      dtype == DType::kBF16 ? "bfloat16" : (dtype == DType::kF16 ? "float16" : "float32");
  {
    const std::string tmp = (fs::path(dir) / "config.json.tmp").string();
    std::ofstream out(tmp);
    out << config.dump(2) << "\n";
    out.close();
    if (!out) return IoError("cannot write " + tmp);
    fs::rename(tmp, fs::path(dir) / "config.json", ec);
    if (ec) return IoError("cannot rename " + tmp + ": " + ec.message());
  }
  const std::string prefix = TextPrefixFor(cfg);
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    // Buffers (layer_scalar) stay fp32-exact only when the model is fp32; HF stores them in the
    // model dtype too.
    tensors.push_back({prefix + e.name, dtype, e.shape, params + e.offset});
  }
  return WriteSafeTensors((fs::path(dir) / "model.safetensors").string(), tensors,
                          {{"format", "pt"}});
}

}  // namespace st
