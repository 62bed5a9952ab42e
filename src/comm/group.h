// Process-group construction: one call that every rank of a group makes, which finds out where
// its peers run (through the store) and picks the transport. Ranks that share a host talk through
// a shared-memory segment (comm/shm); ranks on different hosts through TCP (comm/gloo), and a
// group spanning several hosts with the same number of ranks on each combines the two
// hierarchically (comm/hier). Not a transport itself: see the folders beside it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace st::comm {

enum class Transport {
  kAuto,  // shared memory within a host, TCP across hosts, hierarchical when both (default)
  kTcp,   // Gloo over TCP for every pair, even on one host
  kShm,   // shared memory; every rank must be on this host
};
const char* TransportName(Transport t);
// "auto", "tcp", "shm" (SLICETRAIN_TRANSPORT, --transport).
StatusOr<Transport> ParseTransport(const std::string& s);

struct GroupOptions {
  std::string name = "world";          // groups on one store need distinct names
  std::string hostname = "127.0.0.1";  // address peers use to reach this rank
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // The key every TCP pair proves it holds (the job's SLICETRAIN_SECRET). Groups of one process
  // (the tests' in-memory stores) may leave it empty: the handshake still runs, but proves nothing.
  std::string auth_key;
  Transport transport = Transport::kAuto;
  // Which host this rank runs on, as far as memory sharing goes. "" = HostIdentity(); tests set
  // it to pretend that threads of one process run on several hosts.
  std::string host_key;
  // Bytes of one rank's staging slot in the shared segment (0 = kDefaultShmSlotBytes); a
  // collective larger than a slot runs in slot-sized chunks.
  size_t shm_slot_bytes = 0;
};

// Identifies the shared-memory domain of this process: the boot, and the IPC, PID and network
// namespaces (two containers, or two network namespaces standing for two hosts in the tests, are
// different hosts even on one kernel).
std::string HostIdentity();

// Makes SIGPIPE a no-op for this process: a write to a closed socket (Gloo's TCP pairs write
// with writev, e.g. to a peer that was just killed) then fails with EPIPE and the collective
// reports the lost rank, instead of the signal ending the process silently. A handler rather
// than SIG_IGN: exec resets it, so programs started later get the default back. Every process
// that runs TCP groups calls it once, early (the binary's main, the test binaries).
void CatchSigpipe();

// Rendezvous of `size` ranks through `store` (keys under "pg/<name>/"); every rank of the group
// calls it with the same name and transport. kAuto falls back to TCP, with one line on stderr,
// when a shared segment cannot be set up (every rank then agrees on TCP).
StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(std::shared_ptr<Store> store, int rank,
                                                           int size, const GroupOptions& opts);

}  // namespace st::comm
