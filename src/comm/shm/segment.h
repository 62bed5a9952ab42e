// A shared-memory mapping that no name ever points at. The creator makes an anonymous memfd; the
// other processes of the host open it through /proc/<creator pid>/fd/<fd> while the creator still
// holds it, and once every one has mapped it the creator closes its descriptor. The kernel then
// frees the memory with the last mapping, however the processes end (SIGKILL included): nothing
// is ever left in /dev/shm, so there is nothing to unlink. Not an allocator: one fixed-size block.
#pragma once

#include <cstddef>
#include <string>

#include "core/fd.h"
#include "core/status.h"

namespace st::comm::shm {

class SharedSegment {
 public:
  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& o) noexcept;
  SharedSegment& operator=(SharedSegment&& o) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // A zero-filled segment of `bytes`, mapped here; `label` names it in /proc/<pid>/maps.
  static StatusOr<SharedSegment> Create(size_t bytes, const std::string& label);
  // Maps the segment that process `pid` holds as descriptor `fd` (its handle()); fails unless it
  // is exactly `bytes` long.
  static StatusOr<SharedSegment> Attach(int pid, int fd, size_t bytes);

  // "<pid> <fd>" of the creator's descriptor, for Attach (empty once the descriptor is closed).
  std::string handle() const;
  // The creator drops its descriptor once every peer has attached.
  void CloseDescriptor() { fd_.Reset(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Unmap();
  Fd fd_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace st::comm::shm
