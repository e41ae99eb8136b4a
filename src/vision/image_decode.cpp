#include "vision/image_decode.h"

#include <cstring>
#include <fstream>

#include "base/error.h"

namespace ds41 {

namespace {

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

}  // namespace

void check_image_dimensions(int64_t width, int64_t height, int64_t max_pixels, const std::string& label) {
  if (width <= 0 || height <= 0)
    throw Error(label + ": the image has zero size (" + std::to_string(width) + " x " + std::to_string(height) + ")");
  // width * height cannot overflow: each is below 2^32 in every format we read.
  if (width > (int64_t(1) << 32) || height > (int64_t(1) << 32) || width * height > max_pixels)
    throw Error(label + ": the image is " + std::to_string(width) + " x " + std::to_string(height) +
                " pixels, more than the limit of " + std::to_string(max_pixels) +
                " (the reference's Pillow refuses such images as decompression bombs); scale it down first");
}

ImageFormat detect_image_format(const uint8_t* data, size_t size, const std::string& label) {
  if (size == 0) throw Error(label + ": the file is empty");
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::Png;
  if (starts_with(data, size, "\xff\xd8\xff", 3)) return ImageFormat::Jpeg;
  if (size >= 12 && starts_with(data, size, "RIFF", 4) && std::memcmp(data + 8, "WEBP", 4) == 0) return ImageFormat::Webp;
  std::string what = "an unrecognised format";
  if (starts_with(data, size, "GIF8", 4)) what = "GIF";
  else if (starts_with(data, size, "BM", 2)) what = "BMP";
  else if (starts_with(data, size, "II*\0", 4) || starts_with(data, size, "MM\0*", 4)) what = "TIFF";
  else if (size >= 12 && std::memcmp(data + 4, "ftyp", 4) == 0) what = "HEIF/AVIF";
  else if (starts_with(data, size, "\x89PNG", 4) || starts_with(data, size, "\xff\xd8", 2)) what = "a damaged PNG/JPEG header";
  throw Error(label + ": " + what + " is not a supported image (use PNG, JPEG or WebP)");
}

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels) {
  switch (detect_image_format(data, size, label)) {
    case ImageFormat::Png: return decode_png(data, size, label, max_pixels);
    case ImageFormat::Jpeg: return decode_jpeg(data, size, label, max_pixels);
    case ImageFormat::Webp: return decode_webp(data, size, label, max_pixels);
  }
  throw Error(label + ": unsupported image format");
}

RgbImage read_image_file(const std::string& path, int64_t max_pixels) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": cannot open the image file");
  const std::streamoff size = in.tellg();
  if (size < 0) throw Error(path + ": cannot read the image file");
  if (size > kMaxImageFileBytes)
    throw Error(path + ": the image file is " + std::to_string(size) + " bytes, more than the limit of " +
                std::to_string(kMaxImageFileBytes));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) throw Error(path + ": cannot read the image file");
  return decode_image(bytes.data(), bytes.size(), path, max_pixels);
}

}  // namespace ds41
