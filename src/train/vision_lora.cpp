#include "train/vision_lora.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "io/safetensors.h"

namespace st {

VisionLoraTrainer::VisionLoraTrainer(vision::VisionTower* tower, bool train_projection)
    : tower_(tower), train_projection_(train_projection) {
  ST_CHECK(tower_ != nullptr && (tower_->has_lora() || train_projection))
      << "a vision trainer with nothing to train";
  grads_ = tower_->weights().ZerosLike(/*base=*/false);
  if (train_projection_) grads_.projection.assign(tower_->weights().projection.size(), 0.0f);
  exp_avg_ = grads_;
  exp_avg_sq_ = grads_;
}

template <typename Fn>
void VisionLoraTrainer::ForEachTrained(Fn&& fn) {
  const vision::VisionConfig& c = tower_->config();
  const std::vector<std::string> modules = vision::VisionTower::LinearModules(c);
  vision::VisionTensors& w = tower_->mutable_weights();
  const int64_t r = tower_->lora_rank();
  for (size_t slot = 0; slot < w.lora_a.size(); ++slot) {
    if (w.lora_a[slot].empty()) continue;
    const int64_t in = static_cast<int64_t>(w.lora_a[slot].size()) / r;
    const int64_t out = static_cast<int64_t>(w.lora_b[slot].size()) / r;
    fn(modules[slot] + ".lora_A.weight", std::vector<int64_t>{r, in}, w.lora_a[slot],
       grads_.lora_a[slot], exp_avg_.lora_a[slot], exp_avg_sq_.lora_a[slot]);
    fn(modules[slot] + ".lora_B.weight", std::vector<int64_t>{out, r}, w.lora_b[slot],
       grads_.lora_b[slot], exp_avg_.lora_b[slot], exp_avg_sq_.lora_b[slot]);
  }
  if (train_projection_)
    fn(std::string(vision::VisionTower::kProjectionModule) + ".weight",
       std::vector<int64_t>{c.text_hidden_size, c.hidden_size}, w.projection, grads_.projection,
       exp_avg_.projection, exp_avg_sq_.projection);
}

template <typename Fn>
void VisionLoraTrainer::ForEachGrad(Fn&& fn) const {
  // ForEachTrained hands out every tensor; only the gradients are touched through it.
  const_cast<VisionLoraTrainer*>(this)->ForEachTrained(
      [&](const std::string&, const std::vector<int64_t>&, std::vector<float>&,
          std::vector<float>& g, std::vector<float>&, std::vector<float>&) { fn(g); });
}

int64_t VisionLoraTrainer::parameters() const {
  int64_t n = 0;
  ForEachGrad([&](std::vector<float>& g) { n += static_cast<int64_t>(g.size()); });
  return n;
}

int64_t VisionLoraTrainer::adapter_parameters() const {
  return parameters() - static_cast<int64_t>(grads_.projection.size());
}

void VisionLoraTrainer::ZeroGrad() {
  ForEachGrad([](std::vector<float>& g) { std::fill(g.begin(), g.end(), 0.0f); });
  images_ = 0;
  had_images_ = false;
}

Status VisionLoraTrainer::Backward(const vision::VisionSaved& saved, const float* d_soft) {
  images_ += static_cast<int64_t>(saved.images.size());
  return tower_->Backward(saved, d_soft, &grads_);
}

Status VisionLoraTrainer::AllReduce(comm::ProcessGroup& pg,
                                    const comm::CollectiveOptions& options) {
  // One buffer: every gradient, then this rank's image count.
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(parameters()) + 1);
  ForEachGrad([&](std::vector<float>& g) { flat.insert(flat.end(), g.begin(), g.end()); });
  flat.push_back(static_cast<float>(images_));
  if (pg.size() > 1)
    ST_RETURN_IF_ERROR(pg.AllReduce(flat.data(), static_cast<int64_t>(flat.size()), DType::kF32,
                                    comm::ReduceOp::kSum, options));
  size_t at = 0;
  ForEachGrad([&](std::vector<float>& g) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
              flat.begin() + static_cast<std::ptrdiff_t>(at + g.size()), g.begin());
    at += g.size();
  });
  had_images_ = flat.back() > 0;
  return Status::Ok();
}

double VisionLoraTrainer::SumOfSquares() const {
  double s = 0;
  ForEachGrad([&](std::vector<float>& g) {
    s += st::SumOfSquares(g.data(), static_cast<int64_t>(g.size()));
  });
  return s;
}

void VisionLoraTrainer::Scale(float coef) {
  ForEachGrad([&](std::vector<float>& g) {
    for (float& v : g) v *= coef;
  });
}

bool VisionLoraTrainer::Step(const AdamWConfig& cfg) {
  if (!had_images_) return false;
  ++steps_;
  ForEachTrained([&](const std::string&, const std::vector<int64_t>&, std::vector<float>& w,
                     std::vector<float>& g, std::vector<float>& m, std::vector<float>& v) {
    AdamWStep(cfg, steps_, w.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(w.size()));
  });
  return true;
}

std::vector<VisionLoraTrainer::Named> VisionLoraTrainer::PeftTensors() const {
  std::vector<Named> out;
  const_cast<VisionLoraTrainer*>(this)->ForEachTrained(
      [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& w,
          std::vector<float>&, std::vector<float>&, std::vector<float>&) {
        out.push_back({"base_model.model." + name, shape, &w});
      });
  return out;
}

Status VisionLoraTrainer::SaveState(const std::string& path) const {
  std::vector<TensorToWrite> tensors;
  const_cast<VisionLoraTrainer*>(this)->ForEachTrained(
      [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& w,
          std::vector<float>&, std::vector<float>& m, std::vector<float>& v) {
        const Shape s(shape.begin(), shape.end());
        tensors.push_back({name, DType::kF32, s, w.data()});
        tensors.push_back({name + ".exp_avg", DType::kF32, s, m.data()});
        tensors.push_back({name + ".exp_avg_sq", DType::kF32, s, v.data()});
      });
  return WriteSafeTensors(path, tensors, {{"steps", std::to_string(steps_)}});
}

Status VisionLoraTrainer::LoadState(const std::string& path) {
  ST_ASSIGN_OR_RETURN(const SafeTensorsFile f, SafeTensorsFile::Open(path));
  const auto it = f.metadata().find("steps");
  if (it == f.metadata().end()) return DataLoss(StrCat(path, ": no \"steps\" in its metadata"));
  char* end = nullptr;
  const long long steps = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || steps < 0)
    return DataLoss(StrCat(path, ": metadata \"steps\" is not a count: ", it->second));
  // Everything read before anything changes: a damaged file leaves the adapters as they were.
  std::vector<std::pair<std::vector<float>*, std::vector<float>>> read;
  Status status;
  ForEachTrained([&](const std::string& name, const std::vector<int64_t>& shape,
                     std::vector<float>& w, std::vector<float>&, std::vector<float>& m,
                     std::vector<float>& v) {
    for (auto [suffix, dst] :
         {std::pair{"", &w}, std::pair{".exp_avg", &m}, std::pair{".exp_avg_sq", &v}}) {
      if (!status.ok()) return;
      std::vector<float> values(dst->size());
      status = f.ReadF32(name + suffix, values.data(), Shape(shape.begin(), shape.end()));
      read.emplace_back(dst, std::move(values));
    }
  });
  ST_RETURN_IF_ERROR(status.WithContext(path));
  for (auto& [dst, values] : read) *dst = std::move(values);
  steps_ = steps;
  return Status::Ok();
}

}  // namespace st
