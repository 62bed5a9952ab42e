// Hugging Face model directories for Gemma 4: config.json plus model.safetensors, or shards listed
// in model.safetensors.index.json. Reading maps the files and converts only what is asked for
// (CheckpointWeights, a WeightSource); writing streams tensor by tensor (HfModelWriter), splitting
// a large model into shards with an index as transformers does. Tensor names may carry the
// multimodal prefix `model.language_model.` or the text-only `model.`; a missing `lm_head.weight`
// (tied) and unused K/V tensors of KV-shared layers are tolerated, vision/audio tensors are never
// read. Not a hub client: the directory must already exist locally.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "model/weights.h"

namespace st {

struct LoadReport {
  std::string prefix;  // the text-model prefix found in the files
  int64_t tensors_loaded = 0;
  int64_t tensors_ignored = 0;    // vision/audio, lm_head, shared-layer k/v, ...
  int64_t scalars_defaulted = 0;  // layer_scalar buffers absent from the files (set to 1)
  uint64_t file_bytes = 0;        // the weight files' total size
  uint64_t model_bytes = 0;       // the bytes of the tensors the model uses
};

// The .safetensors files of a model directory: the shards of model.safetensors.index.json (each
// must exist), or model.safetensors.
StatusOr<std::vector<std::string>> ModelWeightFiles(const std::string& dir);

// The weights of a model directory as a WeightSource: every file memory-mapped read-only (shared
// through the page cache by all processes of a host), every registry tensor found and checked up
// front (present, shape as config.json says, a float dtype: F32, BF16, F16 or F64), so that later
// range reads cannot fail. Values are converted to fp32 only for the ranges asked for; nothing is
// read from the files here beyond their headers.
class CheckpointWeights : public WeightSource {
 public:
  // `files` as ModelWeightFiles returns them; with an index, `index_path` lets Open check that
  // every tensor is where the index says.
  static StatusOr<std::unique_ptr<CheckpointWeights>> Open(const std::vector<std::string>& files,
                                                           const ParamRegistry& reg,
                                                           const std::string& index_path = "");
  void Read(int entry, int64_t begin, int64_t count, float* dst) const override;
  std::optional<Stored> StoredBytes(int entry) const override;
  void Release(int entry, int64_t begin = 0, int64_t count = -1) const override;
  DType dtype() const override { return dtype_; }
  const LoadReport& report() const { return report_; }

 private:
  explicit CheckpointWeights(const ParamRegistry& reg) : WeightSource(reg) {}
  struct Where {
    const SafeTensorsFile* file = nullptr;  // null: a defaulted buffer (value 1)
    const SafeTensorInfo* info = nullptr;
  };
  std::vector<std::unique_ptr<SafeTensorsFile>> files_;
  std::vector<Where> where_;  // [registry entries]
  DType dtype_ = DType::kF32;
  LoadReport report_;
};

// Fills params (registry layout) from the files: CheckpointWeights read whole. For small models
// and tests; a training run reads ranges instead.
StatusOr<LoadReport> LoadParams(const std::vector<std::string>& files, const Gemma4Config& cfg,
                                const ParamRegistry& reg, float* params);

// transformers' default --max-shard-size: 5 GB (decimal) per weight file.
constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

// Writes a model directory tensor by tensor in registry order: config.json, then one
// model.safetensors, or, when the tensors exceed max_shard_bytes, model-0000K-of-0000N.safetensors
// files (a tensor larger than the limit gets a file of its own) and model.safetensors.index.json.
// Only one file is open at a time and nothing is buffered beyond a conversion chunk.
class HfModelWriter {
 public:
  // dtypes: per registry entry, the dtype it is written in (config.json's torch_dtype is
  // `model_dtype`). `extra`: tensors outside the registry written after its entries (a multimodal
  // model's towers), under their own names; the k-th is entry reg.layout.size() + k of the
  // Append calls (not AppendFromSource).
  static StatusOr<std::unique_ptr<HfModelWriter>> Create(
      const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
      std::vector<DType> dtypes, DType model_dtype, uint64_t max_shard_bytes,
      const std::vector<TensorSpec>& extra = {});
  // The next values of `entry`, which must be the tensor being written (registry order); a tensor
  // may come in several consecutive pieces.
  Status AppendF32(int entry, const float* data, int64_t n);
  Status AppendStored(int entry, const void* data, size_t bytes, DType dtype);
  // The whole of `entry` as `source` has it: its stored bytes copied unchanged in chunks whose file
  // pages are dropped once written (the writer never holds a frozen tensor's pages), or, for a
  // source that stores none (a preset, an adapter file), converted to fp32 chunk by chunk.
  Status AppendFromSource(int entry, const WeightSource& source);
  // After the last tensor: closes the last file and writes the index (when sharded).
  Status Finish();

  int num_files() const { return static_cast<int>(plan_.size()); }

 private:
  HfModelWriter() = default;
  Status Enter(int entry);  // opens the file of `entry` when it starts a new one

  std::string dir_, prefix_;
  ParamRegistry reg_;
  AlignedBuffer chunk_;  // AppendFromSource's conversion chunk
  struct File {
    std::string name;
    std::vector<int> entries;
    std::vector<TensorSpec> specs;
  };
  std::vector<File> plan_;
  std::vector<int> file_of_;  // [entry]
  std::vector<DType> dtypes_;
  int open_file_ = -1;
  SafeTensorsWriter writer_;
  uint64_t total_bytes_ = 0;
};

// Files of a model directory besides its weights and tokenizer that a directory written from it
// (an export, a full fine-tune's checkpoint) copies: how transformers' processors and generate
// read the model. (A chat template goes with the tokenizer the run used, not here.)
inline const std::vector<std::string> kModelSideFiles = {
    "generation_config.json", "processor_config.json", "preprocessor_config.json"};
// Copies those of kModelSideFiles that `from` has (a model directory; anything else has none)
// into `to`, replacing what is there.
Status CopyModelSideFiles(const std::string& from, const std::string& to);

// The tensors of a multimodal model directory that its text registry does not name (the vision
// and audio towers, their projections): what a model directory written from the text model (a
// merged export, a full fine-tune's checkpoint) copies as stored so that it stays whole. Empty
// for a text-only model (Gemma4ForCausalLM) or a source that is not a directory (a preset).
class TowerTensors {
 public:
  static StatusOr<TowerTensors> Open(const std::string& source, const Gemma4Config& cfg,
                                     const ParamRegistry& text);
  // Name, stored dtype and shape of each, in file order (HfModelWriter::Create's `extra`).
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Tensor k's stored bytes as the writer's entry `entry`, in chunks whose file pages are
  // dropped once written.
  Status CopyTo(size_t k, int entry, HfModelWriter& out) const;

 private:
  std::vector<SafeTensorsFile> files_;
  std::vector<std::pair<size_t, size_t>> where_;  // (file, tensor) of each
  std::vector<TensorSpec> specs_;
};

// The whole model from an fp32 arena (registry layout) in `dtype`: HfModelWriter fed from memory.
Status SaveHfModel(const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
                   const float* params, DType dtype,
                   uint64_t max_shard_bytes = kDefaultMaxShardBytes);

std::string TextPrefixFor(const Gemma4Config& cfg);
// A safetensors dtype ("F32", "BF16", "F16") as ours; none for the others (F64, integers).
std::optional<DType> DTypeOfFile(const std::string& safetensors_dtype);

// "bf16"/"bfloat16", "fp16"/"float16", "fp32"/"float32" (as --save-dtype takes them).
StatusOr<DType> ParseDTypeFlag(const std::string& flag);
// "5GB", "500MB", "2GiB", "123" (bytes), as transformers' max_shard_size.
StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace st
