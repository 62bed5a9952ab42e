#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "io/files.h"

namespace st {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; a big-endian host would need byte swaps");

namespace {

using Json = nlohmann::ordered_json;  // keeps header order, which we report for ties

// ---- dtypes as spelled in safetensors headers ----

enum class Kind { kFloat, kSigned, kUnsigned, kBool, kOther };

struct DTypeDesc {
  const char* name;
  size_t size;  // bytes per element
  Kind kind;
};

// The byte-sized dtypes of the reference implementation. Sub-byte types (F4, F6_*) are not listed:
// Open rejects them as unknown rather than mis-sizing them.
constexpr DTypeDesc kDTypes[] = {
    {"F64", 8, Kind::kFloat},     {"F32", 4, Kind::kFloat},     {"F16", 2, Kind::kFloat},
    {"BF16", 2, Kind::kFloat},    {"I64", 8, Kind::kSigned},    {"I32", 4, Kind::kSigned},
    {"I16", 2, Kind::kSigned},    {"I8", 1, Kind::kSigned},     {"U64", 8, Kind::kUnsigned},
    {"U32", 4, Kind::kUnsigned},  {"U16", 2, Kind::kUnsigned},  {"U8", 1, Kind::kUnsigned},
    {"BOOL", 1, Kind::kBool},     {"F8_E4M3", 1, Kind::kOther}, {"F8_E5M2", 1, Kind::kOther},
    {"F8_E8M0", 1, Kind::kOther},
};

const DTypeDesc* FindDType(const std::string& name) {
  for (const DTypeDesc& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// Move-only owner of a file descriptor.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports close()'s errno (0 on success): on NFS and friends a failed close can be
  // the first sign of a lost write.
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// Makes file-derived text safe for a one-line message: control bytes (and, with escape_high, bytes
// >= 0x80, for text that may not be UTF-8) become \xNN, and text longer than max bytes is cut.
std::string Clip(std::string_view s, bool escape_high = false, size_t max = 120) {
  std::string out;
  size_t n = s.size();
  if (n > max) {
    n = max;
    while (!escape_high && n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  }
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || (escape_high && c >= 0x80)) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < s.size()) out += "...";
  return out;
}

// A JSON value as it appears in the header, clipped for a message.
std::string Dump(const Json& j) {
  return Clip(j.dump());
}

// JSON type names for error messages ("number", "string", ...).
std::string TypeOf(const Json& j) {
  return j.type_name();
}

// Reads a non-negative JSON integer (shape dim or offset). nlohmann stores non-negative integers as
// unsigned, so a signed integer here is negative.
Status ReadUnsigned(const Json& j, const std::string& what, uint64_t max, uint64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > max) return DataLoss(StrCat(what, " is ", v, ", larger than ", max));
    *out = v;
    return Status::Ok();
  }
  if (j.is_number_integer()) return DataLoss(StrCat(what, " is negative (", Dump(j), ")"));
  return DataLoss(StrCat(what, " must be a non-negative integer, found ", TypeOf(j), " ", Dump(j)));
}

// Validates one tensor entry of the header against the data section size.
Status ParseEntry(const std::string& name, const Json& v, size_t data_size, SafeTensorInfo* out) {
  const std::string where = StrCat("tensor '", Clip(name), "'");
  if (!v.is_object())
    return DataLoss(StrCat(where, ": entry must be an object, found ", TypeOf(v)));
  auto field = [&](const char* key, const Json** f) -> Status {
    auto it = v.find(key);
    if (it == v.end()) return DataLoss(StrCat(where, ": missing \"", key, "\""));
    *f = &*it;
    return Status::Ok();
  };
  const Json* dtype;
  const Json* shape;
  const Json* offsets;
  ST_RETURN_IF_ERROR(field("dtype", &dtype));
  ST_RETURN_IF_ERROR(field("shape", &shape));
  ST_RETURN_IF_ERROR(field("data_offsets", &offsets));

  if (!dtype->is_string()) {
    return DataLoss(StrCat(where, ": \"dtype\" must be a string, found ", TypeOf(*dtype)));
  }
  out->name = name;
  out->dtype = dtype->get<std::string>();
  const DTypeDesc* desc = FindDType(out->dtype);
  if (desc == nullptr) return DataLoss(StrCat(where, ": unknown dtype \"", Clip(out->dtype), "\""));

  if (!shape->is_array()) {
    return DataLoss(StrCat(where, ": \"shape\" must be an array, found ", TypeOf(*shape)));
  }
  int64_t numel = 1;
  for (const Json& dim : *shape) {
    uint64_t d;
    ST_RETURN_IF_ERROR(ReadUnsigned(dim, StrCat(where, ": shape dim"),
                                    static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                                    &d));
    out->shape.push_back(static_cast<int64_t>(d));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(d), &numel)) {
      return DataLoss(StrCat(where, ": shape ", Dump(*shape), " has more than 2^63 elements"));
    }
  }
  size_t bytes;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), desc->size, &bytes)) {
    return DataLoss(StrCat(where, ": shape ", Dump(*shape), " of ", out->dtype,
                           " overflows a 64-bit byte count"));
  }

  if (!offsets->is_array() || offsets->size() != 2) {
    return DataLoss(
        StrCat(where, ": \"data_offsets\" must be [begin, end], found ", Dump(*offsets)));
  }
  uint64_t begin, end;
  ST_RETURN_IF_ERROR(ReadUnsigned((*offsets)[0], StrCat(where, ": data_offsets begin"),
                                  std::numeric_limits<size_t>::max(), &begin));
  ST_RETURN_IF_ERROR(ReadUnsigned((*offsets)[1], StrCat(where, ": data_offsets end"),
                                  std::numeric_limits<size_t>::max(), &end));
  if (begin > end) {
    return DataLoss(StrCat(where, ": data_offsets [", begin, ", ", end, "] has begin > end"));
  }
  if (end > data_size) {
    return DataLoss(StrCat(where, ": data_offsets [", begin, ", ", end,
                           "] run past the end of the data section (", data_size,
                           " bytes); truncated file?"));
  }
  if (end - begin != bytes) {
    return DataLoss(StrCat(where, ": data_offsets [", begin, ", ", end, "] span ", end - begin,
                           " bytes but ", out->dtype, " ", ShapeString(out->shape), " needs ",
                           bytes));
  }
  out->begin = begin;
  out->end = end;
  return Status::Ok();
}

Status ParseMetadata(const Json& v, std::map<std::string, std::string>* out) {
  if (!v.is_object()) {
    return DataLoss(StrCat("\"__metadata__\" must be an object, found ", TypeOf(v)));
  }
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return DataLoss(StrCat("\"__metadata__\" value of \"", Clip(key),
                             "\" must be a string, found ", TypeOf(value)));
    }
    (*out)[key] = value.get<std::string>();
  }
  return Status::Ok();
}

// Sorts tensors by position in the data section and rejects any two (non-empty) that share bytes.
Status SortAndCheckOverlaps(std::vector<SafeTensorInfo>* tensors) {
  std::stable_sort(tensors->begin(), tensors->end(),
                   [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  const SafeTensorInfo* furthest = nullptr;  // the non-empty tensor with the largest end so far
  for (const SafeTensorInfo& t : *tensors) {
    if (t.begin == t.end) continue;
    if (furthest != nullptr && t.begin < furthest->end) {
      return DataLoss(StrCat("tensors '", furthest->name, "' [", furthest->begin, ", ",
                             furthest->end, ") and '", t.name, "' [", t.begin, ", ", t.end,
                             ") overlap in the data section"));
    }
    if (furthest == nullptr || t.end > furthest->end) furthest = &t;
  }
  return Status::Ok();
}

// Parses and validates the JSON header `text` (n bytes) for a data section of data_size bytes.
Status ParseHeader(const char* text, size_t n, size_t data_size,
                   std::vector<SafeTensorInfo>* tensors, std::map<std::string, std::string>* meta) {
  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name is ambiguous, so
  // the callback notes the first one.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  bool has_duplicate = false;
  Json::parser_callback_t note_duplicates = [&](int depth, Json::parse_event_t event,
                                                Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && !has_duplicate) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) {
        duplicate = std::move(key);
        has_duplicate = true;
      }
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, text + n, note_duplicates);
  } catch (const Json::exception& e) {
    return DataLoss(
        StrCat("header is not valid JSON: ", Clip(e.what(), /*escape_high=*/true, /*max=*/320)));
  }
  if (!header.is_object()) {
    return DataLoss(StrCat("header must be a JSON object, found ", TypeOf(header)));
  }
  if (has_duplicate) return DataLoss(StrCat("header names '", Clip(duplicate), "' more than once"));

  try {
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        ST_RETURN_IF_ERROR(ParseMetadata(value, meta));
        continue;
      }
      SafeTensorInfo info;
      ST_RETURN_IF_ERROR(ParseEntry(key, value, data_size, &info));
      tensors->push_back(std::move(info));
    }
  } catch (const Json::exception& e) {  // not expected after the type checks, but never crash
    return DataLoss(
        StrCat("malformed header: ", Clip(e.what(), /*escape_high=*/true, /*max=*/320)));
  }
  return SortAndCheckOverlaps(tensors);
}

bool IsAligned(const void* p, size_t align) {
  return reinterpret_cast<uintptr_t>(p) % align == 0;
}

// Converts n 16-bit floats at a possibly unaligned src to fp32.
void Convert16ToF32(DType type, const unsigned char* src, float* dst, int64_t n) {
  if (IsAligned(src, 2)) {
    ConvertToF32(type, src, dst, n);
    return;
  }
  constexpr int64_t kChunk = 4096;
  uint16_t buf[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    int64_t m = std::min(kChunk, n - i);
    std::memcpy(buf, src + i * 2, static_cast<size_t>(m) * 2);
    ConvertToF32(type, buf, dst + i, m);
  }
}

// Copies n integers of type T at a possibly unaligned src into int32, rejecting any that do not
// fit.
template <typename T>
Status CopyIntsToI32(const unsigned char* src, int64_t n, int32_t* dst, const std::string& where) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    if (!std::in_range<int32_t>(v)) {
      return InvalidArgument(StrCat(where, ": element ", i, " = ", +v, " does not fit in int32"));
    }
    dst[i] = static_cast<int32_t>(v);
  }
  return Status::Ok();
}

Status CopyBoolsToI32(const unsigned char* src, int64_t n, int32_t* dst, const std::string& where) {
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] > 1) {
      return DataLoss(StrCat(where, ": BOOL element ", i, " has byte value ",
                             static_cast<int>(src[i]), ", not 0 or 1"));
    }
    dst[i] = src[i];
  }
  return Status::Ok();
}

// The header and byte counts of a file about to be written.
struct WritePlan {
  std::string header;  // JSON, space-padded to a multiple of 8 bytes
  std::vector<size_t> bytes;
};

StatusOr<WritePlan> PlanWrite(const std::vector<TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  WritePlan plan;
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::unordered_set<std::string> names;
  size_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const std::string where = StrCat("tensor '", t.name, "'");
    if (t.name == "__metadata__") return InvalidArgument("a tensor cannot be named __metadata__");
    if (!names.insert(t.name).second) return InvalidArgument(StrCat(where, " given twice"));
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
        return InvalidArgument(StrCat(where, ": invalid shape ", ShapeString(t.shape)));
      }
    }
    size_t bytes = static_cast<size_t>(numel) * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    plan.bytes.push_back(bytes);
  }
  try {
    plan.header = header.dump();  // strict: invalid UTF-8 in a name or metadata throws
  } catch (const Json::exception& e) {
    return InvalidArgument(StrCat("cannot encode header: ", e.what()));
  }
  plan.header.append((8 - plan.header.size() % 8) % 8, ' ');
  return plan;
}

// fsyncs the directory holding path, so that a rename into it survives a crash.
Status SyncParentDir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return IoError(StrCat(dir, ": cannot open directory: ", ErrnoMessage(errno)));
  // Some file systems cannot fsync a directory (EINVAL); the rename is then as durable as it gets.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    return IoError(StrCat(dir, ": fsync of directory failed: ", ErrnoMessage(errno)));
  }
  return Status::Ok();
}

}  // namespace

// ---- SafeTensorsFile ----

StatusOr<SafeTensorsFile> SafeTensorsFile::Open(const std::string& path) {
  SafeTensorsFile f;
  f.path_ = path;
  {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      int err = errno;
      std::string msg = StrCat(path, ": cannot open: ", ErrnoMessage(err));
      return err == ENOENT ? NotFound(msg) : IoError(msg);
    }
    struct stat sb;
    if (::fstat(fd.get(), &sb) != 0) {
      return IoError(StrCat(path, ": fstat failed: ", ErrnoMessage(errno)));
    }
    if (!S_ISREG(sb.st_mode)) return InvalidArgument(StrCat(path, ": not a regular file"));
    size_t size = static_cast<size_t>(sb.st_size);
    if (size < 8) {
      return DataLoss(
          StrCat(path, ": file is ", size,
                 " bytes, shorter than the 8-byte header length; not a safetensors file"));
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (map == MAP_FAILED) return IoError(StrCat(path, ": mmap failed: ", ErrnoMessage(errno)));
    f.map_ = map;
    f.map_size_ = size;
  }  // the mapping outlives the descriptor

  const unsigned char* base = static_cast<const unsigned char*>(f.map_);
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxSafeTensorsHeaderBytes) {
    return DataLoss(StrCat(path, ": header length ", header_len, " is larger than the ",
                           kMaxSafeTensorsHeaderBytes, "-byte limit; not a safetensors file?"));
  }
  if (header_len > f.map_size_ - 8) {
    return DataLoss(StrCat(path, ": header length ", header_len, " runs past the end of the ",
                           f.map_size_, "-byte file; truncated file?"));
  }
  f.data_ = base + 8 + header_len;
  f.data_size_ = f.map_size_ - 8 - header_len;
  Status s = ParseHeader(reinterpret_cast<const char*>(base + 8), header_len, f.data_size_,
                         &f.tensors_, &f.metadata_);
  if (!s.ok()) return s.WithContext(path);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

SafeTensorsFile::~SafeTensorsFile() {
  Release();
}

void SafeTensorsFile::Release() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_ = nullptr;
  data_size_ = 0;
}

SafeTensorsFile::SafeTensorsFile(SafeTensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      data_size_(std::exchange(other.data_size_, 0)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {
  other.tensors_.clear();
  other.index_.clear();
  other.metadata_.clear();
}

SafeTensorsFile& SafeTensorsFile::operator=(SafeTensorsFile&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    data_size_ = std::exchange(other.data_size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    other.tensors_.clear();
    other.index_.clear();
    other.metadata_.clear();
  }
  return *this;
}

const SafeTensorInfo* SafeTensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const void* SafeTensorsFile::Data(const SafeTensorInfo& t) const {
  ST_CHECK(t.begin <= t.end && t.end <= data_size_)
      << "tensor '" << t.name << "' [" << t.begin << ", " << t.end << ") is not inside " << path_
      << " (data section of " << data_size_ << " bytes)";
  return data_ + t.begin;
}

StatusOr<const SafeTensorInfo*> SafeTensorsFile::Lookup(const std::string& name,
                                                        const Shape& expected) const {
  const SafeTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(StrCat(path_, ": no tensor named '", name, "'"));
  if (!expected.empty() && expected != t->shape) {
    return InvalidArgument(StrCat(path_, ": tensor '", name, "' has shape ", ShapeString(t->shape),
                                  " but ", ShapeString(expected), " was expected"));
  }
  return t;
}

Status SafeTensorsFile::ReadF32(const std::string& name, float* dst, const Shape& expected) const {
  ST_ASSIGN_OR_RETURN(const SafeTensorInfo* t, Lookup(name, expected));
  if (!IsFloatDType(t->dtype))
    return InvalidArgument(StrCat(path_, ": tensor '", name, "' has dtype ", t->dtype,
                                  ", which cannot be read as fp32 (F32, BF16, F16, F64 can)"));
  ReadF32Range(*t, 0, Numel(t->shape), dst);
  return Status::Ok();
}

bool SafeTensorsFile::IsFloatDType(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

void SafeTensorsFile::ReadF32Range(const SafeTensorInfo& t, int64_t begin, int64_t count,
                                   float* dst) const {
  const size_t elem = t.dtype == "F64" ? 8 : (t.dtype == "F32" ? 4 : 2);
  ST_CHECK(IsFloatDType(t.dtype) && begin >= 0 && count >= 0 &&
           static_cast<size_t>(begin + count) * elem <= t.end - t.begin)
      << "range [" << begin << ", " << begin + count << ") of tensor '" << t.name << "' ("
      << t.dtype << ") is outside it in " << path_;
  if (count == 0) return;
  const unsigned char* src = static_cast<const unsigned char*>(Data(t)) + begin * elem;
  if (t.dtype == "F32") {
    std::memcpy(dst, src, static_cast<size_t>(count) * 4);
  } else if (t.dtype == "BF16") {
    Convert16ToF32(DType::kBF16, src, dst, count);
  } else if (t.dtype == "F16") {
    Convert16ToF32(DType::kF16, src, dst, count);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      double v;
      std::memcpy(&v, src + i * 8, 8);
      dst[i] = static_cast<float>(v);
    }
  }
}

Status SafeTensorsFile::ReadI32(const std::string& name, int32_t* dst,
                                const Shape& expected) const {
  ST_ASSIGN_OR_RETURN(const SafeTensorInfo* t, Lookup(name, expected));
  const int64_t n = Numel(t->shape);
  const unsigned char* src = static_cast<const unsigned char*>(Data(*t));
  const std::string where = StrCat(path_, ": tensor '", name, "'");
  const std::string& d = t->dtype;
  if (d == "I64") return CopyIntsToI32<int64_t>(src, n, dst, where);
  if (d == "I32") return CopyIntsToI32<int32_t>(src, n, dst, where);
  if (d == "I16") return CopyIntsToI32<int16_t>(src, n, dst, where);
  if (d == "I8") return CopyIntsToI32<int8_t>(src, n, dst, where);
  if (d == "U64") return CopyIntsToI32<uint64_t>(src, n, dst, where);
  if (d == "U32") return CopyIntsToI32<uint32_t>(src, n, dst, where);
  if (d == "U16") return CopyIntsToI32<uint16_t>(src, n, dst, where);
  if (d == "U8") return CopyIntsToI32<uint8_t>(src, n, dst, where);
  if (d == "BOOL") return CopyBoolsToI32(src, n, dst, where);
  return InvalidArgument(StrCat(where, " has dtype ", d, ", which is not an integer type"));
}

// ---- writing ----

size_t SafeTensorsBytes(const std::vector<TensorSpec>& tensors) {
  size_t n = 0;
  for (const TensorSpec& t : tensors) n += static_cast<size_t>(Numel(t.shape)) * DTypeSize(t.dtype);
  return n;
}

StatusOr<SafeTensorsWriter> SafeTensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  StatusOr<WritePlan> plan = PlanWrite(tensors, metadata);
  if (!plan.ok()) return plan.status().WithContext(path);
  SafeTensorsWriter w;
  w.path_ = path;
  w.tmp_ = StrCat(path, ".tmp.", ::getpid());
  w.tensors_ = std::move(tensors);
  w.bytes_ = std::move(plan->bytes);
  w.fd_ = ::open(w.tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return IoError(StrCat(w.tmp_, ": cannot create: ", ErrnoMessage(errno)));
  unsigned char len[8];
  const uint64_t n = plan->header.size();
  std::memcpy(len, &n, 8);  // little-endian host (static_assert above)
  ST_RETURN_IF_ERROR(WriteAll(w.fd_, len, 8, w.tmp_));
  ST_RETURN_IF_ERROR(WriteAll(w.fd_, plan->header.data(), plan->header.size(), w.tmp_));
  return w;
}

SafeTensorsWriter::~SafeTensorsWriter() {
  Abandon();
}

void SafeTensorsWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
}

SafeTensorsWriter::SafeTensorsWriter(SafeTensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      tensors_(std::move(o.tensors_)),
      bytes_(std::move(o.bytes_)),
      fd_(std::exchange(o.fd_, -1)),
      current_(o.current_),
      written_(o.written_) {}

SafeTensorsWriter& SafeTensorsWriter::operator=(SafeTensorsWriter&& o) noexcept {
  if (this != &o) {
    Abandon();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    tensors_ = std::move(o.tensors_);
    bytes_ = std::move(o.bytes_);
    fd_ = std::exchange(o.fd_, -1);
    current_ = o.current_;
    written_ = o.written_;
  }
  return *this;
}

const TensorSpec* SafeTensorsWriter::next() const {
  size_t i = current_;
  size_t done = written_;
  while (i < tensors_.size() && done == bytes_[i]) {
    ++i;
    done = 0;
  }
  return i < tensors_.size() ? &tensors_[i] : nullptr;
}

Status SafeTensorsWriter::Put(const void* data, size_t bytes) {
  if (fd_ < 0) return Internal(StrCat(tmp_, ": the writer is closed"));
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    while (current_ < tensors_.size() && written_ == bytes_[current_]) {
      ++current_;
      written_ = 0;
    }
    if (current_ == tensors_.size())
      return InvalidArgument(StrCat(tmp_, ": more bytes than the header announced"));
    const size_t n = std::min(bytes, bytes_[current_] - written_);
    ST_RETURN_IF_ERROR(WriteAll(fd_, p, n, tmp_));
    written_ += n;
    p += n;
    bytes -= n;
  }
  return Status::Ok();
}

Status SafeTensorsWriter::AppendF32(const float* data, int64_t n) {
  if (n == 0) return Status::Ok();  // nothing to place (a zero-element tensor has no bytes)
  const TensorSpec* t = next();
  if (t == nullptr)
    return InvalidArgument(StrCat(tmp_, ": more tensors than the header announced"));
  if (t->dtype == DType::kF32) return Put(data, static_cast<size_t>(n) * 4);
  constexpr int64_t kChunk = int64_t{1} << 20;
  buf_.resize(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t m = std::min(kChunk, n - j);
    ConvertFromF32(t->dtype, data + j, buf_.data(), m);
    ST_RETURN_IF_ERROR(Put(buf_.data(), static_cast<size_t>(m) * 2));
  }
  return Status::Ok();
}

Status SafeTensorsWriter::AppendStored(const void* data, size_t bytes, DType dtype) {
  if (bytes == 0) return Status::Ok();
  const TensorSpec* t = next();
  if (t == nullptr)
    return InvalidArgument(StrCat(tmp_, ": more tensors than the header announced"));
  if (t->dtype != dtype)
    return InvalidArgument(StrCat(tmp_, ": tensor '", t->name, "' is ", DTypeName(t->dtype),
                                  ", not ", DTypeName(dtype)));
  return Put(data, bytes);
}

Status SafeTensorsWriter::Commit() {
  while (current_ < tensors_.size() && written_ == bytes_[current_]) {
    ++current_;
    written_ = 0;
  }
  if (current_ != tensors_.size())
    return Internal(StrCat(tmp_, ": tensor '", tensors_[current_].name, "' has ", written_,
                           " of its ", bytes_[current_], " bytes"));
  if (::fsync(fd_) != 0) return IoError(StrCat(tmp_, ": fsync failed: ", ErrnoMessage(errno)));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return IoError(StrCat(tmp_, ": close failed: ", ErrnoMessage(err)));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return IoError(StrCat("cannot rename ", tmp_, " to ", path_, ": ", ErrnoMessage(err)));
  }
  return SyncParentDir(path_);
}

Status WriteSafeTensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const TensorToWrite& t : tensors) {
    if (Numel(t.shape) > 0 && t.data == nullptr)
      return InvalidArgument(StrCat(path, ": tensor '", t.name, "': data is null"));
    specs.push_back({t.name, t.dtype, t.shape});
  }
  ST_ASSIGN_OR_RETURN(SafeTensorsWriter w, SafeTensorsWriter::Create(path, specs, metadata));
  for (const TensorToWrite& t : tensors) ST_RETURN_IF_ERROR(w.AppendF32(t.data, Numel(t.shape)));
  return w.Commit();
}

}  // namespace st
