// A GGUF file of a Gemma 4 model as a model slicetrain runs: what llama.cpp's gemma4 reads (and
// `export --format gguf` writes; docs/gguf.md) turned back into a Gemma4Config and the registry's
// tensors. `generate`/`chat` decode its quantized matrices as stored (DecodeWeights' block
// storage, no second rounding); everything else reads the values through GgufWeights, converted
// to fp32 row by row from the memory-mapped file.
#pragma once

#include <string>

#include "core/status.h"
#include "io/gguf.h"
#include "io/model_loader.h"
#include "model/config.h"
#include "model/weights.h"

namespace st {

// The config of a gemma4 GGUF file from its metadata (`gemma4.*` keys) and tensor shapes: the
// vocabulary sizes from token_embd and per_layer_token_embd, the full layers' partial rotation
// from rope_freqs, the token ids from `tokenizer.ggml.*`. One line naming the key or tensor when
// something is missing or contradicts the rest, or when the file is not a gemma4 model.
StatusOr<Gemma4Config> Gemma4ConfigFromGguf(const GgufFile& f);

// The registry's tensors read from a GGUF file (registry names mapped to GGUF names as
// GgufTensorName does); every tensor's presence and shape is checked when it is built.
class GgufWeights : public WeightSource {
 public:
  static StatusOr<std::unique_ptr<GgufWeights>> Open(GgufFile file, const ParamRegistry& reg);
  void Read(int entry, int64_t begin, int64_t count, float* dst) const override;
  std::optional<StoredBlocks> StoredGgml(int entry) const override;
  void Release(int entry, int64_t begin, int64_t count) const override;
  // BF16 when the matrices are mostly stored in bf16 (decoding then holds them in bf16), else F32.
  DType dtype() const override { return dtype_; }
  const GgufFile& file() const { return file_; }

 private:
  GgufWeights(GgufFile file, const ParamRegistry& reg);
  GgufFile file_;
  std::vector<const GgufTensorInfo*> tensor_;  // per registry entry (null past the base ones)
  DType dtype_ = DType::kF32;
};

// --model-id FILE.gguf: the config, registry and weights of a gemma4 GGUF file.
StatusOr<LoadedModel> LoadGgufModel(const std::string& path);

}  // namespace st
