#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/tokenizer.h"
#include "io/files.h"
#include "io/gguf.h"
#include "io/hf_model.h"
#include "io/safetensors.h"

namespace st {

namespace fs = std::filesystem;

namespace {

constexpr const char* kShardHashSuffix = ".sha256";

StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(StrCat(path, ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every regular file under `dir`, as paths relative to it, sorted.
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string PendingCheckpointDir(const std::string& run_dir, int64_t epoch) {
  return (fs::path(run_dir) / StrCat(".pending_epoch_", epoch)).string();
}

std::string PendingStepCheckpointDir(const std::string& run_dir, int64_t global_step) {
  return (fs::path(run_dir) / StrCat(".pending_step_", global_step)).string();
}

std::string ShardPath(const std::string& dir, int rank) {
  return (fs::path(dir) / "shards" / StrCat("rank_", rank, ".safetensors")).string();
}

Status WriteCheckpointShard(const std::string& pending, FsdpModel& fsdp, int rank, int world,
                            int64_t epoch, int64_t global_step) {
  const Shape shape{fsdp.shard_size()};
  const std::map<std::string, std::string> meta = {{"world_size", std::to_string(world)},
                                                   {"rank", std::to_string(rank)},
                                                   {"epoch", std::to_string(epoch)},
                                                   {"global_step", std::to_string(global_step)}};
  const std::string path = ShardPath(pending, rank);
  ST_RETURN_IF_ERROR(WriteSafeTensors(path,
                                      {{"master", DType::kF32, shape, fsdp.master()},
                                       {"exp_avg", DType::kF32, shape, fsdp.exp_avg()},
                                       {"exp_avg_sq", DType::kF32, shape, fsdp.exp_avg_sq()}},
                                      meta));
  ST_ASSIGN_OR_RETURN(std::string digest, HashFile(path));
  return WriteFileDurably(path + kShardHashSuffix, digest);
}

Status WriteHfModel(const std::string& pending, const LoadedModel& model, FsdpModel& fsdp,
                    comm::ProcessGroup& pg, const comm::CollectiveOptions& collective,
                    const HfExportOptions& options) {
  (void)collective;
  const ParamRegistry& reg = model.registry;
  const WeightSource& source = *model.weights;
  const bool writer = pg.rank() == 0;
  // Per tensor: trained ones in the export dtype, frozen ones as the source stores them.
  std::vector<DType> dtypes(reg.layout.size(), options.dtype);
  for (int i = 0; i < reg.layout.size(); ++i)
    if (!fsdp.trainable(i))
      if (std::optional<WeightSource::Stored> s = source.StoredBytes(i)) dtypes[i] = s->dtype;
  std::unique_ptr<HfModelWriter> out;
  Status status;  // rank 0's first write error; the gathers go on so that no rank is left waiting
  // A multimodal base's towers (frozen in a full fine-tune) go into the checkpoint as stored, so
  // that it is a whole Gemma4ForConditionalGeneration that reads images.
  StatusOr<TowerTensors> towers = TowerTensors();
  if (writer) {
    towers = TowerTensors::Open(model.source, model.config, reg);
    StatusOr<std::unique_ptr<HfModelWriter>> w =
        towers.ok() ? HfModelWriter::Create(pending, model.config, reg, dtypes, options.dtype,
                                            options.max_shard_bytes, towers.value().specs())
                    : StatusOr<std::unique_ptr<HfModelWriter>>(towers.status());
    if (w.ok())
      out = std::move(w).value();
    else
      status = w.status();
  }
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    if (fsdp.trainable(i)) {
      AlignedBuffer tensor(e.numel, "a trained tensor gathered for the checkpoint");
      ST_RETURN_IF_ERROR(fsdp.GatherTensor(i, tensor.data()));
      if (writer && status.ok()) status = out->AppendF32(i, tensor.data(), e.numel);
      continue;
    }
    if (writer && status.ok()) status = out->AppendFromSource(i, source);
  }
  if (writer && status.ok())
    for (size_t k = 0; k < towers.value().specs().size() && status.ok(); ++k)
      status = towers.value().CopyTo(k, reg.layout.size() + static_cast<int>(k), *out);
  if (writer && status.ok()) status = out->Finish();
  if (writer && status.ok()) status = CopyModelSideFiles(model.source, pending);
  return status;
}

Status WritePeftAdapter(const std::string& pending, const LoadedModel& model, FsdpModel& fsdp,
                        comm::ProcessGroup& pg, const PeftAdapterConfig& adapter, DType dtype,
                        const VisionLoraTrainer* vision) {
  const ParamRegistry& reg = model.registry;
  const bool writer = pg.rank() == 0;
  const std::string prefix = TextPrefixFor(model.config);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < reg.layout.size(); ++i)
    if (fsdp.trainable(i)) {
      const ArenaEntry& e = reg.layout.entry(i);
      specs.push_back({PeftTensorName(e.name, prefix), dtype, e.shape});
    }
  std::vector<VisionLoraTrainer::Named> tower;
  std::vector<std::string> tower_modules;
  if (vision) {
    tower = vision->PeftTensors();
    for (const VisionLoraTrainer::Named& t : tower) {
      specs.push_back({t.name, dtype, Shape(t.shape.begin(), t.shape.end())});
      if (t.name.find(".lora_A.") != std::string::npos)
        tower_modules.push_back(
            t.name.substr(std::string("base_model.model.").size(),
                          t.name.find(".lora_A.") - std::string("base_model.model.").size()));
    }
  }
  Status status;  // rank 0's first write error; the gathers go on so that no rank is left waiting
  SafeTensorsWriter out;
  if (writer) {
    PeftAdapterConfig c = adapter;
    c.targets = PeftTargetsFor(adapter.targets, prefix, tower_modules);
    c.modules_to_save = PeftModulesToSaveFor(adapter.modules_to_save, reg, prefix,
                                             vision && vision->trains_projection());
    status = WriteFileDurably((fs::path(pending) / kAdapterConfigFile).string(),
                              PeftAdapterConfigJson(c));
    if (status.ok()) {
      StatusOr<SafeTensorsWriter> w = SafeTensorsWriter::Create(
          (fs::path(pending) / kAdapterWeightsFile).string(), specs, {{"format", "pt"}});
      if (w.ok())
        out = std::move(w).value();
      else
        status = w.status();
    }
  }
  std::vector<float> tensor;
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (!fsdp.trainable(i)) continue;
    tensor.resize(static_cast<size_t>(reg.layout.entry(i).numel));
    ST_RETURN_IF_ERROR(fsdp.GatherTensor(i, tensor.data()));
    if (writer && status.ok())
      status = out.AppendF32(tensor.data(), static_cast<int64_t>(tensor.size()));
  }
  for (const VisionLoraTrainer::Named& t : tower)
    if (writer && status.ok())
      status = out.AppendF32(t.values->data(), static_cast<int64_t>(t.values->size()));
  if (writer && status.ok()) status = out.Commit();
  return status;
}

Status CommitCheckpoint(const std::string& pending, const std::string& dir,
                        const CheckpointContent& c) {
  std::error_code ec;
  // A GGUF tokenizer (--tokenizer FILE.gguf) is kept as its vocabulary alone.
  if (fs::is_regular_file(c.tokenizer_dir, ec) && IsGgufFile(c.tokenizer_dir))
    ST_RETURN_IF_ERROR(Tokenizer::WriteGgufVocabulary(
        c.tokenizer_dir, (fs::path(pending) / "tokenizer.gguf").string()));
  for (const std::string& f : kTokenizerFiles) {
    const fs::path src = fs::path(c.tokenizer_dir) / f;
    if (fs::exists(src, ec))
      fs::copy_file(src, fs::path(pending) / f, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return IoError(StrCat("cannot copy ", src.string(), " into ", pending, ": ", ec.message()));
  }
  ST_RETURN_IF_ERROR(
      WriteFileDurably((fs::path(pending) / "metrics.json").string(), c.metrics_json + "\n"));
  ST_RETURN_IF_ERROR(
      WriteFileDurably((fs::path(pending) / "trainer_state.json").string(), c.state_json + "\n"));
  // The manifest: the ranks' own digests of their shards, rank 0's of everything else.
  std::string manifest;
  for (const std::string& rel : FilesUnder(pending)) {
    const std::string path = (fs::path(pending) / rel).string();
    if (rel.size() > 7 && rel.compare(rel.size() - 7, 7, kShardHashSuffix) == 0) continue;
    std::string digest;
    if (rel.rfind("shards/", 0) == 0) {
      ST_ASSIGN_OR_RETURN(digest, ReadSmallFile(path + kShardHashSuffix));
      if (digest.size() != 64)
        return DataLoss(StrCat(path, kShardHashSuffix, ": not a sha256 digest"));
      fs::remove(path + kShardHashSuffix, ec);
    } else {
      ST_RETURN_IF_ERROR(FsyncFile(path));
      ST_ASSIGN_OR_RETURN(digest, HashFile(path));
    }
    manifest += StrCat(digest, "  ", rel, "\n");
  }
  ST_RETURN_IF_ERROR(WriteFileDurably((fs::path(pending) / kChecksumsFile).string(), manifest));
  ST_RETURN_IF_ERROR(FsyncDir((fs::path(pending) / "shards").string()));
  ST_RETURN_IF_ERROR(FsyncDir(pending));
  return RenameDurably(pending, dir);
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& run_dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint_", 0) != 0 || !e.is_directory()) continue;
    std::ifstream in(e.path() / "trainer_state.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("epoch") || !j.contains("global_step") ||
        !j["epoch"].is_number_integer() || !j["global_step"].is_number_integer())
      continue;
    const int64_t step_in_epoch =
        j.contains("step_in_epoch") && j["step_in_epoch"].is_number_integer()
            ? j["step_in_epoch"].get<int64_t>()
            : 0;
    if (step_in_epoch < 0) continue;
    out.push_back({e.path().string(), j["epoch"].get<int64_t>(), step_in_epoch,
                   j["global_step"].get<int64_t>(), std::move(j)});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return a.global_step != b.global_step ? a.global_step > b.global_step : a.dir > b.dir;
  });
  return out;
}

Status VerifyCheckpointFile(const std::string& dir, const std::string& relative) {
  return VerifyChecksum(dir, relative);
}

Status VerifyCheckpoint(const std::string& dir) {
  ST_ASSIGN_OR_RETURN(auto manifest, ReadChecksums(dir));
  for (const auto& [relative, digest] : manifest)
    ST_RETURN_IF_ERROR(VerifyCheckpointFile(dir, relative));
  return Status::Ok();
}

Status LoadCheckpointShard(const std::string& dir, FsdpModel& fsdp, int rank, int world) {
  const std::string path = ShardPath(dir, rank);
  ST_RETURN_IF_ERROR(VerifyCheckpointFile(dir, fs::relative(path, dir).string()));
  ST_ASSIGN_OR_RETURN(SafeTensorsFile f, SafeTensorsFile::Open(path));
  const auto& meta = f.metadata();
  if (!meta.count("world_size") || meta.at("world_size") != std::to_string(world))
    return InvalidArgument(
        StrCat(dir, " was written by ", meta.count("world_size") ? meta.at("world_size") : "?",
               " workers; resume with the same number of workers (", world, " now)"));
  const Shape shape{fsdp.shard_size()};
  ST_RETURN_IF_ERROR(f.ReadF32("master", fsdp.master(), shape));
  ST_RETURN_IF_ERROR(f.ReadF32("exp_avg", fsdp.exp_avg(), shape));
  ST_RETURN_IF_ERROR(f.ReadF32("exp_avg_sq", fsdp.exp_avg_sq(), shape));
  fsdp.MasterChanged();
  return Status::Ok();
}

int RemoveStalePendingCheckpoints(const std::string& run_dir) {
  int removed = 0;
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.path().filename().string().rfind(".pending_", 0) == 0) stale.push_back(e.path());
  for (const auto& p : stale)
    if (fs::remove_all(p, ec) > 0 && !ec) ++removed;
  return removed;
}

}  // namespace st
