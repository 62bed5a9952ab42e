#include "comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace st::comm::shm {

SharedSegment::~SharedSegment() {
  Unmap();
}

SharedSegment::SharedSegment(SharedSegment&& o) noexcept
    : fd_(std::move(o.fd_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void SharedSegment::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  fd_.Reset();
}

StatusOr<SharedSegment> SharedSegment::Create(size_t bytes, const std::string& label) {
  Fd fd(::memfd_create(label.c_str(), MFD_CLOEXEC));
  if (!fd.valid()) return IoError("memfd_create: " + ErrnoMessage(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return IoError(
        StrCat("cannot size a shared segment of ", bytes, " bytes: ", ErrnoMessage(errno)));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return IoError(StrCat("mmap of ", bytes, " shared bytes: ", ErrnoMessage(errno)));
  SharedSegment s;
  s.fd_ = std::move(fd);
  s.data_ = p;
  s.size_ = bytes;
  return s;
}

StatusOr<SharedSegment> SharedSegment::Attach(int pid, int fd_number, size_t bytes) {
  const std::string path = StrCat("/proc/", pid, "/fd/", fd_number);
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid())
    return IoError(StrCat("cannot open the shared segment of process ", pid, " (", path,
                          "): ", ErrnoMessage(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes)
    return IoError(StrCat(path, " is not the expected ", bytes, "-byte shared segment"));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return IoError(StrCat("mmap of ", path, ": ", ErrnoMessage(errno)));
  SharedSegment s;
  s.data_ = p;
  s.size_ = bytes;
  return s;  // fd closes here: the mapping keeps the memory
}

std::string SharedSegment::handle() const {
  return fd_.valid() ? StrCat(::getpid(), " ", fd_.get()) : std::string();
}

}  // namespace st::comm::shm
