// Fully sharded data parallelism (FSDP2-style) for the Gemma 4 engine, one object per rank.
//
// Units: as the seed wraps them, each decoder layer's MLP is a unit and everything else trainable
// is the root unit (FsdpUnitMode::kMlp), or one unit per decoder layer (kLayer). Each unit's
// trainable tensors are flattened (16-float aligned) and split evenly over the ranks: a rank owns
// one contiguous shard per unit of fp32 master weights, gradients and AdamW moments, so the
// sharded state is 1/N of the model. A rank reads only its shard's ranges of each tensor from the
// WeightSource (the memory-mapped checkpoint or the preset's generator), never the whole model.
// Frozen tensors (the seed freezes embed_tokens_per_layer) and buffers (layer_scalar) get no
// gradient or optimizer state and no per-rank fp32 copy of the whole set: FrozenWeights serves them
// from the source (lookup rows, one layer at a time).
//
// A step: the root unit is all-gathered (param dtype, bf16 by default, as MixedPrecisionPolicy's
// param_dtype) before the forward; every other unit is gathered just before the engine uses it
// into one of two slots while the comm thread already gathers the next one (prefetch); the backward
// gathers again (unless the unit is still in its slot) and reduce-scatters each unit's fp32
// gradients (average over ranks, as reduce_dtype=float32) on the comm thread while the backward
// goes on; the root's gradients are reduce-scattered at the end.
//
// Collective-order contract: every rank issues the same collectives in the same order, all of them
// on the comm thread in submission order: count all-reduce, root gather, then per unit gathers and
// reduce-scatters in layer order (forward) and reverse layer order (backward), root
// reduce-scatter, loss all-reduce; ClipGradNorm adds one all-reduce, GatherFull one all-gather
// per unit, GatherTensor one all-gather (all on the caller's thread, between steps).
// The engine's unit hooks fire in the same order on every rank because every rank runs the same
// model on the same shapes.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "model/frozen_weights.h"
#include "model/gemma4.h"
#include "model/weights.h"
#include "optim/adamw.h"

namespace st {

enum class FsdpUnitMode { kMlp, kLayer };

struct FsdpOptions {
  FsdpUnitMode units = FsdpUnitMode::kMlp;
  DType param_dtype = DType::kBF16;  // the all-gather dtype (kF32 or kBF16)
  bool prefetch = true;
  comm::CollectiveOptions collective;
};

class FsdpModel : public ParamHooks {
 public:
  // trainable: per registry entry (false = frozen or buffer: served by FrozenWeights, no
  // gradient). `weights` (the initial values) must outlive the model; call Load to read the shards.
  FsdpModel(const Gemma4Config& cfg, const ParamRegistry& reg, comm::ProcessGroup& pg,
            std::vector<bool> trainable, const WeightSource& weights, const FsdpOptions& options);
  ~FsdpModel() override;
  FsdpModel(const FsdpModel&) = delete;
  FsdpModel& operator=(const FsdpModel&) = delete;

  // This rank's shards of the trainable tensors, read from the weights range by range (no
  // collective: every rank reads its own).
  void Load();
  // The full fp32 parameters (registry layout) on every rank: for tests and small models.
  Status GatherFull(float* full);
  // Every rank: the fp32 master values of one trainable entry ([numel] into out), assembled from
  // every rank's piece (one all-gather); what a streaming save writes tensor by tensor.
  Status GatherTensor(int entry, float* out);
  bool trainable(int entry) const { return trainable_[static_cast<size_t>(entry)]; }
  const WeightSource& weights() const { return weights_; }

  // Forward and backward of this rank's micro-batch. The loss is the mean over the valid targets
  // of all ranks' batches (their count is all-reduced first), so N ranks with a global batch give
  // the gradients of one rank with the whole batch. Gradients are added to the gradient shards.
  // Returns the global batch's loss sum and valid count (Loss() is the global mean).
  StatusOr<ForwardResult> ForwardBackward(Gemma4Engine& engine, const Batch& batch);
  // One micro-batch of an optimizer step that accumulates several (--gradient-accumulation-steps,
  // transformers' semantics): the loss mean is over `global_targets`, every rank's targets of the
  // whole window, and only the last micro-batch (sync) reduce-scatters; the others add each
  // unit's unsharded gradient into a buffer kept until then (FSDP2's no-sync: parameters'
  // worth of fp32 per rank while accumulating).
  struct Micro {
    int64_t global_targets = -1;  // < 0: this micro-batch's own (counted with an all-reduce)
    bool sync = true;
    // An objective other than the mean token loss (train/objectives/): runs between the forward
    // and the backward (it reads the engine's TargetLogProbs and fills the buffer the batch's
    // loss_weights point at); the backward then differentiates sum(weight x token loss) as the
    // whole loss (global_targets is not used: the weights hold the objective's normalisation).
    // No collective may run inside it.
    std::function<Status()> after_forward;
  };
  StatusOr<ForwardResult> ForwardBackward(Gemma4Engine& engine, const Batch& batch,
                                          const Micro& micro);
  // Bytes the accumulation buffers take (0 until a non-sync micro-batch ran).
  size_t AccumulationBytes() const;
  // The forward alone (evaluation): the same gathers, no gradient; loss_sum and num_valid are the
  // whole global batch's (all-reduced). Every rank calls it with its own batch.
  StatusOr<ForwardResult> Forward(Gemma4Engine& engine, const Batch& batch);

  void ZeroGrad();
  // Global gradient norm over all shards (all-reduced) and `extra_sq`, a sum of squares of
  // gradients kept outside the shards (a replicated tensor's: pass it on one rank only); scales
  // the shards' gradients by min(1, max_norm / (norm + 1e-6)) when max_norm > 0 (the caller
  // scales its own). Returns the norm before clipping.
  StatusOr<double> ClipGradNorm(double max_norm, double extra_sq = 0);
  void OptimizerStep(const AdamWConfig& cfg, int64_t step);
  // Call after writing master() directly (a resumed checkpoint): gathered copies are stale.
  void MasterChanged() { root_.unit = slots_[0].unit = slots_[1].unit = -1; }
  // A frozen reference (GRPO's KL term when the trained tensors themselves move): KeepReference
  // copies this rank's master shard as it is now (call it after Load, before a resume overwrites
  // the master); UseReference(true) makes the forwards that follow run on that copy and
  // UseReference(false) brings the trained values back. Swaps two buffers, nothing is copied;
  // no step (backward, optimizer) may run while the reference is in use.
  void KeepReference();
  void UseReference(bool on);

  // Sharded state, for checkpoints: master weights, gradients, AdamW moments ([shard_size()]).
  int64_t shard_size() const { return shard_total_; }
  float* master() { return master_.data(); }
  float* grads() { return grad_.data(); }
  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  // Bytes of the sharded state (master + grads + 2 moments) and of the fp32 frozen tensors this
  // rank holds (FrozenWeights: root copies and two layer slots).
  size_t ShardedStateBytes() const { return static_cast<size_t>(shard_total_) * 4 * sizeof(float); }
  size_t FrozenBytes() const { return frozen_.ResidentBytes(); }
  int num_units() const { return static_cast<int>(units_.size()); }
  // Seconds the caller's thread has spent blocked on the comm thread (gathers not yet arrived,
  // reduce-scatters not yet done, the step's count and loss all-reduces) since construction:
  // the communication that compute did not hide. Observability only; a caller takes differences.
  double CommWaitSeconds() const { return comm_wait_s_; }

  // ParamHooks: called by the engine.
  void BeforeForward(int64_t layer, Part part) override;
  void BeforeBackward(int64_t layer, Part part) override;
  void AfterBackward(int64_t layer, Part part) override;

 private:
  struct Unit {
    std::vector<int> entries;          // registry indices
    std::vector<int64_t> flat_offset;  // offset of each entry in the unit's flat vector
    int64_t total = 0;                 // flat length (aligned), before padding to the world size
    int64_t shard = 0;                 // elements per rank
    int64_t shard_offset = 0;          // where this rank's shard starts in master_/grad_/...
  };
  // Where a unit's gathered parameters and gradients live: root has its own buffers, layer units
  // share two slots (layer l uses slot l % 2).
  struct Slot {
    AlignedBuffer params, grads;  // [world * shard]
    std::vector<uint16_t> send_bf16, recv_bf16;
    std::vector<float> reduced;  // [shard] reduce-scatter output
    int unit = -1;               // unit whose parameters are in `params`
    std::future<Status> gather, reduce;
  };

  bool Handles(Part part) const {
    return (options_.units == FsdpUnitMode::kMlp) == (part == Part::kMlp);
  }
  int UnitOfLayer(int64_t layer) const { return static_cast<int>(layer) + 1; }
  Slot& SlotOf(int unit) { return unit == 0 ? root_ : slots_[(unit - 1) % 2]; }
  // Submits the all-gather of `unit` into its slot (no-op if already there or pending).
  void SubmitGather(int unit);
  // Waits for `unit`'s parameters and points the table at them.
  void AwaitParams(int unit);
  Status Gather(int unit, Slot& slot);
  void Record(const Status& s);
  void Wait(std::future<Status>& f);
  // Blocks on f (timed into comm_wait_s_) and returns its status.
  Status Get(std::future<Status> f);

  const Gemma4Config& cfg_;
  const ParamRegistry& reg_;
  comm::ProcessGroup& pg_;
  std::vector<bool> trainable_;
  FsdpOptions options_;
  std::vector<Unit> units_;  // [0] root, [l + 1] layer l's MLP or layer
  int64_t shard_total_ = 0;
  std::vector<float> master_, grad_, exp_avg_, exp_avg_sq_;  // [shard_total_]
  std::vector<float> reference_;  // [shard_total_] after KeepReference, else empty
  bool using_reference_ = false;  // master_ holds the reference (the trained values in reference_)
  const WeightSource& weights_;
  FrozenWeights frozen_;                            // frozen tensors and buffers
  std::vector<int> unit_of_entry_, index_in_unit_;  // [entry]: for GatherTensor
  Slot root_;
  Slot slots_[2];
  // Gradient accumulation: per unit its unsharded gradient summed over the window's micro-batches
  // so far ([world * shard], allocated on first use); sync_ is the current micro-batch's.
  std::vector<std::vector<float>> accum_;
  bool sync_ = true;
  // Adds the slot's gradient into the unit's buffer (not sync), or the buffer into the slot's
  // gradient and clears it (sync, before the reduce-scatter).
  void Accumulate(int unit, float* grads, int64_t n);
  ParamTable table_;
  comm::CommThread comm_;
  Status status_;  // first collective failure of the current step
  double comm_wait_s_ = 0;
};

}  // namespace st
