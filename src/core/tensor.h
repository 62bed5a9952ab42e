// Flat arenas and the named views carved out of them (llm.c's malloc_and_point_parameters).
// Parameters, gradients, optimizer state and activations each live in one AlignedBuffer; a
// tensor is an offset and a shape inside it. Not a general tensor library: no strides, no autograd.
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace st {

using Shape = std::vector<int64_t>;

int64_t Numel(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "[2048, 1536]"

// A failed allocation of a large buffer: which buffer and how many bytes. Thrown like
// std::bad_alloc (it is one) and turned into one error line by the CLI (docs/errors.md).
class OutOfMemory : public std::bad_alloc {
 public:
  OutOfMemory(std::string what, size_t bytes);
  const char* what() const noexcept override { return message_.c_str(); }
  size_t bytes() const { return bytes_; }

 private:
  std::string message_;
  size_t bytes_;
};

// Move-only owner of a 64-byte aligned, zero-initialised float buffer. `what` names the buffer
// in the OutOfMemory thrown when it cannot be had.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t count, const char* what = "a float buffer");
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return count_; }
  void Zero();

 private:
  float* data_ = nullptr;
  int64_t count_ = 0;
};

// One named tensor inside an arena.
struct ArenaEntry {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in elements from the arena base, a multiple of kArenaAlign
  int64_t numel = 0;
};

// The layout of an arena: which tensors, at which offsets. Built once, then frozen.
class ArenaLayout {
 public:
  static constexpr int64_t kArenaAlign =
      16;  // elements (64 bytes): every view starts on a cache line

  // Appends a tensor and returns its index. Names must be unique.
  int Add(const std::string& name, const Shape& shape);
  int64_t total() const { return total_; }
  int size() const { return static_cast<int>(entries_.size()); }
  const ArenaEntry& entry(int i) const { return entries_[i]; }
  const std::vector<ArenaEntry>& entries() const { return entries_; }
  // Index of a name, or -1.
  int Find(const std::string& name) const;

 private:
  std::vector<ArenaEntry> entries_;
  std::unordered_map<std::string, int> index_;
  int64_t total_ = 0;
};

// n rounded up to a whole number of cache lines of floats (ArenaLayout::kArenaAlign), as every
// tensor of an arena, an FSDP unit or a frozen slot starts on one.
inline int64_t AlignElements(int64_t n) {
  return (n + ArenaLayout::kArenaAlign - 1) / ArenaLayout::kArenaAlign * ArenaLayout::kArenaAlign;
}

}  // namespace st
