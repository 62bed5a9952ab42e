// GGUF files, the format llama.cpp, Ollama and LM Studio load (version 3, little-endian): a header
// (magic "GGUF", version, tensor count, metadata count), typed key/value metadata, one info per
// tensor (name, dims with the fastest-varying first, ggml type, offset), padding to the alignment
// (`general.alignment`, 32 by default), then each tensor's bytes, padded to the alignment. Written
// from the format's description in ggml's docs/gguf.md; checked byte for byte against the `gguf`
// package's GGUFWriter (tools/make_gguf_fixtures.py, tests/test_gguf.cpp).
//
// Reading maps the file read-only and validates all of the header up front (every length, type,
// offset and size inside the file), so that no later access can go out of bounds; every failure
// is one Status naming the path and what is wrong. Writing streams the tensors one by one into a
// temporary file that only Commit renames into place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/quant.h"

namespace st {

// GGUF's metadata value types (enum gguf_type).
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* GgufValueTypeName(GgufValueType t);

// One metadata value: a scalar, a string, or an array of scalars or strings (arrays of arrays,
// which no model file uses, are refused on reading). Integers (bool too) live in `i` (a uint64 as
// its bit pattern), floats in `f`; arrays in the vector of their element kind.
struct GgufValue {
  GgufValueType type = GgufValueType::kU32;
  GgufValueType elem = GgufValueType::kU32;  // arrays only
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  static GgufValue Int(GgufValueType t, int64_t v);   // any integer type or bool
  static GgufValue Float(GgufValueType t, double v);  // kF32 or kF64
  static GgufValue String(std::string v);
  static GgufValue IntArray(GgufValueType elem, std::vector<int64_t> v);
  static GgufValue FloatArray(GgufValueType elem, std::vector<double> v);
  static GgufValue StringArray(std::vector<std::string> v);
  size_t ArraySize() const;
};

// One tensor of a file: `ne` in GGUF's order (ne[0] the length of a row; a PyTorch [out, in]
// weight is ne = {in, out}), its type, and where its bytes are relative to the data section.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;
  size_t bytes = 0;
  int64_t Elements() const;
  std::vector<int64_t> TorchShape() const;  // ne reversed
};

// Whether the file at path starts with GGUF's magic (false when it cannot be read).
bool IsGgufFile(const std::string& path);

constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kGgufDefaultAlignment = 32;

class GgufFile {
 public:
  static StatusOr<GgufFile> Open(const std::string& path);
  GgufFile() = default;
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // In file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufValue* Find(const std::string& key) const;
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // The stored bytes of a tensor of this file (t.bytes of them).
  const uint8_t* Data(const GgufTensorInfo& t) const;
  // The tensor as fp32 (every type GgmlTypeOf knows); dst holds t.Elements() floats.
  void ReadF32(const GgufTensorInfo& t, float* dst) const;
  // Drops this process's pages of a tensor's bytes (they stay in the page cache): reading a
  // multi-gigabyte file tensor by tensor then keeps RSS at one tensor.
  void Release(const GgufTensorInfo& t) const { Release(t, 0, t.bytes); }
  // The same for bytes [begin, begin + count) of a tensor (a chunk of rows just read).
  void Release(const GgufTensorInfo& t, size_t begin, size_t count) const;
  const std::string& path() const { return path_; }
  size_t data_offset() const { return data_offset_; }

 private:
  void Release();
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0, alignment_ = kGgufDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Builds a GGUF file: metadata (kept in the order first set; `general.alignment` sets the
// alignment), tensor infos, then the data, tensor by tensor, so that a model is never whole in
// memory. Write streams everything into <path>.tmp.<pid>; Commit renames it over path (and
// fsyncs); a writer destroyed without Commit removes the temporary file, so a failed export
// leaves nothing behind.
class GgufWriter {
 public:
  GgufWriter() = default;
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Replaces the value of an existing key in place.
  void Set(const std::string& key, GgufValue value);
  // ne as in GgufTensorInfo; a row (ne[0]) must be a whole number of the type's blocks.
  Status AddTensor(const std::string& name, std::vector<int64_t> ne, GgmlType type);
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // `fill(i, put)` gives tensor i's bytes, in order, through `put` in as many pieces as it likes
  // (exactly tensors()[i].bytes in all), so that no tensor has to be whole in memory.
  using PutFn = std::function<Status(const void* data, size_t bytes)>;
  using FillFn = std::function<Status(size_t index, const PutFn& put)>;
  Status Write(const std::string& path, const FillFn& fill);
  // The temporary file Write produced (to reload and check before Commit).
  const std::string& temporary_path() const { return tmp_; }
  Status Commit();

 private:
  std::string path_, tmp_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  uint32_t alignment_ = kGgufDefaultAlignment;
};

}  // namespace st
