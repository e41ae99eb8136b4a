// JPEG through libjpeg-turbo with its default decompression settings (islow IDCT, fancy
// upsampling), as Pillow calls it. libjpeg reports fatal errors through error_exit, which here
// longjmps back to the decoding function (same discipline as png_decode.cpp: every object with a
// destructor is declared before setjmp and libjpeg is called only from that frame).
//
// Warnings: Pillow ignores libjpeg's warnings (corrupt-data recoveries), except that running out
// of data is an error for it ("image file is truncated"); libjpeg signals that with the warning
// JWRN_JPEG_EOF, which we therefore make fatal.
#include <cstdio>
// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "vision/image_decode.h"

namespace ds41 {

namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  e->mgr.format_message(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && e->mgr.msg_code == JWRN_JPEG_EOF) {
    std::snprintf(e->message, sizeof e->message, "the file is truncated");
    std::longjmp(e->jump, 1);
  }
}

struct JpegHandle {
  jpeg_decompress_struct cinfo;
  bool created = false;
  ~JpegHandle() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Pillow's CMYK -> RGB (Convert.c cmyk2rgb) on values already un-inverted as its "CMYK;I"
// unpacker does: with nk = 255 - k, channel = nk - round(c * nk / 255) using its integer
// MULDIV255 (t = c * nk + 128, (t + (t >> 8)) >> 8).
uint8_t cmyk_channel(uint8_t c, uint8_t k) {
  const int nk = 255 - k;
  const int t = c * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels) {
  RgbImage img;
  auto errors = std::make_unique<JpegErrors>();
  auto handle = std::make_unique<JpegHandle>();
  std::vector<uint8_t> row;
  jpeg_decompress_struct& cinfo = handle->cinfo;
  cinfo.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = on_error_exit;
  errors->mgr.emit_message = on_message;
  errors->message[0] = 0;
  if (setjmp(errors->jump)) throw Error(label + ": not a valid JPEG image (" + std::string(errors->message) + ")");

  jpeg_create_decompress(&cinfo);
  handle->created = true;
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  check_image_dimensions(int64_t(cinfo.image_width), int64_t(cinfo.image_height), max_pixels, label);
  const int components = cinfo.num_components;
  if (components == 1) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (components == 3) {
    cinfo.out_color_space = JCS_RGB;
  } else if (components == 4) {
    cinfo.out_color_space = JCS_CMYK;  // libjpeg turns YCCK into CMYK
  } else {
    throw Error(label + ": JPEG with " + std::to_string(components) + " colour components is not supported");
  }
  jpeg_start_decompress(&cinfo);
  const int64_t w = cinfo.output_width, h = cinfo.output_height;
  const int channels = cinfo.output_components;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w * h * 3));
  row.resize(size_t(w * channels));
  while (cinfo.output_scanline < cinfo.output_height) {
    const int64_t y = cinfo.output_scanline;
    JSAMPROW rows[1] = {row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) throw Error(label + ": not a valid JPEG image (no scanline data)");
    uint8_t* out = img.rgb.data() + y * w * 3;
    if (channels == 1) {
      for (int64_t x = 0; x < w; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[size_t(x)];
    } else if (channels == 3) {
      std::memcpy(out, row.data(), size_t(w * 3));
    } else {
      // Pillow assumes Adobe polarity for every CMYK JPEG: stored values are inverted.
      for (int64_t x = 0; x < w; ++x) {
        const uint8_t* p = row.data() + 4 * x;
        const uint8_t k = uint8_t(255 - p[3]);
        for (int c = 0; c < 3; ++c) out[3 * x + c] = cmyk_channel(uint8_t(255 - p[c]), k);
      }
    }
  }
  // Not jpeg_finish_decompress: the pixels are complete, and what follows (up to EOI) is not
  // needed; Pillow does not insist on it either.
  return img;
}

}  // namespace ds41
