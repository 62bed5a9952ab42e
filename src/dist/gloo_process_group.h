// The Gloo backend of ProcessGroup: CPU buffers over TCP (Debian's libgloo, new-style algorithms
// only, never mixed with the legacy ones on one context). Reduce-scatter is our own ring on Gloo's
// unbound buffers (libgloo 0.5 has no new-style reduce_scatter).
#pragma once

#include <memory>
#include <string>

#include "dist/process_group.h"
#include "dist/store.h"

namespace st::dist {

struct GlooOptions {
  std::string name = "world";          // groups on one store need distinct names
  std::string hostname = "127.0.0.1";  // address peers use to reach this rank
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
};

// Rendezvous of `size` ranks through `store` (keys under "pg/<name>/"); every rank calls it.
StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const GlooOptions& opts);

}  // namespace st::dist
