// GGUF files and ggml's quantization blocks against the `gguf` package, llama.cpp's own Python
// library (goldens from tools/make_gguf_fixtures.py): quantized bytes equal for F16, BF16, Q8_0 and
// Q4_0, dequantized values equal for those and Q4_K/Q6_K; a file written by gguf.GGUFWriter reads
// back field for field and our writer reproduces its bytes; broken files are one line each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"
#include "kernels/cpu/quant.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
const std::string kDir = ST_FIXTURE_DIR "/gguf/";

std::vector<uint8_t> Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

std::vector<float> Floats(const std::string& path) {
  const std::vector<uint8_t> b = Bytes(path);
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST(Quant, FloatAndBlockFormatsEqualGgufsReference) {
  const std::vector<float> x = Floats(kDir + "values.f32");
  ASSERT_EQ(x.size(), 8u * 256);
  for (const char* name : {"f16", "bf16", "q8_0", "q4_0", "q5_0"}) {
    SCOPED_TRACE(name);
    const GgmlType t = *ParseGgmlType(name);
    const std::vector<uint8_t> want = Bytes(kDir + "quant." + name);
    const std::vector<float> want_f = Floats(kDir + "dequant." + name);
    const size_t row_bytes = GgmlRowBytes(t, 256);
    ASSERT_EQ(want.size(), 8 * row_bytes);
    ASSERT_EQ(want_f.size(), x.size());
    for (int r = 0; r < 8; ++r) {
      std::vector<uint8_t> got(row_bytes);
      ASSERT_TRUE(QuantizeRow(t, x.data() + r * 256, 256, got.data()));
      EXPECT_EQ(std::memcmp(got.data(), want.data() + r * row_bytes, row_bytes), 0)
          << "row " << r << " differs";
      std::vector<float> back(256);
      DequantizeRow(t, want.data() + r * row_bytes, 256, back.data());
      for (int j = 0; j < 256; ++j)
        ASSERT_EQ(back[j], want_f[r * 256 + j]) << "row " << r << " value " << j;
    }
  }
}

// The K-quants' quantizers against ggml's own C reference (quantize_row_q4_K_ref,
// quantize_row_q6_K_ref, through llama-cpp-python; tools/make_gguf_fixtures.py): byte for byte
// on 64 super-blocks that take their searches down every path, and the dequantized values as
// ggml's dequantize_row_q4_K / _q6_K give them.
TEST(Quant, KQuantsEqualGgmlsReferenceQuantizers) {
  const std::vector<float> x = Floats(kDir + "kvalues.f32");
  ASSERT_EQ(x.size(), 64u * 256);
  for (const char* name : {"q4_k", "q6_k"}) {
    SCOPED_TRACE(name);
    const GgmlType t = *ParseGgmlType(name);
    const std::vector<uint8_t> want = Bytes(kDir + "quant." + name);
    const std::vector<float> want_f = Floats(kDir + "kdequant." + name);
    const size_t row_bytes = GgmlRowBytes(t, 256);
    ASSERT_EQ(want.size(), 64 * row_bytes);
    int differing = 0;
    for (int r = 0; r < 64; ++r) {
      std::vector<uint8_t> got(row_bytes);
      ASSERT_TRUE(QuantizeRow(t, x.data() + r * 256, 256, got.data()));
      if (std::memcmp(got.data(), want.data() + r * row_bytes, row_bytes) != 0) {
        ++differing;
        ADD_FAILURE() << "super-block " << r << " differs from ggml's";
      }
      std::vector<float> back(256);
      DequantizeRow(t, want.data() + r * row_bytes, 256, back.data());
      for (int j = 0; j < 256; ++j)
        ASSERT_EQ(back[j], want_f[r * 256 + j]) << "row " << r << " value " << j;
    }
    EXPECT_EQ(differing, 0);
  }
}

// gguf (numpy) dequantizes the K-quants too: random super-blocks agree with it. Tolerance 1e-5:
// numpy may order d * scale * q - dmin * min differently.
TEST(Quant, KQuantsDequantizeAsGguf) {
  for (const char* name : {"q4_k", "q6_k"}) {
    SCOPED_TRACE(name);
    const GgmlType t = *ParseGgmlType(name);
    const std::vector<uint8_t> blocks = Bytes(kDir + "blocks." + name);
    const std::vector<float> want = Floats(kDir + "dequant." + name);
    ASSERT_EQ(blocks.size(), GgmlRowBytes(t, 1024));
    std::vector<float> got(1024);
    DequantizeRow(t, blocks.data(), 1024, got.data());
    for (int j = 0; j < 1024; ++j) EXPECT_NEAR(got[j], want[j], 1e-5) << j;
  }
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 100), 0u);  // not a whole number of blocks
  std::vector<float> row(100, 1.0f);
  std::vector<uint8_t> out(1000);
  EXPECT_FALSE(QuantizeRow(GgmlType::kQ4_K, row.data(), 100, out.data()));
  EXPECT_FALSE(ParseGgmlType("q5_k").has_value());
}

// The error bound of the block formats: every value within half a step of its block's scale
// (the scale itself rounded to fp16), for random rows of several magnitudes.
TEST(Quant, RoundTripsStayWithinHalfAStep) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const int64_t n = 4096;
    std::vector<float> x(n), back(n);
    for (int64_t i = 0; i < n; ++i) x[i] = normal(gen) * std::exp2(float(i / 512) - 4);
    std::vector<uint8_t> q(GgmlRowBytes(t, n));
    ASSERT_TRUE(QuantizeRow(t, x.data(), n, q.data()));
    DequantizeRow(t, q.data(), n, back.data());
    const int64_t bb = GgmlTypeOf(t).block_bytes;
    for (int64_t b = 0; b < n / 32; ++b) {
      uint16_t h;
      std::memcpy(&h, q.data() + b * bb, 2);
      const float d = std::fabs(HalfToFloat(h));
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      // Q4_0's grid reaches only +7 d on the side opposite the largest value: up to one step there.
      const float bound = (t == GgmlType::kQ8_0 ? 0.5f : 1.0f) * d + 2e-3f * amax;
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), bound)
            << GgmlTypeOf(t).name << " block " << b << " value " << j;
    }
  }
}

TEST(Gguf, ReadsEveryFieldOfAFileTheGgufPackageWrote) {
  auto f = GgufFile::Open(kDir + "writer.gguf");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const auto desc = nlohmann::json::parse(std::ifstream(kDir + "writer.json"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  ASSERT_EQ(f->metadata().size(), desc["metadata"].size());
  for (size_t k = 0; k < f->metadata().size(); ++k) {
    const auto& [key, v] = f->metadata()[k];
    const auto& want = desc["metadata"][k];
    SCOPED_TRACE(key);
    EXPECT_EQ(key, want["key"].get<std::string>());
    std::string type = GgufValueTypeName(v.type);
    for (char& ch : type) ch = static_cast<char>(std::toupper(ch));
    EXPECT_EQ(type, want["type"].get<std::string>());
    const auto& value = want["value"];
    switch (v.type) {
      case GgufValueType::kString:
        EXPECT_EQ(v.s, value.get<std::string>());
        break;
      case GgufValueType::kF32:
      case GgufValueType::kF64:
        EXPECT_EQ(v.f, value.get<double>());
        break;
      case GgufValueType::kBool:
        EXPECT_EQ(v.i != 0, value.get<bool>());
        break;
      case GgufValueType::kU64:
        EXPECT_EQ(static_cast<uint64_t>(v.i), std::stoull(value.get<std::string>()));
        break;
      case GgufValueType::kArray:
        ASSERT_EQ(v.ArraySize(), value.size());
        for (size_t e = 0; e < value.size(); ++e) {
          if (v.elem == GgufValueType::kString)
            EXPECT_EQ(v.strings[e], value[e].get<std::string>());
          else if (v.elem == GgufValueType::kF32)
            EXPECT_EQ(v.floats[e], value[e].get<double>());
          else
            EXPECT_EQ(v.ints[e], value[e].get<int64_t>());
        }
        break;
      default:
        EXPECT_EQ(v.i, value.get<int64_t>());
    }
  }
  ASSERT_EQ(f->tensors().size(), desc["tensors"].size());
  for (size_t k = 0; k < f->tensors().size(); ++k) {
    const GgufTensorInfo& t = f->tensors()[k];
    const auto& want = desc["tensors"][k];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, want["name"].get<std::string>());
    EXPECT_EQ(t.ne, want["ne"].get<std::vector<int64_t>>());
    EXPECT_EQ(std::string(GgmlTypeOf(t.type).name), want["type"].get<std::string>());
    std::vector<float> values(t.Elements());
    f->ReadF32(t, values.data());
    EXPECT_EQ(values, want["values"].get<std::vector<float>>());
  }
  EXPECT_EQ(f->FindTensor("b")->TorchShape(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(f->Find("general.architecture")->s, "slicetrain-test");
  EXPECT_EQ(f->Find("nope"), nullptr);
}

TEST(Gguf, OurWriterReproducesTheGgufPackagesBytes) {
  auto f = GgufFile::Open(kDir + "writer.gguf");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::string dir = test::TempDir("gguf_writer");
  const std::string out = dir + "/copy.gguf";
  {
    GgufWriter w;
    for (const auto& [key, v] : f->metadata()) w.Set(key, v);
    for (const GgufTensorInfo& t : f->tensors())
      ASSERT_TRUE(w.AddTensor(t.name, t.ne, t.type).ok());
    // Each tensor in two pieces, as an exporter streaming rows gives them.
    const Status s = w.Write(out, [&](size_t i, const GgufWriter::PutFn& put) {
      const GgufTensorInfo& t = f->tensors()[i];
      ST_RETURN_IF_ERROR(put(f->Data(t), t.bytes / 2));
      return put(f->Data(t) + t.bytes / 2, t.bytes - t.bytes / 2);
    });
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_FALSE(fs::exists(out));  // nothing at the final path before Commit
    ASSERT_TRUE(fs::exists(w.temporary_path()));
    ASSERT_TRUE(w.Commit().ok());
  }
  EXPECT_EQ(Bytes(out), Bytes(kDir + "writer.gguf"));
  // A write that fails half-way leaves neither the file nor its temporary behind.
  const std::string failed = dir + "/failed.gguf";
  {
    GgufWriter w;
    w.Set("general.architecture", GgufValue::String("x"));
    ASSERT_TRUE(w.AddTensor("t", {32, 2}, GgmlType::kQ8_0).ok());
    ASSERT_TRUE(w.AddTensor("u", {4}, GgmlType::kF32).ok());
    const std::vector<uint8_t> zeros(68, 0);
    const Status s = w.Write(failed, [&](size_t i, const GgufWriter::PutFn& put) {
      if (i == 1) return IoError("the source went away");
      return put(zeros.data(), zeros.size());
    });
    EXPECT_FALSE(s.ok());
    // A tensor given too few or too many bytes is refused, not written out of place.
    GgufWriter short_writer, long_writer;
    ASSERT_TRUE(short_writer.AddTensor("t", {32, 2}, GgmlType::kQ8_0).ok());
    ASSERT_TRUE(long_writer.AddTensor("t", {32, 2}, GgmlType::kQ8_0).ok());
    EXPECT_FALSE(
        short_writer
            .Write(failed,
                   [&](size_t, const GgufWriter::PutFn& put) { return put(zeros.data(), 67); })
            .ok());
    EXPECT_FALSE(long_writer
                     .Write(failed,
                            [&](size_t, const GgufWriter::PutFn& put) {
                              ST_RETURN_IF_ERROR(put(zeros.data(), 68));
                              return put(zeros.data(), 1);
                            })
                     .ok());
  }
  EXPECT_FALSE(fs::exists(failed));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find("failed.gguf.tmp"), std::string::npos);
  // A tensor whose rows are not whole blocks is refused when added.
  GgufWriter w;
  const Status bad = w.AddTensor("odd", {33, 2}, GgmlType::kQ8_0);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("not a whole number of Q8_0 blocks"), std::string::npos);
  fs::remove_all(dir);
}

// Position of tensor `name`'s info (its name's length field) in a file's bytes.
size_t TensorInfoAt(const std::vector<uint8_t>& b, const std::string& name) {
  std::vector<uint8_t> pat(8, 0);
  pat[0] = static_cast<uint8_t>(name.size());
  pat.insert(pat.end(), name.begin(), name.end());
  auto it = std::search(b.begin(), b.end(), pat.begin(), pat.end());
  return static_cast<size_t>(it - b.begin());
}

template <typename T>
void Poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

TEST(Gguf, BrokenFilesAreOneLineEach) {
  const std::vector<uint8_t> good = Bytes(kDir + "writer.gguf");
  const std::string dir = test::TempDir("gguf_broken");
  const std::string path = dir + "/broken.gguf";
  auto expect_error = [&](const std::vector<uint8_t>& b, const std::string& phrase) {
    WriteBytes(path, b);
    auto f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "opened a file that should say: " << phrase;
    const std::string& m = f.status().message();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(phrase), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  std::vector<uint8_t> b = good;
  b[0] = 'X';
  expect_error(b, "not a GGUF file");
  b = good;
  Poke<uint32_t>(b, 4, 1);
  expect_error(b, "GGUF version 1");
  b = good;
  Poke<uint32_t>(b, 4, 0x03000000u);
  expect_error(b, "big-endian");
  b = good;
  Poke<uint64_t>(b, 16, uint64_t{1} << 40);  // metadata count
  expect_error(b, "more than its");
  b = good;
  Poke<uint64_t>(b, 24, uint64_t{1} << 50);  // the first key's length
  expect_error(b, "truncated file?");
  b = good;
  Poke<uint32_t>(b, 24 + 8 + 20, 99);  // general.architecture's value type
  expect_error(b, "value type 99");
  const size_t a = TensorInfoAt(good, "a");
  ASSERT_LT(a, good.size());
  b = good;
  Poke<uint32_t>(b, a + 9, 5);  // n_dims
  expect_error(b, "has 5 dimensions");
  b = good;
  Poke<uint32_t>(b, a + 9 + 4 + 16, 13);  // ggml type 13 (Q5_K)
  expect_error(b, "ggml type 13");
  b = good;
  Poke<uint64_t>(b, a + 9 + 4 + 16 + 4, 8);  // offset 8: not aligned
  expect_error(b, "not a multiple of the alignment 32");
  b = good;
  Poke<uint64_t>(b, a + 9 + 4 + 16 + 4, 32);  // onto tensor b
  expect_error(b, "overlap");
  b = good;
  b.resize(good.size() - 40);
  expect_error(b, "runs past the end of the data");
  b = good;
  b.resize(10);
  expect_error(b, "shorter than a GGUF header");
  // Every truncation and a thousand single-byte corruptions: an error or a valid file, never a
  // crash or a read out of bounds (the sanitizer build checks the latter).
  for (size_t n = 24; n < good.size(); n += 7) {
    WriteBytes(path, std::vector<uint8_t>(good.begin(), good.begin() + n));
    auto f = GgufFile::Open(path);
    if (!f.ok()) {
      EXPECT_EQ(f.status().message().find('\n'), std::string::npos);
    }
  }
  std::mt19937 gen(3);
  for (int k = 0; k < 1000; ++k) {
    b = good;
    b[gen() % b.size()] = static_cast<uint8_t>(gen());
    WriteBytes(path, b);
    auto f = GgufFile::Open(path);
    if (f.ok()) {
      for (const GgufTensorInfo& t : f->tensors()) {
        std::vector<float> v(t.Elements());
        f->ReadF32(t, v.data());
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace st
