#include "comm/device_mesh.h"

namespace st::comm {

int DeviceMesh::axis(const std::string& n) const {
  for (int i = 0; i < ndim(); ++i)
    if (names_[i] == n) return i;
  return -1;
}

StatusOr<DeviceMesh> DeviceMesh::Create(std::shared_ptr<Store> store, int rank, int world,
                                        std::vector<int> shape, std::vector<std::string> names,
                                        const GroupOptions& base) {
  if (shape.empty() || shape.size() > 2 || names.size() != shape.size())
    return InvalidArgument("a device mesh has 1 or 2 axes, each with a name");
  int64_t prod = 1;
  for (int s : shape) prod *= s;
  if (prod != world)
    return InvalidArgument(StrCat("mesh of ", prod, " ranks does not match a world of ", world));
  DeviceMesh m;
  m.rank_ = rank;
  m.shape_ = shape;
  m.names_ = names;
  // Row-major coordinates: rank = c0 * shape[1] + c1.
  m.coords_.resize(shape.size());
  int rem = rank;
  for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
    m.coords_[a] = rem % shape[a];
    rem /= shape[a];
  }
  std::string tag;
  for (size_t a = 0; a < shape.size(); ++a) tag += StrCat(a ? "x" : "", names[a], shape[a]);
  for (int a = 0; a < m.ndim(); ++a) {
    // The group along axis a is identified by the coordinates on the other axes.
    int other = 0;
    for (int b = 0; b < m.ndim(); ++b)
      if (b != a) other = other * shape[b] + m.coords_[b];
    GroupOptions o = base;
    o.name = StrCat("mesh/", tag, "/", names[a], "/", other);
    ST_ASSIGN_OR_RETURN(auto pg, CreateProcessGroup(store, m.coords_[a], shape[a], o));
    m.groups_.push_back(std::move(pg));
  }
  return m;
}

}  // namespace st::comm
