// Tests for src/io/safetensors: round trips through the writer and reader, bf16/f16 rounding, and a
// table of broken files that must each give a clear Status rather than a crash or an OOB read.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A file image: 8-byte length of `header`, header, data.
std::string Image(const std::string& header, const std::string& data = "") {
  return Le64(header.size()) + header + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class SafeTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/slicetrain_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::string WriteRaw(const std::string& name, const std::string& bytes) const {
    std::string p = Path(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return p;
  }

  static std::string ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string dir_;
};

// ---- round trips ----

TEST_F(SafeTensorsTest, RoundTripF32IsBitExact) {
  std::vector<float> a = {0.0f,
                          -0.0f,
                          1.0f,
                          -3.25f,
                          1e-40f,  // subnormal
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  std::vector<float> b(6);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.5f * static_cast<float>(i) - 1.0f;
  std::string p = Path("f32.safetensors");
  ASSERT_TRUE(
      WriteSafeTensors(
          p, {{"a", DType::kF32, {8}, a.data()}, {"b.weight", DType::kF32, {2, 3}, b.data()}}, {})
          .ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "a");
  EXPECT_EQ(f->tensors()[0].dtype, "F32");
  EXPECT_EQ(f->tensors()[1].shape, (Shape{2, 3}));
  EXPECT_TRUE(f->metadata().empty());

  std::vector<float> ra(8), rb(6);
  ASSERT_TRUE(f->ReadF32("a", ra.data(), {8}).ok());
  ASSERT_TRUE(f->ReadF32("b.weight", rb.data(), {2, 3}).ok());
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), 8 * sizeof(float)), 0);
  EXPECT_EQ(rb, b);
  // An empty expected shape skips the check.
  ASSERT_TRUE(f->ReadF32("b.weight", rb.data(), {}).ok());
}

TEST_F(SafeTensorsTest, BF16RoundsToNearestEven) {
  const float one = 1.0f;
  std::vector<float> in = {
      one,
      one + std::ldexp(1.0f, -8),      // exactly halfway between 1 and 1+2^-7: ties to even, 1.0
      one + 3 * std::ldexp(1.0f, -9),  // above halfway: rounds up to 1+2^-7
      one + 3 * std::ldexp(1.0f, -8),  // halfway between 1+2^-7 (odd) and 1+2^-6: up to even
      one + std::ldexp(1.0f, -9),      // below halfway: down to 1.0
      -2.0f,
      0.1f,
  };
  std::vector<float> want = {
      one, one,   one + std::ldexp(1.0f, -7), one + std::ldexp(1.0f, -6),
      one, -2.0f, BF16ToFloat(0x3dcd)};  // 0.1f = 0x3dcccccd rounds up to 0x3dcd
  std::string p = Path("bf16.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"x", DType::kBF16, {7}, in.data()}}, {}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const SafeTensorInfo* t = f->Find("x");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "BF16");
  EXPECT_EQ(t->end - t->begin, 14u);
  // The stored bits, as torch would store them.
  const uint16_t* bits = static_cast<const uint16_t*>(f->Data(*t));
  EXPECT_EQ(bits[0], 0x3f80);
  EXPECT_EQ(bits[1], 0x3f80);
  EXPECT_EQ(bits[2], 0x3f81);
  EXPECT_EQ(bits[3], 0x3f82);
  EXPECT_EQ(bits[5], 0xc000);
  std::vector<float> out(7);
  ASSERT_TRUE(f->ReadF32("x", out.data(), {7}).ok());
  EXPECT_EQ(out, want);
}

TEST_F(SafeTensorsTest, F16RoundTripAndRounding) {
  const float one = 1.0f;
  std::vector<float> in = {
      one,
      -2.5f,
      65504.0f,                         // largest finite half
      std::ldexp(1.0f, -24),            // smallest subnormal half
      one + std::ldexp(1.0f, -11),      // halfway between 1 and 1+2^-10: ties to even, 1.0
      one + 3 * std::ldexp(1.0f, -11),  // halfway between 1+2^-10 (odd) and 1+2^-9: up to even
      0.1f,
      1e6f,  // overflows to inf
  };
  std::vector<float> want = {one,
                             -2.5f,
                             65504.0f,
                             std::ldexp(1.0f, -24),
                             one,
                             one + std::ldexp(1.0f, -9),
                             0.0999755859375f,  // nearest half to 0.1
                             std::numeric_limits<float>::infinity()};
  std::string p = Path("f16.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"h", DType::kF16, {2, 4}, in.data()}}, {}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->Find("h")->dtype, "F16");
  EXPECT_EQ(static_cast<const uint16_t*>(f->Data(*f->Find("h")))[0], 0x3c00);
  std::vector<float> out(8);
  ASSERT_TRUE(f->ReadF32("h", out.data(), {2, 4}).ok());
  EXPECT_EQ(out, want);
}

TEST_F(SafeTensorsTest, MetadataRoundTrip) {
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"step", "1200"},
      {"quote\"and\\slash", "line1\nline2\ttab"},
      {"unicode", "Gemma \xe2\x9c\x93 \xc3\xa9"},
      {"empty", ""},
  };
  std::vector<float> x = {1, 2};
  std::string p = Path("meta.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"x", DType::kF32, {2}, x.data()}}, meta).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), 1u);  // __metadata__ is not a tensor
  EXPECT_EQ(f->Find("__metadata__"), nullptr);
  // The reference layout: "__metadata__" comes first in the header.
  std::string bytes = ReadRaw(p);
  EXPECT_EQ(bytes.substr(8, 16), "{\"__metadata__\":");
}

TEST_F(SafeTensorsTest, ScalarShape) {
  float v = 42.5f;
  std::string p = Path("scalar.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p,
                               {{"s32", DType::kF32, {}, &v},
                                {"s16", DType::kBF16, {}, &v},
                                {"sh", DType::kF16, {}, &v}},
                               {})
                  .ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (const char* name : {"s32", "s16", "sh"}) {
    const SafeTensorInfo* t = f->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_TRUE(t->shape.empty()) << name;
    float out = 0;
    ASSERT_TRUE(f->ReadF32(name, &out, {}).ok()) << name;
    EXPECT_EQ(out, 42.5f) << name;
  }
  EXPECT_NE(ReadRaw(p).find("\"shape\":[]"), std::string::npos);
}

TEST_F(SafeTensorsTest, ZeroElementTensors) {
  std::vector<float> x = {1, 2, 3};
  std::string p = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p,
                               {{"e0", DType::kF32, {0}, nullptr},
                                {"x", DType::kBF16, {3}, x.data()},
                                {"e1", DType::kBF16, {4, 0, 2}, nullptr},
                                {"e2", DType::kF16, {0}, x.data()}},
                               {})
                  .ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->Find("e1")->shape, (Shape{4, 0, 2}));
  EXPECT_EQ(f->Find("e1")->begin, f->Find("e1")->end);
  float sentinel = -7.0f;
  EXPECT_TRUE(f->ReadF32("e0", &sentinel, {0}).ok());
  EXPECT_TRUE(f->ReadF32("e1", &sentinel, {4, 0, 2}).ok());
  EXPECT_TRUE(f->ReadF32("e2", nullptr, {0}).ok());
  EXPECT_EQ(sentinel, -7.0f);
  std::vector<float> out(3);
  ASSERT_TRUE(f->ReadF32("x", out.data(), {3}).ok());
  EXPECT_EQ(out, x);

  // A file with nothing but empty tensors has an empty data section.
  std::string p2 = Path("all_empty.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p2, {{"e", DType::kF32, {0, 5}, nullptr}}, {}).ok());
  StatusOr<SafeTensorsFile> f2 = SafeTensorsFile::Open(p2);
  ASSERT_TRUE(f2.ok()) << f2.status().ToString();
  EXPECT_EQ(f2->tensors().size(), 1u);
  EXPECT_TRUE(f2->ReadF32("e", nullptr, {0, 5}).ok());

  // And a file with no tensors at all is valid too.
  std::string p3 = Path("no_tensors.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p3, {}, {{"k", "v"}}).ok());
  StatusOr<SafeTensorsFile> f3 = SafeTensorsFile::Open(p3);
  ASSERT_TRUE(f3.ok()) << f3.status().ToString();
  EXPECT_TRUE(f3->tensors().empty());
  EXPECT_EQ(f3->metadata().at("k"), "v");
}

TEST_F(SafeTensorsTest, HeaderIsSpacePaddedTo8BytesAndDataAligned) {
  std::vector<float> x = {1, 2, 3};
  for (int name_len = 1; name_len <= 9; ++name_len) {
    std::string p = Path("pad.safetensors");
    std::string name(static_cast<size_t>(name_len), 'n');
    ASSERT_TRUE(WriteSafeTensors(p, {{name, DType::kF32, {3}, x.data()}}, {}).ok());
    std::string bytes = ReadRaw(p);
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 12);
    std::string header = bytes.substr(8, n);
    size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_LT(header.size() - close - 1, 8u);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->Data(*f->Find(name))) % 8, 0u);
  }
}

TEST_F(SafeTensorsTest, TensorsInDataOrderAndFind) {
  std::vector<float> x = {1, 2, 3, 4};
  std::string p = Path("order.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p,
                               {{"zeta", DType::kF32, {1}, x.data()},
                                {"alpha", DType::kBF16, {2}, x.data()},
                                {"mid", DType::kF32, {4}, x.data()}},
                               {})
                  .ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors()[0].name, "zeta");
  EXPECT_EQ(f->tensors()[1].name, "alpha");
  EXPECT_EQ(f->tensors()[2].name, "mid");
  EXPECT_EQ(f->Find("nope"), nullptr);
  EXPECT_EQ(f->Find("alpha"), &f->tensors()[1]);
  EXPECT_EQ(f->path(), p);

  // A header whose key order differs from the byte order (as Python writers produce) is reported in
  // byte order; the data section may also start unaligned and ReadF32 must cope.
  std::vector<uint16_t> b = {0x3f80, 0x4000};  // bf16 1, 2
  std::vector<float> c = {5.0f};
  std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
                       R"("c":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  if (header.size() % 2 == 0) header += " ";  // an odd header length leaves "b" unaligned
  std::string p2 = WriteRaw("python_order.safetensors", Image(header, Bytes(c) + Bytes(b)));
  StatusOr<SafeTensorsFile> g = SafeTensorsFile::Open(p2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors()[0].name, "c");
  EXPECT_EQ(g->tensors()[1].name, "b");
  EXPECT_NE(reinterpret_cast<uintptr_t>(g->Data(*g->Find("b"))) % 2, 0u);
  std::vector<float> out(2);
  ASSERT_TRUE(g->ReadF32("b", out.data(), {2}).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(SafeTensorsTest, MoveTransfersTheMapping) {
  std::vector<float> x = {1, 2};
  std::string p = Path("move.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"x", DType::kF32, {2}, x.data()}}, {{"k", "v"}}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok());
  SafeTensorsFile a = std::move(f).value();
  SafeTensorsFile b;
  b = std::move(a);
  EXPECT_TRUE(a.tensors().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.Find("x"), nullptr);   // NOLINT(bugprone-use-after-move)
  std::vector<float> out(2);
  ASSERT_TRUE(b.ReadF32("x", out.data(), {2}).ok());
  EXPECT_EQ(out, x);
  EXPECT_EQ(b.metadata().at("k"), "v");
  b = SafeTensorsFile();  // releases the mapping
  EXPECT_TRUE(b.tensors().empty());
}

// ---- reading errors that are not about corruption ----

TEST_F(SafeTensorsTest, ReadErrorsNameTheProblem) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::string p = Path("errs.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"w", DType::kBF16, {2, 3}, x.data()}}, {}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok());
  std::vector<float> out(6);

  Status s = f->ReadF32("w", out.data(), {3, 2});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 3]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[3, 2]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();

  s = f->ReadF32("missing", out.data(), {});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.message();

  std::vector<int32_t> ids(6);
  s = f->ReadI32("w", ids.data(), {2, 3});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("BF16"), std::string::npos) << s.message();

  s = SafeTensorsFile::Open(Path("does_not_exist.safetensors")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("does_not_exist"), std::string::npos) << s.message();

  s = SafeTensorsFile::Open(dir_).status();  // a directory
  EXPECT_FALSE(s.ok());
}

TEST_F(SafeTensorsTest, ReadI32FromIntegerDtypes) {
  std::vector<int64_t> i64 = {0, -5, 2147483647, -2147483648LL};
  std::vector<int32_t> i32 = {7, -8, 9};
  std::vector<uint8_t> u8 = {0, 200, 255};
  std::vector<uint8_t> bools = {1, 0, 1, 1};
  std::string data = Bytes(i64) + Bytes(i32) + Bytes(u8) + Bytes(bools);
  std::string header = R"({"i64":{"dtype":"I64","shape":[2,2],"data_offsets":[0,32]},)"
                       R"("i32":{"dtype":"I32","shape":[3],"data_offsets":[32,44]},)"
                       R"("u8":{"dtype":"U8","shape":[3],"data_offsets":[44,47]},)"
                       R"("mask":{"dtype":"BOOL","shape":[4],"data_offsets":[47,51]}})";
  std::string p = WriteRaw("ints.safetensors", Image(header, data));
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<int32_t> out(4);
  ASSERT_TRUE(f->ReadI32("i64", out.data(), {2, 2}).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, -5, 2147483647, -2147483647 - 1}));
  out.assign(3, 0);
  ASSERT_TRUE(f->ReadI32("i32", out.data(), {3}).ok());
  EXPECT_EQ(out, i32);
  ASSERT_TRUE(f->ReadI32("u8", out.data(), {3}).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 200, 255}));
  out.assign(4, 0);
  ASSERT_TRUE(f->ReadI32("mask", out.data(), {4}).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0, 1, 1}));
  // Integers are not floats.
  Status s = f->ReadF32("i64", reinterpret_cast<float*>(out.data()), {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("I64"), std::string::npos) << s.message();
}

TEST_F(SafeTensorsTest, ReadI32RejectsValuesOutsideInt32) {
  std::vector<int64_t> big = {1, 2147483648LL};
  std::vector<uint8_t> bad_bool = {0, 2};
  std::string header = R"({"big":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                       R"("bad_bool":{"dtype":"BOOL","shape":[2],"data_offsets":[16,18]}})";
  std::string p = WriteRaw("bigints.safetensors", Image(header, Bytes(big) + Bytes(bad_bool)));
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<int32_t> out(2);
  Status s = f->ReadI32("big", out.data(), {2});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("2147483648"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("element 1"), std::string::npos) << s.message();
  s = f->ReadI32("bad_bool", out.data(), {2});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("BOOL"), std::string::npos) << s.message();
}

// ---- writing ----

TEST_F(SafeTensorsTest, WriteIsAtomicAndOverwrites) {
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  std::string p = Path("ckpt.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p, {{"x", DType::kF32, {2}, a.data()}}, {}).ok());
  ASSERT_TRUE(WriteSafeTensors(p, {{"x", DType::kF32, {3}, b.data()}}, {}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
  ASSERT_TRUE(f.ok());
  std::vector<float> out(3);
  ASSERT_TRUE(f->ReadF32("x", out.data(), {3}).ok());
  EXPECT_EQ(out, b);
  // No temporary file is left behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "ckpt.safetensors");
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(SafeTensorsTest, WriteErrors) {
  std::vector<float> x = {1, 2};
  Status s =
      WriteSafeTensors(Path("no/such/dir/x.safetensors"), {{"x", DType::kF32, {2}, x.data()}}, {});
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos) << s.message();

  std::string p = Path("bad.safetensors");
  s = WriteSafeTensors(p, {{"x", DType::kF32, {2}, x.data()}, {"x", DType::kF32, {2}, x.data()}},
                       {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s.message();
  s = WriteSafeTensors(p, {{"x", DType::kF32, {2, -1}, x.data()}}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafeTensors(p, {{"x", DType::kF32, {2}, nullptr}}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafeTensors(p, {{"__metadata__", DType::kF32, {2}, x.data()}}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafeTensors(p, {{"x", DType::kF32, {2}, x.data()}}, {{"bad", "\xff\xfe"}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir_));
}

// ---- broken files ----

struct BrokenCase {
  const char* name;
  std::string bytes;
  const char* expect;  // a substring the message must contain
};

std::vector<BrokenCase> BrokenCases() {
  const std::string f32x2 = std::string(8, '\0');  // 2 floats of data
  auto entry = [](const std::string& body) { return "{\"t\":{" + body + "}}"; };
  return {
      {"empty file", "", "shorter than"},
      {"seven bytes", std::string(7, '\0'), "shorter than"},
      {"truncated header",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])")).substr(0, 30),
       "runs past the end"},
      {"huge header length", Le64(uint64_t{1} << 40) + "{}", "limit"},
      {"header length max u64", Le64(~uint64_t{0}) + "{}", "limit"},
      {"non-JSON header", Image("this is not json", f32x2), "not valid JSON"},
      {"binary header", Image(std::string("\x00\x01\x02\xff", 4)), "not valid JSON"},
      {"truncated JSON", Image(R"({"t":{"dtype":"F32")"), "not valid JSON"},
      {"invalid UTF-8", Image("{\"t\xff\":{}}"), "not valid JSON"},
      {"header is an array", Image("[1,2,3]"), "JSON object"},
      {"header is a string", Image("\"hello\""), "JSON object"},
      {"entry not an object", Image(R"({"t":[1,2]})"), "must be an object"},
      {"missing dtype", Image(entry(R"("shape":[2],"data_offsets":[0,8])"), f32x2), "\"dtype\""},
      {"missing shape", Image(entry(R"("dtype":"F32","data_offsets":[0,8])"), f32x2), "\"shape\""},
      {"missing data_offsets", Image(entry(R"("dtype":"F32","shape":[2])"), f32x2),
       "\"data_offsets\""},
      {"dtype not a string", Image(entry(R"("dtype":4,"shape":[2],"data_offsets":[0,8])"), f32x2),
       "must be a string"},
      {"wrong dtype string",
       Image(entry(R"("dtype":"F33","shape":[2],"data_offsets":[0,8])"), f32x2), "unknown dtype"},
      {"control characters in a name",
       Image(R"({"a\nb\u0000":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", f32x2),
       "'a\\x0ab\\x00'"},
      {"very long name is clipped",
       Image("{\"" + std::string(5000, 'n') +
                 R"(":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})",
             f32x2),
       "nnn..."},
      {"lowercase dtype", Image(entry(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), f32x2),
       "unknown dtype"},
      {"shape not an array", Image(entry(R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), f32x2),
       "must be an array"},
      {"shape dim a string",
       Image(entry(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), f32x2),
       "non-negative integer"},
      {"shape dim fractional",
       Image(entry(R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])"), f32x2),
       "non-negative integer"},
      {"negative shape dim",
       Image(entry(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), f32x2), "negative"},
      {"negative dims whose product is positive",
       Image(entry(R"("dtype":"F32","shape":[-1,-2],"data_offsets":[0,8])"), f32x2), "negative"},
      {"overflowing shape product",
       Image(entry(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])"), f32x2),
       "2^63"},
      {"byte count overflow",
       Image(entry(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8])"), f32x2),
       "overflows"},
      {"dim beyond int64",
       Image(entry(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8])"), f32x2),
       "larger than"},
      {"data_offsets not a pair",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])"), f32x2), "[begin, end]"},
      {"data_offsets not an array",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":8)"), f32x2), "[begin, end]"},
      {"negative data_offsets",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"), f32x2), "negative"},
      {"begin after end", Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), f32x2),
       "begin > end"},
      {"out-of-range offsets",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[1000,1008])"), f32x2),
       "past the end of the data section"},
      {"offsets near 2^64",
       Image(entry(R"("dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,)"
                   R"(18446744073709551615])"),
             f32x2),
       "past the end of the data section"},
      {"truncated data", Image(entry(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])"), f32x2),
       "past the end of the data section"},
      {"lying data_offsets (too long)",
       Image(entry(R"("dtype":"F32","shape":[1],"data_offsets":[0,8])"), f32x2), "needs 4"},
      {"shape/size mismatch",
       Image(entry(R"("dtype":"BF16","shape":[2],"data_offsets":[0,8])"), f32x2), "needs 4"},
      {"overlapping tensors",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             f32x2),
       "overlap"},
      {"identical tensors overlap",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
             f32x2),
       "overlap"},
      {"duplicate tensor name",
       Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             f32x2),
       "more than once"},
      {"metadata not an object", Image(R"({"__metadata__":[1]})"), "__metadata__"},
      {"metadata value not a string", Image(R"({"__metadata__":{"step":3}})"), "\"step\""},
  };
}

TEST_F(SafeTensorsTest, BrokenFilesGiveClearErrors) {
  int i = 0;
  for (const BrokenCase& c : BrokenCases()) {
    SCOPED_TRACE(c.name);
    std::string p = WriteRaw("broken_" + std::to_string(i++) + ".safetensors", c.bytes);
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(p);
    ASSERT_FALSE(f.ok());
    const std::string& m = f.status().message();
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    EXPECT_EQ(m.rfind(p, 0), 0u) << "message should start with the path: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "message should be one line: " << m;
    EXPECT_EQ(m.find('\xff'), std::string::npos) << "raw file bytes in the message: " << m;
    EXPECT_LT(m.size(), 600u) << m;
  }
}

// Every strict prefix of a valid file is rejected (the data section always ends in a tensor).
TEST_F(SafeTensorsTest, EveryTruncationIsRejected) {
  std::vector<float> x = {1, 2, 3, 4, 5};
  std::string p = Path("whole.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p,
                               {{"a", DType::kBF16, {5}, x.data()},
                                {"b", DType::kF32, {1, 5}, x.data()},
                                {"c", DType::kF16, {}, x.data()}},
                               {{"k", "v"}})
                  .ok());
  std::string whole = ReadRaw(p);
  for (size_t len = 0; len < whole.size(); ++len) {
    std::string q = WriteRaw("prefix.safetensors", whole.substr(0, len));
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(q);
    EXPECT_FALSE(f.ok()) << "prefix of " << len << " bytes opened";
  }
}

// Corrupting any header byte must give either an error or a file whose tensors all read in bounds.
TEST_F(SafeTensorsTest, CorruptedHeaderBytesNeverCrash) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::string p = Path("fuzz.safetensors");
  ASSERT_TRUE(WriteSafeTensors(p,
                               {{"a", DType::kBF16, {2, 3}, x.data()},
                                {"b", DType::kF32, {6}, x.data()},
                                {"c", DType::kF16, {3}, x.data()}},
                               {{"k", "v"}})
                  .ok());
  const std::string whole = ReadRaw(p);
  const char replacements[] = {'0', '9', '-', '"', ',', '}', ']', '[', ' ', '\0', '\xff', 'e'};
  uint64_t header_len;
  std::memcpy(&header_len, whole.data(), 8);
  int opened = 0;
  for (size_t pos = 0; pos < 8 + header_len; ++pos) {  // length prefix and header
    for (char r : replacements) {
      std::string bytes = whole;
      if (bytes[pos] == r) continue;
      bytes[pos] = r;
      std::string q = WriteRaw("fuzz_case.safetensors", bytes);
      StatusOr<SafeTensorsFile> f = SafeTensorsFile::Open(q);
      if (!f.ok()) {
        EXPECT_FALSE(f.status().message().empty());
        continue;
      }
      ++opened;
      for (const SafeTensorInfo& t : f->tensors()) {
        std::vector<float> out(static_cast<size_t>(Numel(t.shape)) + 1);
        Status s = f->ReadF32(t.name, out.data(), t.shape);
        (void)s;  // may fail for a non-float dtype; must not crash
      }
    }
  }
  EXPECT_GT(opened, 0);  // some corruptions are harmless (e.g. in metadata strings)
}

}  // namespace
}  // namespace st
