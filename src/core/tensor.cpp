#include "core/tensor.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace st {

int64_t Numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

OutOfMemory::OutOfMemory(std::string what, size_t bytes) : bytes_(bytes) {
  char size[64];
  std::snprintf(size, sizeof(size), "%zu bytes, %.2f GiB", bytes,
                static_cast<double>(bytes) / (1 << 30));
  message_ = "out of memory: cannot allocate " + what + " (" + size + ")";
}

namespace {
// Buffers this large are mapped pages of their own: zero without touching them, and given back to
// the kernel when freed (a heap would keep them, so RSS would drift with every buffer a checkpoint
// allocates and frees).
constexpr size_t kMapBytes = size_t{1} << 20;

size_t BufferBytes(int64_t count) {
  return (static_cast<size_t>(count) * sizeof(float) + 63) / 64 * 64;
}

void FreeBuffer(float* data, int64_t count) {
  if (data == nullptr) return;
  const size_t bytes = BufferBytes(count);
  if (bytes >= kMapBytes)
    ::munmap(data, bytes);
  else
    std::free(data);
}
}  // namespace

AlignedBuffer::AlignedBuffer(int64_t count, const char* what) : count_(count) {
  if (count <= 0) return;
  const size_t bytes = BufferBytes(count);
  if (bytes >= kMapBytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<float*>(p);  // page-aligned, zero-filled
  } else {
    data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (data_ != nullptr) std::memset(data_, 0, bytes);
  }
  if (data_ == nullptr) {
    count_ = 0;
    throw OutOfMemory(what, bytes);
  }
}

AlignedBuffer::~AlignedBuffer() {
  FreeBuffer(data_, count_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), count_(other.count_) {
  other.data_ = nullptr;
  other.count_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    FreeBuffer(data_, count_);
    data_ = other.data_;
    count_ = other.count_;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

void AlignedBuffer::Zero() {
  if (data_) std::memset(data_, 0, static_cast<size_t>(count_) * sizeof(float));
}

int ArenaLayout::Add(const std::string& name, const Shape& shape) {
  ST_CHECK(index_.find(name) == index_.end()) << "duplicate arena entry " << name;
  ArenaEntry e;
  e.name = name;
  e.shape = shape;
  e.numel = Numel(shape);
  e.offset = total_;
  total_ += (e.numel + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  entries_.push_back(e);
  index_[name] = static_cast<int>(entries_.size()) - 1;
  return static_cast<int>(entries_.size()) - 1;
}

int ArenaLayout::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace st
