// The shared-memory backend of ProcessGroup: ranks of one host exchange data through one segment
// (comm/shm/segment.h) with two sets of per-rank staging slots, and meet at a counter barrier that
// spins briefly, then sleeps on a futex. Collectives are reduce-in-place algorithms on the slots:
// all_reduce copies in, each rank reduces its own slice of the chunk over every rank (in rank
// order, so every rank gets the same bits), then all read; messages larger than a slot run in
// chunks. A peer that exits is seen through its pidfd; a rank that fails aborts the group for all.
// Not for ranks on different hosts: comm/group.h picks TCP or the hierarchical group for those.
#pragma once

#include <memory>

#include "comm/group.h"
#include "comm/process_group.h"
#include "comm/store/store.h"

namespace st::comm::shm {

constexpr size_t kDefaultSlotBytes = size_t{1} << 20;
constexpr int kMaxRanks = 256;

// Every rank of the group calls it; `store` is already scoped to the group. Rank 0 creates the
// segment and the others attach; the outcome is the same on every rank: ok, or kUnimplemented
// with the first failing rank's reason (callers fall back to TCP together). Any other error (the
// store, a peer that never came) is the rendezvous failing, not shared memory.
StatusOr<std::unique_ptr<ProcessGroup>> CreateShmProcessGroup(std::shared_ptr<Store> store,
                                                              int rank, int size,
                                                              const GroupOptions& opts);

}  // namespace st::comm::shm
