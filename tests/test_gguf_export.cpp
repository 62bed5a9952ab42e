// `slicetrain export --format gguf` (io/gguf_export.h): what the file holds, read back with our own
// GGUF reader. That llama.cpp loads these files, tokenizes as transformers does and computes
// transformers' logits, and that our bytes equal llama.cpp's converter's, is checked by
// tools/check_gguf.py against llama.cpp itself (docs/gguf.md has its figures).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "io/gguf.h"
#include "io/gguf_export.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "kernels/cpu/quant.h"
#include "model/config.h"
#include "model/decode.h"
#include "model/lora.h"
#include "model/params.h"
#include "model/weights.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
const std::string kBin = ST_BINARY;
const std::string kTokenizer = ST_SOURCE_DIR "/data/tokenizer";

// The tiny preset: its layout is one llama.cpp runs (the last layer before the KV-shared ones
// full-attention, the one before it sliding, as in E2B).
Gemma4Config LlamaCppTiny() {
  return PresetConfig("gemma4-tiny").value();
}

LoadedModel PresetModel(const Gemma4Config& cfg) {
  LoadedModel m;
  m.config = cfg;
  m.registry = BuildParamRegistry(cfg);
  m.weights = std::make_unique<PresetWeights>(cfg, m.registry, 7);
  m.source = "test preset";
  return m;
}

const GgufValue& Meta(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.Find(key);
  EXPECT_NE(v, nullptr) << key;
  static const GgufValue kNone;
  return v ? *v : kNone;
}

TEST(GgufExport, TensorNamesAreLlamaCppGemma4s) {
  EXPECT_EQ(GgufTensorName("embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(GgufTensorName("embed_tokens_per_layer.weight"), "per_layer_token_embd.weight");
  EXPECT_EQ(GgufTensorName("norm.weight"), "output_norm.weight");
  EXPECT_EQ(GgufTensorName("layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(GgufTensorName("layers.0.layer_scalar"), "blk.0.layer_output_scale.weight");
  EXPECT_EQ(GgufTensorName("layers.3.post_per_layer_input_norm.weight"), "blk.3.post_norm.weight");
  EXPECT_EQ(GgufTensorName("layers.3.pre_feedforward_layernorm.weight"), "blk.3.ffn_norm.weight");
  EXPECT_EQ(GgufTensorName("layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(GgufTensorName("lm_head.weight"), "");
  EXPECT_EQ(GgufTensorName("layers.x.mlp.down_proj.weight"), "");
  // Every tensor of every preset has a name.
  for (const std::string& preset : PresetNames()) {
    const ParamRegistry reg = BuildParamRegistry(PresetConfig(preset).value());
    for (const ArenaEntry& e : reg.layout.entries())
      EXPECT_FALSE(GgufTensorName(e.name).empty()) << preset << " " << e.name;
  }
}

TEST(GgufExport, QuantFlagNamesWhatIsWritten) {
  EXPECT_EQ(ParseGgufQuant("Q8_0").value().type, GgmlType::kQ8_0);
  EXPECT_EQ(ParseGgufQuant("bf16").value().type, GgmlType::kBF16);
  EXPECT_EQ(ParseGgufQuant("fp16").value().type, GgmlType::kF16);
  EXPECT_EQ(ParseGgufQuant("q4_0").value().type, GgmlType::kQ4_0);
  EXPECT_EQ(ParseGgufQuant("Q6_K").value().type, GgmlType::kQ6_K);
  EXPECT_FALSE(ParseGgufQuant("q8_0").value().q4_k_m);
  const GgufQuant km = ParseGgufQuant("Q4_K_M").value();
  EXPECT_EQ(km.type, GgmlType::kQ4_K);
  EXPECT_TRUE(km.q4_k_m);
  const Status k = ParseGgufQuant("q4_k_s").status();
  EXPECT_EQ(k.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.message().find("q4_k_m"), std::string::npos) << k.message();
  EXPECT_FALSE(ParseGgufQuant("int3").ok());
}

// llama.cpp takes a shared layer's KV cache from fixed layers; a layout where that differs from
// transformers' rule is refused rather than written for llama.cpp to compute wrong answers.
TEST(GgufExport, RefusesLayoutsWhoseKvSharingLlamaCppGetsWrong) {
  EXPECT_TRUE(CheckLlamaCppKvSharing(PresetConfig("gemma4-e2b").value()).ok());
  EXPECT_TRUE(CheckLlamaCppKvSharing(LlamaCppTiny()).ok());
  // The shared sliding layer 4 reads layer 3 in transformers, layer 2 in llama.cpp.
  Gemma4Config other = LlamaCppTiny();
  const LayerType S = LayerType::kSliding, F = LayerType::kFull;
  other.layer_types = {S, S, F, S, S, F};
  const Status refused = CheckLlamaCppKvSharing(other);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("layer 4"), std::string::npos) << refused.message();
  EXPECT_FALSE(CheckLlamaCppKvSharing(PresetConfig("gemma4-small").value()).ok());
  const std::string dir = test::TempDir("gguf_export_refused");
  GgufExportOptions o;
  o.output = dir + "/m.gguf";
  o.tokenizer_dir = kTokenizer;
  EXPECT_FALSE(ExportGguf(PresetModel(other), o).ok());
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// The vocabulary: tokenizer.json's tokens by id, padded to the model's rows, with the token types
// llama.cpp reads (specials CONTROL so that "<|turn>" in a prompt is one token, bytes BYTE).
TEST(GgufExport, VocabularyHasTheTokenizersTokensAndTypes) {
  StatusOr<GgufVocab> v = ReadGgufVocab(kTokenizer, 8192);
  ASSERT_TRUE(v.ok()) << v.status().message();
  StatusOr<Tokenizer> tok = Tokenizer::Load(kTokenizer);
  ASSERT_TRUE(tok.ok());
  ASSERT_EQ(v->tokens.size(), 8192u);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) EXPECT_EQ(v->tokens[id], tok->IdToToken(id));
  EXPECT_EQ(v->padding_tokens, 8192 - tok->vocab_size());
  EXPECT_EQ(v->tokens[8191], "[PAD8191]");
  EXPECT_EQ(v->types[8191], 5);
  auto type_of = [&](const std::string& t) { return v->types[*tok->TokenToId(t)]; };
  EXPECT_EQ(type_of("<bos>"), 3);
  EXPECT_EQ(type_of("<|turn>"), 3);
  EXPECT_EQ(type_of("<turn|>"), 3);
  EXPECT_EQ(type_of("<|channel>"), 4);  // kept visible, as llama.cpp's converter does
  EXPECT_EQ(type_of("<0x0A>"), 6);
  EXPECT_EQ(type_of("▁the"), 1);
  EXPECT_EQ(v->bos, tok->bos_id());
  EXPECT_EQ(v->eos, tok->eos_id());
  EXPECT_EQ(v->pad, tok->pad_id());
  EXPECT_GT(v->merges.size(), 1000u);
  EXPECT_EQ(v->merges[0].find(' ') != std::string::npos, true);
  EXPECT_EQ(v->chat_template_source, "gemma-chat (built in)");
  EXPECT_NE(v->chat_template.find("<|turn>"), std::string::npos);
  // A model with fewer rows than the tokenizer has tokens cannot take it.
  const Status small = ReadGgufVocab(kTokenizer, 1000).status();
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("1000"), std::string::npos);
  EXPECT_EQ(ReadGgufVocab("/nonexistent", 8192).status().code(), StatusCode::kNotFound);
  // A field of the wrong JSON type is one error, not an exception.
  const std::string bad = test::TempDir("gguf_vocab_bad");
  std::string text = test::ReadFile(kTokenizer + "/tokenizer.json");
  const size_t at = text.find("\"id\": 0");
  const size_t at2 = text.find("\"id\":0");
  ASSERT_TRUE(at != std::string::npos || at2 != std::string::npos);
  if (at != std::string::npos)
    text.replace(at, 7, "\"id\": \"zero\"");
  else
    text.replace(at2, 6, "\"id\":\"zero\"");
  std::ofstream(bad + "/tokenizer.json") << text;
  const Status typed = ReadGgufVocab(bad, 8192).status();
  EXPECT_EQ(typed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typed.message().find("unexpected type"), std::string::npos) << typed.message();
  fs::remove_all(bad);
}

// The vocabulary an export writes, read back as a tokenizer (Tokenizer::Load of the .gguf, as
// `--tokenizer model.gguf` does): llama.cpp's gemma4 tokenization of it. Without newlines that is
// the tokenizer.json's; llama.cpp splits text into runs of newlines and of everything else before
// merging (and takes a run of newlines that is a token whole), so with newlines it is the
// tokenizer.json's on each run. That the ids are llama.cpp's own is checked against llama.cpp
// (tools/check_gguf.py, and Gemma 4's real vocabulary and llama.cpp's cases for it).
TEST(GgufExport, ItsVocabularyTokenizesAsLlamaCppDoes) {
  const LoadedModel m = PresetModel(LlamaCppTiny());
  const std::string dir = test::TempDir("gguf_export_vocab");
  GgufExportOptions o;
  o.output = dir + "/m.gguf";
  o.weight_type = GgmlType::kQ8_0;
  o.tokenizer_dir = kTokenizer;
  ASSERT_TRUE(ExportGguf(m, o).ok());
  StatusOr<Tokenizer> hf = Tokenizer::Load(kTokenizer);
  StatusOr<Tokenizer> gg = Tokenizer::Load(o.output);
  ASSERT_TRUE(hf.ok() && gg.ok()) << gg.status().message();
  EXPECT_NE(gg->kind().find("GGUF"), std::string::npos) << gg->kind();
  EXPECT_EQ(gg->vocab_size(), 8192);
  EXPECT_EQ(gg->IdToToken(8191), "[PAD8191]");
  EXPECT_EQ(gg->bos_id(), hf->bos_id());
  EXPECT_EQ(gg->eos_id(), hf->eos_id());
  EXPECT_EQ(gg->pad_id(), hf->pad_id());
  for (const std::string text :
       {"Hello world", "  two leading spaces, and\ttabs\t", "<|turn>user Hi<turn|> <|channel>x",
        "Ünïcödé ½ 🦙 ならば", "Instruction: write a poem. Response:", ""}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(gg->Encode(text), hf->Encode(text));
    EXPECT_EQ(gg->Decode(gg->Encode(text, false)), text);
  }
  // Text with newlines: the tokenizer.json's ids run by run.
  const std::string text = "### Instruction:\nName three colours.\n\n### Response:\nRed\n\n\n";
  std::vector<int32_t> want = {hf->bos_id()};
  for (size_t b = 0; b < text.size();) {
    const bool nl = text[b] == '\n';
    size_t e = b;
    while (e < text.size() && (text[e] == '\n') == nl) ++e;
    const std::string run = text.substr(b, e - b);
    const std::optional<int32_t> whole = hf->TokenToId(run);
    if (nl && whole) {
      want.push_back(*whole);
    } else {
      const std::vector<int32_t> ids = hf->Encode(run, false);
      want.insert(want.end(), ids.begin(), ids.end());
    }
    b = e;
  }
  EXPECT_EQ(gg->Encode(text), want);
  EXPECT_NE(gg->Encode(text), hf->Encode(text));  // the bundled tokenizer joins "s.\n" and such
  EXPECT_EQ(gg->Decode(want, /*skip_special_tokens=*/true), text);

  // The command: `tokenize --tokenizer m.gguf`, texts with newlines as JSON strings (--jsonl), and
  // back with --decode --jsonl.
  std::ofstream(dir + "/texts.jsonl") << nlohmann::json(text).dump() << "\n\"Hello world\"\n";
  const test::Ran enc = test::RunCommand(kBin + " tokenize --tokenizer " + o.output + " --file " +
                                         dir + "/texts.jsonl --jsonl --no-special");
  ASSERT_EQ(enc.code, 0) << enc.out;
  std::string ids_line;
  for (size_t i = 1; i < want.size(); ++i) ids_line += (i > 1 ? " " : "") + std::to_string(want[i]);
  EXPECT_NE(enc.out.find(ids_line + "\n"), std::string::npos) << enc.out;
  std::ofstream(dir + "/ids.txt") << ids_line << "\n";
  const test::Ran dec = test::RunCommand(kBin + " tokenize --tokenizer " + o.output + " --file " +
                                         dir + "/ids.txt --decode --jsonl");
  ASSERT_EQ(dec.code, 0) << dec.out;
  EXPECT_EQ(dec.out, nlohmann::json(text).dump() + "\n");

  // Trained with it: the checkpoint keeps the vocabulary as tokenizer.gguf (no tensors), which
  // evaluate and generate then take without --tokenizer.
  const test::Ran ft = test::RunCommand(
      kBin + " finetune --data-dir " ST_SOURCE_DIR "/data --no-dashboard --progress off " +
      "--model-id gemma4-tiny --tokenizer " + o.output +
      " --dataset-split 'train[:16]' --max-seq-len 32 --num-epochs 1 --storage-path " + dir +
      " --run-name gg");
  ASSERT_EQ(ft.code, 0) << ft.out;
  const std::string ckpt = test::NewestCheckpoint(dir + "/gg");
  ASSERT_FALSE(ckpt.empty());
  StatusOr<GgufFile> kept = GgufFile::Open(ckpt + "/tokenizer.gguf");
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_TRUE(kept->tensors().empty());
  EXPECT_LT(fs::file_size(ckpt + "/tokenizer.gguf"), fs::file_size(o.output) / 4);
  StatusOr<Tokenizer> from_ckpt = Tokenizer::Load(ckpt);
  ASSERT_TRUE(from_ckpt.ok()) << from_ckpt.status().message();
  EXPECT_EQ(from_ckpt->Encode(text), want);
  // evaluate finds no tokenizer but the checkpoint's (it has no fallback to the bundled one).
  const test::Ran ev =
      test::RunCommand(kBin + " evaluate --data-dir " ST_SOURCE_DIR "/data --model-id " + ckpt +
                       " --dataset-split 'train[:4]' --max-seq-len 32");
  EXPECT_EQ(ev.code, 0) << ev.out;
  const test::Ran gen = test::RunCommand(kBin + " generate --model-id " + ckpt +
                                         " --max-new-tokens 4 --prompt 'Name a colour.'");
  EXPECT_EQ(gen.code, 0) << gen.out;
  fs::remove_all(dir);
}

// An F32 export holds the model's values exactly, under llama.cpp's names and shapes, with the
// hyperparameters its gemma4 loader reads.
TEST(GgufExport, F32FileHoldsTheModelExactly) {
  const Gemma4Config cfg = LlamaCppTiny();
  const LoadedModel m = PresetModel(cfg);
  const std::string dir = test::TempDir("gguf_export_f32");
  GgufExportOptions o;
  o.output = dir + "/m.gguf";
  o.weight_type = GgmlType::kF32;
  o.tokenizer_dir = kTokenizer;
  o.name = "tiny";
  StatusOr<GgufExportReport> r = ExportGguf(m, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->worst_relative_rms_error, 0.0);
  StatusOr<GgufFile> f = GgufFile::Open(o.output);
  ASSERT_TRUE(f.ok()) << f.status().message();

  EXPECT_EQ(Meta(*f, "general.architecture").s, "gemma4");
  EXPECT_EQ(Meta(*f, "general.name").s, "tiny");
  EXPECT_EQ(Meta(*f, "general.file_type").i, 0);
  EXPECT_EQ(Meta(*f, "gemma4.block_count").i, 6);
  EXPECT_EQ(Meta(*f, "gemma4.embedding_length").i, 128);
  EXPECT_EQ(Meta(*f, "gemma4.feed_forward_length").ints,
            (std::vector<int64_t>{512, 512, 512, 512, 1024, 1024}));
  EXPECT_EQ(Meta(*f, "gemma4.attention.sliding_window_pattern").ints,
            (std::vector<int64_t>{1, 1, 1, 0, 1, 0}));
  EXPECT_EQ(Meta(*f, "gemma4.attention.shared_kv_layers").i, 2);
  EXPECT_EQ(Meta(*f, "gemma4.attention.key_length").i, 64);
  EXPECT_EQ(Meta(*f, "gemma4.attention.key_length_swa").i, 32);
  EXPECT_EQ(Meta(*f, "gemma4.embedding_length_per_layer_input").i, 32);
  EXPECT_FLOAT_EQ(static_cast<float>(Meta(*f, "gemma4.rope.freq_base").f), 1e6f);
  EXPECT_FLOAT_EQ(static_cast<float>(Meta(*f, "gemma4.rope.freq_base_swa").f), 1e4f);
  EXPECT_FLOAT_EQ(static_cast<float>(Meta(*f, "gemma4.final_logit_softcapping").f), 30.0f);
  EXPECT_EQ(Meta(*f, "tokenizer.ggml.model").s, "gemma4");
  EXPECT_EQ(Meta(*f, "tokenizer.ggml.tokens").strings.size(), 8192u);
  EXPECT_EQ(Meta(*f, "tokenizer.ggml.bos_token_id").i, 2);
  EXPECT_EQ(Meta(*f, "tokenizer.ggml.add_bos_token").i, 1);

  // rope_freqs: the rotated quarter of a full layer's 32 frequency pairs at 1, the rest 1e30.
  const GgufTensorInfo* rope = f->FindTensor("rope_freqs.weight");
  ASSERT_NE(rope, nullptr);
  std::vector<float> freqs(static_cast<size_t>(rope->Elements()));
  f->ReadF32(*rope, freqs.data());
  ASSERT_EQ(freqs.size(), 32u);
  for (size_t i = 0; i < freqs.size(); ++i) EXPECT_EQ(freqs[i], i < 8 ? 1.0f : 1e30f) << i;

  // Every registry tensor, under its name, reversed shape, same values; nothing else but rope.
  const ParamRegistry& reg = m.registry;
  EXPECT_EQ(f->tensors().size(), static_cast<size_t>(reg.layout.size()) + 1);
  EXPECT_EQ(f->tensors()[0].name, "rope_freqs.weight");
  for (int e = 0; e < reg.layout.size(); ++e) {
    const ArenaEntry& en = reg.layout.entry(e);
    const GgufTensorInfo* t = f->FindTensor(GgufTensorName(en.name));
    ASSERT_NE(t, nullptr) << en.name;
    EXPECT_EQ(t->TorchShape(), en.shape) << en.name;
    EXPECT_EQ(t->type, GgmlType::kF32);
    std::vector<float> want(static_cast<size_t>(en.numel)), got(want.size());
    m.weights->ReadAll(e, want.data());
    f->ReadF32(*t, got.data());
    EXPECT_EQ(want, got) << en.name;
  }
  // Sorted by registry name after rope_freqs, as llama.cpp's converter orders them.
  for (size_t i = 2; i < f->tensors().size(); ++i) {
    auto registry_name = [&](const std::string& gguf) {
      for (const ArenaEntry& en : reg.layout.entries())
        if (GgufTensorName(en.name) == gguf) return en.name;
      return std::string();
    };
    EXPECT_LT(registry_name(f->tensors()[i - 1].name), registry_name(f->tensors()[i].name));
  }
  fs::remove_all(dir);
}

// Quantized exports: matrices in the asked format (vectors stay F32), every value within its
// format's step of the model's, and the relative error what each format gives.
TEST(GgufExport, QuantizedFilesStayWithinTheirFormatsBound) {
  const LoadedModel m = PresetModel(LlamaCppTiny());
  const std::string dir = test::TempDir("gguf_export_q");
  struct Case {
    GgmlType type;
    int64_t file_type;
    double max_rel;  // RMS error over RMS value, worst tensor
  };
  for (const Case& c : {Case{GgmlType::kBF16, 32, 4e-3}, Case{GgmlType::kF16, 1, 5e-4},
                        Case{GgmlType::kQ8_0, 7, 1e-2}, Case{GgmlType::kQ4_0, 2, 0.2}}) {
    GgufExportOptions o;
    o.output = dir + "/m_" + GgmlTypeOf(c.type).name + ".gguf";
    o.weight_type = c.type;
    o.tokenizer_dir = kTokenizer;
    StatusOr<GgufExportReport> r = ExportGguf(m, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_GT(r->worst_relative_rms_error, 0.0);
    EXPECT_LT(r->worst_relative_rms_error, c.max_rel) << GgmlTypeOf(c.type).name;
    StatusOr<GgufFile> f = GgufFile::Open(o.output);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(Meta(*f, "general.file_type").i, c.file_type);
    for (const GgufTensorInfo& t : f->tensors()) {
      // Q6_K's rows must be whole super-blocks of 256: the tiny model's 128-value rows fall back
      // to Q8_0, as llama-quantize does; ffn_down's 512 and 1024 stay Q6_K.
      GgmlType want_type = t.ne.size() == 1 ? GgmlType::kF32 : c.type;
      if (want_type == GgmlType::kQ6_K && t.ne[0] % 256 != 0) want_type = GgmlType::kQ8_0;
      EXPECT_EQ(t.type, want_type) << t.name;
      if (t.name == "rope_freqs.weight") continue;
      int entry = -1;
      for (int e = 0; e < m.registry.layout.size(); ++e)
        if (GgufTensorName(m.registry.layout.entry(e).name) == t.name) entry = e;
      ASSERT_GE(entry, 0) << t.name;
      std::vector<float> want(static_cast<size_t>(t.Elements())), got(want.size());
      m.weights->ReadAll(entry, want.data());
      f->ReadF32(t, got.data());
      const int64_t block = GgmlTypeOf(t.type).block_elems;
      for (size_t b0 = 0; b0 < want.size(); b0 += static_cast<size_t>(block)) {
        float amax = 0;
        for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(want[b0 + j]));
        for (int64_t j = 0; j < block; ++j) {
          const double x = want[b0 + j], err = std::fabs(got[b0 + j] - x);
          double bound = 0;
          switch (t.type) {
            case GgmlType::kBF16:
              bound = std::fabs(x) / 256;
              break;
            case GgmlType::kF16:
              bound = std::max(std::fabs(x) / 2048, 0x1p-25);
              break;
            case GgmlType::kQ8_0:
              bound = amax / 127 * 0.57;
              break;
            case GgmlType::kQ4_0:
              bound = amax / 8 * 1.01;
              break;
            case GgmlType::kQ6_K:
              bound = amax / 24 + 0x1p-12;
              break;
            default:
              break;
          }
          ASSERT_LE(err, bound) << t.name << " element " << b0 + j;
        }
      }
    }
  }
  fs::remove_all(dir);
}

// --quant q4_k_m: llama-quantize's Q4_K_M choice per tensor (tools/check_gguf.py compares the
// bytes with llama-quantize's own file). Its rules, from llama.cpp's src/llama-quant.cpp: the tied
// token tables take the output's Q6_K (Q8_0 when a row is not whole 256-value blocks); the
// attention values and feed-forward outputs of the layers use_more_bits picks (the first and last
// eighth, every third between) Q6_K; per_layer_model_proj is not quantized; the rest Q4_K; a row
// that is not whole 256-value blocks falls back, Q4_K to Q5_0 and Q6_K to Q8_0.
TEST(GgufExport, Q4KMFollowsLlamaQuantizesMixture) {
  const LoadedModel m = PresetModel(LlamaCppTiny());
  const std::string dir = test::TempDir("gguf_export_q4km");
  GgufExportOptions o;
  o.output = dir + "/m.gguf";
  o.weight_type = GgmlType::kQ4_K;
  o.q4_k_m = true;
  o.tokenizer_dir = kTokenizer;
  StatusOr<GgufExportReport> r = ExportGguf(m, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r->worst_relative_rms_error, 0.0);
  EXPECT_LT(r->worst_relative_rms_error, 0.15);
  StatusOr<GgufFile> f = GgufFile::Open(o.output);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(Meta(*f, "general.file_type").i, 15);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  const int64_t layers = m.config.num_hidden_layers;
  auto more_bits = [](int64_t i, int64_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
  };
  ASSERT_EQ(layers, 6);
  // Of 6 layers: 6 / 8 = 0 and 7 * 6 / 8 = 5, so layers 2 and 5.
  EXPECT_FALSE(more_bits(0, 6) || more_bits(1, 6) || more_bits(3, 6) || more_bits(4, 6));
  EXPECT_TRUE(more_bits(2, 6) && more_bits(5, 6));
  // KV-shared layers (4 and 5) have no attn_v: the values count 4, and use_more_bits(i, 4) picks
  // i = 2 and 3. (With under 10 layers the file's name order is the layer order.)
  const int64_t v_count = layers - m.config.num_kv_shared_layers;
  ASSERT_EQ(v_count, 4);
  EXPECT_TRUE(more_bits(2, 4) && more_bits(3, 4) && !more_bits(0, 4) && !more_bits(1, 4));
  std::map<GgmlType, int> seen;
  int64_t v_index = 0;
  for (const GgufTensorInfo& t : f->tensors()) {
    GgmlType want = GgmlType::kQ4_K;
    const int64_t layer = t.name.rfind("blk.", 0) == 0 ? std::stoll(t.name.substr(4)) : -1;
    if (t.ne.size() == 1 || t.name == "per_layer_model_proj.weight") {
      want = GgmlType::kF32;
    } else if (t.name == "token_embd.weight" || t.name == "per_layer_token_embd.weight") {
      want = t.ne[0] % 256 == 0 ? GgmlType::kQ6_K : GgmlType::kQ8_0;
    } else if (t.name.find("attn_v.weight") != std::string::npos) {
      if (more_bits(v_index++, v_count)) want = GgmlType::kQ6_K;
    } else if (t.name.find("ffn_down.weight") != std::string::npos) {
      if (more_bits(layer, layers)) want = GgmlType::kQ6_K;
    }
    if (t.ne.size() > 1 && t.ne[0] % 256 != 0) {
      if (want == GgmlType::kQ4_K) want = GgmlType::kQ5_0;
      if (want == GgmlType::kQ6_K) want = GgmlType::kQ8_0;
    }
    EXPECT_EQ(t.type, want) << t.name << " is " << GgmlTypeOf(t.type).name;
    ++seen[t.type];
  }
  EXPECT_EQ(v_index, v_count);
  // The tiny model's rows of 128 and 512/1024 take every branch: Q4_K, Q6_K, Q5_0, Q8_0.
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kQ8_0})
    EXPECT_GT(seen[t], 0) << GgmlTypeOf(t).name;
  fs::remove_all(dir);
}

// A model that cannot be written (a NaN in it) leaves neither the file nor a temporary behind.
TEST(GgufExport, BrokenModelLeavesNothingBehind) {
  const Gemma4Config cfg = LlamaCppTiny();
  LoadedModel m;
  m.config = cfg;
  m.registry = BuildParamRegistry(cfg);
  AlignedBuffer arena(m.registry.layout.total());
  InitParams(cfg, m.registry, arena.data(), 3);
  const ArenaEntry& down = m.registry.layout.entry(m.registry.layers[4].down_proj);
  arena.data()[down.offset + 17] = std::nanf("");
  m.weights = std::make_unique<ArenaWeights>(m.registry, arena.data());
  const std::string dir = test::TempDir("gguf_export_nan");
  GgufExportOptions o;
  o.output = dir + "/m.gguf";
  o.tokenizer_dir = kTokenizer;
  const Status s = ExportGguf(m, o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers.4.mlp.down_proj.weight"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s.message();
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// A LoRA adapter alone: llama.cpp's names ("<matrix>.lora_a" [in, R], ".lora_b" [R, out] in GGUF
// dims), alpha such that llama.cpp's alpha / rank is PEFT's scaling (rsLoRA included), the values
// exactly (f32); adapters llama.cpp would apply only in part are refused.
TEST(GgufExport, LoraAdapterAloneInLlamaCppsLayout) {
  const std::string dir = test::TempDir("gguf_export_lora");
  for (const bool rslora : {false, true}) {
    LoadedModel m = PresetModel(LlamaCppTiny());
    PeftAdapterConfig c;
    c.r = 4;
    c.lora_alpha = 8;
    c.use_rslora = rslora;
    c.targets = ParseLoraTargets("q_proj,down_proj,per_layer_projection");
    StatusOr<LoraSpec> spec = LoraSpecFor(m.config, m.registry, c);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(AttachLora(&m, *spec, 5).ok());
    GgufExportOptions o;
    o.output = dir + (rslora ? "/rs.gguf" : "/lora.gguf");
    o.weight_type = GgmlType::kF32;
    o.name = "adapter";
    StatusOr<GgufExportReport> r = ExportGgufLora(m, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    StatusOr<GgufFile> f = GgufFile::Open(o.output);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(Meta(*f, "general.type").s, "adapter");
    EXPECT_EQ(Meta(*f, "adapter.type").s, "lora");
    EXPECT_EQ(Meta(*f, "general.architecture").s, "gemma4");
    const double scaling = rslora ? 8 / std::sqrt(4.0) : 8 / 4.0;
    EXPECT_NEAR(Meta(*f, "adapter.lora.alpha").f / 4, scaling, 1e-6);
    EXPECT_EQ(f->FindTensor("rope_freqs.weight"), nullptr);
    ASSERT_EQ(f->tensors().size(), 2u * 6 * 3);
    const ParamRegistry& reg = m.registry;
    for (int e = 0; e < reg.base_entries; ++e) {
      const int a = reg.lora_a[static_cast<size_t>(e)];
      if (a < 0) continue;
      const std::string base = GgufTensorName(reg.layout.entry(e).name);
      for (const auto& [entry, suffix] : {std::pair<int, std::string>{a, ".lora_a"},
                                          {reg.lora_b[static_cast<size_t>(e)], ".lora_b"}}) {
        const ArenaEntry& en = reg.layout.entry(entry);
        const GgufTensorInfo* t = f->FindTensor(base + suffix);
        ASSERT_NE(t, nullptr) << base << suffix;
        EXPECT_EQ(t->TorchShape(), en.shape);
        std::vector<float> want(static_cast<size_t>(en.numel)), got(want.size());
        m.weights->ReadAll(entry, want.data());
        f->ReadF32(*t, got.data());
        EXPECT_EQ(want, got) << base << suffix;
      }
    }
    EXPECT_EQ(f->FindTensor("blk.0.attn_q.weight.lora_a")->ne,
              (std::vector<int64_t>{128, 4}));  // A [R, in] as GGUF dims
    EXPECT_EQ(f->FindTensor("blk.0.attn_q.weight.lora_b")->ne, (std::vector<int64_t>{4, 128}));
  }
  // A pair on per_layer_model_projection (llama.cpp multiplies by it without LoRA) and full
  // modules_to_save are refused, and leave no file.
  for (const char* targets : {"q_proj,per_layer_model_projection", ""}) {
    LoadedModel m = PresetModel(LlamaCppTiny());
    PeftAdapterConfig c;
    c.r = 4;
    c.lora_alpha = 8;
    c.targets = ParseLoraTargets(*targets ? targets : "q_proj");
    if (!*targets) c.modules_to_save = {"input_layernorm"};
    StatusOr<LoraSpec> spec = LoraSpecFor(m.config, m.registry, c);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(AttachLora(&m, *spec, 5).ok());
    GgufExportOptions o;
    o.output = dir + "/refused.gguf";
    const Status s = ExportGgufLora(m, o).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--format gguf"), std::string::npos) << s.message();
    EXPECT_FALSE(fs::exists(o.output));
  }
  // Without an adapter there is nothing to write.
  GgufExportOptions o;
  o.output = dir + "/none.gguf";
  EXPECT_EQ(ExportGgufLora(PresetModel(LlamaCppTiny()), o).status().code(),
            StatusCode::kInvalidArgument);
  const test::Ran cli = test::RunCommand(
      kBin + " export --model-id gemma4-tiny --format gguf-lora --output " + dir + "/cli.gguf");
  EXPECT_EQ(cli.code, 2) << cli.out;
  EXPECT_NE(cli.out.find("--adapter"), std::string::npos) << cli.out;
  const test::Ran ollama =
      test::RunCommand(kBin + " export --model-id gemma4-tiny --adapter " + dir +
                       " --format gguf-lora --ollama --output " + dir + "/cli.gguf");
  EXPECT_EQ(ollama.code, 2) << ollama.out;
  EXPECT_NE(ollama.out.find("--ollama"), std::string::npos) << ollama.out;
  fs::remove_all(dir);
}

// The command: a checkpoint directory in, one file (and a Modelfile) out, one error line for what
// cannot be done.
TEST(GgufExport, CommandWritesTheFileAndAModelfile) {
  const Gemma4Config cfg = LlamaCppTiny();
  const LoadedModel m = PresetModel(cfg);
  const std::string dir = test::TempDir("gguf_export_cli");
  const std::string model = dir + "/model";
  AlignedBuffer params = MaterializeParams(m);
  ASSERT_TRUE(SaveHfModel(model, cfg, m.registry, params.data(), DType::kBF16).ok());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kTokenizer + std::string("/") + f, model + "/" + f);
  const std::string out = dir + "/out/tiny-q8.gguf";
  const test::Ran ran = test::RunCommand(kBin + " export --model-id " + model +
                                         " --format gguf --quant q8_0 --ollama --output " + out);
  ASSERT_EQ(ran.code, 0) << ran.out;
  EXPECT_NE(ran.out.find("GGUF gemma4, 102 tensors (49 F32, 53 Q8_0)"), std::string::npos)
      << ran.out;
  EXPECT_NE(ran.out.find("Checked after reload"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("newline"), std::string::npos) << ran.out;  // the bundled tokenizer's
  StatusOr<GgufFile> f = GgufFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(Meta(*f, "general.name").s, "model");
  const std::string modelfile = test::ReadFile(dir + "/out/Modelfile");
  EXPECT_NE(modelfile.find("FROM ./tiny-q8.gguf"), std::string::npos) << modelfile;
  EXPECT_NE(modelfile.find("PARAMETER stop \"<turn|>\""), std::string::npos) << modelfile;
  EXPECT_NE(modelfile.find("<|turn>model"), std::string::npos) << modelfile;

  // A second --ollama export into the same directory would overwrite the Modelfile: refused
  // before anything is written.
  const test::Ran twice =
      test::RunCommand(kBin + " export --model-id " + model + " --format gguf --ollama --output " +
                       dir + "/out/other.gguf");
  EXPECT_EQ(twice.code, 2) << twice.out;
  EXPECT_NE(twice.out.find("Modelfile exists"), std::string::npos) << twice.out;
  EXPECT_FALSE(fs::exists(dir + "/out/other.gguf"));
  // Again onto the same path: refused, the file kept.
  const test::Ran again =
      test::RunCommand(kBin + " export --model-id " + model + " --format gguf --output " + out);
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("exists"), std::string::npos) << again.out;
  EXPECT_TRUE(GgufFile::Open(out).ok());
  // One error line each, and no file: a mixture not written, an option of the other format
  // (refused rather than ignored), the mixture for an adapter, a layout llama.cpp cannot run.
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {model + " --format gguf --quant q5_k_m", "use q4_k_m, q6_k, q8_0 or q4_0"},
           {model + " --adapter " + model + " --quant q8_0", "are for --format gguf"},
           {model + " --format gguf --max-shard-size 1GB", "are for --format hf"},
           {model + " --adapter " + model + " --format gguf-lora --quant q4_k_m", "one type"},
           {"gemma4-small --format gguf", "llama.cpp cannot run this model"}}) {
    SCOPED_TRACE(flags);
    const test::Ran r =
        test::RunCommand(kBin + " export --model-id " + flags + " --output " + dir + "/k.gguf");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir + "/k.gguf"));
  }
  // A preset exports with the bundled tokenizer.
  const test::Ran preset = test::RunCommand(kBin + " export --model-id gemma4-tiny --format gguf " +
                                            "--quant f16 --output " + dir + "/t.gguf");
  EXPECT_EQ(preset.code, 0) << preset.out;
  EXPECT_TRUE(GgufFile::Open(dir + "/t.gguf").ok());
  const test::Ran hf =
      test::RunCommand(kBin + " export --model-id " + model + " --output " + dir + "/hf");
  EXPECT_EQ(hf.code, 2) << hf.out;
  EXPECT_NE(hf.out.find("--adapter"), std::string::npos) << hf.out;
  fs::remove_all(dir);
}

// m exported in q4_k_m to `path`, then loaded back as a model (LoadModel of the file).
StatusOr<LoadedModel> ExportQ4KMAndLoad(const LoadedModel& m, const std::string& path) {
  GgufExportOptions o;
  o.output = path;
  o.weight_type = GgmlType::kQ4_K;
  o.q4_k_m = true;
  o.tokenizer_dir = kTokenizer;
  o.name = "tiny";
  ST_RETURN_IF_ERROR(ExportGguf(m, o).status());
  return LoadModel(path, 0);
}

// A GGUF model read back (io/gguf_model.h): the config from the metadata is the exported model's,
// each tensor is stored in the type the export chose and reads back as its stored values (ranges
// that start and end inside rows included), vectors exactly.
TEST(GgufModel, ConfigAndTensorsReadBackFromAnExport) {
  const Gemma4Config cfg = LlamaCppTiny();
  const LoadedModel m = PresetModel(cfg);
  const std::string dir = test::TempDir("gguf_model_read");
  StatusOr<LoadedModel> g = ExportQ4KMAndLoad(m, dir + "/m.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  const Gemma4Config& c = g->config;
  EXPECT_EQ(c.num_hidden_layers, cfg.num_hidden_layers);
  EXPECT_EQ(c.hidden_size, cfg.hidden_size);
  EXPECT_EQ(c.intermediate_size, cfg.intermediate_size);
  EXPECT_EQ(c.use_double_wide_mlp, cfg.use_double_wide_mlp);
  EXPECT_EQ(c.num_attention_heads, cfg.num_attention_heads);
  EXPECT_EQ(c.num_key_value_heads, cfg.num_key_value_heads);
  EXPECT_EQ(c.head_dim, cfg.head_dim);
  EXPECT_EQ(c.global_head_dim, cfg.global_head_dim);
  EXPECT_EQ(c.hidden_size_per_layer_input, cfg.hidden_size_per_layer_input);
  EXPECT_EQ(c.vocab_size, cfg.vocab_size);
  EXPECT_EQ(c.vocab_size_per_layer_input, cfg.vocab_size_per_layer_input);
  EXPECT_EQ(c.num_kv_shared_layers, cfg.num_kv_shared_layers);
  EXPECT_EQ(c.sliding_window, cfg.sliding_window);
  EXPECT_EQ(c.layer_types, cfg.layer_types);
  EXPECT_EQ(c.max_position_embeddings, cfg.max_position_embeddings);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), static_cast<float>(cfg.rms_norm_eps));
  EXPECT_FLOAT_EQ(static_cast<float>(c.final_logit_softcapping),
                  static_cast<float>(cfg.final_logit_softcapping));
  EXPECT_EQ(c.rope_full.rope_type, "proportional");
  EXPECT_DOUBLE_EQ(c.rope_full.partial_rotary_factor, cfg.rope_full.partial_rotary_factor);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rope_full.theta), static_cast<float>(cfg.rope_full.theta));
  EXPECT_FLOAT_EQ(static_cast<float>(c.rope_sliding.theta),
                  static_cast<float>(cfg.rope_sliding.theta));
  EXPECT_EQ(c.bos_token_id, 2);
  ASSERT_EQ(g->registry.layout.total(), m.registry.layout.total());

  const std::vector<GgmlType> types =
      GgufMatrixTypes(m.registry, cfg.num_hidden_layers, GgufQuant{GgmlType::kQ4_K, true});
  for (int e = 0; e < m.registry.base_entries; ++e) {
    const ArenaEntry& a = m.registry.layout.entry(e);
    SCOPED_TRACE(a.name);
    const std::optional<WeightSource::StoredBlocks> st = g->weights->StoredGgml(e);
    ASSERT_TRUE(st.has_value());
    std::vector<float> want(static_cast<size_t>(a.numel));
    m.weights->ReadAll(e, want.data());
    if (a.shape.size() < 2) {
      EXPECT_EQ(st->type, GgmlType::kF32);
      std::vector<float> got(want.size());
      g->weights->ReadAll(e, got.data());
      EXPECT_EQ(got, want);
      continue;
    }
    EXPECT_EQ(st->type, types[static_cast<size_t>(e)]);
    const int64_t cols = a.shape[1];
    const size_t row_bytes = GgmlRowBytes(st->type, cols);
    std::vector<float> stored(want.size());
    for (int64_t r = 0; r < a.shape[0]; ++r)
      DequantizeRow(st->type, st->data + r * row_bytes, cols, stored.data() + r * cols);
    const int64_t begin = cols / 2 + 3, count = std::min<int64_t>(a.numel - begin, 2 * cols + 5);
    std::vector<float> got(static_cast<size_t>(count));
    g->weights->Read(e, begin, count, got.data());
    EXPECT_EQ(got, std::vector<float>(stored.begin() + begin, stored.begin() + begin + count));
  }
}

// A GGUF file's quantized matrices are decoded as stored: the file's blocks are the bytes that
// quantizing the model's values on load gives (the same quantizers), so a decoder on the file and
// one on the preset quantized on load (with the per-layer table, which decoding reads row by row
// from the source, given the file's quantized values) hold the same bytes and compute the same
// logits, step after step.
TEST(GgufModel, DecodesTheFilesBlocksAsStored) {
  const Gemma4Config cfg = LlamaCppTiny();
  const LoadedModel m = PresetModel(cfg);
  const std::string dir = test::TempDir("gguf_model_decode");
  StatusOr<LoadedModel> g = ExportQ4KMAndLoad(m, dir + "/m.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();

  DecodeWeights::BlockStorage stored;
  stored.types.assign(static_cast<size_t>(g->registry.layout.size()), GgmlType::kF32);
  for (int e = 0; e < g->registry.base_entries; ++e)
    if (g->registry.layout.entry(e).shape.size() == 2)
      stored.types[static_cast<size_t>(e)] = g->weights->StoredGgml(e)->type;
  const DecodeWeights from_file(g->registry, *g->weights, stored);

  AlignedBuffer params = MaterializeParams(m);
  const ArenaEntry& ple = m.registry.layout.entry(m.registry.embed_tokens_per_layer);
  g->weights->ReadAll(m.registry.embed_tokens_per_layer, params.data() + ple.offset);
  const ArenaWeights preset(m.registry, params.data());
  DecodeWeights::BlockStorage mixture;
  mixture.types =
      GgufMatrixTypes(m.registry, cfg.num_hidden_layers, GgufQuant{GgmlType::kQ4_K, true});
  const DecodeWeights on_load(m.registry, preset, mixture);
  EXPECT_EQ(mixture.types, stored.types);
  for (int e = 0; e < m.registry.base_entries; ++e) {
    const ArenaEntry& a = m.registry.layout.entry(e);
    if (from_file.blocks(e) == nullptr) continue;
    SCOPED_TRACE(a.name);
    ASSERT_NE(on_load.blocks(e), nullptr);
    const size_t bytes = GgmlRowBytes(from_file.block_type(e), a.shape[1]) * a.shape[0];
    EXPECT_EQ(std::memcmp(from_file.blocks(e), on_load.blocks(e), bytes), 0);
  }

  Gemma4Decoder a(g->config, g->registry, from_file, 64, 8);
  Gemma4Decoder b(cfg, m.registry, on_load, 64, 8);
  std::vector<int32_t> ids = {2, 105, 2364, 107, 7, 99, 1234, 4321, 17};
  std::vector<float> la(static_cast<size_t>(cfg.vocab_size)), lb(la.size());
  ASSERT_TRUE(a.Append(ids, la.data()).ok());
  ASSERT_TRUE(b.Append(ids, lb.data()).ok());
  for (int step = 0; step < 12; ++step) {
    EXPECT_EQ(la, lb) << "step " << step;
    const int32_t next = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
    ASSERT_TRUE(a.Append({&next, 1}, la.data()).ok());
    ASSERT_TRUE(b.Append({&next, 1}, lb.data()).ok());
  }
  fs::remove_all(dir);
}

// The commands on a GGUF model: `generate` on an f32 export gives the preset's tokens (the config
// read back from the metadata is the model's), and runs on a q4_k_m export with the file's own
// vocabulary as its tokenizer; `evaluate` gives the preset's loss on the f32 export; finetune
// refuses GGUF with one line.
TEST(GgufModel, CommandsReadTheFile) {
  const std::string dir = test::TempDir("gguf_model_cli");
  for (const char* quant : {"f32", "q4_k_m"}) {
    const test::Ran ex =
        test::RunCommand(kBin + " export --model-id gemma4-tiny --format gguf " + "--quant " +
                         quant + " --output " + dir + "/" + quant + ".gguf");
    ASSERT_EQ(ex.code, 0) << ex.out;
  }
  const std::string gen =
      " generate --threads 1 --max-new-tokens 12 --json --prompt "
      "'Name three colors' --tokenizer " +
      kTokenizer + " --model-id ";
  // A command that must succeed and print one JSON object.
  auto json_of = [](const std::string& cmd) {
    const test::Ran r = test::RunCommand(kBin + cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << cmd << "\n" << r.out;
    return j.is_object() ? j : nlohmann::json::object();
  };
  const nlohmann::json a = json_of(gen + dir + "/f32.gguf");
  const nlohmann::json b = json_of(gen + "gemma4-tiny --weights-dtype fp32");
  EXPECT_EQ(a.value("token_ids", nlohmann::json()), b.value("token_ids", nlohmann::json()));
  EXPECT_EQ(a.value("token_ids", nlohmann::json::array()).size(), 12u);
  const nlohmann::json own =
      json_of(" generate --threads 1 --max-new-tokens 4 --json --prompt hi --model-id " + dir +
              "/q4_k_m.gguf");
  EXPECT_GT(own.value("new_tokens", 0), 0);

  const std::string eval = " evaluate --data-dir " ST_SOURCE_DIR
                           "/data --dataset-split 'train[:8]' --max-seq-len 64 --json "
                           "--tokenizer " +
                           kTokenizer + " --model-id ";
  const nlohmann::json jf = json_of(eval + dir + "/f32.gguf");
  const nlohmann::json jp = json_of(eval + "gemma4-tiny");
  ASSERT_TRUE(jf.contains("loss") && jp.contains("loss"));
  EXPECT_NEAR(jf["loss"].get<double>(), jp["loss"].get<double>(), 1e-5);
  const test::Ran ft = test::RunCommand(kBin + " finetune --model-id " + dir + "/f32.gguf");
  EXPECT_NE(ft.code, 0);
  EXPECT_NE(ft.out.find("is a GGUF file"), std::string::npos) << ft.out;
  fs::remove_all(dir);
}

// A GGUF file that is not a gemma4 model, or lacks a tensor, is one line.
TEST(GgufModel, OtherFilesAreOneLineEach) {
  const std::string dir = test::TempDir("gguf_model_bad");
  auto write = [&](const std::string& name, const std::string& arch, bool with_tensor) {
    GgufWriter w;
    w.Set("general.architecture", GgufValue::String(arch));
    if (with_tensor) {
      EXPECT_TRUE(w.AddTensor("token_embd.weight", {4, 8}, GgmlType::kF32).ok());
    }
    const std::string path = dir + "/" + name;
    EXPECT_TRUE(w.Write(path, [](size_t, const GgufWriter::PutFn& put) {
                   std::vector<float> z(32, 0.0f);
                   return put(z.data(), z.size() * sizeof(float));
                 }).ok());
    EXPECT_TRUE(w.Commit().ok());
    return path;
  };
  const StatusOr<LoadedModel> llama = LoadModel(write("llama.gguf", "llama", true), 0);
  ASSERT_FALSE(llama.ok());
  EXPECT_NE(llama.status().message().find("'llama' model"), std::string::npos)
      << llama.status().message();
  const StatusOr<LoadedModel> bare = LoadModel(write("bare.gguf", "gemma4", false), 0);
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("gemma4.block_count"), std::string::npos)
      << bare.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace st
