// Which tensors a run trains: everything but buffers and what --freeze (a regex over HF tensor
// names) matches. One definition for the trainer and the up-front memory estimate. Not the FSDP
// plan (parallel/fsdp.h shards what this marks trainable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/params.h"

namespace st {

struct Trainable {
  std::vector<bool> mask;  // [registry entries]: true = trained
  int64_t frozen = 0;      // elements matched by --freeze
};

// InvalidArgument for a regex that does not compile; "" freezes nothing. A registry with LoRA
// adapters trains them and its modules_to_save only (the regex is not used).
StatusOr<Trainable> TrainableTensors(const ParamRegistry& registry, const std::string& freeze);

}  // namespace st
