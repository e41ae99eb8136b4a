// PNG through libpng, without libpng's colour transforms: rows are read as stored (sub-byte
// samples unpacked to one byte each) and converted to RGB here, following Pillow's rules for each
// PNG mode (image_decode.h). libpng reports errors by longjmp: the function that calls setjmp
// keeps every C++ object with a destructor declared before it, and calls libpng only from its own
// frame, so a longjmp never skips a destructor.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "vision/image_decode.h"

namespace ds41 {

namespace {

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
  char message[200];
};

void read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "the file is truncated");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

[[noreturn]] void on_error(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof src->message, "%s", msg ? msg : "unknown error");
  png_longjmp(png, 1);
}

// Warnings (unknown ancillary chunks, bad ancillary CRCs skipped, ...) do not stop Pillow either.
void on_warning(png_structp, png_const_charp) {}

struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngHandles() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

struct PngLayout {
  int64_t width = 0;
  int bit_depth = 0, color_type = 0;
  uint8_t palette[256][3];  // Pillow 9.4.0: the gray ramp, then the PLTE entries
};

// One stored row (after png_set_packing: sub-byte samples one per byte, 16-bit big-endian) to RGB.
void convert_row(const PngLayout& L, const uint8_t* in, uint8_t* out) {
  const int64_t w = L.width;
  const bool wide = L.bit_depth == 16;
  switch (L.color_type) {
    case PNG_COLOR_TYPE_GRAY:
      for (int64_t x = 0; x < w; ++x) {
        uint8_t v;
        if (wide) {
          // Pillow mode "I" -> RGB clips to 0..255.
          const unsigned s = unsigned(in[2 * x]) << 8 | in[2 * x + 1];
          v = uint8_t(s > 255 ? 255 : s);
        } else {
          const unsigned scale = L.bit_depth == 1 ? 255 : L.bit_depth == 2 ? 85 : L.bit_depth == 4 ? 17 : 1;
          v = uint8_t(in[x] * scale);
        }
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = v;
      }
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      for (int64_t x = 0; x < w; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[(wide ? 4 : 2) * x];
      break;
    case PNG_COLOR_TYPE_PALETTE:
      for (int64_t x = 0; x < w; ++x) std::memcpy(out + 3 * x, L.palette[in[x]], 3);
      break;
    case PNG_COLOR_TYPE_RGB:
    case PNG_COLOR_TYPE_RGB_ALPHA: {
      const int channels = L.color_type == PNG_COLOR_TYPE_RGB ? 3 : 4;
      const int bytes = wide ? 2 : 1;  // 16-bit: the high (first) byte of each sample
      for (int64_t x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) out[3 * x + c] = in[(x * channels + c) * bytes];
      break;
    }
  }
}

}  // namespace

RgbImage decode_png(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels) {
  RgbImage img;
  // Heap-held so that what the error callback writes is well defined after the longjmp.
  auto src = std::make_unique<PngSource>(PngSource{data, size, 0, {0}});
  PngHandles h;
  PngLayout layout{};
  std::vector<uint8_t> raw;            // one row, or the whole image when interlaced
  std::vector<png_bytep> row_pointers; // interlaced images only
  h.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src.get(), on_error, on_warning);
  if (!h.png) throw Error(label + ": cannot start the PNG decoder (out of memory)");
  h.info = png_create_info_struct(h.png);
  if (!h.info) throw Error(label + ": cannot start the PNG decoder (out of memory)");
  if (setjmp(png_jmpbuf(h.png))) throw Error(label + ": not a valid PNG image (" + std::string(src->message) + ")");

  png_set_read_fn(h.png, src.get(), read_bytes);
  // Our own pixel cap applies (below); libpng's default 1,000,000-pixel width/height limits would
  // refuse long thin images the reference accepts.
  png_set_user_limits(h.png, 0x7fffffff, 0x7fffffff);
  png_read_info(h.png, h.info);
  layout.width = int64_t(png_get_image_width(h.png, h.info));
  const int64_t height = int64_t(png_get_image_height(h.png, h.info));
  layout.bit_depth = png_get_bit_depth(h.png, h.info);
  layout.color_type = png_get_color_type(h.png, h.info);
  check_image_dimensions(layout.width, height, max_pixels, label);
  if (layout.color_type == PNG_COLOR_TYPE_PALETTE) {
    for (int i = 0; i < 256; ++i) layout.palette[i][0] = layout.palette[i][1] = layout.palette[i][2] = uint8_t(i);
    png_colorp plte = nullptr;
    int n = 0;
    if (png_get_PLTE(h.png, h.info, &plte, &n) == 0 || !plte) png_error(h.png, "palette image without a PLTE chunk");
    for (int i = 0; i < n && i < 256; ++i) {
      layout.palette[i][0] = plte[i].red;
      layout.palette[i][1] = plte[i].green;
      layout.palette[i][2] = plte[i].blue;
    }
  }
  if (layout.bit_depth < 8) png_set_packing(h.png);
  const int passes = png_set_interlace_handling(h.png);
  png_read_update_info(h.png, h.info);
  const size_t row_bytes = png_get_rowbytes(h.png, h.info);
  img.width = layout.width;
  img.height = height;
  img.rgb.resize(size_t(layout.width * height * 3));
  if (passes <= 1) {
    raw.resize(row_bytes);
    for (int64_t y = 0; y < height; ++y) {
      png_read_row(h.png, raw.data(), nullptr);
      convert_row(layout, raw.data(), img.rgb.data() + y * layout.width * 3);
    }
  } else {
    raw.resize(row_bytes * size_t(height));
    row_pointers.resize(size_t(height));
    for (int64_t y = 0; y < height; ++y) row_pointers[size_t(y)] = raw.data() + size_t(y) * row_bytes;
    png_read_image(h.png, row_pointers.data());
    for (int64_t y = 0; y < height; ++y)
      convert_row(layout, row_pointers[size_t(y)], img.rgb.data() + y * layout.width * 3);
  }
  // The image is complete; what follows IDAT (text chunks, IEND) is not needed, as in Pillow.
  return img;
}

}  // namespace ds41
