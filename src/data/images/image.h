// Gemma 4's image processor: image files (JPEG, PNG, WebP) decoded to RGB as transformers sees
// them, resized to a soft-token budget and cut into patches, value for value as transformers'
// `Gemma4ImageProcessorPil` (the processor's PIL backend) makes them. See docs/vision.md.
//
//   decode   libjpeg / libpng / libwebp; transparency (an alpha channel, a tRNS chunk) composited
//            over white as transformers' convert_to_rgb does, with PIL's integer arithmetic
//   resize   PIL's bicubic resampling (a = -0.5, support scaled by the shrink factor, 22-bit
//            fixed-point coefficients, an 8-bit image after each pass) to the largest size whose
//            sides are multiples of pooling * patch and that holds at most budget * pooling^2
//            patches
//   rescale  float(double(byte) * rescale_factor), then (x - mean) / std in fp32 if asked
//   patches  row-major patches, each patch_size x patch_size x 3 (row, column, channel), padded to
//            budget * pooling^2 with zeros and positions (-1, -1)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace st::images {

// An 8-bit RGB image, rows top to bottom, pixels left to right, 3 bytes each.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3
};

// "JPEG", "PNG", "WebP", or the name of a format slicetrain does not read ("GIF", "BMP", "TIFF",
// "AVIF", "HEIC", "ICO"); "" when the bytes start like no image format known here.
std::string SniffImageFormat(const uint8_t* data, size_t size);

// PIL's decompression-bomb limit (2 x 89.5 M pixels): a larger image is refused before decoding.
constexpr int64_t kMaxImagePixels = 178'956'970;

// Decodes a whole image file held in memory. The error names the format and the problem; the
// caller adds where the bytes came from (a path, a row). `max_pixels` lowers the size limit.
StatusOr<RgbImage> DecodeImage(const uint8_t* data, size_t size,
                               int64_t max_pixels = kMaxImagePixels);
// Reads and decodes a file; errors start with the path.
StatusOr<RgbImage> ReadImageFile(const std::string& path);

// The image part of a processor_config.json ("image_processor") or preprocessor_config.json.
struct ImageProcessorConfig {
  int patch_size = 16;
  int max_soft_tokens = 280;  // the budget: 70, 140, 280, 560 or 1120
  int pooling_kernel_size = 3;
  bool do_resize = true;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = false;
  float image_mean[3] = {0, 0, 0};
  float image_std[3] = {1, 1, 1};

  int max_patches() const { return max_soft_tokens * pooling_kernel_size * pooling_kernel_size; }
  int patch_dim() const { return patch_size * patch_size * 3; }
};

// Checks the values transformers checks (and the ones this processor cannot serve: a resample
// filter other than bicubic is refused when the config is read).
Status ValidateImageProcessorConfig(const ImageProcessorConfig& c);
// From a model directory (processor_config.json, else preprocessor_config.json) or one of those
// files; a directory with neither gives Gemma 4's defaults. Errors name the file and the key.
StatusOr<ImageProcessorConfig> LoadImageProcessorConfig(const std::string& path);

// The size an image of height x width is resized to (transformers'
// get_aspect_ratio_preserving_size): the largest with both sides multiples of pooling * patch and
// at most max_patches patches; a side that would round to 0 becomes one multiple.
struct Size {
  int height = 0;
  int width = 0;
};
StatusOr<Size> AspectRatioPreservingSize(int height, int width, int patch_size, int max_patches,
                                         int pooling_kernel_size);

// PIL's Image.resize(..., BICUBIC) of an RGB image, byte for byte.
RgbImage ResizeBicubic(const RgbImage& in, int width, int height);

// What the processor gives the model for one image.
struct ProcessedImage {
  int height = 0, width = 0;  // after resizing
  int num_patches = 0;        // real patches (the rest of max_patches is padding)
  int num_soft_tokens = 0;    // num_patches / pooling^2: the image's tokens in the text
  int max_patches = 0;
  int patch_dim = 0;
  std::vector<float> pixel_values;  // [max_patches, patch_dim]
  std::vector<int32_t> positions;   // [max_patches, 2]: (column, row) of each patch; -1 padding
};
StatusOr<ProcessedImage> ProcessImage(const RgbImage& image, const ImageProcessorConfig& config);

}  // namespace st::images
