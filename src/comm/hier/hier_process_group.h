// The hierarchical backend of ProcessGroup, for a group spread over several hosts with the same
// number of ranks L on each (NCCL's and HSDP's two-level layout): a shared-memory group among the
// L ranks of each host, and L TCP (Gloo) groups across hosts, one per local index, which run side
// by side. all_reduce = local reduce_scatter, cross-host all_reduce of this rank's 1/L part, local
// all_gather: each byte crosses the network once per host pair of links, not once per rank.
// Groups whose hosts hold different numbers of ranks, or one rank each, are flat TCP groups.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/process_group.h"
#include "comm/store/store.h"

namespace st::comm::hier {

// `hosts[p]` is rank p's host identity (as gathered by CreateProcessGroup); every rank calls it.
StatusOr<std::unique_ptr<ProcessGroup>> CreateHierarchicalGroup(
    std::shared_ptr<Store> store, int rank, int size, const std::vector<std::string>& hosts,
    const GroupOptions& opts);

}  // namespace st::comm::hier
