// Parquet: footer and page headers through libthrift's compact protocol, pages through Snappy /
// zlib / Zstd, values and levels decoded here, records assembled from repetition and definition
// levels (the Dremel scheme the format is built on).
#include "data/formats/parquet.h"

#include <fcntl.h>
#include <snappy.h>
#include <sys/stat.h>
#include <thrift/protocol/TCompactProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace st {

namespace {

using json = nlohmann::json;
using apache::thrift::TException;
using apache::thrift::protocol::TType;
using apache::thrift::transport::TMemoryBuffer;
using Proto = apache::thrift::protocol::TCompactProtocolT<TMemoryBuffer>;

// Format enums (parquet.thrift).
enum PhysicalType { kBoolean = 0, kInt32, kInt64, kInt96, kFloat, kDouble, kByteArray, kFixed };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kRleDictionary = 8 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Converted { kMap = 1, kMapKeyValue = 2, kList = 3, kUint8 = 11, kUint16, kUint32, kUint64 };

constexpr size_t kMaxPageBytes = size_t{256} << 20;  // larger pages are refused (pyarrow: ~1 MiB)
constexpr int64_t kMaxPageValues = int64_t{1} << 24;
constexpr int kMaxDepth = 64;

const char* EncodingName(int e) {
  static const char* kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? kNames[e] : "an unknown encoding";
}

// ---------------------------------------------------------------------- thrift structs
// Calls f(id, type) for every field of a struct; f returns false to skip the field.
template <class F>
void ReadStruct(Proto& p, int depth, F&& f) {
  if (depth > kMaxDepth) throw apache::thrift::protocol::TProtocolException("nesting too deep");
  std::string name;
  p.readStructBegin(name);
  for (;;) {
    TType t;
    int16_t id;
    p.readFieldBegin(name, t, id);
    if (t == apache::thrift::protocol::T_STOP) break;
    if (!f(id, t)) p.skip(t);
    p.readFieldEnd();
  }
  p.readStructEnd();
}
bool IsI32(TType t) {
  return t == apache::thrift::protocol::T_I32;
}
bool IsI64(TType t) {
  return t == apache::thrift::protocol::T_I64;
}
bool IsStr(TType t) {
  return t == apache::thrift::protocol::T_STRING;
}
bool IsStruct(TType t) {
  return t == apache::thrift::protocol::T_STRUCT;
}
bool IsList(TType t) {
  return t == apache::thrift::protocol::T_LIST;
}
bool IsBool(TType t) {
  return t == apache::thrift::protocol::T_BOOL;
}

template <class F>
void ReadList(Proto& p, TType want, F&& each) {
  TType et;
  uint32_t n;
  p.readListBegin(et, n);
  for (uint32_t i = 0; i < n; ++i) {
    if (et == want)
      each();
    else
      p.skip(et);
  }
  p.readListEnd();
}

struct SchemaElement {
  int type = -1, type_length = 0, repetition = kRequired, num_children = 0, converted = -1;
  bool logical_list = false, logical_map = false;
  std::string name;
};

struct ColumnMeta {
  int type = -1, codec = 0;
  int64_t num_values = 0, total_compressed = 0, data_page_offset = -1, dict_page_offset = -1;
  bool external = false, has_meta = false;
};

struct RowGroupMeta {
  int64_t num_rows = 0;
  std::vector<ColumnMeta> columns;
};

struct PageHeader {
  int type = -1;
  int64_t uncompressed = -1, compressed = -1;
  int64_t num_values = 0;
  int encoding = 0, def_encoding = kRle, rep_encoding = kRle;
  int64_t def_len = 0, rep_len = 0;  // v2
  bool v2_compressed = true;
  bool has_body = false;
};

Proto MakeProto(const std::shared_ptr<TMemoryBuffer>& buf, size_t size) {
  const int32_t limit = static_cast<int32_t>(std::min<size_t>(size, INT32_MAX));
  return Proto(buf, limit, limit);
}

void ReadSchemaElement(Proto& p, SchemaElement* e) {
  ReadStruct(p, 1, [&](int16_t id, TType t) {
    int32_t v;
    switch (id) {
      case 1:
        if (!IsI32(t)) return false;
        p.readI32(v), e->type = v;
        return true;
      case 2:
        if (!IsI32(t)) return false;
        p.readI32(v), e->type_length = v;
        return true;
      case 3:
        if (!IsI32(t)) return false;
        p.readI32(v), e->repetition = v;
        return true;
      case 4:
        if (!IsStr(t)) return false;
        p.readString(e->name);
        return true;
      case 5:
        if (!IsI32(t)) return false;
        p.readI32(v), e->num_children = v;
        return true;
      case 6:
        if (!IsI32(t)) return false;
        p.readI32(v), e->converted = v;
        return true;
      case 10:  // LogicalType union: 2 MAP, 3 LIST
        if (!IsStruct(t)) return false;
        ReadStruct(p, 2, [&](int16_t lid, TType) {
          if (lid == 2) e->logical_map = true;
          if (lid == 3) e->logical_list = true;
          return false;
        });
        return true;
      default:
        return false;
    }
  });
}

void ReadColumnMeta(Proto& p, ColumnMeta* c) {
  ReadStruct(p, 3, [&](int16_t id, TType t) {
    int32_t v;
    switch (id) {
      case 1:
        if (!IsI32(t)) return false;
        p.readI32(v), c->type = v;
        return true;
      case 4:
        if (!IsI32(t)) return false;
        p.readI32(v), c->codec = v;
        return true;
      case 5:
        return IsI64(t) && (p.readI64(c->num_values), true);
      case 7:
        return IsI64(t) && (p.readI64(c->total_compressed), true);
      case 9:
        return IsI64(t) && (p.readI64(c->data_page_offset), true);
      case 11:
        return IsI64(t) && (p.readI64(c->dict_page_offset), true);
      default:
        return false;
    }
  });
  c->has_meta = true;
}

void ReadRowGroupMeta(Proto& p, RowGroupMeta* rg) {
  ReadStruct(p, 1, [&](int16_t id, TType t) {
    if (id == 1 && IsList(t)) {
      ReadList(p, apache::thrift::protocol::T_STRUCT, [&] {
        ColumnMeta c;
        ReadStruct(p, 2, [&](int16_t cid, TType ct) {
          if (cid == 1 && IsStr(ct)) {
            std::string fp;
            p.readString(fp);
            c.external = !fp.empty();
            return true;
          }
          if (cid == 3 && IsStruct(ct)) {
            ReadColumnMeta(p, &c);
            return true;
          }
          return false;
        });
        rg->columns.push_back(c);
      });
      return true;
    }
    if (id == 3 && IsI64(t)) {
      p.readI64(rg->num_rows);
      return true;
    }
    return false;
  });
}

// Parses a page header at [p, p+n); returns the bytes it took.
size_t ReadPageHeader(const uint8_t* data, size_t n, PageHeader* h) {
  auto buf = std::make_shared<TMemoryBuffer>(const_cast<uint8_t*>(data),
                                             static_cast<uint32_t>(std::min<size_t>(n, UINT32_MAX)),
                                             TMemoryBuffer::OBSERVE);
  Proto p = MakeProto(buf, n);
  ReadStruct(p, 0, [&](int16_t id, TType t) {
    int32_t v;
    switch (id) {
      case 1:
        if (!IsI32(t)) return false;
        p.readI32(v), h->type = v;
        return true;
      case 2:
        if (!IsI32(t)) return false;
        p.readI32(v), h->uncompressed = v;
        return true;
      case 3:
        if (!IsI32(t)) return false;
        p.readI32(v), h->compressed = v;
        return true;
      case 5:
      case 7:
        if (!IsStruct(t)) return false;
        h->has_body = true;
        ReadStruct(p, 1, [&](int16_t f, TType ft) {
          if (!IsI32(ft)) return false;
          p.readI32(v);
          if (f == 1) h->num_values = v;
          if (f == 2) h->encoding = v;
          if (f == 3 && id == 5) h->def_encoding = v;
          if (f == 4 && id == 5) h->rep_encoding = v;
          return true;
        });
        return true;
      case 8:
        if (!IsStruct(t)) return false;
        h->has_body = true;
        ReadStruct(p, 1, [&](int16_t f, TType ft) {
          if (f == 7 && IsBool(ft)) {
            bool b;
            p.readBool(b);
            h->v2_compressed = b;
            return true;
          }
          if (!IsI32(ft)) return false;
          p.readI32(v);
          if (f == 1) h->num_values = v;
          if (f == 4) h->encoding = v;
          if (f == 5) h->def_len = v;
          if (f == 6) h->rep_len = v;
          return true;
        });
        return true;
      default:
        return false;
    }
  });
  return n - buf->available_read();
}

// ---------------------------------------------------------------------- decoding
int BitWidth(int64_t max_value) {
  int w = 0;
  while ((int64_t{1} << w) <= max_value) ++w;
  return w;
}

bool ReadUleb(const uint8_t*& p, const uint8_t* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= end) return false;
    const uint8_t b = *p++;
    v |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// The RLE / bit-packed hybrid (levels, dictionary indices, RLE booleans).
class RleDecoder {
 public:
  RleDecoder(const uint8_t* p, const uint8_t* end, int bit_width)
      : p_(p), end_(end), bw_(bit_width) {}

  // Appends n values; false when the data ends early or is malformed.
  template <class T>
  bool Get(int64_t n, std::vector<T>* out) {
    while (n > 0) {
      if (left_ == 0 && !NextRun()) return false;
      const int64_t k = std::min<int64_t>(n, left_);
      if (rle_) {
        out->insert(out->end(), static_cast<size_t>(k), static_cast<T>(value_));
      } else {
        const uint64_t mask = bw_ == 64 ? ~uint64_t{0} : (uint64_t{1} << bw_) - 1;
        for (int64_t i = 0; i < k; ++i, ++pos_) {
          const uint64_t bit = static_cast<uint64_t>(pos_) * static_cast<uint64_t>(bw_);
          const size_t byte = static_cast<size_t>(bit >> 3);
          const size_t need = static_cast<size_t>((bit + static_cast<uint64_t>(bw_) + 7) >> 3);
          if (need > packed_bytes_) return false;
          uint64_t w = 0;
          const size_t avail = std::min<size_t>(8, packed_bytes_ - byte);
          std::memcpy(&w, packed_ + byte, avail);
          out->push_back(static_cast<T>((w >> (bit & 7)) & mask));
        }
      }
      left_ -= k;
      n -= k;
    }
    return true;
  }
  const uint8_t* position() const { return p_; }

 private:
  bool NextRun() {
    uint64_t header;
    if (!ReadUleb(p_, end_, &header)) return false;
    if (header & 1) {
      const uint64_t groups = header >> 1;
      if (groups == 0 || groups > (uint64_t{1} << 40)) return false;
      rle_ = false;
      left_ = static_cast<int64_t>(groups * 8);
      packed_ = p_;
      // The last run may be shorter in the file than its header says; only what is read counts.
      packed_bytes_ =
          std::min<uint64_t>(groups * static_cast<uint64_t>(bw_), static_cast<uint64_t>(end_ - p_));
      p_ += packed_bytes_;
      pos_ = 0;
    } else {
      rle_ = true;
      left_ = static_cast<int64_t>(std::min<uint64_t>(header >> 1, uint64_t{1} << 40));
      if (left_ == 0) return false;
      const int nb = (bw_ + 7) / 8;
      if (end_ - p_ < nb) return false;
      value_ = 0;
      for (int i = 0; i < nb; ++i) value_ |= uint64_t{p_[i]} << (8 * i);
      p_ += nb;
    }
    return true;
  }

  const uint8_t* p_;
  const uint8_t* end_;
  int bw_;
  bool rle_ = true;
  int64_t left_ = 0;
  uint64_t value_ = 0;
  const uint8_t* packed_ = nullptr;
  size_t packed_bytes_ = 0;
  int64_t pos_ = 0;
};

struct Node {
  std::string name;
  int repetition = kRequired;
  int physical = -1, type_length = 0, converted = -1;
  bool container = false;    // a LIST / MAP group: its repeated child indexes into its array
  bool transparent = false;  // the repeated middle group of a 3-level list: its child is the item
  int def = 0, rep = 0;      // max levels at this node
  std::vector<int> children;
  int parent = -1;
  bool leaf() const { return children.empty() && physical >= 0; }
};

struct ColumnData {
  std::vector<int16_t> def, rep;  // empty when the max level is 0
  std::vector<json> values;
  int64_t levels = 0;
};

// PLAIN values of a leaf into out.
bool DecodePlain(const Node& leaf, const uint8_t* p, const uint8_t* end, int64_t n,
                 std::vector<json>* out) {
  auto need = [&](size_t bytes) { return static_cast<size_t>(end - p) >= bytes; };
  switch (leaf.physical) {
    case kBoolean:
      if (!need(static_cast<size_t>((n + 7) / 8))) return false;
      for (int64_t i = 0; i < n; ++i) out->push_back(((p[i >> 3] >> (i & 7)) & 1) != 0);
      return true;
    case kInt32:
      if (!need(static_cast<size_t>(n) * 4)) return false;
      for (int64_t i = 0; i < n; ++i, p += 4) {
        int32_t v;
        std::memcpy(&v, p, 4);
        if (leaf.converted == kUint8 || leaf.converted == kUint16 || leaf.converted == kUint32)
          out->push_back(static_cast<uint32_t>(v));
        else
          out->push_back(v);
      }
      return true;
    case kInt64:
      if (!need(static_cast<size_t>(n) * 8)) return false;
      for (int64_t i = 0; i < n; ++i, p += 8) {
        int64_t v;
        std::memcpy(&v, p, 8);
        if (leaf.converted == kUint64)
          out->push_back(static_cast<uint64_t>(v));
        else
          out->push_back(v);
      }
      return true;
    case kInt96:  // legacy timestamps: nanoseconds of the day, then the Julian day
      if (!need(static_cast<size_t>(n) * 12)) return false;
      for (int64_t i = 0; i < n; ++i, p += 12) {
        int64_t nanos;
        int32_t day;
        std::memcpy(&nanos, p, 8);
        std::memcpy(&day, p + 8, 4);
        // Wrapping arithmetic: a damaged day must not be signed overflow.
        const uint64_t ns = static_cast<uint64_t>(int64_t{day} - 2440588) * 86400000000000ULL +
                            static_cast<uint64_t>(nanos);
        out->push_back(static_cast<int64_t>(ns));
      }
      return true;
    case kFloat:
      if (!need(static_cast<size_t>(n) * 4)) return false;
      for (int64_t i = 0; i < n; ++i, p += 4) {
        float v;
        std::memcpy(&v, p, 4);
        out->push_back(static_cast<double>(v));
      }
      return true;
    case kDouble:
      if (!need(static_cast<size_t>(n) * 8)) return false;
      for (int64_t i = 0; i < n; ++i, p += 8) {
        double v;
        std::memcpy(&v, p, 8);
        out->push_back(v);
      }
      return true;
    case kByteArray:
      for (int64_t i = 0; i < n; ++i) {
        if (!need(4)) return false;
        uint32_t len;
        std::memcpy(&len, p, 4);
        p += 4;
        if (!need(len)) return false;
        out->push_back(std::string(reinterpret_cast<const char*>(p), len));
        p += len;
      }
      return true;
    case kFixed:
      if (leaf.type_length < 0 || !need(static_cast<size_t>(n) * leaf.type_length)) return false;
      for (int64_t i = 0; i < n; ++i, p += leaf.type_length)
        out->push_back(std::string(reinterpret_cast<const char*>(p), leaf.type_length));
      return true;
    default:
      return false;
  }
}

std::string Join(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ".") + p;
  return s;
}

}  // namespace

Status ParquetDecompress(int codec, const uint8_t* src, size_t n, size_t size,
                         std::vector<uint8_t>* out) {
  out->resize(size);
  switch (codec) {
    case 0:
      if (n != size) return DataLoss("an uncompressed page's two sizes differ");
      if (size) std::memcpy(out->data(), src, size);
      return Status::Ok();
    case 1: {
      size_t len = 0;
      const char* s = reinterpret_cast<const char*>(src);
      if (!snappy::GetUncompressedLength(s, n, &len) || len != size ||
          !snappy::RawUncompress(s, n, reinterpret_cast<char*>(out->data())))
        return DataLoss("corrupt Snappy page");
      return Status::Ok();
    }
    case 2: {
      z_stream zs{};
      if (inflateInit2(&zs, 15 + 32) != Z_OK) return Internal("zlib inflateInit2 failed");
      zs.next_in = const_cast<Bytef*>(src);
      zs.avail_in = static_cast<uInt>(n);
      zs.next_out = out->data();
      zs.avail_out = static_cast<uInt>(size);
      const int r = inflate(&zs, Z_FINISH);
      const bool ok = r == Z_STREAM_END && zs.total_out == size;
      inflateEnd(&zs);
      if (!ok) return DataLoss("corrupt Gzip page");
      return Status::Ok();
    }
    case 6: {
      const size_t r = ZSTD_decompress(out->data(), size, src, n);
      if (ZSTD_isError(r) || r != size) return DataLoss("corrupt Zstd page");
      return Status::Ok();
    }
    default: {
      static const char* kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                     "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
      return Unimplemented(StrCat("compression ", codec >= 0 && codec < 8 ? kNames[codec] : "?",
                                  " is not supported (Snappy, Gzip, Zstd or none; rewrite the "
                                  "file with pyarrow, e.g. compression='zstd')"));
    }
  }
}

struct ParquetFile::Meta {
  std::vector<Node> nodes;      // nodes[0] is the root
  std::vector<int> leaves;      // node index of each column chunk, in file order
  std::vector<int> top;         // node index of each top-level column
  std::vector<int> top_first;   // first leaf of each top-level column
  std::vector<int> top_leaves;  // number of leaves of each top-level column
  std::vector<RowGroupMeta> row_groups;
  std::vector<std::vector<int>> leaf_path;  // node indices from the top-level node to the leaf
  std::vector<std::string> leaf_name;       // dotted path
};

ParquetFile::ParquetFile(ParquetFile&& o) noexcept {
  *this = std::move(o);
}
ParquetFile& ParquetFile::operator=(ParquetFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
    file_size_ = o.file_size_;
    num_rows_ = o.num_rows_;
    row_group_rows_ = std::move(o.row_group_rows_);
    columns_ = std::move(o.columns_);
    meta_ = std::move(o.meta_);
    chunk_ = std::move(o.chunk_);
    page_ = std::move(o.page_);
  }
  return *this;
}
ParquetFile::~ParquetFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

Status PreadAll(int fd, uint8_t* dst, size_t n, int64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return IoError(StrCat(path, ": read failed: ", std::strerror(errno)));
    if (r == 0) return DataLoss(StrCat(path, ": truncated (the file ends at byte ", off, ")"));
    dst += r, n -= static_cast<size_t>(r), off += r;
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ParquetFile> ParquetFile::Open(const std::string& path) {
  ParquetFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) return IoError(StrCat(path, ": ", std::strerror(errno)));
  f.file_size_ = st.st_size;
  const std::string not_parquet = StrCat(path, ": not a Parquet file");
  if (f.file_size_ < 12) return DataLoss(StrCat(not_parquet, " (", f.file_size_, " bytes)"));
  uint8_t head[4], tail[8];
  ST_RETURN_IF_ERROR(PreadAll(f.fd_, head, 4, 0, path));
  ST_RETURN_IF_ERROR(PreadAll(f.fd_, tail, 8, f.file_size_ - 8, path));
  if (std::memcmp(tail + 4, "PARE", 4) == 0)
    return Unimplemented(StrCat(path, ": an encrypted Parquet file; decrypt it first"));
  if (std::memcmp(head, "PAR1", 4) != 0 || std::memcmp(tail + 4, "PAR1", 4) != 0)
    return DataLoss(StrCat(not_parquet, " (no PAR1 magic; truncated or another format?)"));
  uint32_t footer_len;
  std::memcpy(&footer_len, tail, 4);
  if (footer_len == 0 || footer_len > static_cast<uint64_t>(f.file_size_) - 12)
    return DataLoss(StrCat(path, ": the footer length ", footer_len, " does not fit the file"));
  std::vector<uint8_t> footer(footer_len);
  ST_RETURN_IF_ERROR(
      PreadAll(f.fd_, footer.data(), footer_len, f.file_size_ - 8 - footer_len, path));

  std::vector<SchemaElement> schema;
  std::vector<RowGroupMeta> rgs;
  int64_t num_rows = -1;
  try {
    auto buf = std::make_shared<TMemoryBuffer>(footer.data(), footer_len, TMemoryBuffer::OBSERVE);
    Proto p = MakeProto(buf, footer_len);
    ReadStruct(p, 0, [&](int16_t id, TType t) {
      if (id == 2 && IsList(t)) {
        ReadList(p, apache::thrift::protocol::T_STRUCT, [&] {
          schema.emplace_back();
          ReadSchemaElement(p, &schema.back());
        });
        return true;
      }
      if (id == 3 && IsI64(t)) return p.readI64(num_rows), true;
      if (id == 4 && IsList(t)) {
        ReadList(p, apache::thrift::protocol::T_STRUCT, [&] {
          rgs.emplace_back();
          ReadRowGroupMeta(p, &rgs.back());
        });
        return true;
      }
      return false;
    });
  } catch (const std::exception& e) {
    return DataLoss(StrCat(path, ": corrupt Parquet footer (", e.what(), ")"));
  }
  if (schema.empty() || num_rows < 0)
    return DataLoss(StrCat(path, ": the Parquet footer has no schema or row count"));

  // The schema tree (elements in depth-first order, each group followed by its children).
  auto m = std::make_unique<Meta>();
  size_t next = 0;
  std::function<Status(int, int)> build = [&](int parent, int depth) -> Status {
    if (depth > kMaxDepth || next >= schema.size())
      return DataLoss(StrCat(path, ": malformed Parquet schema"));
    const SchemaElement& e = schema[next++];
    const int idx = static_cast<int>(m->nodes.size());
    m->nodes.emplace_back();
    {
      Node& n = m->nodes.back();
      n.name = e.name;
      n.parent = parent;
      n.repetition = parent < 0 ? kRequired : e.repetition;
      if (n.repetition < kRequired || n.repetition > kRepeated)
        return DataLoss(StrCat(path, ": column ", e.name, ": bad repetition type"));
      n.converted = e.converted;
      n.container = e.logical_list || e.logical_map || e.converted == kList ||
                    e.converted == kMap || e.converted == kMapKeyValue;
      const Node* pn = parent >= 0 ? &m->nodes[parent] : nullptr;
      n.def = (pn ? pn->def : 0) + (n.repetition != kRequired ? 1 : 0);
      n.rep = (pn ? pn->rep : 0) + (n.repetition == kRepeated ? 1 : 0);
      if (e.num_children <= 0) {
        if (parent < 0) return DataLoss(StrCat(path, ": the Parquet schema has no columns"));
        if (e.type < kBoolean || e.type > kFixed)
          return DataLoss(StrCat(path, ": column ", e.name, ": bad physical type ", e.type));
        n.physical = e.type;
        n.type_length = e.type_length;
        n.container = false;
        m->leaves.push_back(idx);
        return Status::Ok();
      }
      if (static_cast<size_t>(e.num_children) > schema.size())
        return DataLoss(StrCat(path, ": malformed Parquet schema"));
    }
    for (int c = 0; c < e.num_children; ++c) {
      const int child = static_cast<int>(m->nodes.size());
      m->nodes[idx].children.push_back(child);
      ST_RETURN_IF_ERROR(build(idx, depth + 1));
    }
    Node& n = m->nodes[idx];
    if (n.container) {
      // A LIST or MAP group: one repeated child whose repetitions are the items.
      if (n.children.size() != 1 || m->nodes[n.children[0]].repetition != kRepeated) {
        n.container = false;  // not the standard shape: read as a plain struct
      } else {
        Node& r = m->nodes[n.children[0]];
        const bool is_map = e.logical_map || e.converted == kMap || e.converted == kMapKeyValue;
        // Three-level list: the repeated group wraps the item (unless named as the legacy
        // two-level layouts name their item groups).
        r.transparent = !is_map && !r.leaf() && r.children.size() == 1 && r.name != "array" &&
                        r.name != n.name + "_tuple";
      }
    }
    return Status::Ok();
  };
  ST_RETURN_IF_ERROR(build(-1, 0));
  if (next != schema.size()) return DataLoss(StrCat(path, ": malformed Parquet schema"));
  if (m->nodes[0].children.empty())
    return DataLoss(StrCat(path, ": the Parquet schema has no columns"));
  m->leaf_path.resize(m->leaves.size());
  m->leaf_name.resize(m->leaves.size());
  for (size_t l = 0; l < m->leaves.size(); ++l) {
    std::vector<int> chain;
    for (int n = m->leaves[l]; n > 0; n = m->nodes[n].parent) chain.push_back(n);
    std::reverse(chain.begin(), chain.end());
    m->leaf_path[l] = chain;
    std::vector<std::string> names;
    for (int n : chain) names.push_back(m->nodes[n].name);
    m->leaf_name[l] = Join(names);
  }
  for (int t : m->nodes[0].children) {
    m->top.push_back(t);
    const int first =
        static_cast<int>(std::find_if(m->leaf_path.begin(), m->leaf_path.end(),
                                      [&](const std::vector<int>& c) { return c.front() == t; }) -
                         m->leaf_path.begin());
    int count = 0;
    for (const auto& c : m->leaf_path) count += c.front() == t;
    if (count == 0) return DataLoss(StrCat(path, ": column ", m->nodes[t].name, " has no values"));
    m->top_first.push_back(first);
    m->top_leaves.push_back(count);
    f.columns_.push_back(m->nodes[t].name);
  }
  int64_t total = 0;
  for (size_t g = 0; g < rgs.size(); ++g) {
    const RowGroupMeta& rg = rgs[g];
    if (rg.columns.size() != m->leaves.size() || rg.num_rows < 0)
      return DataLoss(StrCat(path, ": row group ", g, " has ", rg.columns.size(),
                             " column chunks, the schema ", m->leaves.size()));
    total += rg.num_rows;
    f.row_group_rows_.push_back(rg.num_rows);
  }
  if (total != num_rows)
    return DataLoss(
        StrCat(path, ": the row groups hold ", total, " rows, the footer says ", num_rows));
  f.num_rows_ = num_rows;
  m->row_groups = std::move(rgs);
  f.meta_ = std::move(m);
  return f;
}

Status ParquetFile::ReadRowGroup(int rg, const std::vector<std::string>& columns,
                                 std::vector<json>* rows) const {
  rows->clear();
  if (rg < 0 || rg >= num_row_groups()) return InvalidArgument("row group out of range");
  const Meta& m = *meta_;
  std::vector<int> tops;  // indices into m.top
  if (columns.empty()) {
    for (size_t t = 0; t < m.top.size(); ++t) tops.push_back(static_cast<int>(t));
  } else {
    for (const std::string& c : columns) {
      auto it = std::find(columns_.begin(), columns_.end(), c);
      if (it == columns_.end()) return InvalidArgument(StrCat(path_, ": no column '", c, "'"));
      tops.push_back(static_cast<int>(it - columns_.begin()));
    }
  }
  const RowGroupMeta& g = m.row_groups[rg];
  const int64_t nrows = g.num_rows;
  if (nrows == 0) return Status::Ok();
  // Each row has at least one level entry in every column: a row count beyond a chunk's values
  // is a corrupt footer, refused before anything is allocated for it.
  for (int t : tops)
    for (int l = m.top_first[t]; l < m.top_first[t] + m.top_leaves[t]; ++l)
      if (g.columns[l].num_values < nrows)
        return DataLoss(StrCat(path_, ": row group ", rg, ", column ", m.leaf_name[l], ": ",
                               g.columns[l].num_values, " values for ", nrows, " rows"));
  rows->assign(static_cast<size_t>(nrows), json());  // nulls; a row becomes an object when set

  std::vector<uint8_t>& chunk = chunk_;
  std::vector<uint8_t>& page = page_;
  for (int t : tops) {
    for (int l = m.top_first[t]; l < m.top_first[t] + m.top_leaves[t]; ++l) {
      const Node& leaf = m.nodes[m.leaves[l]];
      const ColumnMeta& cm = g.columns[l];
      auto where = [&](const std::string& what) {
        return StrCat(path_, ": row group ", rg, ", column ", m.leaf_name[l], ": ", what);
      };
      if (cm.external || !cm.has_meta)
        return Unimplemented(where("the column chunk is in another file or encrypted"));
      if (cm.type != leaf.physical)
        return DataLoss(where("the chunk's type differs from the schema's"));
      int64_t start = cm.data_page_offset;
      if (cm.dict_page_offset > 0 && cm.dict_page_offset < start) start = cm.dict_page_offset;
      if (start < 4 || cm.total_compressed <= 0 || cm.total_compressed > file_size_ ||
          start > file_size_ - cm.total_compressed)
        return DataLoss(where("the column chunk lies outside the file (truncated?)"));
      chunk.resize(static_cast<size_t>(cm.total_compressed));
      ST_RETURN_IF_ERROR(PreadAll(fd_, chunk.data(), chunk.size(), start, path_));

      ColumnData col;
      std::vector<json> dict;
      bool have_dict = false;
      const int def_bw = BitWidth(leaf.def), rep_bw = BitWidth(leaf.rep);
      size_t pos = 0;
      int page_no = 0;
      while (col.levels < cm.num_values) {
        const std::string pw = StrCat("page ", page_no, ": ");
        if (pos >= chunk.size())
          return DataLoss(where(StrCat("the chunk ends after ", col.levels, " of ", cm.num_values,
                                       " values (truncated?)")));
        PageHeader h;
        size_t hlen;
        try {
          hlen = ReadPageHeader(chunk.data() + pos, chunk.size() - pos, &h);
        } catch (const std::exception& e) {
          return DataLoss(where(StrCat(pw, "corrupt page header (", e.what(), ")")));
        }
        pos += hlen;
        if (h.compressed < 0 || h.uncompressed < 0 ||
            static_cast<size_t>(h.compressed) > chunk.size() - pos ||
            static_cast<size_t>(h.uncompressed) > kMaxPageBytes)
          return DataLoss(where(pw + "the page's sizes do not fit the chunk (truncated?)"));
        const uint8_t* body = chunk.data() + pos;
        const size_t body_n = static_cast<size_t>(h.compressed);
        pos += body_n;
        ++page_no;
        if (h.type == kIndexPage || !h.has_body) continue;
        if (h.num_values < 0 || h.num_values > kMaxPageValues ||
            (h.type != kDictionaryPage && h.num_values > cm.num_values - col.levels))
          return DataLoss(where(pw + "bad value count"));
        if (h.type == kDictionaryPage) {
          if (h.encoding != kPlain && h.encoding != kPlainDictionary)
            return Unimplemented(where(StrCat("dictionary page in ", EncodingName(h.encoding))));
          ST_RETURN_IF_ERROR(
              ParquetDecompress(cm.codec, body, body_n, static_cast<size_t>(h.uncompressed), &page)
                  .WithContext(where(pw)));
          dict.clear();
          if (!DecodePlain(leaf, page.data(), page.data() + page.size(), h.num_values, &dict))
            return DataLoss(where(pw + "the dictionary page is shorter than its values"));
          have_dict = true;
          continue;
        }
        if (h.type != kDataPage && h.type != kDataPageV2) continue;
        const int64_t n = h.num_values;
        const uint8_t* p;
        const uint8_t* end;
        const size_t def_before = col.def.size();
        if (h.type == kDataPage) {
          ST_RETURN_IF_ERROR(
              ParquetDecompress(cm.codec, body, body_n, static_cast<size_t>(h.uncompressed), &page)
                  .WithContext(where(pw)));
          p = page.data();
          end = page.data() + page.size();
          auto levels = [&](int max, int bw, int enc, std::vector<int16_t>* out) -> Status {
            if (max == 0) return Status::Ok();
            if (enc != kRle)
              return Unimplemented(where(StrCat(pw, "levels in ", EncodingName(enc))));
            if (end - p < 4) return DataLoss(where(pw + "truncated levels"));
            uint32_t len;
            std::memcpy(&len, p, 4);
            p += 4;
            if (len > static_cast<size_t>(end - p)) return DataLoss(where(pw + "truncated levels"));
            RleDecoder d(p, p + len, bw);
            if (!d.Get(n, out)) return DataLoss(where(pw + "corrupt levels"));
            p += len;
            return Status::Ok();
          };
          ST_RETURN_IF_ERROR(levels(leaf.rep, rep_bw, h.rep_encoding, &col.rep));
          ST_RETURN_IF_ERROR(levels(leaf.def, def_bw, h.def_encoding, &col.def));
        } else {
          if (h.rep_len < 0 || h.def_len < 0 || static_cast<size_t>(h.rep_len + h.def_len) > body_n)
            return DataLoss(where(pw + "level lengths do not fit the page"));
          const uint8_t* lv = body;
          if (leaf.rep > 0) {
            RleDecoder d(lv, lv + h.rep_len, rep_bw);
            if (!d.Get(n, &col.rep)) return DataLoss(where(pw + "corrupt repetition levels"));
          }
          lv += h.rep_len;
          if (leaf.def > 0) {
            RleDecoder d(lv, lv + h.def_len, def_bw);
            if (!d.Get(n, &col.def)) return DataLoss(where(pw + "corrupt definition levels"));
          }
          lv += h.def_len;
          const size_t rest = body_n - static_cast<size_t>(h.rep_len + h.def_len);
          const int64_t want = h.uncompressed - h.rep_len - h.def_len;
          if (want < 0) return DataLoss(where(pw + "bad page sizes"));
          ST_RETURN_IF_ERROR(ParquetDecompress(h.v2_compressed ? cm.codec : 0, lv, rest,
                                               static_cast<size_t>(want), &page)
                                 .WithContext(where(pw)));
          p = page.data();
          end = page.data() + page.size();
        }
        int64_t present = n;
        if (leaf.def > 0) {
          present = 0;
          for (size_t i = def_before; i < col.def.size(); ++i) {
            if (col.def[i] > leaf.def) return DataLoss(where(pw + "definition level too high"));
            present += col.def[i] == leaf.def;
          }
        }
        if (h.encoding == kPlain) {
          if (!DecodePlain(leaf, p, end, present, &col.values))
            return DataLoss(where(pw + "the page is shorter than its values"));
        } else if (h.encoding == kPlainDictionary || h.encoding == kRleDictionary) {
          if (!have_dict)
            return DataLoss(where(pw + "dictionary-encoded page without a dictionary"));
          if (present > 0) {
            if (p >= end) return DataLoss(where(pw + "truncated dictionary indices"));
            const int bw = *p++;
            if (bw > 32) return DataLoss(where(pw + "bad dictionary index width"));
            std::vector<uint32_t> idx;
            idx.reserve(static_cast<size_t>(present));
            RleDecoder d(p, end, bw);
            if (!d.Get(present, &idx)) return DataLoss(where(pw + "corrupt dictionary indices"));
            for (uint32_t i : idx) {
              if (i >= dict.size()) return DataLoss(where(pw + "dictionary index out of range"));
              col.values.push_back(dict[i]);
            }
          }
        } else if (h.encoding == kRle && leaf.physical == kBoolean) {
          if (end - p < 4) return DataLoss(where(pw + "truncated booleans"));
          uint32_t len;
          std::memcpy(&len, p, 4);
          p += 4;
          if (len > static_cast<size_t>(end - p)) return DataLoss(where(pw + "truncated booleans"));
          std::vector<uint8_t> bits;
          RleDecoder d(p, p + len, 1);
          if (!d.Get(present, &bits)) return DataLoss(where(pw + "corrupt booleans"));
          for (uint8_t b : bits) col.values.push_back(b != 0);
        } else {
          return Unimplemented(where(StrCat("values in ", EncodingName(h.encoding),
                                            " are not supported (PLAIN or dictionary; pyarrow "
                                            "writes those by default)")));
        }
        col.levels += n;
      }
      if (col.levels != cm.num_values)
        return DataLoss(where(
            StrCat("the pages hold ", col.levels, " values, the chunk says ", cm.num_values)));

      // Assemble: rows start where the repetition level is 0.
      const std::vector<int>& chain = m.leaf_path[l];
      std::vector<int64_t> idx(static_cast<size_t>(leaf.rep) + 1, 0);
      int64_t row = -1;
      size_t vi = 0;
      for (int64_t i = 0; i < col.levels; ++i) {
        const int r = leaf.rep > 0 ? col.rep[i] : 0;
        const int d = leaf.def > 0 ? col.def[i] : 0;
        if (r > leaf.rep) return DataLoss(where("repetition level too high"));
        if (r == 0) {
          if (++row >= nrows)
            return DataLoss(where(StrCat("more than the row group's ", nrows, " rows")));
          std::fill(idx.begin(), idx.end(), 0);
        } else {
          if (row < 0) return DataLoss(where("the first value continues a row"));
          ++idx[r];
          std::fill(idx.begin() + r + 1, idx.end(), 0);
        }
        json* slot = &(*rows)[row][m.nodes[chain[0]].name];
        for (size_t k = 0; k < chain.size(); ++k) {
          const Node& n = m.nodes[chain[k]];
          if (n.def > d) {
            if (n.repetition == kRepeated && slot->is_null()) *slot = json::array();
            break;
          }
          if (n.repetition == kRepeated) {
            if (!slot->is_array()) *slot = json::array();
            const size_t at = static_cast<size_t>(idx[n.rep]);
            if (at > slot->size()) return DataLoss(where("inconsistent repetition levels"));
            if (at == slot->size()) slot->push_back(nullptr);
            slot = &(*slot)[at];
          }
          if (k + 1 == chain.size()) {
            if (vi >= col.values.size()) return DataLoss(where("fewer values than levels"));
            *slot = std::move(col.values[vi++]);
            break;
          }
          if (!n.container && !n.transparent) {
            if (!slot->is_object()) *slot = json::object();
            slot = &(*slot)[m.nodes[chain[k + 1]].name];
          }
        }
      }
      if (row + 1 != nrows)
        return DataLoss(where(StrCat(row + 1, " rows, the row group says ", nrows)));
    }
  }
  for (json& r : *rows)
    if (r.is_null()) r = json::object();
  return Status::Ok();
}

}  // namespace st
