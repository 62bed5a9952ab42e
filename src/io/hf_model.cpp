#include "io/hf_model.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "io/files.h"

namespace st {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

StatusOr<nlohmann::json> ReadIndex(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    return DataLoss(path + ": not a valid safetensors index (no weight_map object)");
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      return DataLoss(path + ": weight_map entry " + name + " is not a file name");
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f == ".." || f == "." || f.empty())
      return DataLoss(path + ": shard name '" + f + "' is not a plain file name");
  }
  return j;
}

size_t ElementBytes(const std::string& dtype) {
  return dtype == "F64" ? 8 : (dtype == "F32" ? 4 : 2);
}

const char* TorchDTypeName(DType t) {
  return t == DType::kBF16 ? "bfloat16" : (t == DType::kF16 ? "float16" : "float32");
}

}  // namespace

std::optional<DType> DTypeOfFile(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  return std::nullopt;
}

std::string TextPrefixFor(const Gemma4Config& cfg) {
  return cfg.model_type == "gemma4" ? "model.language_model." : "model.";
}

StatusOr<std::vector<std::string>> ModelWeightFiles(const std::string& dir) {
  const fs::path index = fs::path(dir) / kIndexName;
  std::error_code ec;
  if (fs::exists(index, ec)) {
    ST_ASSIGN_OR_RETURN(nlohmann::json j, ReadIndex(index.string()));
    std::set<std::string> files;
    for (auto& [name, file] : j["weight_map"].items()) files.insert(file.get<std::string>());
    if (files.empty()) return DataLoss(index.string() + ": the weight_map names no file");
    std::vector<std::string> out;
    for (const auto& f : files) {
      const fs::path p = fs::path(dir) / f;
      if (!fs::is_regular_file(p, ec))
        return NotFound(StrCat(index.string(), " names the weight file ", f,
                               ", which is not in the directory: an incomplete download or copy"));
      out.push_back(p.string());
    }
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) return std::vector<std::string>{single.string()};
  return NotFound(dir + ": no model.safetensors or model.safetensors.index.json in this directory");
}

// ---- reading ----

StatusOr<std::unique_ptr<CheckpointWeights>> CheckpointWeights::Open(
    const std::vector<std::string>& files, const ParamRegistry& reg,
    const std::string& index_path) {
  std::unique_ptr<CheckpointWeights> w(new CheckpointWeights(reg));
  std::error_code ec;
  for (const auto& f : files) {
    ST_ASSIGN_OR_RETURN(SafeTensorsFile sf, SafeTensorsFile::Open(f));
    w->files_.push_back(std::make_unique<SafeTensorsFile>(std::move(sf)));
    const uintmax_t n = fs::file_size(f, ec);
    if (!ec) w->report_.file_bytes += n;
  }
  // name -> (file, tensor); a name in two files is ambiguous.
  std::unordered_map<std::string, Where> by_name;
  for (const auto& f : w->files_)
    for (const SafeTensorInfo& t : f->tensors()) {
      auto [it, inserted] = by_name.emplace(t.name, Where{f.get(), &t});
      if (!inserted)
        return DataLoss(StrCat("tensor ", t.name, " is in both ", it->second.file->path(), " and ",
                               f->path(), "; which one is meant?"));
    }
  if (!index_path.empty()) {
    ST_ASSIGN_OR_RETURN(nlohmann::json j, ReadIndex(index_path));
    for (auto& [name, file] : j["weight_map"].items()) {
      auto it = by_name.find(name);
      if (it == by_name.end() ||
          fs::path(it->second.file->path()).filename() != file.get<std::string>())
        return DataLoss(StrCat(
            index_path, " says ", file.get<std::string>(), " holds ", name, ", but ",
            it == by_name.end() ? "no weight file has it" : "it is in " + it->second.file->path()));
    }
  }
  LoadReport& report = w->report_;
  const std::string anchor = reg.layout.entry(reg.embed_tokens).name;
  bool found = false;
  for (const char* p : {"model.language_model.", "model.", "language_model.model.", ""}) {
    if (by_name.count(p + anchor)) {
      report.prefix = p;
      found = true;
      break;
    }
  }
  if (!found)
    return NotFound(StrCat(files.empty() ? std::string("model") : files[0],
                           ": no Gemma 4 text weights found (looked for ", anchor,
                           " under the prefixes model.language_model., model. and none)"));
  std::map<DType, uint64_t> bytes_by_dtype;
  w->where_.resize(reg.layout.size());
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    const std::string name = report.prefix + e.name;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (reg.is_buffer[i]) {  // layer_scalar: transformers initialises a missing one to 1
        ++report.scalars_defaulted;
        continue;
      }
      return NotFound(StrCat("tensor ", name, " ", ShapeString(e.shape),
                             " is missing from the checkpoint (", files.size(),
                             " file(s); does config.json match the weights?)"));
    }
    const Where& where = it->second;
    const SafeTensorInfo& t = *where.info;
    if (t.shape != e.shape)
      return InvalidArgument(StrCat(where.file->path(), ": tensor '", name, "' has shape ",
                                    ShapeString(t.shape), " but config.json expects ",
                                    ShapeString(e.shape)));
    if (!SafeTensorsFile::IsFloatDType(t.dtype))
      return InvalidArgument(StrCat(where.file->path(), ": tensor '", name, "' has dtype ", t.dtype,
                                    "; model weights must be F32, BF16, F16 or F64"));
    w->where_[i] = where;
    ++report.tensors_loaded;
    const uint64_t bytes = static_cast<uint64_t>(e.numel) * ElementBytes(t.dtype);
    report.model_bytes += bytes;
    if (std::optional<DType> d = DTypeOfFile(t.dtype)) bytes_by_dtype[*d] += bytes;
    by_name.erase(it);
  }
  report.tensors_ignored = static_cast<int64_t>(by_name.size());
  // The checkpoint's dtype: the one most of its bytes have (F64 checkpoints save as F32).
  uint64_t most = 0;
  for (const auto& [d, b] : bytes_by_dtype)
    if (b > most) {
      most = b;
      w->dtype_ = d;
    }
  return w;
}

void CheckpointWeights::Read(int entry, int64_t begin, int64_t count, float* dst) const {
  const Where& w = where_[static_cast<size_t>(entry)];
  if (w.file == nullptr) {
    std::fill(dst, dst + count, 1.0f);
    return;
  }
  // A large range (a rank's shard of the embeddings, a layer's matrices) in chunks whose file
  // pages are dropped once converted: the process never holds more than a chunk of the file.
  const int64_t elem = static_cast<int64_t>(ElementBytes(w.info->dtype));
  const int64_t chunk = (int64_t{16} << 20) / elem;
  if (count * elem < (int64_t{16} << 20)) {
    w.file->ReadF32Range(*w.info, begin, count, dst);
    return;
  }
  const auto* base = static_cast<const uint8_t*>(w.file->Data(*w.info));
  for (int64_t j = 0; j < count; j += chunk) {
    const int64_t n = std::min(chunk, count - j);
    w.file->ReadF32Range(*w.info, begin + j, n, dst + j);
    DropPages(base + (begin + j) * elem, static_cast<size_t>(n * elem));
  }
}

std::optional<WeightSource::Stored> CheckpointWeights::StoredBytes(int entry) const {
  const Where& w = where_[static_cast<size_t>(entry)];
  if (w.file == nullptr) return std::nullopt;
  std::optional<DType> d = DTypeOfFile(w.info->dtype);
  if (!d) return std::nullopt;
  return Stored{w.file->Data(*w.info), w.info->end - w.info->begin, *d};
}

void CheckpointWeights::Release(int entry, int64_t begin, int64_t count) const {
  const Where& w = where_[static_cast<size_t>(entry)];
  if (w.file == nullptr) return;
  // The whole pages inside the range's bytes (a page shared with a neighbour is left alone).
  const size_t elem = ElementBytes(w.info->dtype), bytes = w.info->end - w.info->begin;
  const size_t a = std::min(bytes, static_cast<size_t>(begin) * elem);
  const size_t b = count < 0 ? bytes : std::min(bytes, a + static_cast<size_t>(count) * elem);
  DropPages(static_cast<const uint8_t*>(w.file->Data(*w.info)) + a, b - a);
}

StatusOr<LoadReport> LoadParams(const std::vector<std::string>& files, const Gemma4Config& cfg,
                                const ParamRegistry& reg, float* params) {
  (void)cfg;
  ST_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWeights> w, CheckpointWeights::Open(files, reg));
  for (int i = 0; i < reg.layout.size(); ++i) w->ReadAll(i, params + reg.layout.entry(i).offset);
  return w->report();
}

// ---- writing ----

StatusOr<std::unique_ptr<HfModelWriter>> HfModelWriter::Create(
    const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
    std::vector<DType> dtypes, DType model_dtype, uint64_t max_shard_bytes,
    const std::vector<TensorSpec>& extra) {
  ST_CHECK(static_cast<int>(dtypes.size()) == reg.layout.size()) << "one dtype per tensor";
  std::unique_ptr<HfModelWriter> w(new HfModelWriter());
  w->dir_ = dir;
  w->prefix_ = TextPrefixFor(cfg);
  w->reg_ = reg;
  w->dtypes_ = std::move(dtypes);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create directory " + dir + ": " + ec.message());
  nlohmann::json config = cfg.original.is_object() ? cfg.original : cfg.ToTextJson();
  if (!cfg.original.is_object() || config.value("model_type", "") != cfg.model_type)
    config = cfg.ToTextJson();
  config["torch_dtype"] = TorchDTypeName(model_dtype);
  if (config.contains("dtype")) config["dtype"] = TorchDTypeName(model_dtype);  // transformers 5
  ST_RETURN_IF_ERROR(
      WriteFileDurably((fs::path(dir) / "config.json").string(), config.dump(2) + "\n"));
  // Files as transformers' shard_checkpoint fills them: in order, a new file when the next tensor
  // would take the current one past the limit.
  uint64_t in_file = 0;
  const int entries = reg.layout.size() + static_cast<int>(extra.size());
  w->file_of_.assign(static_cast<size_t>(entries), 0);
  for (int i = 0; i < entries; ++i) {
    TensorSpec spec;
    if (i < reg.layout.size()) {
      const ArenaEntry& e = reg.layout.entry(i);
      spec = {w->prefix_ + e.name, w->dtypes_[static_cast<size_t>(i)], e.shape};
    } else {
      spec = extra[static_cast<size_t>(i - reg.layout.size())];
    }
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    const uint64_t bytes = static_cast<uint64_t>(numel) * DTypeSize(spec.dtype);
    if (w->plan_.empty() || (in_file > 0 && in_file + bytes > max_shard_bytes)) {
      w->plan_.emplace_back();
      in_file = 0;
    }
    File& f = w->plan_.back();
    f.entries.push_back(i);
    f.specs.push_back(std::move(spec));
    in_file += bytes;
    w->total_bytes_ += bytes;
    w->file_of_[i] = static_cast<int>(w->plan_.size()) - 1;
  }
  const size_t n = w->plan_.size();
  for (size_t k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, n);
    w->plan_[k].name = n == 1 ? "model.safetensors" : name;
  }
  // A directory reused for another layout must not keep files of the old one.
  for (const char* stale : {"model.safetensors", kIndexName})
    if (n > 1 || std::string(stale) != "model.safetensors") fs::remove(fs::path(dir) / stale, ec);
  return w;
}

Status HfModelWriter::Enter(int entry) {
  const int f = file_of_[static_cast<size_t>(entry)];
  if (f == open_file_) return Status::Ok();
  if (f != open_file_ + 1)
    return Internal(StrCat("HfModelWriter: tensor ", entry, " given out of order"));
  if (open_file_ >= 0) ST_RETURN_IF_ERROR(writer_.Commit());
  open_file_ = f;
  ST_ASSIGN_OR_RETURN(writer_, SafeTensorsWriter::Create(
                                   (fs::path(dir_) / plan_[static_cast<size_t>(f)].name).string(),
                                   plan_[static_cast<size_t>(f)].specs, {{"format", "pt"}}));
  return Status::Ok();
}

Status HfModelWriter::AppendF32(int entry, const float* data, int64_t n) {
  ST_RETURN_IF_ERROR(Enter(entry));
  return writer_.AppendF32(data, n);
}

Status HfModelWriter::AppendStored(int entry, const void* data, size_t bytes, DType dtype) {
  ST_RETURN_IF_ERROR(Enter(entry));
  return writer_.AppendStored(data, bytes, dtype);
}

Status HfModelWriter::AppendFromSource(int entry, const WeightSource& source) {
  if (std::optional<WeightSource::Stored> s = source.StoredBytes(entry)) {
    constexpr size_t kBytes = size_t{16} << 20;
    const size_t elem = DTypeSize(s->dtype);
    for (size_t off = 0; off < s->bytes; off += kBytes) {
      const size_t n = std::min(kBytes, s->bytes - off);
      ST_RETURN_IF_ERROR(AppendStored(entry, static_cast<const char*>(s->data) + off, n, s->dtype));
      source.Release(entry, static_cast<int64_t>(off / elem), static_cast<int64_t>(n / elem));
    }
    return Status::Ok();
  }
  constexpr int64_t kChunk = int64_t{1} << 22;
  const int64_t numel = reg_.layout.entry(entry).numel;
  if (chunk_.size() < std::min(kChunk, numel))
    chunk_ = AlignedBuffer(std::min(kChunk, numel), "the model writer's conversion chunk");
  for (int64_t j = 0; j < numel; j += kChunk) {
    const int64_t n = std::min(kChunk, numel - j);
    source.Read(entry, j, n, chunk_.data());
    ST_RETURN_IF_ERROR(AppendF32(entry, chunk_.data(), n));
  }
  return Status::Ok();
}

Status HfModelWriter::Finish() {
  if (open_file_ != static_cast<int>(plan_.size()) - 1)
    return Internal("HfModelWriter: the model's last tensors were not written");
  ST_RETURN_IF_ERROR(writer_.Commit());
  if (plan_.size() == 1) return Status::Ok();
  nlohmann::json index;
  index["metadata"] = {{"total_size", total_bytes_}};
  nlohmann::json map = nlohmann::json::object();
  for (const File& f : plan_)
    for (const TensorSpec& t : f.specs) map[t.name] = f.name;
  index["weight_map"] = std::move(map);
  return WriteFileDurably((fs::path(dir_) / kIndexName).string(), index.dump(2) + "\n");
}

Status CopyModelSideFiles(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (from.empty() || !fs::is_directory(from, ec)) return Status::Ok();
  for (const std::string& f : kModelSideFiles) {
    if (!fs::is_regular_file(fs::path(from) / f, ec)) continue;
    fs::copy_file(fs::path(from) / f, fs::path(to) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError(StrCat("cannot copy ", f, " into ", to, ": ", ec.message()));
  }
  return Status::Ok();
}

StatusOr<TowerTensors> TowerTensors::Open(const std::string& source, const Gemma4Config& cfg,
                                          const ParamRegistry& text) {
  TowerTensors t;
  const std::string prefix = TextPrefixFor(cfg);
  std::error_code ec;
  if (prefix == "model." || !fs::is_directory(source, ec)) return t;
  ST_ASSIGN_OR_RETURN(const std::vector<std::string> paths, ModelWeightFiles(source));
  for (const std::string& p : paths) {
    ST_ASSIGN_OR_RETURN(SafeTensorsFile f, SafeTensorsFile::Open(p));
    t.files_.push_back(std::move(f));
  }
  std::set<std::string> names;
  for (int i = 0; i < text.base_entries; ++i) names.insert(prefix + text.layout.entry(i).name);
  for (size_t f = 0; f < t.files_.size(); ++f)
    for (size_t k = 0; k < t.files_[f].tensors().size(); ++k) {
      const SafeTensorInfo& info = t.files_[f].tensors()[k];
      if (names.count(info.name)) continue;
      const std::optional<DType> d = DTypeOfFile(info.dtype);
      if (!d)
        return Unimplemented(StrCat(t.files_[f].path(), ": tensor ", info.name, " has dtype ",
                                    info.dtype, ", which a model directory is not written in ",
                                    "(F32, BF16, F16)"));
      t.where_.emplace_back(f, k);
      t.specs_.push_back({info.name, *d, info.shape});
    }
  return t;
}

Status TowerTensors::CopyTo(size_t k, int entry, HfModelWriter& out) const {
  const SafeTensorsFile& f = files_[where_[k].first];
  const SafeTensorInfo& info = f.tensors()[where_[k].second];
  constexpr size_t kBytes = size_t{16} << 20;
  const auto* data = static_cast<const char*>(f.Data(info));
  const size_t bytes = info.end - info.begin;
  for (size_t off = 0; off == 0 || off < bytes; off += kBytes) {  // once when empty
    const size_t n = std::min(kBytes, bytes - off);
    ST_RETURN_IF_ERROR(out.AppendStored(entry, data + off, n, specs_[k].dtype));
    DropPages(data + off, n);
  }
  return Status::Ok();
}

Status SaveHfModel(const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
                   const float* params, DType dtype, uint64_t max_shard_bytes) {
  // Buffers (layer_scalar) stay fp32-exact only when the model is fp32; HF stores them in the
  // model dtype too.
  ST_ASSIGN_OR_RETURN(
      std::unique_ptr<HfModelWriter> w,
      HfModelWriter::Create(dir, cfg, reg, std::vector<DType>(reg.layout.size(), dtype), dtype,
                            max_shard_bytes));
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    ST_RETURN_IF_ERROR(w->AppendF32(i, params + e.offset, e.numel));
  }
  return w->Finish();
}

StatusOr<DType> ParseDTypeFlag(const std::string& flag) {
  if (flag == "bf16" || flag == "bfloat16") return DType::kBF16;
  if (flag == "fp16" || flag == "float16") return DType::kF16;
  if (flag == "fp32" || flag == "float32") return DType::kF32;
  return InvalidArgument("a dtype must be bf16, fp16 or fp32, got '" + flag + "'");
}

StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"B", 1},
                                                       {"KB", 1e3},
                                                       {"MB", 1e6},
                                                       {"GB", 1e9},
                                                       {"TB", 1e12},
                                                       {"KIB", 1024.0},
                                                       {"MIB", 1048576.0},
                                                       {"GIB", 1073741824.0},
                                                       {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  char* end = nullptr;
  const double v = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (it == kUnits.end() || v <= 0 || end != number.c_str() + number.size())
    return InvalidArgument(
        "a size must be a positive number with an optional unit (5GB, 500MB, "
        "2GiB), got '" +
        text + "'");
  return static_cast<uint64_t>(v * it->second);
}

}  // namespace st
