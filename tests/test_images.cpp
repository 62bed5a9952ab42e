// The image processor (src/data/images) against transformers' Gemma4ImageProcessorPil: decoding,
// the budget's size, PIL's bicubic resize and the patches, on the JPEG, PNG and WebP files of
// tests/fixtures/images (goldens from tools/make_image_fixtures.py).
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/images/image.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace st {
namespace {

const std::string kDir = ST_FIXTURE_DIR "/images";

std::string Sha256Hex(const void* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += kHex[md[i] >> 4];
    s += kHex[md[i] & 15];
  }
  return s;
}

class ImagesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto f = SafeTensorsFile::Open(kDir + "/goldens.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    goldens_ = new SafeTensorsFile(std::move(f).value());
  }
  static void TearDownTestSuite() {
    delete goldens_;
    goldens_ = nullptr;
  }
  static std::vector<std::string> Names() {
    return nlohmann::json::parse(goldens_->metadata().at("images")).get<std::vector<std::string>>();
  }
  static nlohmann::json Meta(const std::string& key) {
    return nlohmann::json::parse(goldens_->metadata().at(key));
  }
  static const uint8_t* Bytes(const std::string& name, Shape* shape) {
    const SafeTensorInfo* t = goldens_->Find(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return nullptr;
    *shape = t->shape;
    return static_cast<const uint8_t*>(goldens_->Data(*t));
  }
  static SafeTensorsFile* goldens_;
};
SafeTensorsFile* ImagesTest::goldens_ = nullptr;

// Every file decodes to the bytes transformers' processor starts from (PIL's decoding, then
// transparency over white): 8 and 16-bit PNGs of every colour type, palettes with and without
// transparency, baseline 4:2:0 and 4:4:4, progressive and grayscale JPEGs, lossy, lossless and
// alpha WebPs.
TEST_F(ImagesTest, DecodedEqualsWhatTransformersStartsFrom) {
  const std::vector<std::string> names = Names();
  ASSERT_GE(names.size(), 17u);
  for (const std::string& name : names) {
    auto img = images::ReadImageFile(kDir + "/" + name);
    ASSERT_TRUE(img.ok()) << name << ": " << img.status().ToString();
    Shape shape;
    const uint8_t* want = Bytes("decoded/" + name, &shape);
    ASSERT_NE(want, nullptr);
    ASSERT_EQ(shape.size(), 3u);
    ASSERT_EQ(img->height, shape[0]) << name;
    ASSERT_EQ(img->width, shape[1]) << name;
    int64_t differ = 0, worst = 0;
    for (size_t i = 0; i < img->rgb.size(); ++i) {
      const int d = std::abs(int(img->rgb[i]) - int(want[i]));
      differ += d != 0;
      worst = std::max<int64_t>(worst, d);
    }
    EXPECT_EQ(differ, 0) << name << ": " << differ << " of " << img->rgb.size()
                         << " bytes differ, by up to " << worst;
  }
}

// For the small processor (patch 4) and the E2B one (patch 16), at every budget: the resized
// size, the soft-token count and the fp32 pixel values bit for bit (SHA-256 of the real patches);
// padding is zeros at position -1. At budget 70 the small processor's resized bytes and positions
// are compared value by value, so a failure says where.
TEST_F(ImagesTest, PatchesEqualTransformersAtEveryBudget) {
  const std::vector<int> budgets = Meta("budgets").get<std::vector<int>>();
  for (const std::string& name : Names()) {
    auto img = images::ReadImageFile(kDir + "/" + name);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    for (const char* which : {"small", "e2b"}) {
      for (int budget : budgets) {
        images::ImageProcessorConfig c;
        c.patch_size = std::string(which) == "small" ? 4 : 16;
        c.max_soft_tokens = budget;
        const std::string key = std::string(which) + "/" + name + "/" + std::to_string(budget);
        const nlohmann::json want = Meta(key);
        auto out = images::ProcessImage(*img, c);
        ASSERT_TRUE(out.ok()) << key << ": " << out.status().ToString();
        EXPECT_EQ(out->height, want["height"].get<int>()) << key;
        EXPECT_EQ(out->width, want["width"].get<int>()) << key;
        ASSERT_EQ(out->num_soft_tokens, want["soft_tokens"].get<int>()) << key;
        ASSERT_EQ(out->num_patches, out->num_soft_tokens * 9) << key;
        ASSERT_EQ(out->max_patches, budget * 9);
        const size_t real = size_t(out->num_patches) * out->patch_dim;
        EXPECT_EQ(Sha256Hex(out->pixel_values.data(), real * sizeof(float)),
                  want["sha256"].get<std::string>())
            << key;
        for (size_t i = real; i < out->pixel_values.size(); ++i)
          ASSERT_EQ(out->pixel_values[i], 0.0f) << key;
        for (size_t i = 2 * size_t(out->num_patches); i < out->positions.size(); ++i)
          ASSERT_EQ(out->positions[i], -1) << key;
        if (std::string(which) != "small" || budget != 70) continue;
        Shape shape, pshape;
        const uint8_t* bytes = Bytes("resized/" + name + "/70", &shape);
        const uint8_t* pos_raw = Bytes("positions/" + name + "/70", &pshape);
        ASSERT_TRUE(bytes && pos_raw);
        ASSERT_EQ(shape[0], out->num_patches);
        ASSERT_EQ(shape[1], out->patch_dim);
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < real; ++i) {
          const float v = static_cast<float>(double(bytes[i]) * (1.0 / 255.0));
          if (out->pixel_values[i] != v) {
            if (first < 0) first = int64_t(i);
            ++differ;
          }
        }
        EXPECT_EQ(differ, 0) << key << ": " << differ << " values differ, the first at patch "
                             << first / out->patch_dim << ", value " << first % out->patch_dim;
        for (int64_t i = 0; i < 2 * int64_t(out->num_patches); ++i) {
          int64_t p;
          std::memcpy(&p, pos_raw + 8 * i, 8);
          ASSERT_EQ(out->positions[i], p) << key << " position " << i;
        }
      }
    }
  }
}

// transformers' get_aspect_ratio_preserving_size on shapes worked out by hand: sides are multiples
// of pooling * patch; a side that would round to 0 becomes one multiple and the other is capped.
TEST(Images, TheBudgetsSizes) {
  auto s = images::AspectRatioPreservingSize(480, 640, 16, 280 * 9, 3);
  ASSERT_TRUE(s.ok());
  // factor sqrt(2520 * 256 / 307200) = 1.449: 695.6 -> 672, 927.5 -> 912
  EXPECT_EQ(s->height, 672);
  EXPECT_EQ(s->width, 912);
  s = images::AspectRatioPreservingSize(2, 4000, 16, 70 * 9, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->height, 48);
  EXPECT_EQ(s->width, 70 * 48);  // floor(4000 / 2) * 48, capped at (630 / 9) * 48
  EXPECT_FALSE(images::AspectRatioPreservingSize(1, 1, 16, 0, 3).ok());
}

TEST(Images, ProcessorConfigFromTheModelDirectory) {
  const std::string dir = test::TempDir("imgcfg");
  ASSERT_FALSE(dir.empty());
  auto defaults = images::LoadImageProcessorConfig(dir);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->patch_size, 16);
  EXPECT_EQ(defaults->max_soft_tokens, 280);
  const auto write = [&](const std::string& text) {
    std::ofstream(dir + "/processor_config.json") << text;
  };
  write(R"({"image_processor": {"patch_size": 4, "max_soft_tokens": 560, "pooling_kernel_size": 2,
            "resample": 3, "do_normalize": true, "image_mean": [0.5, 0.5, 0.5],
            "image_std": 0.25, "rescale_factor": 0.00392156862745098},
            "processor_class": "Gemma4Processor"})");
  auto c = images::LoadImageProcessorConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->patch_size, 4);
  EXPECT_EQ(c->max_soft_tokens, 560);
  EXPECT_EQ(c->pooling_kernel_size, 2);
  EXPECT_TRUE(c->do_normalize);
  EXPECT_EQ(c->image_mean[2], 0.5f);
  EXPECT_EQ(c->image_std[0], 0.25f);
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::string>>{
           {R"({"image_processor": {"max_soft_tokens": 100}})", "max_soft_tokens must be one of"},
           {R"({"image_processor": {"resample": 2}})", "resample 2 is not supported"},
           {R"({"image_processor": {"patch_size": "16"}})", "'patch_size' must be an integer"},
           {R"({"image_processor": {"image_std": [1, 0, 1]}})", "image_std must be non-zero"},
           {R"([1, 2])", "not a JSON object"},
       }) {
    write(text);
    auto bad = images::LoadImageProcessorConfig(dir);
    ASSERT_FALSE(bad.ok()) << text;
    const std::string m = bad.status().ToString();
    EXPECT_NE(m.find(words), std::string::npos) << m;
    EXPECT_NE(m.find("processor_config.json"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

// Broken and unsupported files: one line each, naming the format and what is wrong; never a
// crash (the sanitizer build runs this too).
TEST(Images, BrokenFilesAreOneLineEach) {
  const auto read = [](const std::string& name) {
    std::ifstream f(kDir + "/" + name, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                                std::istreambuf_iterator<char>());
  };
  struct Case {
    std::string what;
    std::vector<uint8_t> bytes;
    std::string words;
  };
  std::vector<Case> cases;
  for (const char* name : {"rgb420_61x43.jpg", "rgb_37x23.png", "lossy_57x39.webp",
                           "progressive_47x35.jpg", "lossless_35x33.webp"}) {
    std::vector<uint8_t> b = read(name);
    ASSERT_GT(b.size(), 100u);
    b.resize(b.size() / 2);
    const std::string n = name;
    const std::string format = n.find(".jpg") != n.npos   ? "JPEG"
                               : n.find(".png") != n.npos ? "PNG"
                                                          : "WebP";
    cases.push_back({std::string("half of ") + name, b,
                     format == "PNG" ? "ends early" : "truncated " + format});
  }
  std::vector<uint8_t> png = read("rgb_37x23.png");
  for (size_t i = 40; i < 80; ++i) png[i] ^= 0x5a;  // IDAT bytes
  cases.push_back({"a PNG with corrupt bytes", png, "corrupt or truncated PNG"});
  cases.push_back({"no bytes", {}, "empty image"});
  cases.push_back({"a GIF", {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0}, "GIF images are not"});
  cases.push_back({"text", {'h', 'e', 'l', 'l', 'o'}, "not an image file"});
  for (const Case& c : cases) {
    auto img = images::DecodeImage(c.bytes.data(), c.bytes.size());
    ASSERT_FALSE(img.ok()) << c.what;
    const std::string m = img.status().ToString();
    EXPECT_NE(m.find(c.words), std::string::npos) << c.what << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << c.what << ": " << m;
  }
  for (const char* name : {"rgb420_61x43.jpg", "rgb_37x23.png", "lossy_57x39.webp"}) {
    const std::vector<uint8_t> b = read(name);
    auto big = images::DecodeImage(b.data(), b.size(), /*max_pixels=*/100);
    ASSERT_FALSE(big.ok()) << name;
    EXPECT_NE(big.status().ToString().find("pixels is larger than the 100 pixels"),
              std::string::npos)
        << big.status().ToString();
  }
  auto missing = images::ReadImageFile(kDir + "/no_such.png");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("no_such.png: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// `slicetrain images`: each file's sizes and soft tokens as transformers counts them (the E2B
// processor's goldens), from any directory; a broken file is one error line and a non-zero exit.
TEST(ImagesCli, PrintsTheBudgetsSizesAndRefusesBrokenFiles) {
  const std::string dir = test::TempDir("imgcli");
  ASSERT_FALSE(dir.empty());
  const test::Ran r = test::RunCommand("cd " + dir + " && " ST_BINARY " images --json " + kDir +
                                       "/rgb420_61x43.jpg " + kDir + "/alpha_43x31.webp " +
                                       "--max-soft-tokens 560");
  ASSERT_EQ(r.code, 0) << r.out;
  auto goldens = SafeTensorsFile::Open(kDir + "/goldens.safetensors");
  ASSERT_TRUE(goldens.ok());
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string file = j["file"].get<std::string>();
    const std::string name = file.substr(file.rfind('/') + 1);
    const nlohmann::json want =
        nlohmann::json::parse(goldens->metadata().at("e2b/" + name + "/560"));
    EXPECT_EQ(j["soft_tokens"], want["soft_tokens"]) << line;
    EXPECT_EQ(j["resized_width"], want["width"]) << line;
    EXPECT_EQ(j["resized_height"], want["height"]) << line;
    EXPECT_EQ(j["max_soft_tokens"], 560);
  }
  EXPECT_EQ(n, 2);
  std::ofstream(dir + "/cut.jpg", std::ios::binary) << "\xFF\xD8\xFF\xE0" << std::string(20, 'x');
  const test::Ran bad = test::RunCommand(ST_BINARY " images " + dir + "/cut.jpg");
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(std::count(bad.out.begin(), bad.out.end(), '\n'), 1) << bad.out;
  EXPECT_NE(
      bad.out.find("slicetrain images: error: " + dir + "/cut.jpg: corrupt or truncated JPEG"),
      std::string::npos)
      << bad.out;
}

}  // namespace
}  // namespace st
