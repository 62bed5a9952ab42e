// Gemma 4's image processor after decoding: the soft-token budget's size, PIL's bicubic resize,
// rescaling and patches (image.h). Built with -ffp-contract=off (CMakeLists.txt): the filter
// weights are computed in double exactly as PIL's C code computes them, and a fused multiply-add
// could move a weight across a rounding boundary of the 22-bit fixed point.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/images/image.h"

namespace st::images {
namespace {

constexpr int kBudgets[] = {70, 140, 280, 560, 1120};
constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's fixed point for 8-bit images
constexpr int kBicubic = 3;                 // PIL.Image.Resampling.BICUBIC

double BicubicWeight(double x) {  // Keys' cubic with a = -0.5, as PIL's filter
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// The taps of one pass: for each output index its first input index, its count of inputs and its
// fixed-point weights (ksize of them, zero past the count).
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weight;
};

Taps ComputeTaps(int in_size, int out_size) {
  const double scale = double(float(in_size)) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weight.assign(size_t(out_size) * t.ksize, 0);
  std::vector<double> w(t.ksize);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = hi - lo;
    double total = 0;
    for (int k = 0; k < n; ++k) {
      w[k] = BicubicWeight((k + lo - center + 0.5) * inv);
      total += w[k];
    }
    for (int k = 0; k < n; ++k) {
      const double v = total != 0.0 ? w[k] / total : w[k];
      const double scaled = v * (1 << kPrecisionBits);
      t.weight[size_t(o) * t.ksize + k] =
          static_cast<int32_t>(v < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    t.first[o] = lo;
    t.count[o] = n;
  }
  return t;
}

inline uint8_t Clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;  // arithmetic shift: PIL's table starts at -640
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

int JsonInt(const nlohmann::json& j, const char* key, int fallback, Status* err) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_number_integer()) {
    *err = InvalidArgument(StrCat("'", key, "' must be an integer"));
    return fallback;
  }
  return j[key].get<int>();
}

bool JsonBool(const nlohmann::json& j, const char* key, bool fallback, Status* err) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_boolean()) {
    *err = InvalidArgument(StrCat("'", key, "' must be true or false"));
    return fallback;
  }
  return j[key].get<bool>();
}

void JsonTriple(const nlohmann::json& j, const char* key, float* out, Status* err) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j[key];
  if (v.is_number()) {
    out[0] = out[1] = out[2] = v.get<float>();
    return;
  }
  if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() ||
      !v[2].is_number()) {
    *err = InvalidArgument(StrCat("'", key, "' must be a number or a list of 3 numbers"));
    return;
  }
  for (int c = 0; c < 3; ++c) out[c] = v[c].get<float>();
}

}  // namespace

Status ValidateImageProcessorConfig(const ImageProcessorConfig& c) {
  if (std::find(std::begin(kBudgets), std::end(kBudgets), c.max_soft_tokens) == std::end(kBudgets))
    return InvalidArgument(
        StrCat("max_soft_tokens must be one of 70, 140, 280, 560, 1120, not ", c.max_soft_tokens));
  if (c.patch_size < 1 || c.patch_size > 256)
    return InvalidArgument(StrCat("patch_size must be in 1..256, not ", c.patch_size));
  if (c.pooling_kernel_size < 1 || c.pooling_kernel_size > 16)
    return InvalidArgument(
        StrCat("pooling_kernel_size must be in 1..16, not ", c.pooling_kernel_size));
  if (!(c.rescale_factor > 0) || !std::isfinite(c.rescale_factor))
    return InvalidArgument("rescale_factor must be a positive number");
  for (float s : c.image_std)
    if (!(s != 0) || !std::isfinite(s)) return InvalidArgument("image_std must be non-zero");
  return Status::Ok();
}

StatusOr<ImageProcessorConfig> LoadImageProcessorConfig(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file.clear();
    for (const char* name : {"processor_config.json", "preprocessor_config.json"})
      if (fs::is_regular_file(fs::path(path) / name, ec)) {
        file = (fs::path(path) / name).string();
        break;
      }
    if (file.empty()) return ImageProcessorConfig{};
  }
  std::ifstream f(file);
  if (!f) return NotFound(StrCat(file, ": cannot open"));
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(StrCat(file, ": not a JSON object"));
  if (j.contains("image_processor")) j = j["image_processor"];
  if (!j.is_object()) return DataLoss(StrCat(file, ": 'image_processor' is not an object"));
  ImageProcessorConfig c;
  Status err;
  c.patch_size = JsonInt(j, "patch_size", c.patch_size, &err);
  c.max_soft_tokens = JsonInt(j, "max_soft_tokens", c.max_soft_tokens, &err);
  c.pooling_kernel_size = JsonInt(j, "pooling_kernel_size", c.pooling_kernel_size, &err);
  c.do_resize = JsonBool(j, "do_resize", c.do_resize, &err);
  c.do_rescale = JsonBool(j, "do_rescale", c.do_rescale, &err);
  c.do_normalize = JsonBool(j, "do_normalize", c.do_normalize, &err);
  if (j.contains("rescale_factor")) {
    if (j["rescale_factor"].is_number())
      c.rescale_factor = j["rescale_factor"].get<double>();
    else
      err = InvalidArgument("'rescale_factor' must be a number");
  }
  JsonTriple(j, "image_mean", c.image_mean, &err);
  JsonTriple(j, "image_std", c.image_std, &err);
  if (err.ok() && JsonInt(j, "resample", kBicubic, &err) != kBicubic && err.ok())
    err = Unimplemented(StrCat("resample ", j["resample"].dump(),
                               " is not supported (Gemma 4's processors use 3, bicubic)"));
  if (err.ok() && !JsonBool(j, "do_convert_rgb", true, &err) && err.ok())
    err = Unimplemented("do_convert_rgb false is not supported (images are always made RGB)");
  if (err.ok()) err = ValidateImageProcessorConfig(c);
  if (!err.ok()) return err.WithContext(file);
  return c;
}

StatusOr<Size> AspectRatioPreservingSize(int height, int width, int patch_size, int max_patches,
                                         int pooling_kernel_size) {
  const double total = double(height) * width;
  const double target_px = double(max_patches) * patch_size * patch_size;
  const double factor = std::sqrt(target_px / total);
  const int side = pooling_kernel_size * patch_size;
  Size s;
  s.height = static_cast<int>(std::floor(factor * height / side)) * side;
  s.width = static_cast<int>(std::floor(factor * width / side)) * side;
  if (s.height == 0 && s.width == 0)
    return InvalidArgument(StrCat("an image of ", width, "x", height, " resizes to 0x0"));
  const int max_side = (max_patches / (pooling_kernel_size * pooling_kernel_size)) * side;
  if (s.height == 0) {
    s.height = side;
    s.width = std::min(static_cast<int>(std::floor(double(width) / height)) * side, max_side);
  } else if (s.width == 0) {
    s.width = side;
    s.height = std::min(static_cast<int>(std::floor(double(height) / width)) * side, max_side);
  }
  if (double(s.height) * s.width > target_px)
    return InvalidArgument(StrCat("an image of ", width, "x", height, " resizes to ", s.width, "x",
                                  s.height, ", more than ", max_patches, " patches of ", patch_size,
                                  "x", patch_size));
  return s;
}

RgbImage ResizeBicubic(const RgbImage& in, int width, int height) {
  if (width == in.width && height == in.height) return in;
  // PIL works out the vertical taps first, runs the horizontal pass over the rows they read only
  // (the result is the same as over every row), then the vertical pass.
  const Taps vert = ComputeTaps(in.height, height);
  const int row0 = vert.first[0];
  const int rows = vert.first[height - 1] + vert.count[height - 1] - row0;
  RgbImage mid;
  const RgbImage* src = &in;
  int src_row0 = 0;
  if (width != in.width) {
    const Taps hor = ComputeTaps(in.width, width);
    mid.width = width;
    mid.height = rows;
    mid.rgb.resize(size_t(width) * rows * 3);
    for (int y = 0; y < rows; ++y) {
      const uint8_t* line = in.rgb.data() + size_t(y + row0) * in.width * 3;
      uint8_t* out = mid.rgb.data() + size_t(y) * width * 3;
      for (int x = 0; x < width; ++x) {
        const int32_t* k = hor.weight.data() + size_t(x) * hor.ksize;
        const uint8_t* p = line + size_t(hor.first[x]) * 3;
        int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
        for (int i = 0; i < hor.count[x]; ++i) {
          a0 += p[3 * i] * k[i];
          a1 += p[3 * i + 1] * k[i];
          a2 += p[3 * i + 2] * k[i];
        }
        out[3 * x] = Clip8(a0);
        out[3 * x + 1] = Clip8(a1);
        out[3 * x + 2] = Clip8(a2);
      }
    }
    src = &mid;
    src_row0 = row0;
  }
  if (height == src->height && src_row0 == 0 && height == in.height) return mid;
  RgbImage out;
  out.width = src->width;
  out.height = height;
  out.rgb.resize(size_t(out.width) * height * 3);
  const size_t stride = size_t(src->width) * 3;
  for (int y = 0; y < height; ++y) {
    const int32_t* k = vert.weight.data() + size_t(y) * vert.ksize;
    const uint8_t* base = src->rgb.data() + size_t(vert.first[y] - src_row0) * stride;
    uint8_t* dst = out.rgb.data() + size_t(y) * stride;
    for (size_t x = 0; x < stride; ++x) {
      int32_t acc = 1 << (kPrecisionBits - 1);
      for (int i = 0; i < vert.count[y]; ++i) acc += base[size_t(i) * stride + x] * k[i];
      dst[x] = Clip8(acc);
    }
  }
  return out;
}

StatusOr<ProcessedImage> ProcessImage(const RgbImage& image, const ImageProcessorConfig& c) {
  ST_RETURN_IF_ERROR(ValidateImageProcessorConfig(c));
  const int p = c.patch_size;
  RgbImage resized;
  const RgbImage* img = &image;
  if (c.do_resize) {
    ST_ASSIGN_OR_RETURN(const Size s,
                        AspectRatioPreservingSize(image.height, image.width, p, c.max_patches(),
                                                  c.pooling_kernel_size));
    if (s.height != image.height || s.width != image.width) {
      resized = ResizeBicubic(image, s.width, s.height);
      img = &resized;
    }
  }
  ProcessedImage out;
  out.height = img->height;
  out.width = img->width;
  const int ph = img->height / p, pw = img->width / p;
  out.num_patches = ph * pw;
  out.max_patches = c.max_patches();
  out.patch_dim = c.patch_dim();
  if (out.num_patches > out.max_patches)
    return InvalidArgument(StrCat("an image of ", img->width, "x", img->height, " makes ",
                                  out.num_patches, " patches, more than the ", out.max_patches,
                                  " of max_soft_tokens ", c.max_soft_tokens));
  out.num_soft_tokens = out.num_patches / (c.pooling_kernel_size * c.pooling_kernel_size);
  out.pixel_values.assign(size_t(out.max_patches) * out.patch_dim, 0.0f);
  out.positions.assign(size_t(out.max_patches) * 2, -1);
  // Each byte's value once: rescale as transformers does (double product, rounded to fp32), then
  // normalise in fp32.
  float table[3][256];
  for (int ch = 0; ch < 3; ++ch)
    for (int v = 0; v < 256; ++v) {
      float x = c.do_rescale ? static_cast<float>(double(v) * c.rescale_factor) : float(v);
      if (c.do_normalize) x = (x - c.image_mean[ch]) / c.image_std[ch];
      table[ch][v] = x;
    }
  for (int py = 0; py < ph; ++py)
    for (int px = 0; px < pw; ++px) {
      const size_t patch = size_t(py) * pw + px;
      float* dst = out.pixel_values.data() + patch * out.patch_dim;
      for (int y = 0; y < p; ++y) {
        const uint8_t* row = img->rgb.data() + (size_t(py * p + y) * img->width + px * p) * 3;
        for (int i = 0; i < p * 3; ++i) dst[y * p * 3 + i] = table[i % 3][row[i]];
      }
      out.positions[2 * patch] = px;
      out.positions[2 * patch + 1] = py;
    }
  return out;
}

}  // namespace st::images
