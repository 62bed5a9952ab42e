// FSDP parity: N ranks (threads, Gloo over an in-memory store) with a global batch split across
// them must produce the losses and parameters of one process running the whole batch, for both
// unit layouts, world sizes 1-4, with a frozen tensor and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "comm/group.h"
#include "comm/store/store.h"
#include "kernels/cpu/gemm.h"
#include "model/lora.h"
#include "parallel/fsdp.h"
#include "test_util.h"

namespace st {
namespace {

Gemma4Config Config() {
  Gemma4Config c;
  c.vocab_size = c.vocab_size_per_layer_input = 64;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 4;
  c.layer_types = {LayerType::kSliding, LayerType::kFull, LayerType::kSliding, LayerType::kFull};
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.global_head_dim = 16;
  c.hidden_size_per_layer_input = 4;
  c.num_kv_shared_layers = 2;
  c.use_double_wide_mlp = true;
  c.sliding_window = 4;
  c.final_logit_softcapping = 30.0;
  c.initializer_range = 0.2;
  EXPECT_TRUE(c.Validate().ok());
  return c;
}

constexpr int64_t kB = 12, kT = 9, kSteps = 4;  // batches 0, 1, 0, 1

struct Data {
  std::vector<int32_t> ids, labels;
  std::vector<uint8_t> mask;
};

Data MakeData(const Gemma4Config& c, int step) {
  Data d;
  Rng rng(100 + step);
  d.ids.resize(kB * kT);
  d.mask.assign(kB * kT, 1);
  for (auto& id : d.ids) id = 1 + static_cast<int32_t>(rng.Below(c.vocab_size - 1));
  for (int64_t b = 0; b < kB; ++b)  // right padding of a varying length
    for (int64_t t = kT - static_cast<int64_t>(b % 4); t < kT; ++t) {
      d.mask[b * kT + t] = 0;
      d.ids[b * kT + t] = 0;
    }
  d.labels = d.ids;
  for (int64_t i = 0; i < kB * kT; ++i)
    if (!d.mask[i]) d.labels[i] = -100;
  return d;
}

std::vector<bool> Trainable(const ParamRegistry& reg) {
  std::vector<bool> t(reg.layout.size());
  if (reg.HasAdapters()) {  // LoRA: the adapters only
    for (int i = 0; i < reg.layout.size(); ++i) t[i] = i >= reg.base_entries;
    return t;
  }
  for (int i = 0; i < reg.layout.size(); ++i) t[i] = !reg.is_buffer[i];
  t[reg.embed_tokens_per_layer] = false;  // frozen, as the seed does
  return t;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<float> params;
};

// eps 1e-3: with torch's 1e-8, elements whose gradient is rounding noise get full-size updates
// (m / sqrt(v) ~ +-1), and the order in which ranks sum gradients decides their sign.
const AdamWConfig kAdam{1e-2, 0.9, 0.999, 1e-3, 0.01};
constexpr double kMaxNorm = 1.0;

// One process, whole batch, plain arenas.
RunResult Reference(const Gemma4Config& c, const std::vector<float>& init, int steps = kSteps,
                    const LoraSpec& lora = {}, Precision precision = Precision::kFp32) {
  EngineOptions options;
  options.lora = lora;
  options.precision = precision;
  Gemma4Engine eng(c, kB, kT, options);
  const ParamRegistry& reg = eng.registry();
  const std::vector<bool> trainable = Trainable(reg);
  RunResult out;
  out.params = init;
  // AdamW state and gradients in one arena (three consecutive parts): GCC 12 at -O3 misreports
  // the destruction of three separate vectors here (-Wfree-nonheap-object).
  std::vector<float> state(3 * init.size(), 0.f);
  float* const grads_data = state.data();
  float* const m_data = state.data() + init.size();
  float* const v_data = state.data() + 2 * init.size();
  for (int s = 0; s < steps; ++s) {
    Data d = MakeData(c, s % 2);
    const Batch b{d.ids.data(), d.mask.data(), d.labels.data(), kB, kT};
    std::fill(grads_data, grads_data + init.size(), 0.f);
    ForwardResult r = eng.Forward(out.params.data(), b);
    eng.Backward(out.params.data(), grads_data, b, 1.0f / r.num_valid, &trainable);
    out.losses.push_back(r.Loss());
    double sq = 0;
    for (int i = 0; i < reg.layout.size(); ++i)
      if (trainable[i])
        sq += SumOfSquares(grads_data + reg.layout.entry(i).offset, reg.layout.entry(i).numel);
    const float coef = ClipCoefficient(std::sqrt(sq), kMaxNorm);
    for (int i = 0; i < reg.layout.size(); ++i) {
      if (!trainable[i]) continue;
      const ArenaEntry& e = reg.layout.entry(i);
      for (int64_t j = 0; j < e.numel; ++j) grads_data[e.offset + j] *= coef;
      AdamWStep(kAdam, s + 1, out.params.data() + e.offset, grads_data + e.offset,
                m_data + e.offset, v_data + e.offset, e.numel);
    }
  }
  return out;
}

RunResult Sharded(const Gemma4Config& c, const std::vector<float>& init, int world,
                  FsdpUnitMode mode, DType param_dtype, int steps = kSteps,
                  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone,
                  const LoraSpec& lora = {}, int micro = 1, bool sync_each_batch = false,
                  std::vector<size_t>* accumulation_bytes = nullptr,
                  Precision precision = Precision::kFp32) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<RunResult> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::GroupOptions go;
      auto pg = comm::CreateProcessGroup(store, r, world, go);
      if (!pg.ok()) {
        errors[r] = pg.status().ToString();
        return;
      }
      const int64_t b_local = kB / world, b_micro = b_local / micro;
      EngineOptions engine;
      engine.checkpointing = checkpointing;
      engine.lora = lora;
      engine.precision = precision;
      Gemma4Engine eng(c, b_micro, kT, engine);
      FsdpOptions o;
      o.units = mode;
      o.param_dtype = param_dtype;
      const ArenaWeights weights(eng.registry(), init.data());
      FsdpModel fsdp(c, eng.registry(), **pg, Trainable(eng.registry()), weights, o);
      fsdp.Load();
      for (int s = 0; s < steps; ++s) {
        Data d = MakeData(c, s % 2);
        const int64_t off = r * b_local * kT;
        const Batch b{d.ids.data() + off, d.mask.data() + off, d.labels.data() + off, b_local, kT};
        fsdp.ZeroGrad();
        StatusOr<ForwardResult> res = ForwardResult{};
        if (micro == 1) {
          res = fsdp.ForwardBackward(eng, b);
        } else {
          // The window's micro-batches: this rank's rows in `micro` pieces, the loss mean over
          // the global batch's targets (every rank sees the whole batch here, so counts it).
          int64_t targets = 0;
          for (int64_t i = 0; i < kB; ++i)
            for (int64_t t = 1; t < kT; ++t) targets += d.labels[i * kT + t] != -100;
          for (int k = 0; k < micro && res.ok(); ++k) {
            const int64_t o = off + k * b_micro * kT;
            const Batch bk{d.ids.data() + o, d.mask.data() + o, d.labels.data() + o, b_micro, kT};
            FsdpModel::Micro m;
            m.global_targets = targets;
            m.sync = sync_each_batch || k + 1 == micro;
            const double sum = res->loss_sum;
            res = fsdp.ForwardBackward(eng, bk, m);
            if (res.ok()) res->loss_sum += sum;
          }
        }
        if (!res.ok()) {
          errors[r] = res.status().ToString();
          return;
        }
        results[r].losses.push_back(res->Loss());
        if (accumulation_bytes) (*accumulation_bytes)[r] = fsdp.AccumulationBytes();
        auto norm = fsdp.ClipGradNorm(kMaxNorm);
        if (!norm.ok()) {
          errors[r] = norm.status().ToString();
          return;
        }
        fsdp.OptimizerStep(kAdam, s + 1);
      }
      results[r].params.resize(init.size());
      Status g = fsdp.GatherFull(results[r].params.data());
      if (!g.ok()) errors[r] = g.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].params, results[0].params) << "rank " << r;
  return results[0];
}

void ExpectClose(const RunResult& a, const RunResult& ref, const ParamRegistry& reg, double tol) {
  ASSERT_EQ(a.losses.size(), ref.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(a.losses[s], ref.losses[s], 2e-5 * ref.losses[s]) << "step " << s;
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    EXPECT_LT(test::RelError(a.params.data() + e.offset, ref.params.data() + e.offset, e.numel),
              tol)
        << e.name;
  }
}

struct Case {
  int world;
  FsdpUnitMode mode;
};

class FsdpParity : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpParity, MatchesOneProcessWithTheWholeBatch) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 5);
  const RunResult ref = Reference(c, init);
  const RunResult got = Sharded(c, init, GetParam().world, GetParam().mode, DType::kF32);
  // The losses fall: the run trains (steps 2 and 3 see batches 0 and 1 again).
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  EXPECT_LT(ref.losses[3], ref.losses[1]);
  ExpectClose(got, ref, reg, 1e-4);
}

// LoRA under FSDP: the adapters are the only sharded tensors (an MLP's adapters in the MLP's
// unit), the base is served by FrozenWeights; N ranks match one process with the whole batch.
TEST(FsdpLora, NRanksMatchOneProcessWithTheWholeBatch) {
  const Gemma4Config c = Config();
  const ParamRegistry base = BuildParamRegistry(c);
  LoraSpec lora;
  lora.targets = LinearEntries(base);  // all-linear
  lora.rank = 3;
  lora.scaling = 2;
  const ParamRegistry reg = BuildParamRegistry(c, lora);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 7);  // A and B random: every adapter gradient is non-zero
  const RunResult ref = Reference(c, init, kSteps, lora);
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  for (int world : {1, 2, 4})
    for (FsdpUnitMode mode : {FsdpUnitMode::kMlp, FsdpUnitMode::kLayer}) {
      SCOPED_TRACE(StrCat(world, " ranks, ", mode == FsdpUnitMode::kMlp ? "mlp" : "layer"));
      const RunResult got =
          Sharded(c, init, world, mode, DType::kF32, kSteps, ActivationCheckpointing::kNone, lora);
      // Adapters are small and AdamW normalises their updates: the reduction order's rounding
      // shows at 2.2e-4 of their scale after the steps (losses within 2e-5 as for full training).
      ExpectClose(got, ref, reg, 5e-4);
    }
}

// Gradient accumulation: each rank's rows in 3 micro-batches per step match one process with the
// whole batch, whether the micro-batches keep unsharded gradients until the last one (FSDP2's
// no-sync: a buffer per unit) or each reduce-scatters into the shards (--sync-each-batch: none).
TEST(FsdpAccumulation, MicroBatchesMatchTheWholeBatchWithAndWithoutSync) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 5);
  const RunResult ref = Reference(c, init);
  for (FsdpUnitMode mode : {FsdpUnitMode::kMlp, FsdpUnitMode::kLayer})
    for (bool sync : {false, true}) {
      SCOPED_TRACE(StrCat(mode == FsdpUnitMode::kMlp ? "mlp" : "layer",
                          sync ? ", sync each batch" : ", no-sync"));
      std::vector<size_t> buffers(2);
      const RunResult got = Sharded(c, init, 2, mode, DType::kF32, kSteps,
                                    ActivationCheckpointing::kNone, {}, 3, sync, &buffers);
      ExpectClose(got, ref, reg, 1e-4);
      size_t trainable = 0;  // elements
      const std::vector<bool> t = Trainable(reg);
      for (int i = 0; i < reg.layout.size(); ++i)
        if (t[i]) trainable += static_cast<size_t>(reg.layout.entry(i).numel);
      for (size_t bytes : buffers) {
        if (sync) {
          EXPECT_EQ(bytes, 0u);
        } else {  // every trainable element's fp32 gradient, unsharded (plus alignment)
          EXPECT_GE(bytes, trainable * sizeof(float));
          EXPECT_LT(bytes,
                    (trainable + 16 * static_cast<size_t>(reg.layout.size())) * sizeof(float));
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndUnits, FsdpParity,
                         ::testing::Values(Case{1, FsdpUnitMode::kMlp}, Case{2, FsdpUnitMode::kMlp},
                                           Case{3, FsdpUnitMode::kMlp}, Case{4, FsdpUnitMode::kMlp},
                                           Case{2, FsdpUnitMode::kLayer},
                                           Case{3, FsdpUnitMode::kLayer},
                                           Case{4, FsdpUnitMode::kLayer}),
                         [](const auto& info) {
                           return std::to_string(info.param.world) + "ranks_" +
                                  (info.param.mode == FsdpUnitMode::kMlp ? "mlp" : "layer");
                         });

// bf16 parameter transport (the seed's MixedPrecisionPolicy): N ranks vs 1 rank, same policy, one
// step (after it, master weights that differ in the last fp32 bit may round to different bf16
// values, and the runs legitimately drift apart at bf16 precision).
// Activation checkpointing under FSDP: the backward gathers each unit again for the recompute
// (the MLP unit before the layer's forward reruns), and 20 steps at 1 and 2 ranks, for both unit
// layouts, give the losses and parameters of keeping every activation, bit for bit.
TEST(FsdpCheckpointing, TwentyStepsEqualBitForBit) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 9);
  for (int world : {1, 2})
    for (FsdpUnitMode mode : {FsdpUnitMode::kMlp, FsdpUnitMode::kLayer}) {
      const RunResult none = Sharded(c, init, world, mode, DType::kBF16, 20);
      for (ActivationCheckpointing ckpt :
           {ActivationCheckpointing::kMlp, ActivationCheckpointing::kLayer}) {
        const RunResult got = Sharded(c, init, world, mode, DType::kBF16, 20, ckpt);
        EXPECT_EQ(got.losses, none.losses)
            << world << " ranks, " << ActivationCheckpointingName(ckpt);
        EXPECT_EQ(got.params, none.params)
            << world << " ranks, " << ActivationCheckpointingName(ckpt);
      }
      EXPECT_LT(none.losses[18], none.losses[0]);
    }
}

TEST(FsdpBf16, NRanksMatchOneRank) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 6);
  const RunResult one = Sharded(c, init, 1, FsdpUnitMode::kMlp, DType::kBF16, 1);
  const RunResult four = Sharded(c, init, 4, FsdpUnitMode::kMlp, DType::kBF16, 1);
  ExpectClose(four, one, reg, 1e-4);
  // And bf16 transport really differs from fp32 (the policy is in effect).
  const RunResult fp32 = Sharded(c, init, 1, FsdpUnitMode::kMlp, DType::kF32, 1);
  EXPECT_NE(one.losses[0], fp32.losses[0]);
}

// bf16 compute (--precision bf16) under FSDP with fp32 transport: N ranks against one process
// with the whole batch, both in bf16, 4 steps; measured at 2 and 4 ranks: losses within 5e-6
// relative, parameters within 2.3e-4 of their scale at -O3 -march=native, but 2.9e-4 and 1.3e-2
// in the sanitizer build (-O1, generic x86-64: other fp32 summation orders move more operands
// across a bf16 rounding boundary), so the bars are 1e-3 and 3e-2. This toy model is far
// more sensitive to bf16 rounding than a real one (its fp32 and bf16 gradients differ by up to
// 80 % of their scale, with the ref backend too). Powers of two only: FSDP scales the loss's
// gradient by W / (global targets) before the backward (the reduce-scatter averages), and bf16
// rounding commutes with a power-of-two scale but not with 3: at 3 and 6 ranks every dy rounds to
// a neighbouring bf16 value now and then, a different rounding of the same product (the step-0
// gradient norm 8.6e-5 from one process's, which this toy model's sensitivity turns into
// parameters 7e-2 apart after 4 steps; in fp32 2.7e-8).
TEST(FsdpBf16Compute, NRanksMatchOneProcessWithTheWholeBatch) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 5);
  const RunResult ref = Reference(c, init, kSteps, {}, Precision::kBf16);
  const RunResult fp32 = Reference(c, init);
  EXPECT_NE(ref.losses[0], fp32.losses[0]) << "bf16 compute is in effect";
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  for (int world : {2, 4})
    for (FsdpUnitMode mode : {FsdpUnitMode::kMlp, FsdpUnitMode::kLayer}) {
      SCOPED_TRACE(StrCat(world, " ranks, ", mode == FsdpUnitMode::kMlp ? "mlp" : "layer"));
      const RunResult got =
          Sharded(c, init, world, mode, DType::kF32, kSteps, ActivationCheckpointing::kNone, {}, 1,
                  false, nullptr, Precision::kBf16);
      double loss_err = 0, param_err = 0;
      for (size_t s = 0; s < got.losses.size(); ++s)
        loss_err = std::max(loss_err, std::fabs(got.losses[s] - ref.losses[s]) / ref.losses[s]);
      for (int i = 0; i < reg.layout.size(); ++i) {
        const ArenaEntry& e = reg.layout.entry(i);
        param_err = std::max(param_err, test::RelError(got.params.data() + e.offset,
                                                       ref.params.data() + e.offset, e.numel));
      }
      std::printf("bf16 compute, %d ranks: loss %.2e, parameters %.2e\n", world, loss_err,
                  param_err);
      // Where oneDNN has no bf16 matmul (AVX2-only CPUs) the products are sgemm's on the widened
      // bf16 values, in yet another summation order: measured on a Zen 3, losses 1.6e-3 and
      // parameters 3.3e-2 apart, hence twice the bars there.
      const double widen = cpu::GemmBf16Native() ? 1.0 : 2.0;
      EXPECT_LT(loss_err, 1e-3 * widen);
      EXPECT_LT(param_err, 3e-2 * widen);
    }
}

// Checkpointing's recompute runs the same bf16 products on the same inputs: bit for bit.
TEST(FsdpBf16Compute, CheckpointingEqualsBitForBit) {
  const Gemma4Config c = Config();
  const ParamRegistry reg = BuildParamRegistry(c);
  std::vector<float> init(reg.layout.total());
  InitParams(c, reg, init.data(), 9);
  auto run = [&](ActivationCheckpointing ckpt) {
    return Sharded(c, init, 2, FsdpUnitMode::kMlp, DType::kBF16, 6, ckpt, {}, 1, false, nullptr,
                   Precision::kBf16);
  };
  const RunResult none = run(ActivationCheckpointing::kNone);
  for (ActivationCheckpointing ckpt :
       {ActivationCheckpointing::kMlp, ActivationCheckpointing::kLayer}) {
    const RunResult got = run(ckpt);
    EXPECT_EQ(got.losses, none.losses) << ActivationCheckpointingName(ckpt);
    EXPECT_EQ(got.params, none.params) << ActivationCheckpointingName(ckpt);
  }
}

TEST(FsdpMemory, ShardedStateFallsAsOneOverN) {
  auto m = PresetConfig("gemma4-tiny");
  ASSERT_TRUE(m.ok());
  const ParamRegistry reg = BuildParamRegistry(*m);
  auto store = std::make_shared<comm::MemoryStore>();
  for (int world : {1, 2, 4}) {
    std::vector<size_t> bytes(world);
    std::vector<std::thread> threads;
    auto st = std::make_shared<comm::MemoryStore>();
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        comm::GroupOptions go;
        go.name = "mem" + std::to_string(world);
        auto pg = comm::CreateProcessGroup(st, r, world, go);
        ASSERT_TRUE(pg.ok());
        const PresetWeights weights(*m, reg, 1);
        FsdpModel f(*m, reg, **pg, Trainable(reg), weights, FsdpOptions{});
        bytes[r] = f.ShardedStateBytes();
      });
    for (auto& t : threads) t.join();
    int64_t trainable = 0;
    const auto tr = Trainable(reg);
    for (int i = 0; i < reg.layout.size(); ++i)
      if (tr[i]) trainable += reg.layout.entry(i).numel;
    const double full = 16.0 * trainable;  // 4 fp32 buffers
    EXPECT_NEAR(bytes[0] / full, 1.0 / world, 0.01) << world << " ranks";
  }
}

}  // namespace
}  // namespace st
