#include "comm/group.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "comm/gloo/gloo_process_group.h"
#include "comm/hier/hier_process_group.h"
#include "comm/shm/shm_process_group.h"

namespace st::comm {

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kAuto:
      return "auto";
    case Transport::kTcp:
      return "tcp";
    case Transport::kShm:
      return "shm";
  }
  return "?";
}

StatusOr<Transport> ParseTransport(const std::string& s) {
  if (s == "auto" || s.empty()) return Transport::kAuto;
  if (s == "tcp") return Transport::kTcp;
  if (s == "shm") return Transport::kShm;
  return InvalidArgument("transport '" + s + "' is not one of auto, tcp, shm");
}

std::string HostIdentity() {
  std::string id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, id);
  for (const char* ns : {"ipc", "pid", "net"}) {
    char link[128] = {};
    const std::string path = std::string("/proc/self/ns/") + ns;
    const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
    id.push_back('|');
    id.append(n > 0 ? link : ns);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) {
    id.push_back('|');
    id.append(host);
  }
  return id;
}

StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(std::shared_ptr<Store> store, int rank,
                                                           int size, const GroupOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument(StrCat("rank ", rank, " is outside a group of ", size));
  if (opts.transport == Transport::kTcp) return CreateGlooProcessGroup(store, rank, size, opts);
  auto scoped = std::make_shared<PrefixStore>("pg/" + opts.name, store);
  const StoreOptions so{opts.connect_timeout};
  // Where every rank runs.
  const std::string mine = opts.host_key.empty() ? HostIdentity() : opts.host_key;
  ST_RETURN_IF_ERROR(scoped->Set(StrCat("host/", rank), mine, so));
  std::vector<std::string> hosts(size);
  for (int p = 0; p < size; ++p) {
    auto h = scoped->Get(StrCat("host/", p), so);
    if (!h.ok())
      return h.status().WithContext(
          StrCat("group '", opts.name, "': rank ", p, " did not say which host it runs on"));
    hosts[p] = *h;
  }
  int other = -1;
  for (int p = 0; p < size && other < 0; ++p)
    if (hosts[p] != hosts[0]) other = p;
  if (other < 0) {
    auto g = shm::CreateShmProcessGroup(scoped, rank, size, opts);
    if (g.ok() || g.status().code() != StatusCode::kUnimplemented) return g;
    if (opts.transport == Transport::kShm)
      return Status(
          g.status().code(),
          StrCat("group '", opts.name, "': no shared memory between the ranks of this ", "host (",
                 g.status().message(), "); SLICETRAIN_TRANSPORT=auto or tcp uses TCP instead"));
    if (rank == 0)
      std::fprintf(stderr,
                   "slicetrain: warning: group '%s': no shared memory between the ranks of this "
                   "host (%s); using TCP\n",
                   opts.name.c_str(), g.status().message().c_str());
    return CreateGlooProcessGroup(store, rank, size, opts);
  }
  if (opts.transport == Transport::kShm)
    return InvalidArgument(StrCat("group '", opts.name, "': transport shm needs every rank on one ",
                                  "host, but ranks 0 and ", other,
                                  " run on different hosts; use auto or tcp"));
  return hier::CreateHierarchicalGroup(store, rank, size, hosts, opts);
}

void CatchSigpipe() {
  struct sigaction a {};
  a.sa_handler = [](int) {};
  a.sa_flags = SA_RESTART;
  sigemptyset(&a.sa_mask);
  sigaction(SIGPIPE, &a, nullptr);
}

}  // namespace st::comm
