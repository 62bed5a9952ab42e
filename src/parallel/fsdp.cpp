#include "parallel/fsdp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace st {

namespace {
std::vector<bool> Not(const std::vector<bool>& v) {
  std::vector<bool> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = !v[i];
  return out;
}
}  // namespace

FsdpModel::FsdpModel(const Gemma4Config& cfg, const ParamRegistry& reg, comm::ProcessGroup& pg,
                     std::vector<bool> trainable, const WeightSource& weights,
                     const FsdpOptions& options)
    : cfg_(cfg),
      reg_(reg),
      pg_(pg),
      trainable_(std::move(trainable)),
      options_(options),
      weights_(weights),
      frozen_(reg, weights, Not(trainable_)),
      unit_of_entry_(reg.layout.size(), -1),
      index_in_unit_(reg.layout.size(), -1) {
  ST_CHECK(static_cast<int>(trainable_.size()) == reg.layout.size())
      << "trainable has the wrong size";
  ST_CHECK(options.param_dtype == DType::kF32 || options.param_dtype == DType::kBF16)
      << "FSDP gathers parameters in f32 or bf16";
  const int64_t L = cfg.num_hidden_layers, W = pg.size();
  units_.resize(L + 1);
  // Which unit each trainable entry belongs to.
  std::vector<int> unit_of(reg.layout.size(), 0);
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& lp = reg.layers[l];
    if (options.units == FsdpUnitMode::kMlp) {
      for (int idx : {lp.gate_proj, lp.up_proj, lp.down_proj})
        for (int e : {idx, reg.lora_a[idx], reg.lora_b[idx]})  // the MLP's adapters with it
          if (e >= 0) unit_of[e] = UnitOfLayer(l);
    } else {
      const std::string prefix = "layers." + std::to_string(l) + ".";
      for (int i = 0; i < reg.layout.size(); ++i)
        if (reg.layout.entry(i).name.rfind(prefix, 0) == 0) unit_of[i] = UnitOfLayer(l);
    }
  }
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (!trainable_[i]) continue;
    Unit& u = units_[unit_of[i]];
    unit_of_entry_[i] = unit_of[i];
    index_in_unit_[i] = static_cast<int>(u.entries.size());
    u.entries.push_back(i);
    u.flat_offset.push_back(u.total);
    u.total += AlignElements(reg.layout.entry(i).numel);
  }
  int64_t max_slot = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = units_[k];
    u.shard = (u.total + W - 1) / W;
    u.shard_offset = shard_total_;
    shard_total_ += u.shard;
    if (k > 0) max_slot = std::max(max_slot, u.shard * W);
  }
  master_.assign(shard_total_, 0.0f);
  grad_.assign(shard_total_, 0.0f);
  exp_avg_.assign(shard_total_, 0.0f);
  exp_avg_sq_.assign(shard_total_, 0.0f);

  auto size_slot = [&](Slot& s, int64_t full) {
    s.params = AlignedBuffer(full, "an FSDP unit's gathered parameters");
    s.grads = AlignedBuffer(full, "an FSDP unit's gathered gradients");
    if (options_.param_dtype == DType::kBF16) {
      s.send_bf16.resize(full / W);
      s.recv_bf16.resize(full);
    }
    s.reduced.resize(full / W);
  };
  size_slot(root_, units_[0].shard * W);
  for (Slot& s : slots_) size_slot(s, max_slot);

  // The table: frozen tensors point where FrozenWeights keeps them, unit tensors into their slot
  // when gathered.
  table_.param.assign(reg.layout.size(), nullptr);
  table_.grad.assign(reg.layout.size(), nullptr);
  frozen_.Bind(&table_);
}

FsdpModel::~FsdpModel() {
  for (Slot* s : {&root_, &slots_[0], &slots_[1]}) {
    if (s->gather.valid()) s->gather.wait();
    if (s->reduce.valid()) s->reduce.wait();
  }
}

void FsdpModel::Load() {
  const int64_t r = pg_.rank();
  for (const Unit& u : units_) {
    // This rank's part of the unit's flat vector: [r * shard, (r + 1) * shard).
    const int64_t lo = r * u.shard, hi = lo + u.shard;
    float* dst = master_.data() + u.shard_offset;
    std::fill(dst, dst + u.shard, 0.0f);  // alignment gaps and the tail stay zero
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t begin = u.flat_offset[k], end = begin + reg_.layout.entry(u.entries[k]).numel;
      const int64_t a = std::max(begin, lo), b = std::min(end, hi);
      if (a < b) weights_.Read(u.entries[k], a - begin, b - a, dst + (a - lo));
      weights_.Release(u.entries[k]);
    }
  }
  MasterChanged();
}

void FsdpModel::KeepReference() {
  ST_CHECK(!using_reference_);
  reference_ = master_;
}

void FsdpModel::UseReference(bool on) {
  ST_CHECK(!reference_.empty());
  if (on == using_reference_) return;
  // A prefetched gather may still read the shard being swapped out.
  for (Slot* s : {&root_, &slots_[0], &slots_[1]}) Wait(s->gather);
  master_.swap(reference_);
  using_reference_ = on;
  MasterChanged();
}

Status FsdpModel::GatherFull(float* full) {
  std::vector<float> gathered;
  for (const Unit& u : units_) {
    if (u.total == 0) continue;
    gathered.resize(u.shard * pg_.size());
    ST_RETURN_IF_ERROR(pg_.AllGather(master_.data() + u.shard_offset, gathered.data(), u.shard,
                                     DType::kF32, options_.collective));
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const ArenaEntry& e = reg_.layout.entry(u.entries[k]);
      std::memcpy(full + e.offset, gathered.data() + u.flat_offset[k], e.numel * sizeof(float));
    }
  }
  for (int i = 0; i < reg_.layout.size(); ++i)
    if (!trainable_[i]) weights_.ReadAll(i, full + reg_.layout.entry(i).offset);
  return Status::Ok();
}

Status FsdpModel::GatherTensor(int entry, float* out) {
  ST_CHECK(trainable_[entry]) << "GatherTensor of a frozen entry";
  const Unit& u = units_[unit_of_entry_[entry]];
  const int64_t W = pg_.size(), r = pg_.rank();
  const int64_t begin = u.flat_offset[index_in_unit_[entry]];
  const int64_t numel = reg_.layout.entry(entry).numel, end = begin + numel;
  if (W == 1) {  // one worker holds every tensor whole: no collective, no staging buffers
    std::memcpy(out, master_.data() + u.shard_offset + begin,
                static_cast<size_t>(numel) * sizeof(float));
    return Status::Ok();
  }
  // Rank q holds [max(begin, q * shard), min(end, (q + 1) * shard)) of the tensor; every rank
  // sends `piece` floats (its part, zero-padded) and places the others' parts.
  auto part = [&](int64_t q) {
    return std::make_pair(std::max(begin, q * u.shard), std::min(end, (q + 1) * u.shard));
  };
  int64_t piece = 0;
  for (int64_t q = 0; q < W; ++q) piece = std::max(piece, part(q).second - part(q).first);
  // Mapped buffers (AlignedBuffer), given back when the tensor is written: a checkpoint leaves no
  // heap behind.
  AlignedBuffer send(piece, "a tensor's piece for the checkpoint writer"),
      recv(piece * W, "a tensor gathered for the checkpoint writer");
  {
    const auto [a, b] = part(r);
    if (a < b)
      std::memcpy(send.data(), master_.data() + u.shard_offset + (a - r * u.shard),
                  static_cast<size_t>(b - a) * sizeof(float));
  }
  ST_RETURN_IF_ERROR(
      pg_.AllGather(send.data(), recv.data(), piece, DType::kF32, options_.collective));
  for (int64_t q = 0; q < W; ++q) {
    const auto [a, b] = part(q);
    if (a < b)
      std::memcpy(out + (a - begin), recv.data() + q * piece,
                  static_cast<size_t>(b - a) * sizeof(float));
  }
  return Status::Ok();
}

Status FsdpModel::Gather(int unit, Slot& slot) {
  const Unit& u = units_[unit];
  const float* shard = master_.data() + u.shard_offset;
  if (options_.param_dtype == DType::kBF16) {
    // Parameters travel and compute as bf16 values (MixedPrecisionPolicy(param_dtype=bf16)).
    ConvertFromF32(DType::kBF16, shard, slot.send_bf16.data(), u.shard);
    ST_RETURN_IF_ERROR(pg_.AllGather(slot.send_bf16.data(), slot.recv_bf16.data(), u.shard,
                                     DType::kBF16, options_.collective));
    ConvertToF32(DType::kBF16, slot.recv_bf16.data(), slot.params.data(), u.shard * pg_.size());
  } else {
    ST_RETURN_IF_ERROR(
        pg_.AllGather(shard, slot.params.data(), u.shard, DType::kF32, options_.collective));
  }
  return Status::Ok();
}

void FsdpModel::Record(const Status& s) {
  if (!s.ok() && status_.ok()) status_ = s;
}

Status FsdpModel::Get(std::future<Status> f) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = f.get();
  comm_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

void FsdpModel::Wait(std::future<Status>& f) {
  if (f.valid()) Record(Get(std::move(f)));
}

void FsdpModel::SubmitGather(int unit) {
  if (unit < 0 || unit >= num_units() || units_[unit].total == 0) return;
  Slot& slot = SlotOf(unit);
  if (slot.unit == unit) return;  // already there or on its way
  Wait(slot.gather);
  slot.unit = unit;
  if (!status_.ok()) return;  // a collective failed this step: issue no more
  slot.gather = comm_.Submit([this, unit, &slot] { return Gather(unit, slot); });
}

void FsdpModel::AwaitParams(int unit) {
  const Unit& u = units_[unit];
  if (u.total == 0) return;
  Slot& slot = SlotOf(unit);
  SubmitGather(unit);
  Wait(slot.gather);
  for (size_t k = 0; k < u.entries.size(); ++k)
    table_.param[u.entries[k]] = slot.params.data() + u.flat_offset[k];
}

void FsdpModel::BeforeForward(int64_t layer, Part part) {
  frozen_.BeforeForward(layer, part);
  if (!Handles(part)) return;
  const int unit = UnitOfLayer(layer);
  AwaitParams(unit);
  if (options_.prefetch) SubmitGather(unit + 1);
}

void FsdpModel::BeforeBackward(int64_t layer, Part part) {
  frozen_.BeforeBackward(layer, part);
  if (!Handles(part)) return;
  const int unit = UnitOfLayer(layer);
  const Unit& u = units_[unit];
  if (u.total == 0) return;
  AwaitParams(unit);
  Slot& slot = SlotOf(unit);
  Wait(slot.reduce);  // the slot's previous reduce-scatter must be done with its grads
  std::memset(slot.grads.data(), 0, static_cast<size_t>(u.shard * pg_.size()) * sizeof(float));
  for (size_t k = 0; k < u.entries.size(); ++k)
    table_.grad[u.entries[k]] = slot.grads.data() + u.flat_offset[k];
  if (options_.prefetch && unit - 1 >= 1) SubmitGather(unit - 1);
}

void FsdpModel::AfterBackward(int64_t layer, Part part) {
  if (!Handles(part)) return;
  const int unit = UnitOfLayer(layer);
  const Unit& u = units_[unit];
  if (u.total == 0) return;
  Slot& slot = SlotOf(unit);
  if (!status_.ok()) return;
  Accumulate(unit, slot.grads.data(), u.shard * pg_.size());
  if (!sync_) return;  // kept for the window's last micro-batch
  slot.reduce = comm_.Submit([this, &u, &slot] {
    ST_RETURN_IF_ERROR(pg_.ReduceScatter(slot.grads.data(), slot.reduced.data(), u.shard,
                                         DType::kF32, comm::ReduceOp::kAvg, options_.collective));
    float* g = grad_.data() + u.shard_offset;
    for (int64_t j = 0; j < u.shard; ++j) g[j] += slot.reduced[j];
    return Status::Ok();
  });
}

void FsdpModel::Accumulate(int unit, float* grads, int64_t n) {
  if (accum_.empty()) accum_.resize(static_cast<size_t>(num_units()));
  std::vector<float>& a = accum_[static_cast<size_t>(unit)];
  if (!sync_) {
    if (a.empty()) a.assign(static_cast<size_t>(n), 0.0f);
    for (int64_t j = 0; j < n; ++j) a[j] += grads[j];
  } else if (!a.empty()) {
    for (int64_t j = 0; j < n; ++j) grads[j] += a[j];
    std::fill(a.begin(), a.end(), 0.0f);
  }
}

size_t FsdpModel::AccumulationBytes() const {
  size_t n = 0;
  for (const auto& a : accum_) n += a.size() * sizeof(float);
  return n;
}

StatusOr<ForwardResult> FsdpModel::ForwardBackward(Gemma4Engine& engine, const Batch& batch) {
  return ForwardBackward(engine, batch, Micro{});
}

StatusOr<ForwardResult> FsdpModel::ForwardBackward(Gemma4Engine& engine, const Batch& batch,
                                                   const Micro& micro) {
  status_ = Status::Ok();
  sync_ = micro.sync;
  // The global count of valid targets (labels shifted by one), for the loss mean over all ranks.
  int64_t local = 0;
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 1; t < batch.T; ++t) local += batch.labels[b * batch.T + t] != -100;
  const bool weighted = static_cast<bool>(micro.after_forward);
  float count = static_cast<float>(micro.global_targets >= 0 ? micro.global_targets : local);
  std::future<Status> counted;
  if (micro.global_targets < 0 && !weighted)
    counted = comm_.Submit([this, &count] {
      return pg_.AllReduce(&count, 1, DType::kF32, comm::ReduceOp::kSum, options_.collective);
    });
  // Root parameters for the whole step, then the first unit on its way.
  const Unit& root = units_[0];
  SubmitGather(0);
  if (counted.valid()) Wait(counted);
  AwaitParams(0);
  if (options_.prefetch) SubmitGather(1);
  if (!status_.ok()) return status_;

  ForwardResult r = engine.Forward(table_, batch, this);
  if (!status_.ok()) return status_;
  if (weighted) {
    Status s = micro.after_forward();
    if (!s.ok()) {
      for (Slot& sl : slots_) Wait(sl.gather);
      return s;
    }
  }
  const int64_t global = static_cast<int64_t>(std::llround(count));
  // Reduce-scatter averages over ranks, so scale by W / global: the sum over ranks of the averaged
  // gradients is then (1 / global) x the gradient of the summed loss. Weighted: by W alone.
  const float grad_scale = weighted ? static_cast<float>(pg_.size())
                           : global > 0
                               ? static_cast<float>(pg_.size()) / static_cast<float>(global)
                               : 0.0f;

  std::memset(root_.grads.data(), 0, static_cast<size_t>(root.shard * pg_.size()) * sizeof(float));
  for (size_t k = 0; k < root.entries.size(); ++k)
    table_.grad[root.entries[k]] = root_.grads.data() + root.flat_offset[k];
  if (options_.prefetch) SubmitGather(num_units() - 1);
  engine.Backward(table_, batch, grad_scale, this);
  for (Slot& s : slots_) Wait(s.reduce);
  if (root.total > 0) Accumulate(0, root_.grads.data(), root.shard * pg_.size());
  if (status_.ok() && root.total > 0 && sync_) {
    Status s = Get(comm_.Submit([this, &root] {
      ST_RETURN_IF_ERROR(pg_.ReduceScatter(root_.grads.data(), root_.reduced.data(), root.shard,
                                           DType::kF32, comm::ReduceOp::kAvg, options_.collective));
      float* g = grad_.data() + root.shard_offset;
      for (int64_t j = 0; j < root.shard; ++j) g[j] += root_.reduced[j];
      return Status::Ok();
    }));
    Record(s);
  }
  for (Slot& s : slots_) Wait(s.gather);
  // The loss of the whole global batch: every rank's summed token losses.
  float loss_sum = static_cast<float>(r.loss_sum);
  if (status_.ok())
    Record(Get(comm_.Submit([this, &loss_sum] {
      return pg_.AllReduce(&loss_sum, 1, DType::kF32, comm::ReduceOp::kSum, options_.collective);
    })));
  if (!status_.ok()) return status_;
  r.loss_sum = loss_sum;
  r.num_valid = global;
  return r;
}

StatusOr<ForwardResult> FsdpModel::Forward(Gemma4Engine& engine, const Batch& batch) {
  status_ = Status::Ok();
  int64_t local = 0;
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 1; t < batch.T; ++t) local += batch.labels[b * batch.T + t] != -100;
  float sums[2] = {0, static_cast<float>(local)};
  SubmitGather(0);
  AwaitParams(0);
  if (options_.prefetch) SubmitGather(1);
  if (!status_.ok()) return status_;
  ForwardResult r = engine.Forward(table_, batch, this);
  for (Slot& s : slots_) Wait(s.gather);
  if (!status_.ok()) return status_;
  sums[0] = static_cast<float>(r.loss_sum);
  Record(Get(comm_.Submit([this, &sums] {
    return pg_.AllReduce(sums, 2, DType::kF32, comm::ReduceOp::kSum, options_.collective);
  })));
  if (!status_.ok()) return status_;
  r.loss_sum = sums[0];
  r.num_valid = static_cast<int64_t>(std::llround(sums[1]));
  return r;
}

void FsdpModel::ZeroGrad() {
  std::fill(grad_.begin(), grad_.end(), 0.0f);
}

StatusOr<double> FsdpModel::ClipGradNorm(double max_norm, double extra_sq) {
  // Padding elements of the shards are zero and stay zero, so they do not change the norm.
  float sq = static_cast<float>(SumOfSquares(grad_.data(), shard_total_) + extra_sq);
  double total = sq;
  if (pg_.size() > 1) {
    ST_RETURN_IF_ERROR(
        pg_.AllReduce(&sq, 1, DType::kF32, comm::ReduceOp::kSum, options_.collective));
    total = sq;
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const float coef = ClipCoefficient(norm, max_norm);
    if (coef < 1.0f)
      for (float& g : grad_) g *= coef;
  }
  return norm;
}

void FsdpModel::OptimizerStep(const AdamWConfig& cfg, int64_t step) {
  AdamWStep(cfg, step, master_.data(), grad_.data(), exp_avg_.data(), exp_avg_sq_.data(),
            shard_total_);
  root_.unit = slots_[0].unit = slots_[1].unit = -1;  // gathered copies are now stale
}

}  // namespace st
