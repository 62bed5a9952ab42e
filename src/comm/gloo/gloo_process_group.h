// The Gloo backend of ProcessGroup: CPU buffers over TCP (Debian's libgloo, new-style algorithms
// only, never mixed with the legacy ones on one context). Reduce-scatter is our own ring on Gloo's
// unbound buffers (libgloo 0.5 has no new-style reduce_scatter).
//
// Debian's libgloo has no TLS transport, and Gloo's TCP pair takes the first connection that
// reaches its listening port. So once the mesh is connected, every pair proves the job secret to
// each other (a mutual HMAC-SHA256 challenge-response over fresh nonces) before the group is
// used: a process that connected in a peer's place, or a peer started with another secret, makes
// the rendezvous fail with an error naming the pair. What it does not give: encryption or
// integrity of later messages (see docs/reliability.md, "Security").
#pragma once

#include <memory>
#include <string>

#include "comm/group.h"
#include "comm/process_group.h"
#include "comm/store/store.h"

namespace st::comm {

// Rendezvous of `size` ranks through `store` (keys under "pg/<name>/"); every rank calls it.
StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const GroupOptions& opts);

}  // namespace st::comm
