// DeviceMesh: ranks laid out row-major on a 1-D or 2-D grid with named axes ("dp", "tp"), one
// process group per axis containing the ranks that share every other coordinate (PyTorch's
// init_device_mesh). Not a placement policy: which tensor shards on which axis is the caller's
// plan.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/process_group.h"
#include "comm/store/store.h"

namespace st::comm {

class DeviceMesh {
 public:
  // Every rank of the world calls this with the same shape and names; product(shape) == world.
  static StatusOr<DeviceMesh> Create(std::shared_ptr<Store> store, int rank, int world,
                                     std::vector<int> shape, std::vector<std::string> names,
                                     const GroupOptions& base);
  DeviceMesh(DeviceMesh&&) = default;
  DeviceMesh& operator=(DeviceMesh&&) = default;

  int ndim() const { return static_cast<int>(shape_.size()); }
  int size(int axis) const { return shape_[axis]; }
  int coordinate(int axis) const { return coords_[axis]; }
  int rank() const { return rank_; }
  // Axis index of a name, or -1.
  int axis(const std::string& name) const;
  ProcessGroup& group(int axis) { return *groups_[axis]; }
  const std::string& name(int axis) const { return names_[axis]; }

 private:
  DeviceMesh() = default;
  int rank_ = 0;
  std::vector<int> shape_, coords_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;
};

}  // namespace st::comm
