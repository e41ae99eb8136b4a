// Still WebP images (lossy or lossless, alpha or not) through libwebp's simple decoding API.
// Pillow decodes a WebP file's first frame as non-premultiplied RGBA with libwebp's default
// settings and convert("RGB") then drops alpha; decoding straight to RGB gives the same colour
// values. Animated files are refused (the reference would take the first frame; not needed here).
#include <webp/decode.h>

#include "base/error.h"
#include "vision/image_decode.h"

namespace ds41 {

namespace {

const char* webp_status_text(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OK: return "ok";
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the file is truncated";
  }
  return "unknown error";
}

}  // namespace

RgbImage decode_webp(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels) {
  WebPBitstreamFeatures features;
  const VP8StatusCode st = WebPGetFeatures(data, size, &features);
  if (st != VP8_STATUS_OK) throw Error(label + ": not a valid WebP image (" + webp_status_text(st) + ")");
  if (features.has_animation) throw Error(label + ": animated WebP images are not supported (use a still image)");
  check_image_dimensions(features.width, features.height, max_pixels, label);
  RgbImage img;
  img.width = features.width;
  img.height = features.height;
  img.rgb.resize(size_t(img.width * img.height * 3));
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw Error(label + ": cannot start the WebP decoder (library version mismatch)");
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = img.rgb.data();
  config.output.u.RGBA.stride = int(img.width * 3);
  config.output.u.RGBA.size = img.rgb.size();
  const VP8StatusCode ds = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);
  if (ds != VP8_STATUS_OK) throw Error(label + ": not a valid WebP image (" + webp_status_text(ds) + ")");
  return img;
}

}  // namespace ds41
