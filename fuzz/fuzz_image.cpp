// Fuzzes the image decoders (JPEG through libjpeg, PNG through libpng, WebP through libwebp, and
// the format sniffing in front of them) with whole files, then runs an accepted image through the
// processor (resize and patches) at the smallest budget. Images over 4 M pixels are refused up
// front, so that a header claiming a huge image does not hold the fuzzer for seconds.
#include <cstdint>

#include "data/images/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st::StatusOr<st::images::RgbImage> img = st::images::DecodeImage(data, size, int64_t{1} << 22);
  if (!img.ok()) return 0;
  if (img->rgb.size() != size_t(img->width) * img->height * 3) __builtin_trap();
  st::images::ImageProcessorConfig c;
  c.patch_size = 4;
  c.max_soft_tokens = 70;
  (void)st::images::ProcessImage(*img, c);
  return 0;
}
