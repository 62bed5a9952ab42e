// The sharded streaming load and save of [load]: weight sources read by range (presets and
// memory-mapped checkpoints, single-file and sharded, F32 and BF16, text-only and multimodal
// names), FSDP ranks that read only their shards and reproduce transformers' loss at 1, 2 and 4
// workers, frozen tensors served without an fp32 copy of the model, and the streamed Hugging Face
// export (sharded with an index, frozen tensors copied byte for byte) that reloads identically.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/group.h"
#include "comm/store/store.h"
#include "core/rng.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/safetensors.h"
#include "model/frozen_weights.h"
#include "parallel/fsdp.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainable.h"

namespace st {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = ST_FIXTURE_DIR;

std::vector<float> WholeArena(const WeightSource& w, const ParamRegistry& reg) {
  std::vector<float> out(reg.layout.total(), 0.0f);
  for (int i = 0; i < reg.layout.size(); ++i) w.ReadAll(i, out.data() + reg.layout.entry(i).offset);
  return out;
}

TEST(PresetWeights, AnyRangeHasTheValuesOfTheWholeInitialisation) {
  auto cfg = PresetConfig("gemma4-tiny");
  ASSERT_TRUE(cfg.ok());
  const ParamRegistry reg = BuildParamRegistry(*cfg);
  std::vector<float> whole(reg.layout.total());
  InitParams(*cfg, reg, whole.data(), 42);
  const PresetWeights w(*cfg, reg, 42);
  Rng rng(3);
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    const int64_t begin = static_cast<int64_t>(rng.Below(e.numel));
    const int64_t count = 1 + static_cast<int64_t>(rng.Below(e.numel - begin));
    std::vector<float> part(count);
    w.Read(i, begin, count, part.data());
    ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + e.offset + begin, count * sizeof(float)))
        << e.name << " [" << begin << ", " << begin + count << ")";
  }
  // Lookup rows, scaled, including the (zero) padding row.
  const int entry = reg.embed_tokens_per_layer;
  const int64_t cols = reg.layout.entry(entry).shape[1];
  const std::vector<int32_t> ids = {5, 0, 5, 1000};
  std::vector<float> rows(ids.size() * cols);
  w.GatherRows(entry, ids.data(), static_cast<int64_t>(ids.size()), 2.0f, rows.data());
  for (size_t r = 0; r < ids.size(); ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(rows[r * cols + c],
                2.0f * whole[reg.layout.entry(entry).offset + ids[r] * cols + c]);
}

// A model directory written in bf16 and split into several files reads back as the bf16-rounded
// values, names its files in an index, and a frozen tensor copied as stored is byte-identical.
TEST(HfModelWriter, ShardedBf16ExportReloadsExactly) {
  auto cfg = PresetConfig("gemma4-tiny");
  ASSERT_TRUE(cfg.ok());
  const ParamRegistry reg = BuildParamRegistry(*cfg);
  std::vector<float> params(reg.layout.total());
  InitParams(*cfg, reg, params.data(), 7);
  const std::string dir = test::TempDir("load_sharded");
  ASSERT_TRUE(SaveHfModel(dir, *cfg, reg, params.data(), DType::kBF16, 1'000'000).ok());
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));
  auto files = ModelWeightFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_GE(files->size(), 3u);
  // Each file within the limit (plus its header), unless it holds one tensor larger than it.
  for (const std::string& f : *files) {
    auto opened = SafeTensorsFile::Open(f);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened->tensors().size() > 1) {
      EXPECT_LE(fs::file_size(f), 1'000'000u + 64 * 1024) << f;
    }
  }
  auto loaded = LoadModel(dir, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->weights->dtype(), DType::kBF16);
  EXPECT_EQ(loaded->report.tensors_loaded, reg.layout.size());
  const std::vector<float> back = WholeArena(*loaded->weights, reg);
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    for (int64_t j = 0; j < e.numel; ++j)
      ASSERT_EQ(back[e.offset + j], BF16ToFloat(FloatToBF16(params[e.offset + j])))
          << e.name << "[" << j << "]";
  }
  // Written again, every tensor copied as stored: the same bytes in every file.
  const std::string again = test::TempDir("load_again");
  {
    std::vector<DType> dtypes(reg.layout.size(), DType::kBF16);
    auto w = HfModelWriter::Create(again, loaded->config, reg, dtypes, DType::kBF16, 1'000'000);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int i = 0; i < reg.layout.size(); ++i) {
      auto s = loaded->weights->StoredBytes(i);
      ASSERT_TRUE(s.has_value());
      ASSERT_TRUE((*w)->AppendStored(i, s->data, s->bytes, s->dtype).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
  }
  for (const std::string& f : *files) {
    const std::string name = fs::path(f).filename();
    EXPECT_EQ(test::ReadFile(f), test::ReadFile(again + "/" + name)) << name;
  }
  EXPECT_EQ(test::ReadFile(dir + "/model.safetensors.index.json"),
            test::ReadFile(again + "/model.safetensors.index.json"));
  fs::remove_all(dir);
  fs::remove_all(again);
}

// Runs fn(rank, pg) on `world` threads joined by Gloo over an in-memory store.
template <typename Fn>
void OnRanks(int world, const std::string& name, Fn fn) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      comm::GroupOptions go;
      go.name = name;
      auto pg = comm::CreateProcessGroup(store, r, world, go);
      ASSERT_TRUE(pg.ok()) << pg.status().ToString();
      fn(r, **pg);
    });
  for (auto& t : threads) t.join();
}

struct Golden {
  std::vector<int32_t> ids, labels;
  std::vector<uint8_t> mask;
  int64_t B = 0, T = 0;
  float loss = 0;
  std::vector<float> logits;
  Batch batch() const { return {ids.data(), mask.data(), labels.data(), B, T}; }
};

Golden ReadGolden(const std::string& dir) {
  Golden g;
  auto f = SafeTensorsFile::Open(dir + "/golden.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return g;
  g.B = f->Find("input_ids")->shape[0];
  g.T = f->Find("input_ids")->shape[1];
  g.ids.resize(g.B * g.T);
  g.labels.resize(g.B * g.T);
  std::vector<int32_t> mask(g.B * g.T);
  EXPECT_TRUE(f->ReadI32("input_ids", g.ids.data(), {g.B, g.T}).ok());
  EXPECT_TRUE(f->ReadI32("labels", g.labels.data(), {g.B, g.T}).ok());
  EXPECT_TRUE(f->ReadI32("attention_mask", mask.data(), {g.B, g.T}).ok());
  g.mask.assign(mask.begin(), mask.end());
  EXPECT_TRUE(f->ReadF32("loss", &g.loss, {1}).ok());
  g.logits.resize(Numel(f->Find("logits")->shape));
  EXPECT_TRUE(f->ReadF32("logits", g.logits.data(), {}).ok());
  return g;
}

class CheckpointFixture : public ::testing::TestWithParam<const char*> {
 protected:
  std::string Dir() const { return kFixtures + "/" + GetParam(); }
};

// `evaluate`'s path: nothing trained, every tensor served by FrozenWeights (the embedding tables'
// rows and the tied head's vocabulary blocks from the mapped file, one layer at a time in fp32):
// transformers' logits.
TEST_P(CheckpointFixture, FrozenForwardGivesTransformersLogits) {
  auto m = LoadModel(Dir(), 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  if (std::string(GetParam()).find("vision") != std::string::npos) {
    // The vision and audio towers' tensors are in the file, mapped but never read.
    EXPECT_GT(m->report.tensors_ignored, 50);
    EXPECT_EQ(m->report.prefix, "model.language_model.");
  }
  const Golden g = ReadGolden(Dir());
  Gemma4Engine engine(m->config, g.B, g.T);
  FrozenWeights frozen(m->registry, *m->weights,
                       std::vector<bool>(static_cast<size_t>(m->registry.layout.size()), true));
  // Both embedding tables are used straight from the file (rows, and head blocks).
  EXPECT_EQ(frozen.LookupElements(),
            m->registry.layout.entry(m->registry.embed_tokens_per_layer).numel +
                m->registry.layout.entry(m->registry.embed_tokens).numel);
  ParamTable table;
  table.param.assign(m->registry.layout.size(), nullptr);
  table.grad.assign(m->registry.layout.size(), nullptr);
  frozen.Bind(&table);
  const ForwardResult r = engine.Forward(table, g.batch(), &frozen);
  EXPECT_NEAR(r.Loss(), g.loss, 1e-4 * g.loss);
  std::vector<float> logits(g.logits.size());
  engine.ComputeLogits(table, logits.data());
  EXPECT_LT(test::RelError(logits.data(), g.logits.data(), static_cast<int64_t>(g.logits.size())),
            1e-4);
}

// Training with both embedding tables frozen and served from the source (rows, and the tied head
// in vocabulary blocks, here three of them): the loss and every other gradient as with the tables
// in an fp32 arena.
TEST(FrozenWeights, FrozenEmbeddingsFromTheSourceTrainAsFromAnArena) {
  Gemma4Config c;
  c.vocab_size = c.vocab_size_per_layer_input = 2 * kHeadBlock + 123;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.layer_types = {LayerType::kSliding, LayerType::kFull};
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.global_head_dim = 16;
  c.hidden_size_per_layer_input = 4;
  c.sliding_window = 4;
  c.final_logit_softcapping = 30.0;
  c.initializer_range = 0.2;
  ASSERT_TRUE(c.Validate().ok());
  const int64_t B = 2, T = 7;
  Gemma4Engine engine(c, B, T);
  const ParamRegistry& reg = engine.registry();
  std::vector<float> params(reg.layout.total());
  InitParams(c, reg, params.data(), 11);
  std::vector<int32_t> ids(B * T);
  Rng rng(5);
  for (auto& id : ids) id = 1 + static_cast<int32_t>(rng.Below(c.vocab_size - 1));
  const Batch batch{ids.data(), nullptr, ids.data(), B, T};
  auto trainable = TrainableTensors(reg, "^embed_tokens");
  ASSERT_TRUE(trainable.ok());
  ASSERT_FALSE(trainable->mask[reg.embed_tokens]);

  std::vector<float> g_arena(reg.layout.total(), 0.0f), g_frozen(reg.layout.total(), 0.0f);
  const ForwardResult a = engine.Forward(params.data(), batch);
  engine.Backward(params.data(), g_arena.data(), batch, 1.0f / a.num_valid, &trainable->mask);

  const ArenaWeights source(reg, params.data());
  std::vector<bool> frozen(trainable->mask.size());
  for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = !trainable->mask[i];
  FrozenWeights fw(reg, source, frozen);
  ParamTable table = ParamTable::FromArenas(reg, params.data(), g_frozen.data(), &trainable->mask);
  fw.Bind(&table);
  ASSERT_EQ(table.param[reg.embed_tokens], nullptr);
  const ForwardResult b = engine.Forward(table, batch, &fw);
  engine.Backward(table, batch, 1.0f / b.num_valid, &fw);
  EXPECT_NEAR(a.Loss(), b.Loss(), 1e-6 * a.Loss());
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (!trainable->mask[i]) continue;
    const ArenaEntry& e = reg.layout.entry(i);
    EXPECT_LT(test::RelError(g_frozen.data() + e.offset, g_arena.data() + e.offset, e.numel), 1e-5)
        << e.name;
  }
}

// FSDP at 1, 2 and 4 ranks, each reading only its shards: the gathered parameters are exactly the
// checkpoint's, and every rank running the golden batch gets transformers' loss.
TEST_P(CheckpointFixture, ShardedLoadAtOneTwoAndFourRanks) {
  auto m = LoadModel(Dir(), 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ParamRegistry& reg = m->registry;
  const std::vector<float> whole = WholeArena(*m->weights, reg);
  const Golden g = ReadGolden(Dir());
  auto trainable = TrainableTensors(reg, "^embed_tokens_per_layer");
  ASSERT_TRUE(trainable.ok());
  for (int world : {1, 2, 4}) {
    std::vector<std::vector<float>> gathered(world);
    std::vector<double> losses(world, -1);
    OnRanks(world, "load" + std::to_string(world), [&](int r, comm::ProcessGroup& pg) {
      Gemma4Engine engine(m->config, g.B, g.T);
      FsdpModel fsdp(m->config, reg, pg, trainable->mask, *m->weights, FsdpOptions{});
      fsdp.Load();
      gathered[r].resize(reg.layout.total());
      ASSERT_TRUE(fsdp.GatherFull(gathered[r].data()).ok());
      // FSDP gathers in bf16 by default; fp32 checkpoints then differ from the golden loss by
      // rounding, so compare an fp32 gather.
      FsdpOptions f32;
      f32.param_dtype = DType::kF32;
      FsdpModel exact(m->config, reg, pg, trainable->mask, *m->weights, f32);
      exact.Load();
      auto res = exact.ForwardBackward(engine, g.batch());
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      losses[r] = res->Loss();
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(gathered[r].size(), whole.size());
      for (int i = 0; i < reg.layout.size(); ++i) {
        const ArenaEntry& e = reg.layout.entry(i);
        ASSERT_EQ(0, std::memcmp(gathered[r].data() + e.offset, whole.data() + e.offset,
                                 e.numel * sizeof(float)))
            << e.name << " on rank " << r << " of " << world;
      }
      EXPECT_NEAR(losses[r], g.loss, 1e-4 * g.loss) << "rank " << r << " of " << world;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CheckpointFixture,
                         ::testing::Values("tiny_text", "tiny_mm", "tiny_text_bf16_sharded",
                                           "tiny_mm_vision_bf16"));

// The streamed export of a checkpoint: 2 ranks, the per-layer table frozen in a bf16 source. The
// trained tensors come out as the ranks' master weights, the frozen table as the source's bytes.
TEST(WriteHfModel, StreamsEveryRanksPiecesAndCopiesFrozenTensors) {
  auto cfg = PresetConfig("gemma4-tiny");
  ASSERT_TRUE(cfg.ok());
  const ParamRegistry reg = BuildParamRegistry(*cfg);
  std::vector<float> params(reg.layout.total());
  InitParams(*cfg, reg, params.data(), 9);
  const std::string src = test::TempDir("load_src"), out = test::TempDir("load_out");
  ASSERT_TRUE(SaveHfModel(src, *cfg, reg, params.data(), DType::kBF16).ok());
  auto m = LoadModel(src, 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto trainable = TrainableTensors(reg, "^embed_tokens_per_layer");
  ASSERT_TRUE(trainable.ok());
  std::vector<float> master(reg.layout.total());
  OnRanks(2, "export", [&](int r, comm::ProcessGroup& pg) {
    FsdpModel fsdp(m->config, reg, pg, trainable->mask, *m->weights, FsdpOptions{});
    fsdp.Load();
    // Something to tell the trained values from the source's: one optimizer step's worth.
    for (int64_t j = 0; j < fsdp.shard_size(); ++j) fsdp.master()[j] += 0.5f;
    std::vector<float> mine(reg.layout.total());
    ASSERT_TRUE(fsdp.GatherFull(mine.data()).ok());
    if (r == 0) master = mine;
    HfExportOptions o;
    o.dtype = DType::kF32;
    o.max_shard_bytes = 2'000'000;
    ASSERT_TRUE(WriteHfModel(out, *m, fsdp, pg, {}, o).ok());
  });
  auto back = LoadModel(out, 0);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    auto stored = back->weights->StoredBytes(i);
    ASSERT_TRUE(stored.has_value()) << e.name;
    if (trainable->mask[i]) {
      EXPECT_EQ(stored->dtype, DType::kF32) << e.name;
      std::vector<float> v(e.numel);
      back->weights->ReadAll(i, v.data());
      ASSERT_EQ(0, std::memcmp(v.data(), master.data() + e.offset, e.numel * sizeof(float)))
          << e.name;
    } else {
      const auto orig = m->weights->StoredBytes(i);
      ASSERT_EQ(stored->dtype, orig->dtype) << e.name;
      ASSERT_EQ(stored->bytes, orig->bytes) << e.name;
      EXPECT_EQ(0, std::memcmp(stored->data, orig->data, orig->bytes)) << e.name;
    }
  }
  fs::remove_all(src);
  fs::remove_all(out);
}

// What a damaged or inconsistent model directory says: one line naming the file and the tensor.
class BrokenModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = PresetConfig("gemma4-tiny");
    ASSERT_TRUE(cfg.ok());
    cfg_ = *cfg;
    reg_ = BuildParamRegistry(cfg_);
    params_.resize(reg_.layout.total());
    InitParams(cfg_, reg_, params_.data(), 1);
    dir_ = test::TempDir("load_broken");
    ASSERT_TRUE(SaveHfModel(dir_, cfg_, reg_, params_.data(), DType::kBF16, 1'000'000).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Error() {
    auto m = LoadModel(dir_, 0);
    return m.ok() ? "" : m.status().message();
  }
  Gemma4Config cfg_;
  ParamRegistry reg_;
  std::vector<float> params_;
  std::string dir_;
};

TEST_F(BrokenModelDir, AShardTheIndexNamesIsMissing) {
  auto files = ModelWeightFiles(dir_);
  ASSERT_TRUE(files.ok());
  fs::remove(files->back());
  const std::string e = Error();
  EXPECT_NE(e.find("model.safetensors.index.json names the weight file"), std::string::npos) << e;
  EXPECT_NE(e.find(fs::path(files->back()).filename().string()), std::string::npos) << e;
}

TEST_F(BrokenModelDir, ATruncatedShard) {
  auto files = ModelWeightFiles(dir_);
  ASSERT_TRUE(files.ok());
  fs::resize_file(files->front(), fs::file_size(files->front()) - 100);
  const std::string e = Error();
  EXPECT_NE(e.find(fs::path(files->front()).filename().string()), std::string::npos) << e;
}

TEST_F(BrokenModelDir, TheIndexPutsATensorInTheWrongFile) {
  std::string index = test::ReadFile(dir_ + "/model.safetensors.index.json");
  const size_t at = index.find("\"model.norm.weight\": \"model-0000");
  ASSERT_NE(at, std::string::npos) << index;
  // Point it at the first file, which does not hold it.
  const size_t q = index.find("model-0000", at);
  index.replace(q, 11, "model-00001");
  ASSERT_TRUE(WriteFileDurably(dir_ + "/model.safetensors.index.json", index).ok());
  const std::string e = Error();
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00001"), std::string::npos) << e;
}

TEST_F(BrokenModelDir, AShapeThatDisagreesWithConfigJson) {
  // A narrower MLP in config.json than in the weights.
  std::string config = test::ReadFile(dir_ + "/config.json");
  const std::string key = "\"intermediate_size\": " + std::to_string(cfg_.intermediate_size);
  const size_t at = config.find(key);
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, key.size(),
                 "\"intermediate_size\": " + std::to_string(cfg_.intermediate_size / 2));
  ASSERT_TRUE(WriteFileDurably(dir_ + "/config.json", config).ok());
  const std::string e = Error();
  EXPECT_NE(e.find("mlp.gate_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json expects"), std::string::npos) << e;
}

TEST_F(BrokenModelDir, AnIntegerWeight) {
  const std::string dir = dir_ + "_int";
  fs::create_directories(dir);
  fs::copy_file(dir_ + "/config.json", dir + "/config.json");
  // Every tensor as saved, but the final norm as I32 bytes.
  {
    std::vector<TensorToWrite> t;
    for (int i = 0; i < reg_.layout.size(); ++i)
      t.push_back({"model." + reg_.layout.entry(i).name, DType::kF32, reg_.layout.entry(i).shape,
                   params_.data() + reg_.layout.entry(i).offset});
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", t, {}).ok());
  }
  // Patch the header's dtype of model.norm.weight from F32 to I32 (same width, same offsets).
  std::string bytes = test::ReadFile(dir + "/model.safetensors");
  const size_t at = bytes.find("\"model.norm.weight\":{");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(bytes.find("\"F32\"", at), 5, "\"I32\"");
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary);
    out << bytes;
  }
  auto m = LoadModel(dir, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.norm.weight"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("I32"), std::string::npos) << m.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace st
