// Image files to RGB as transformers' processor receives them: PIL's decoding (Image.open) followed
// by transformers' convert_to_rgb (transparency composited over white). See image.h.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <webp/decode.h>

#include <csetjmp>
#include <cstring>
#include <fstream>
#include <iterator>

#include "data/images/image.h"

namespace st::images {
namespace {

bool StartsWith(const uint8_t* d, size_t n, const char* magic, size_t m, size_t at = 0) {
  return n >= at + m && std::memcmp(d + at, magic, m) == 0;
}

// PIL's alpha_composite of a pixel over opaque white, in its integer arithmetic (7 fraction
// bits, division by 255 as two shifts): checked against PIL for every (value, alpha) pair by
// tools/make_image_fixtures.py's images and the tests.
inline uint8_t OverWhite(uint32_t v, uint32_t a) {
  if (a == 0) return 255;
  const uint32_t t = 128 * (v * a + 255 * (255 - a)) + (0x80 << 7);
  return static_cast<uint8_t>((((t >> 8) + t) >> 8) >> 7);
}

// RGBA rows (4 bytes a pixel) to RGB over white, in place into `out`.
void CompositeRgba(const uint8_t* rgba, size_t pixels, uint8_t* rgb) {
  for (size_t i = 0; i < pixels; ++i) {
    const uint32_t a = rgba[4 * i + 3];
    for (int c = 0; c < 3; ++c) rgb[3 * i + c] = OverWhite(rgba[4 * i + c], a);
  }
}

// The size limit of the decode in progress (DecodeImage's max_pixels; one decode per thread at a
// time). The processor shrinks everything to at most 1120 * 9 patches anyway.
thread_local int64_t max_pixels_now = kMaxImagePixels;
bool TooLarge(int64_t w, int64_t h) {
  return w * h > max_pixels_now;
}

Status CheckSize(int64_t w, int64_t h, const char* format) {
  if (w <= 0 || h <= 0) return DataLoss(StrCat(format, " image of ", w, "x", h, " pixels"));
  if (TooLarge(w, h))
    return InvalidArgument(StrCat(format, " image of ", w, "x", h, " pixels is larger than the ",
                                  max_pixels_now, " pixels an image may have"));
  return Status::Ok();
}

// ---- JPEG (libjpeg-turbo): the library's YCbCr -> RGB conversion, fancy upsampling and the
// accurate integer IDCT, as PIL asks for them. Any warning (truncated or corrupt data) fails.
struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings about corrupt data are ignored, as PIL ignores them (libjpeg decodes what it can); data
// that ends early is an error, as it is for PIL ("image file is truncated").
void JpegMessage(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) JpegErrorExit(cinfo);
}

// No object with a destructor lives in this function: longjmp leaves it from inside libjpeg.
bool DecodeJpegInto(const uint8_t* data, size_t size, RgbImage* out, std::string* error,
                    bool* cmyk) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  err.mgr.emit_message = JpegMessage;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    error->assign(err.message);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    *cmyk = true;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = JCS_RGB;
  out->width = static_cast<int>(cinfo.image_width);
  out->height = static_cast<int>(cinfo.image_height);
  if (TooLarge(cinfo.image_width, cinfo.image_height)) {
    jpeg_destroy_decompress(&cinfo);
    error->assign("image too large");
    return false;
  }
  out->rgb.resize(size_t(out->width) * out->height * 3);
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + size_t(cinfo.output_scanline) * out->width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

StatusOr<RgbImage> DecodeJpeg(const uint8_t* data, size_t size) {
  RgbImage img;
  std::string error;
  bool cmyk = false;
  if (DecodeJpegInto(data, size, &img, &error, &cmyk)) return img;
  if (cmyk) return Unimplemented("CMYK JPEG images are not supported (convert the image to RGB)");
  if (error == "image too large") {
    Status s = CheckSize(img.width, img.height, "JPEG");
    if (!s.ok()) return s;
  }
  return DataLoss(StrCat("corrupt or truncated JPEG data (", error, ")"));
}

// ---- PNG (libpng): PIL's modes and conversions. 16-bit samples keep their high byte (PIL's
// ";16B" raw modes), except 16-bit grayscale, which PIL holds as "I;16" and converts to RGB by
// clipping at 255; 1, 2 and 4-bit grays are scaled to 0..255; palettes expanded; tRNS becomes
// alpha. Gamma, colour-profile and other ancillary chunks are ignored, as PIL ignores them.
struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t at;
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->at) png_error(png, "the file ends early");
  std::memcpy(out, r->data + r->at, n);
  r->at += n;
}

void PngError(png_structp png, png_const_charp message) {
  auto* msg = static_cast<std::string*>(png_get_error_ptr(png));
  msg->assign(message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

// Decodes into `pixels` (RGB or RGBA per `*channels`), with `rows` for the row pointers; both
// belong to the caller, and no local changed after setjmp is read after a longjmp (libpng leaves
// by longjmp). Returns false with `error` set.
bool DecodePngInto(const uint8_t* data, size_t size, std::vector<uint8_t>* pixels,
                   std::vector<png_bytep>* rows, int* width, int* height, int* channels,
                   bool* gray16, std::string* error) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, error, PngError, PngWarning);
  if (!png) {
    error->assign("out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  PngReader reader{data, size, 0};
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (!info) png_error(png, "out of memory");
  png_set_read_fn(png, &reader, PngRead);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  if (TooLarge(w, h)) png_error(png, "image too large");
  const bool trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  *gray16 = color == PNG_COLOR_TYPE_GRAY && depth == 16 && !trns;
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (trns) png_set_tRNS_to_alpha(png);
  if (depth == 16 && !*gray16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  pixels->assign(row_bytes * h, 0);
  rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y) (*rows)[y] = pixels->data() + y * row_bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

StatusOr<RgbImage> DecodePng(const uint8_t* data, size_t size) {
  std::vector<uint8_t> pixels;
  std::vector<png_bytep> rows;
  int w = 0, h = 0, channels = 0;
  bool gray16 = false;
  std::string error;
  if (!DecodePngInto(data, size, &pixels, &rows, &w, &h, &channels, &gray16, &error)) {
    if (error == "image too large") {
      Status s = CheckSize(w, h, "PNG");
      if (!s.ok()) return s;
    }
    return DataLoss(StrCat("corrupt or truncated PNG data (", error, ")"));
  }
  RgbImage img;
  img.width = w;
  img.height = h;
  const size_t n = size_t(w) * h;
  img.rgb.resize(n * 3);
  if (gray16) {  // gray_to_rgb kept 16 bits: 3 big-endian samples a pixel, clipped as PIL does
    for (size_t i = 0; i < n * 3; ++i) img.rgb[i] = pixels[2 * i] != 0 ? 255 : pixels[2 * i + 1];
  } else if (channels == 4) {
    CompositeRgba(pixels.data(), n, img.rgb.data());
  } else {
    img.rgb = std::move(pixels);
  }
  return img;
}

// ---- WebP (libwebp): one still image, fancy upsampling of lossy chroma as PIL's decoder gets
// it; an alpha channel composited over white.
StatusOr<RgbImage> DecodeWebp(const uint8_t* data, size_t size) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(data, size, &f);
  if (st != VP8_STATUS_OK)
    return DataLoss(st == VP8_STATUS_NOT_ENOUGH_DATA ? "truncated WebP data"
                                                     : "corrupt WebP data (no valid header)");
  if (f.has_animation)
    return Unimplemented("animated WebP images are not supported (save one frame as an image)");
  ST_RETURN_IF_ERROR(CheckSize(f.width, f.height, "WebP"));
  RgbImage img;
  img.width = f.width;
  img.height = f.height;
  const size_t n = size_t(f.width) * f.height;
  img.rgb.resize(n * 3);
  if (f.has_alpha) {
    std::vector<uint8_t> rgba(n * 4);
    if (!WebPDecodeRGBAInto(data, size, rgba.data(), rgba.size(), f.width * 4))
      return DataLoss("corrupt or truncated WebP data");
    CompositeRgba(rgba.data(), n, img.rgb.data());
  } else if (!WebPDecodeRGBInto(data, size, img.rgb.data(), img.rgb.size(), f.width * 3)) {
    return DataLoss("corrupt or truncated WebP data");
  }
  return img;
}

}  // namespace

std::string SniffImageFormat(const uint8_t* d, size_t n) {
  if (StartsWith(d, n, "\xFF\xD8\xFF", 3)) return "JPEG";
  if (StartsWith(d, n, "\x89PNG\r\n\x1A\n", 8)) return "PNG";
  if (StartsWith(d, n, "RIFF", 4) && StartsWith(d, n, "WEBP", 4, 8)) return "WebP";
  if (StartsWith(d, n, "GIF87a", 6) || StartsWith(d, n, "GIF89a", 6)) return "GIF";
  if (StartsWith(d, n, "BM", 2)) return "BMP";
  if (StartsWith(d, n, "II*\0", 4) || StartsWith(d, n, "MM\0*", 4)) return "TIFF";
  if (StartsWith(d, n, "ftypavif", 8, 4) || StartsWith(d, n, "ftypavis", 8, 4)) return "AVIF";
  if (StartsWith(d, n, "ftypheic", 8, 4) || StartsWith(d, n, "ftypmif1", 8, 4)) return "HEIC";
  if (StartsWith(d, n, "\0\0\1\0", 4)) return "ICO";
  return "";
}

StatusOr<RgbImage> DecodeImage(const uint8_t* data, size_t size, int64_t max_pixels) {
  if (size == 0) return DataLoss("empty image (0 bytes)");
  max_pixels_now = max_pixels;
  const std::string format = SniffImageFormat(data, size);
  if (format == "JPEG") return DecodeJpeg(data, size);
  if (format == "PNG") return DecodePng(data, size);
  if (format == "WebP") return DecodeWebp(data, size);
  if (format.empty())
    return InvalidArgument("not an image file slicetrain reads (JPEG, PNG or WebP)");
  return Unimplemented(StrCat(format, " images are not supported (JPEG, PNG and WebP are)"));
}

StatusOr<RgbImage> ReadImageFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(StrCat(path, ": cannot open the image"));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                   std::istreambuf_iterator<char>());
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  StatusOr<RgbImage> img = DecodeImage(bytes.data(), bytes.size());
  if (!img.ok()) return img.status().WithContext(path);
  return img;
}

}  // namespace st::images
