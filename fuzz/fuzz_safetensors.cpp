// Fuzzes SafeTensorsFile::Open (header length, JSON header, dtypes, shapes, offsets, overlaps) and
// then reads every tensor it accepted as fp32 and as int32, so that an accepted header that lies
// about its data shows up as an out-of-bounds read.
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = st::fuzz::ScratchPath(".safetensors");
  st::fuzz::WriteScratch(path, data, size);
  st::StatusOr<st::SafeTensorsFile> f = st::SafeTensorsFile::Open(path);
  if (!f.ok()) return 0;
  std::vector<float> f32;
  std::vector<int32_t> i32;
  for (const st::SafeTensorInfo& t : f->tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;  // bounded: numel * element size == end - begin
    f32.assign(static_cast<size_t>(numel), 0.f);
    i32.assign(static_cast<size_t>(numel), 0);
    (void)f->ReadF32(t.name, f32.data(), t.shape);
    (void)f->ReadI32(t.name, i32.data(), {});
    (void)f->ReadF32(t.name, f32.data(), {numel + 1});  // a shape mismatch is an error, not a read
    const unsigned char* bytes = static_cast<const unsigned char*>(f->Data(t));
    volatile unsigned sum = 0;
    for (size_t i = 0; i < t.end - t.begin; ++i) sum = sum + bytes[i];
  }
  (void)f->Find("model.embed_tokens.weight");
  return 0;
}
