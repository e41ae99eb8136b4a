// Decoding image files into 8-bit RGB exactly as the reference's loader sees them.
//
// The reference (image_processor.py load_image) opens every image with Pillow and calls
// convert("RGB") — nothing else (spec engram_dspark_vision.md §C.2 Pixels step 1, pitfall 15):
//  * no EXIF orientation transpose: a JPEG tagged "rotate 90" stays in its stored orientation;
//  * alpha is dropped, not composited (RGBA/LA -> the colour channels as stored), and a PNG tRNS
//    transparency key is ignored;
//  * 16-bit PNG samples: colour and gray+alpha keep the high byte; plain 16-bit gray is Pillow mode
//    "I", whose RGB conversion clips (values above 255 become 255, they are not scaled);
//  * 1/2/4-bit gray is scaled by bit replication (x255, x85, x17); palette indices look up the
//    PLTE entries, and an index past the end of the palette reads the gray ramp entry (i, i, i)
//    (Pillow 9.4.0, the version the reference was run with, starts every palette as that ramp);
//  * CMYK JPEGs are taken as Adobe-inverted (Pillow always does) and converted with Pillow's
//    rule r = clip(255 - k - (c' * (255 - k) + 127) / 255 ...) (see jpeg_decode.cpp);
//  * JPEG and WebP pixels come from libjpeg-turbo / libwebp with their default settings (islow
//    IDCT, fancy upsampling), which is what Pillow calls.
// Supported containers: PNG, JPEG (baseline, progressive, arithmetic; gray, YCbCr/RGB, CMYK/YCCK)
// and still WebP (lossy, lossless, with or without alpha). Anything else, and any corrupt,
// truncated, zero-size or oversized file, is a ds41::Error naming the file and the problem.
// Size is checked from the header before any pixel is decoded (decompression bombs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds41 {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height][width][3], row-major
};

// Pillow refuses an image of more than 2 x Image.MAX_IMAGE_PIXELS (89,478,485) pixels with a
// DecompressionBombError, so the reference cannot take one either; we refuse the same images.
inline constexpr int64_t kMaxImagePixels = 2 * int64_t(89478485);
// Files are read whole into memory first; nothing legitimate under the pixel cap comes near this.
inline constexpr int64_t kMaxImageFileBytes = int64_t(1) << 30;

enum class ImageFormat { Png, Jpeg, Webp };

// From the leading bytes; throws for anything that is not PNG, JPEG or WebP (naming GIF, BMP,
// TIFF and the like when recognised). `label` names the source in errors (a path, "image 2").
ImageFormat detect_image_format(const uint8_t* data, size_t size, const std::string& label);

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& label,
                      int64_t max_pixels = kMaxImagePixels);
RgbImage read_image_file(const std::string& path, int64_t max_pixels = kMaxImagePixels);

// Per-format decoders behind decode_image (the format already detected).
RgbImage decode_png(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels);
RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels);
RgbImage decode_webp(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels);

// Throws unless 0 < width, 0 < height and width * height <= max_pixels (and the RGB buffer size
// fits in memory arithmetic). Shared by the decoders, called with the header's dimensions.
void check_image_dimensions(int64_t width, int64_t height, int64_t max_pixels, const std::string& label);

}  // namespace ds41
