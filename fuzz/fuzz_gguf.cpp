// Fuzzes GgufFile::Open (header, metadata of every type, tensor infos, alignment, offsets) and then
// dequantizes every tensor it accepted and reads every byte of it, so that an accepted header that
// lies about its data shows up as an out-of-bounds read.
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = st::fuzz::ScratchPath(".gguf");
  st::fuzz::WriteScratch(path, data, size);
  st::StatusOr<st::GgufFile> f = st::GgufFile::Open(path);
  if (!f.ok()) return 0;
  std::vector<float> values;
  for (const st::GgufTensorInfo& t : f->tensors()) {
    // Validated: the bytes lie inside the file, so the count is bounded by its size.
    values.assign(static_cast<size_t>(t.Elements()), 0.f);
    f->ReadF32(t, values.data());
    const uint8_t* bytes = f->Data(t);
    volatile unsigned sum = 0;
    for (size_t i = 0; i < t.bytes; ++i) sum = sum + bytes[i];
  }
  (void)f->Find("general.architecture");
  (void)f->FindTensor("token_embd.weight");
  return 0;
}
