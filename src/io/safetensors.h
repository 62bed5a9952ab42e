// Reading and writing .safetensors checkpoints (the Hugging Face format: 8-byte little-endian
// header length, a JSON header, then the raw tensor bytes). Reading is a read-only mmap, validated
// up front so that no later access can go out of bounds; writing is atomic (temp file, fsync,
// rename). Not a tensor library: the reader hands out fp32/int32 copies or raw bytes, nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace st {

// The largest JSON header Open accepts; real checkpoints have headers of a few hundred KB.
constexpr size_t kMaxSafeTensorsHeaderBytes = 100'000'000;

// One tensor entry of the header, after validation.
struct SafeTensorInfo {
  std::string name;
  std::string
      dtype;    // as spelled in the file: "F32", "BF16", "F16", "I64", "I32", "U8", "BOOL", ...
  Shape shape;  // [] for a scalar
  size_t begin = 0;  // byte offsets relative to the start of the data section, begin <= end
  size_t end = 0;
};

// A read-only memory map of one .safetensors file. Open validates the whole header (types, dtypes,
// shapes, offsets inside the data section, sizes matching shapes, no overlaps) and every failure is
// a Status naming the path. Move-only; the mapping is released by the destructor.
class SafeTensorsFile {
 public:
  static StatusOr<SafeTensorsFile> Open(const std::string& path);

  SafeTensorsFile() = default;
  ~SafeTensorsFile();
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;
  SafeTensorsFile(SafeTensorsFile&& other) noexcept;
  SafeTensorsFile& operator=(SafeTensorsFile&& other) noexcept;

  // Every tensor, in the order of its bytes in the data section (ties, i.e. zero-element tensors at
  // the same offset, keep header order). For files written by WriteSafeTensors this is write order.
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafeTensorInfo* Find(const std::string& name) const;
  // The "__metadata__" object (string to string); empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The raw bytes of a tensor of this file, (end - begin) of them. Not necessarily aligned to the
  // element size: the format does not promise it (our writer does align the data section to 8).
  const void* Data(const SafeTensorInfo& t) const;

  // Copies a float tensor (F32, BF16, F16 or F64 in the file) into dst as fp32; dst holds numel
  // floats. Fails if the name is missing, the dtype is not a float type, or `expected` is non-empty
  // and differs from the stored shape (pass {} to skip the check; a scalar has numel 1).
  Status ReadF32(const std::string& name, float* dst, const Shape& expected) const;
  // Elements [begin, begin + count) of a float tensor of this file (IsFloatDType) as fp32: the
  // range reads of a sharded load. The range must lie inside the tensor (checked).
  void ReadF32Range(const SafeTensorInfo& t, int64_t begin, int64_t count, float* dst) const;
  static bool IsFloatDType(const std::string& dtype);
  // Copies an integer tensor (I64, I32, I16, I8, U64, U32, U16, U8 or BOOL) into int32 dst, failing
  // on any value outside int32 (or a BOOL byte other than 0/1). Same name/shape checks as ReadF32.
  Status ReadI32(const std::string& name, int32_t* dst, const Shape& expected) const;

  const std::string& path() const { return path_; }

 private:
  // Looks a tensor up and checks its shape against `expected`; the error names the path.
  StatusOr<const SafeTensorInfo*> Lookup(const std::string& name, const Shape& expected) const;
  void Release();

  std::string path_;
  void* map_ = nullptr;  // the whole file, PROT_READ; the descriptor is closed once mapped
  size_t map_size_ = 0;
  const unsigned char* data_ = nullptr;  // start of the data section inside map_
  size_t data_size_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `data` holds numel fp32 values (may be null when numel is 0) and is
// converted to `dtype` (round to nearest even) on the way out.
struct TensorToWrite {
  std::string name;
  DType dtype;
  Shape shape;
  const float* data;
};

// A tensor of a file to write: its name, element type and shape.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

// The data section's size for these tensors.
size_t SafeTensorsBytes(const std::vector<TensorSpec>& tensors);

// Writes a .safetensors file tensor by tensor, so that a model is saved without ever being whole
// in memory: Create writes the header (all names, dtypes and shapes known up front) into
// <path>.tmp.<pid>; the Append calls give the tensors' values in header order, each tensor in one
// or several consecutive pieces (zero-element tensors have no bytes and need no call); Commit
// checks that every byte came, fsyncs, renames over path and fsyncs the directory. A writer
// destroyed before Commit removes its temporary file. The header puts "__metadata__" first (omitted
// when empty) and is padded with spaces so that the data section starts 8-byte aligned, as the
// reference implementation does.
class SafeTensorsWriter {
 public:
  static StatusOr<SafeTensorsWriter> Create(const std::string& path,
                                            std::vector<TensorSpec> tensors,
                                            const std::map<std::string, std::string>& metadata);
  SafeTensorsWriter() = default;
  ~SafeTensorsWriter();
  SafeTensorsWriter(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter(SafeTensorsWriter&& other) noexcept;
  SafeTensorsWriter& operator=(SafeTensorsWriter&& other) noexcept;

  // The next n values of the current tensor, as fp32, converted (round to nearest even) to its
  // dtype.
  Status AppendF32(const float* data, int64_t n);
  // The next bytes of the current tensor, already in its dtype (must equal `dtype`): a frozen
  // tensor copied from the source checkpoint unchanged.
  Status AppendStored(const void* data, size_t bytes, DType dtype);
  Status Commit();

 private:
  const TensorSpec* next() const;  // the tensor the next bytes belong to
  Status Put(const void* data, size_t bytes);
  void Abandon();

  std::string path_, tmp_;
  std::vector<TensorSpec> tensors_;
  std::vector<size_t> bytes_;
  int fd_ = -1;
  size_t current_ = 0, written_ = 0;  // tensor being written, bytes of it written
  std::vector<uint16_t> buf_;
};

// Writes a whole .safetensors file atomically with a SafeTensorsWriter: the tensors in the given
// order, their bytes without gaps.
Status WriteSafeTensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata);

}  // namespace st
