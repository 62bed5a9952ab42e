// Fuzzes what opening a model directory parses: model.safetensors.index.json (weight_map, shard
// names) and the safetensors header of its shard, matched against a small Gemma 4 config's tensors
// (names, shapes, dtypes), then every range read and stored-bytes view the loader hands out. Input:
// the index JSON, a NUL byte, then the bytes of the one shard it may name
// (model-00001-of-00001.safetensors); without a NUL, the whole input is model.safetensors.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "fuzz_util.h"
#include "io/hf_model.h"

namespace {

st::Gemma4Config MicroConfig() {
  st::Gemma4Config c;
  c.vocab_size = c.vocab_size_per_layer_input = 8;
  c.hidden_size = 4;
  c.intermediate_size = 4;
  c.num_hidden_layers = 1;
  c.layer_types = {st::LayerType::kFull};
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.global_head_dim = 2;
  c.hidden_size_per_layer_input = 0;
  c.num_kv_shared_layers = 0;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = st::fuzz::ScratchPath("_model_dir");
    std::filesystem::create_directories(d);
    return d;
  }();
  static const st::ParamRegistry reg = st::BuildParamRegistry(MicroConfig());
  std::error_code ec;
  for (const char* f :
       {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00001.safetensors"})
    std::filesystem::remove(dir + "/" + f, ec);
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  if (nul == nullptr) {
    st::fuzz::WriteScratch(dir + "/model.safetensors", data, size);
  } else {
    st::fuzz::WriteScratch(dir + "/model.safetensors.index.json", data,
                           static_cast<size_t>(nul - data));
    st::fuzz::WriteScratch(dir + "/model-00001-of-00001.safetensors", nul + 1,
                           size - static_cast<size_t>(nul - data) - 1);
  }
  st::StatusOr<std::vector<std::string>> files = st::ModelWeightFiles(dir);
  if (!files.ok()) return 0;
  const std::string index = dir + "/model.safetensors.index.json";
  auto weights = st::CheckpointWeights::Open(
      *files, reg, std::filesystem::exists(index, ec) ? index : std::string());
  if (!weights.ok()) return 0;
  std::vector<float> buf;
  for (int i = 0; i < reg.layout.size(); ++i) {
    const st::ArenaEntry& e = reg.layout.entry(i);
    buf.assign(static_cast<size_t>(e.numel), 0.0f);
    (*weights)->ReadAll(i, buf.data());
    if (e.numel > 1) (*weights)->Read(i, 1, e.numel - 1, buf.data());
    if (auto s = (*weights)->StoredBytes(i)) {
      volatile unsigned sum = 0;
      for (size_t b = 0; b < s->bytes; ++b)
        sum = sum + static_cast<const unsigned char*>(s->data)[b];
    }
    (*weights)->Release(i);
  }
  return 0;
}
