#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/fd.h"
#include "io/files.h"

namespace st {

static_assert(std::endian::native == std::endian::little,
              "GGUF is read and written little-endian; a big-endian host would need byte swaps");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS

bool IsFloat(GgufValueType t) {
  return t == GgufValueType::kF32 || t == GgufValueType::kF64;
}

// Bytes of a scalar of this type (0 for strings and arrays).
size_t ScalarBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    default:
      return 0;
  }
}

bool KnownType(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufValueType::kF64);
}

// A bounds-checked reader over the mapped bytes; the first failure sticks and names the offset.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t pos() const { return pos_; }
  void Fail(const std::string& what) {
    if (error_.empty()) error_ = StrCat(what, " (at byte ", pos_, ")");
  }
  bool Need(size_t bytes, const char* what) {
    if (!ok()) return false;
    if (bytes > n_ - pos_) {
      Fail(StrCat(what, " needs ", bytes, " bytes but the file ends ", n_ - pos_,
                  " bytes later; truncated file?"));
      return false;
    }
    return true;
  }
  template <typename T>
  T Get(const char* what) {
    T v{};
    if (!Need(sizeof(T), what)) return v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string String(const char* what) {
    const uint64_t len = Get<uint64_t>(what);
    if (!ok()) return {};
    if (!Need(len, what)) return {};
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  // One scalar of an integer or float type into v.
  void Scalar(GgufValueType t, GgufValue* v, const char* what) {
    switch (t) {
      case GgufValueType::kU8:
        v->i = Get<uint8_t>(what);
        return;
      case GgufValueType::kI8:
        v->i = Get<int8_t>(what);
        return;
      case GgufValueType::kU16:
        v->i = Get<uint16_t>(what);
        return;
      case GgufValueType::kI16:
        v->i = Get<int16_t>(what);
        return;
      case GgufValueType::kU32:
        v->i = Get<uint32_t>(what);
        return;
      case GgufValueType::kI32:
        v->i = Get<int32_t>(what);
        return;
      case GgufValueType::kBool: {
        const uint8_t b = Get<uint8_t>(what);
        if (ok() && b > 1) Fail(StrCat(what, ": a bool of value ", int(b)));
        v->i = b;
        return;
      }
      case GgufValueType::kU64:
        v->i = static_cast<int64_t>(Get<uint64_t>(what));
        return;
      case GgufValueType::kI64:
        v->i = Get<int64_t>(what);
        return;
      case GgufValueType::kF32:
        v->f = Get<float>(what);
        return;
      case GgufValueType::kF64:
        v->f = Get<double>(what);
        return;
      default:
        Fail(StrCat(what, ": not a scalar type"));
    }
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  std::string error_;
};

GgufValue ReadValue(Cursor& c, const std::string& key) {
  GgufValue v;
  const std::string what = StrCat("metadata '", key, "'");
  const uint32_t type = c.Get<uint32_t>(what.c_str());
  if (!c.ok()) return v;
  if (!KnownType(type)) {
    c.Fail(StrCat(what, " has value type ", type, ", which GGUF does not define"));
    return v;
  }
  v.type = static_cast<GgufValueType>(type);
  if (v.type == GgufValueType::kString) {
    v.s = c.String(what.c_str());
  } else if (v.type == GgufValueType::kArray) {
    const uint32_t elem = c.Get<uint32_t>(what.c_str());
    const uint64_t count = c.Get<uint64_t>(what.c_str());
    if (!c.ok()) return v;
    if (!KnownType(elem) || elem == static_cast<uint32_t>(GgufValueType::kArray)) {
      c.Fail(StrCat(what, " is an array of ",
                    KnownType(elem) ? "arrays" : StrCat("value type ", elem),
                    ", which slicetrain does not read"));
      return v;
    }
    v.elem = static_cast<GgufValueType>(elem);
    // Every element takes at least one byte (a string at least eight): a count beyond what is
    // left is a broken file, found before anything is allocated for it.
    const size_t least = v.elem == GgufValueType::kString ? 8 : ScalarBytes(v.elem);
    if (count > std::numeric_limits<size_t>::max() / least || !c.Need(count * least, what.c_str()))
      return v;
    if (v.elem == GgufValueType::kString) {
      v.strings.reserve(count);
      for (uint64_t k = 0; k < count && c.ok(); ++k) v.strings.push_back(c.String(what.c_str()));
    } else if (IsFloat(v.elem)) {
      v.floats.reserve(count);
      GgufValue item;
      for (uint64_t k = 0; k < count && c.ok(); ++k) {
        c.Scalar(v.elem, &item, what.c_str());
        v.floats.push_back(item.f);
      }
    } else {
      v.ints.reserve(count);
      GgufValue item;
      for (uint64_t k = 0; k < count && c.ok(); ++k) {
        c.Scalar(v.elem, &item, what.c_str());
        v.ints.push_back(item.i);
      }
    }
  } else {
    c.Scalar(v.type, &v, what.c_str());
  }
  return v;
}

// ---- writing ----

void PutBytes(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}

template <typename T>
void Put(std::string& out, T v) {
  PutBytes(out, &v, sizeof(T));
}

void PutString(std::string& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out += s;
}

void PutScalar(std::string& out, GgufValueType t, int64_t i, double f) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kBool:
      Put<uint8_t>(out, static_cast<uint8_t>(i));
      return;
    case GgufValueType::kI8:
      Put<int8_t>(out, static_cast<int8_t>(i));
      return;
    case GgufValueType::kU16:
      Put<uint16_t>(out, static_cast<uint16_t>(i));
      return;
    case GgufValueType::kI16:
      Put<int16_t>(out, static_cast<int16_t>(i));
      return;
    case GgufValueType::kU32:
      Put<uint32_t>(out, static_cast<uint32_t>(i));
      return;
    case GgufValueType::kI32:
      Put<int32_t>(out, static_cast<int32_t>(i));
      return;
    case GgufValueType::kU64:
      Put<uint64_t>(out, static_cast<uint64_t>(i));
      return;
    case GgufValueType::kI64:
      Put<int64_t>(out, i);
      return;
    case GgufValueType::kF32:
      Put<float>(out, static_cast<float>(f));
      return;
    case GgufValueType::kF64:
      Put<double>(out, f);
      return;
    default:
      return;
  }
}

void PutValue(std::string& out, const GgufValue& v) {
  Put<uint32_t>(out, static_cast<uint32_t>(v.type));
  if (v.type == GgufValueType::kString) {
    PutString(out, v.s);
  } else if (v.type == GgufValueType::kArray) {
    Put<uint32_t>(out, static_cast<uint32_t>(v.elem));
    Put<uint64_t>(out, v.ArraySize());
    if (v.elem == GgufValueType::kString) {
      for (const std::string& s : v.strings) PutString(out, s);
    } else if (IsFloat(v.elem)) {
      for (double f : v.floats) PutScalar(out, v.elem, 0, f);
    } else {
      for (int64_t i : v.ints) PutScalar(out, v.elem, i, 0);
    }
  } else {
    PutScalar(out, v.type, v.i, v.f);
  }
}

uint64_t PadTo(uint64_t n, uint64_t align) {
  return (n + align - 1) / align * align;
}

}  // namespace

const char* GgufValueTypeName(GgufValueType t) {
  static const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                 "int32",  "float32", "bool",   "string", "array",
                                 "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

GgufValue GgufValue::Int(GgufValueType t, int64_t v) {
  GgufValue g;
  g.type = t;
  g.i = v;
  return g;
}

GgufValue GgufValue::Float(GgufValueType t, double v) {
  GgufValue g;
  g.type = t;
  g.f = v;
  return g;
}

GgufValue GgufValue::String(std::string v) {
  GgufValue g;
  g.type = GgufValueType::kString;
  g.s = std::move(v);
  return g;
}

GgufValue GgufValue::IntArray(GgufValueType elem, std::vector<int64_t> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem = elem;
  g.ints = std::move(v);
  return g;
}

GgufValue GgufValue::FloatArray(GgufValueType elem, std::vector<double> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem = elem;
  g.floats = std::move(v);
  return g;
}

GgufValue GgufValue::StringArray(std::vector<std::string> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem = GgufValueType::kString;
  g.strings = std::move(v);
  return g;
}

size_t GgufValue::ArraySize() const {
  if (elem == GgufValueType::kString) return strings.size();
  return IsFloat(elem) ? floats.size() : ints.size();
}

int64_t GgufTensorInfo::Elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensorInfo::TorchShape() const {
  return std::vector<int64_t>(ne.rbegin(), ne.rend());
}

// ---- GgufFile ----

bool IsGgufFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool ok = ::pread(fd, magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  ::close(fd);
  return ok;
}

StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      const int err = errno;
      const std::string msg = StrCat(path, ": cannot open: ", ErrnoMessage(err));
      return err == ENOENT ? NotFound(msg) : IoError(msg);
    }
    struct stat sb;
    if (::fstat(fd.get(), &sb) != 0)
      return IoError(StrCat(path, ": fstat failed: ", ErrnoMessage(errno)));
    if (!S_ISREG(sb.st_mode)) return InvalidArgument(StrCat(path, ": not a regular file"));
    const auto size = static_cast<size_t>(sb.st_size);
    if (size < 24)
      return DataLoss(StrCat(path, ": ", size,
                             " bytes, shorter than a GGUF header (24 bytes); not a GGUF file"));
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (map == MAP_FAILED) return IoError(StrCat(path, ": mmap failed: ", ErrnoMessage(errno)));
    f.map_ = map;
    f.map_size_ = size;
  }
  const auto* base = static_cast<const uint8_t*>(f.map_);
  Cursor c(base, f.map_size_);
  auto bad = [&](const std::string& what) { return DataLoss(StrCat(path, ": ", what)); };
  const uint32_t magic = c.Get<uint32_t>("magic");
  if (magic != kMagic)
    return bad("does not start with GGUF's magic bytes \"GGUF\"; not a GGUF file");
  f.version_ = c.Get<uint32_t>("version");
  if (f.version_ == 0x03000000u || f.version_ == 0x02000000u)
    return bad("is a big-endian GGUF file; slicetrain reads little-endian ones only");
  if (f.version_ != 2 && f.version_ != 3)
    return bad(StrCat("is GGUF version ", f.version_, "; slicetrain reads versions 2 and 3"));
  const uint64_t n_tensors = c.Get<uint64_t>("tensor count");
  const uint64_t n_kv = c.Get<uint64_t>("metadata count");
  // Each metadata entry takes at least 12 bytes, each tensor info at least 24.
  if (n_kv > f.map_size_ / 12 || n_tensors > f.map_size_ / 24)
    return bad(StrCat("claims ", n_kv, " metadata entries and ", n_tensors,
                      " tensors, more than its ", f.map_size_, " bytes can hold; broken file?"));
  for (uint64_t k = 0; k < n_kv && c.ok(); ++k) {
    std::string key = c.String("metadata key");
    if (!c.ok()) break;
    GgufValue v = ReadValue(c, key);
    if (!c.ok()) break;
    if (!f.key_index_.emplace(key, f.metadata_.size()).second)
      return bad(StrCat("metadata key '", key, "' appears twice"));
    f.metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (!c.ok()) return bad(c.error());
  if (const GgufValue* a = f.Find("general.alignment")) {
    if (a->type != GgufValueType::kU32 || a->i == 0 || (a->i & (a->i - 1)) != 0)
      return bad(StrCat("general.alignment must be a uint32 power of two, not a ",
                        GgufValueTypeName(a->type), " of value ", a->i));
    f.alignment_ = static_cast<uint32_t>(a->i);
  }
  for (uint64_t k = 0; k < n_tensors && c.ok(); ++k) {
    GgufTensorInfo t;
    t.name = c.String("tensor name");
    const uint32_t n_dims = c.Get<uint32_t>("tensor dims");
    if (!c.ok()) break;
    if (n_dims < 1 || n_dims > kMaxDims)
      return bad(
          StrCat("tensor '", t.name, "' has ", n_dims, " dimensions; GGUF allows 1 to ", kMaxDims));
    // At most 2^40 elements (4 TiB of fp32), checked as the dims come, so no product overflows.
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = c.Get<uint64_t>("tensor dims");
      if (ne != 0 && elements > (uint64_t{1} << 40) / ne)
        return bad(StrCat("tensor '", t.name, "' has more than 2^40 elements (a dim of ", ne, ")"));
      elements *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t type = c.Get<uint32_t>("tensor type");
    t.offset = c.Get<uint64_t>("tensor offset");
    if (!c.ok()) break;
    const std::optional<GgmlTypeInfo> info = GgmlTypeOf(type);
    if (!info)
      return bad(StrCat("tensor '", t.name, "' has ggml type ", type,
                        ", which slicetrain does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_K, "
                        "Q6_K)"));
    t.type = info->type;
    if (t.ne[0] % info->block_elems != 0)
      return bad(StrCat("tensor '", t.name, "' has rows of ", t.ne[0],
                        " values, not a multiple of ", info->name, "'s blocks of ",
                        info->block_elems));
    t.bytes = static_cast<size_t>(t.Elements() / info->block_elems * info->block_bytes);
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
      return bad(StrCat("tensor '", t.name, "' appears twice"));
    f.tensors_.push_back(std::move(t));
  }
  if (!c.ok()) return bad(c.error());
  f.data_offset_ = PadTo(c.pos(), f.alignment_);
  const size_t data_size = f.map_size_ >= f.data_offset_ ? f.map_size_ - f.data_offset_ : 0;
  if (!f.tensors_.empty() && f.map_size_ < f.data_offset_)
    return bad("ends before its tensor data begins; truncated file?");
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f.tensors_) {
    if (t.offset % f.alignment_ != 0)
      return bad(StrCat("tensor '", t.name, "' starts at offset ", t.offset,
                        ", not a multiple of the alignment ", f.alignment_));
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      return bad(StrCat("tensor '", t.name, "' (", t.bytes, " bytes at offset ", t.offset,
                        ") runs past the end of the data (", data_size,
                        " bytes); truncated file?"));
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k)
    if (by_offset[k - 1]->offset + by_offset[k - 1]->bytes > by_offset[k]->offset)
      return bad(
          StrCat("tensors '", by_offset[k - 1]->name, "' and '", by_offset[k]->name, "' overlap"));
  return f;
}

GgufFile::~GgufFile() {
  Release();
}

void GgufFile::Release() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

GgufFile::GgufFile(GgufFile&& o) noexcept {
  *this = std::move(o);
}

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    metadata_ = std::move(o.metadata_);
    key_index_ = std::move(o.key_index_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::Data(const GgufTensorInfo& t) const {
  return static_cast<const uint8_t*>(map_) + data_offset_ + t.offset;
}

void GgufFile::ReadF32(const GgufTensorInfo& t, float* dst) const {
  const int64_t row = t.ne[0];
  const int64_t rows = row > 0 ? t.Elements() / row : 0;
  const size_t row_bytes = GgmlRowBytes(t.type, row);
  const uint8_t* p = Data(t);
  for (int64_t r = 0; r < rows; ++r) DequantizeRow(t.type, p + r * row_bytes, row, dst + r * row);
}

void GgufFile::Release(const GgufTensorInfo& t, size_t begin, size_t count) const {
  begin = std::min(begin, t.bytes);
  DropPages(Data(t) + begin, std::min(count, t.bytes - begin));
}

// ---- GgufWriter ----

GgufWriter::~GgufWriter() {
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void GgufWriter::Set(const std::string& key, GgufValue value) {
  if (key == "general.alignment" && value.type == GgufValueType::kU32 && value.i > 0 &&
      (value.i & (value.i - 1)) == 0)
    alignment_ = static_cast<uint32_t>(value.i);
  for (auto& [k, v] : metadata_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  metadata_.emplace_back(key, std::move(value));
}

Status GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> ne, GgmlType type) {
  if (ne.empty() || ne.size() > kMaxDims)
    return InvalidArgument(StrCat("GGUF tensor '", name, "': ", ne.size(), " dimensions"));
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return InvalidArgument(StrCat("GGUF tensor '", name, "' added twice"));
  const GgmlTypeInfo info = GgmlTypeOf(type);
  if (ne[0] % info.block_elems != 0)
    return InvalidArgument(StrCat("GGUF tensor '", name, "': rows of ", ne[0],
                                  " values are not a whole number of ", info.name, " blocks (",
                                  info.block_elems, ")"));
  GgufTensorInfo t;
  t.name = name;
  t.ne = std::move(ne);
  t.type = type;
  t.bytes = static_cast<size_t>(t.Elements() / info.block_elems * info.block_bytes);
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path, const FillFn& fill) {
  path_ = path;
  tmp_ = StrCat(path, ".tmp.", ::getpid());
  // The offsets, now that the alignment is final.
  uint64_t offset = 0;
  for (GgufTensorInfo& t : tensors_) {
    t.offset = offset;
    offset += PadTo(t.bytes, alignment_);
  }
  std::string head;
  Put<uint32_t>(head, kMagic);
  Put<uint32_t>(head, kGgufVersion);
  Put<uint64_t>(head, tensors_.size());
  Put<uint64_t>(head, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    PutString(head, key);
    PutValue(head, value);
  }
  for (const GgufTensorInfo& t : tensors_) {
    PutString(head, t.name);
    Put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(head, static_cast<uint64_t>(d));
    Put<uint32_t>(head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(head, t.offset);
  }
  head.resize(PadTo(head.size(), alignment_), '\0');
  Fd fd(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return IoError(StrCat(tmp_, ": cannot create: ", ErrnoMessage(errno)));
  ST_RETURN_IF_ERROR(WriteAll(fd.get(), head.data(), head.size(), tmp_));
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensorInfo& t = tensors_[i];
    size_t written = 0;
    const PutFn put = [&](const void* data, size_t n) -> Status {
      if (n > t.bytes - written)
        return Internal(
            StrCat(path, ": tensor '", t.name, "' came with more than its ", t.bytes, " bytes"));
      written += n;
      return WriteAll(fd.get(), data, n, tmp_);
    };
    ST_RETURN_IF_ERROR(fill(i, put));
    if (written != t.bytes)
      return Internal(
          StrCat(path, ": tensor '", t.name, "' came with ", written, " bytes, not ", t.bytes));
    ST_RETURN_IF_ERROR(
        WriteAll(fd.get(), zeros.data(), PadTo(written, alignment_) - written, tmp_));
  }
  if (::fsync(fd.get()) != 0) return IoError(StrCat(tmp_, ": fsync failed: ", ErrnoMessage(errno)));
  return Status::Ok();
}

Status GgufWriter::Commit() {
  if (tmp_.empty()) return Internal(StrCat(path_, ": nothing written to commit"));
  ST_RETURN_IF_ERROR(RenameDurably(tmp_, path_));
  tmp_.clear();
  return Status::Ok();
}

}  // namespace st
