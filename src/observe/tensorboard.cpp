#include "observe/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace st::observe {

namespace {

// Reflected CRC-32C table (polynomial 0x1EDC6F41, reversed 0x82F63B78).
std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void PutLittle(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Protocol buffer fields: key = field number << 3 | wire type.
void PutDouble(std::string* out, int field, double v) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | 1);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutLittle(out, bits, 8);
}
void PutFloat(std::string* out, int field, float v) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | 5);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutLittle(out, bits, 4);
}
void PutInt64(std::string* out, int field, int64_t v) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | 0);
  PutVarint(out, static_cast<uint64_t>(v));
}
void PutBytes(std::string* out, int field, std::string_view v) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | 2);
  PutVarint(out, v.size());
  out->append(v);
}

// tensorflow.Event: wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7.
// tensorflow.Summary: value = 1; Summary.Value: tag = 1, simple_value = 2.
// tensorflow.SessionLog: status = 1 (START = 1).
std::string EventHead(double wall_time, int64_t step) {
  std::string e;
  PutDouble(&e, 1, wall_time);
  if (step != 0) PutInt64(&e, 2, step);  // proto3: a default value is not written
  return e;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string FrameRecord(std::string_view data) {
  std::string length;
  PutLittle(&length, data.size(), 8);
  std::string out = length;
  PutLittle(&out, MaskedCrc32c(length), 4);
  out.append(data);
  PutLittle(&out, MaskedCrc32c(data), 4);
  return out;
}

std::string FileVersionEvent(double wall_time) {
  std::string e = EventHead(wall_time, 0);
  PutBytes(&e, 3, "brain.Event:2");
  return e;
}

std::string SessionStartEvent(double wall_time, int64_t step) {
  std::string log;
  PutInt64(&log, 1, 1);
  std::string e = EventHead(wall_time, step);
  PutBytes(&e, 7, log);
  return e;
}

std::string ScalarsEvent(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    PutBytes(&value, 1, s.tag);
    PutFloat(&value, 2, s.value);
    PutBytes(&summary, 1, value);
  }
  std::string e = EventHead(wall_time, step);
  PutBytes(&e, 5, summary);
  return e;
}

StatusOr<EventFileWriter> EventFileWriter::Open(const std::string& dir, double wall_time,
                                                int64_t purge_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError(StrCat("cannot create ", dir, ": ", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  char name[512];
  std::snprintf(name, sizeof(name), "events.out.tfevents.%010lld.%s",
                static_cast<long long>(std::floor(wall_time)), host);
  EventFileWriter w;
  w.path_ = (std::filesystem::path(dir) / name).string();
  w.f_ = std::fopen(w.path_.c_str(), "ab");
  if (w.f_ == nullptr) return IoError(StrCat("cannot write ", w.path_, ": ", std::strerror(errno)));
  ST_RETURN_IF_ERROR(w.Write(FileVersionEvent(wall_time)));
  if (purge_step > 0) ST_RETURN_IF_ERROR(w.Write(SessionStartEvent(wall_time, purge_step)));
  return w;
}

EventFileWriter::EventFileWriter(EventFileWriter&& other) noexcept
    : f_(other.f_), path_(std::move(other.path_)) {
  other.f_ = nullptr;
}

EventFileWriter& EventFileWriter::operator=(EventFileWriter&& other) noexcept {
  if (this != &other) {
    if (f_) std::fclose(f_);
    f_ = other.f_;
    path_ = std::move(other.path_);
    other.f_ = nullptr;
  }
  return *this;
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

Status EventFileWriter::Write(const std::string& event) {
  const std::string record = FrameRecord(event);
  if (std::fwrite(record.data(), 1, record.size(), f_) != record.size() || std::fflush(f_) != 0)
    return IoError(StrCat("cannot write ", path_, ": ", std::strerror(errno)));
  return Status::Ok();
}

Status EventFileWriter::Add(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  return Write(ScalarsEvent(wall_time, step, scalars));
}

}  // namespace st::observe
