// Accelerator types and slice shapes -> hosts, chips per host, devices per chip. The one table of
// what slicetrain knows about slices (docs/runtime.md lists it). Not a scheduler: it does not
// place anything, it only says how many workers a slice has and how they group into hosts.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace st::launch {

// The largest world size a topology may describe (a typo such as 100000x100000 is refused instead
// of overflowing the worker count).
constexpr int64_t kMaxWorldSize = 65536;

struct Topology {
  std::string accelerator_type;  // "TPU-V6E", "TPU-V7X", "GPU-H100", "CPU"
  std::string shape;             // "4x4", "2x2x2", ...
  int chips = 0;                 // product of the shape
  int hosts = 0;
  int chips_per_host = 0;
  int devices_per_chip = 1;
  int devices_per_host() const { return chips_per_host * devices_per_chip; }
  int world_size() const { return hosts * devices_per_host(); }
  // "TPU-V6E 4x4: 4 hosts x 4 chips x 1 device = 16 workers"
  std::string ToString() const;
};

// Accepted spellings: TPU-V6E / v6e / TPU-V7X / tpu7x (case-insensitive); GPU-<name> with shape
// "G" (one host of G GPUs) or "HxG" (H hosts of G); CPU with shape "D" or "HxD" (H virtual hosts of
// D devices, all on this machine). An impossible shape is rejected with the valid ones listed.
StatusOr<Topology> ResolveTopology(const std::string& accelerator_type, const std::string& shape);

// The slice shapes listed for a TPU type ("" for non-TPU types).
std::vector<std::string> ValidShapes(const std::string& accelerator_type);

}  // namespace st::launch
