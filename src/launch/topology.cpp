#include "launch/topology.h"

#include <algorithm>
#include <cctype>

namespace st::launch {

namespace {

struct TpuKind {
  const char* name;
  int chips_per_host;
  int devices_per_chip;
  std::vector<std::string> shapes;
};

const std::vector<TpuKind>& TpuKinds() {
  static const std::vector<TpuKind> kinds = {
      {"TPU-V6E", 4, 1, {"2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"}},
      {"TPU-V7X", 4, 2, {"2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"}},
  };
  return kinds;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// "TPU-V6E", "V6E", "TPU-V6E-16" -> "TPU-V6E"; "TPU7X", "TPU-V7X" -> "TPU-V7X".
std::string CanonicalTpu(const std::string& upper) {
  if (upper.find("V6E") != std::string::npos) return "TPU-V6E";
  if (upper.find("7X") != std::string::npos) return "TPU-V7X";
  return "";
}

StatusOr<std::vector<int>> ParseShape(const std::string& shape) {
  std::vector<int> dims;
  size_t pos = 0;
  while (pos <= shape.size()) {
    size_t x = shape.find('x', pos);
    std::string part = shape.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    if (part.empty() || part.size() > 6 ||
        !std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); }))
      return InvalidArgument("topology '" + shape + "' is not of the form AxB or AxBxC");
    dims.push_back(std::stoi(part));
    if (dims.back() <= 0) return InvalidArgument("topology '" + shape + "' has a zero dimension");
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return dims;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::string Topology::ToString() const {
  return StrCat(accelerator_type, " ", shape, ": ", hosts, " host", hosts == 1 ? "" : "s", " x ",
                chips_per_host, " chip", chips_per_host == 1 ? "" : "s", " x ", devices_per_chip,
                " device", devices_per_chip == 1 ? "" : "s", " = ", world_size(), " workers");
}

std::vector<std::string> ValidShapes(const std::string& accelerator_type) {
  const std::string canon = CanonicalTpu(Upper(accelerator_type));
  for (const auto& k : TpuKinds())
    if (canon == k.name) return k.shapes;
  return {};
}

StatusOr<Topology> ResolveTopology(const std::string& accelerator_type, const std::string& shape) {
  const std::string upper = Upper(accelerator_type);
  Topology t;
  t.shape = shape;
  if (upper.rfind("TPU", 0) == 0 || upper == "V6E" || upper == "V7X") {
    const std::string canon = CanonicalTpu(upper);
    const TpuKind* kind = nullptr;
    for (const auto& k : TpuKinds())
      if (canon == k.name) kind = &k;
    if (!kind)
      return InvalidArgument("unknown TPU accelerator type '" + accelerator_type +
                             "' (known: TPU-V6E, TPU-V7X)");
    if (std::find(kind->shapes.begin(), kind->shapes.end(), shape) == kind->shapes.end())
      return InvalidArgument(StrCat("topology '", shape, "' is not a valid ", kind->name,
                                    " slice; valid: ", Join(kind->shapes)));
    ST_ASSIGN_OR_RETURN(std::vector<int> dims, ParseShape(shape));
    t.accelerator_type = kind->name;
    t.chips = 1;
    for (int d : dims) t.chips *= d;
    t.chips_per_host = std::min(kind->chips_per_host, t.chips);
    t.devices_per_chip = kind->devices_per_chip;
    t.hosts = t.chips / t.chips_per_host;
    return t;
  }
  const bool gpu = upper.rfind("GPU", 0) == 0;
  if (!gpu && upper != "CPU")
    return InvalidArgument("unknown accelerator type '" + accelerator_type +
                           "' (known: TPU-V6E, TPU-V7X, GPU-<name>, CPU)");
  if (gpu && (upper.size() < 5 || upper[3] != '-'))
    return InvalidArgument("GPU accelerator type must be GPU-<name>, e.g. GPU-H100");
  ST_ASSIGN_OR_RETURN(std::vector<int> dims, ParseShape(shape));
  if (dims.size() > 2)
    return InvalidArgument(StrCat("topology '", shape, "' for ", accelerator_type,
                                  " must be D (one host of D devices) or HxD (H hosts of D)"));
  // Each dimension has at most 6 digits, so the product fits in int64 but not always in int.
  int64_t workers = 1;
  for (int d : dims) workers *= d;
  if (workers > kMaxWorldSize)
    return InvalidArgument(StrCat("topology '", shape, "' has ", workers,
                                  " workers, more than the limit of ", kMaxWorldSize));
  t.accelerator_type = gpu ? "GPU-" + upper.substr(4) : "CPU";
  t.hosts = dims.size() == 2 ? dims[0] : 1;
  t.chips_per_host = dims.back();
  t.chips = t.hosts * t.chips_per_host;
  t.devices_per_chip = 1;
  return t;
}

}  // namespace st::launch
