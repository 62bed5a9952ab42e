#include "io/files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "core/fd.h"

namespace st {

namespace fs = std::filesystem;

namespace {

Status Fsync(const std::string& path, int flags, const char* what) {
  Fd fd(::open(path.c_str(), flags | O_CLOEXEC));
  if (fd.get() < 0) return IoError(StrCat(path, ": cannot open ", what, ": ", ErrnoMessage(errno)));
  if (::fsync(fd.get()) != 0 && errno != EINVAL)
    return IoError(StrCat(path, ": fsync failed: ", ErrnoMessage(errno)));
  return Status::Ok();
}

std::string ParentOf(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

namespace {

std::string Hex(const unsigned char* md, unsigned int len) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[md[i] >> 4]);
    hex.push_back(kHex[md[i] & 15]);
  }
  return hex;
}

}  // namespace

std::string HashText(const std::string& text) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr);
  return Hex(md, len);
}

StatusOr<std::string> HashFile(const std::string& path, HashKind kind, const std::string& prefix) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0)
    return IoError(StrCat(path, ": cannot open for hashing: ", ErrnoMessage(errno)));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), kind == HashKind::kSha1 ? EVP_sha1() : EVP_sha256(),
                                nullptr) != 1)
    return Internal("OpenSSL digest initialisation failed");
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t k = ::read(fd.get(), buf.data(), buf.size());
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return IoError(StrCat(path, ": read failed while hashing: ", ErrnoMessage(errno)));
    if (k == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(k));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return Hex(md, len);
}

Status FsyncFile(const std::string& path) {
  return Fsync(path, O_RDONLY, "file");
}

Status FsyncDir(const std::string& dir) {
  return Fsync(dir, O_RDONLY | O_DIRECTORY, "directory");
}

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  return text;
}

Status WriteAll(int fd, const void* buf, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (size > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const bool full = w < 0 && errno == ENOSPC;
      return IoError(
          StrCat(path, ": write failed: ", w < 0 ? ErrnoMessage(errno) : std::string("no progress"),
                 full ? " (is the disk full?)" : ""));
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status WriteFileDurably(const std::string& path, const std::string& text) {
  const std::string tmp = StrCat(path, ".tmp", ::getpid());
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return IoError(StrCat(tmp, ": cannot create: ", ErrnoMessage(errno)));
    if (Status w = WriteAll(fd.get(), text.data(), text.size(), tmp); !w.ok()) {
      ::unlink(tmp.c_str());
      return w;
    }
    if (::fsync(fd.get()) != 0) {
      const std::string why = ErrnoMessage(errno);
      ::unlink(tmp.c_str());
      return IoError(StrCat(tmp, ": fsync failed: ", why));
    }
  }
  return RenameDurably(tmp, path);
}

void DropPages(const void* begin, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t first = (start + page - 1) / page * page, last = (start + bytes) / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Status RenameDurably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    return IoError(StrCat("cannot rename ", from, " to ", to, ": ", ErrnoMessage(errno)));
  return FsyncDir(ParentOf(to));
}

StatusOr<std::map<std::string, std::string>> ReadChecksums(const std::string& dir) {
  const std::string path = (fs::path(dir) / kChecksumsFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    return DataLoss(StrCat(dir, " has no ", kChecksumsFile,
                           ": it was never committed (a run killed while writing it?)"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(StrCat(path, ": cannot open: ", ErrnoMessage(errno)));
  std::map<std::string, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const bool well_formed = line.size() > 66 && line.compare(64, 2, "  ") == 0 &&
                             line.find_first_not_of("0123456789abcdef") == 64;
    if (!well_formed) return DataLoss(StrCat(path, ": malformed line '", line.substr(0, 80), "'"));
    out[line.substr(66)] = line.substr(0, 64);
  }
  if (out.empty()) return DataLoss(StrCat(path, " lists no file"));
  return out;
}

namespace {

Status VerifyListed(const std::string& dir, const std::map<std::string, std::string>& manifest,
                    const std::string& relative) {
  auto it = manifest.find(relative);
  if (it == manifest.end())
    return DataLoss(StrCat(dir, "/", kChecksumsFile, " does not list ", relative));
  const std::string path = (fs::path(dir) / relative).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return DataLoss(StrCat(path, " is missing"));
  ST_ASSIGN_OR_RETURN(std::string digest, HashFile(path));
  if (digest != it->second)
    return DataLoss(StrCat(path, " does not match the checksum recorded at commit (", digest,
                           " now, ", it->second, " then): it was truncated or altered"));
  return Status::Ok();
}

}  // namespace

Status VerifyChecksum(const std::string& dir, const std::string& relative) {
  ST_ASSIGN_OR_RETURN(auto manifest, ReadChecksums(dir));
  return VerifyListed(dir, manifest, relative);
}

Status VerifyChecksumsIfListed(const std::string& dir, const std::vector<std::string>& relative) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kChecksumsFile, ec)) return Status::Ok();
  ST_ASSIGN_OR_RETURN(auto manifest, ReadChecksums(dir));
  for (const std::string& r : relative)
    if (fs::exists(fs::path(dir) / r, ec)) ST_RETURN_IF_ERROR(VerifyListed(dir, manifest, r));
  return Status::Ok();
}

}  // namespace st
