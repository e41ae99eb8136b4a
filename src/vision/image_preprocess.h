// From decoded RGB to the bf16 patches the ViT receives (spec §C.2 "Pixels", pitfall 15;
// image_processor.py load_image):
//  1. letterbox into the planned size with Pillow's ImageOps.pad semantics: fit inside the target
//     keeping the aspect ratio (the new side rounded half-to-even, as Python's round), BICUBIC
//     resize (pillow_resize.h), paste centred on a gray-127 canvas at round((target - size) * 0.5);
//     when vision_max_wh_ratio says so, a plain BICUBIC resize to the target instead;
//  2. x = fp32(v) / 255, x = (x - 0.5) / 0.5 in fp32, rounded to bf16 (RNE);
//  3. patchify row-major over the ViT grid, each patch channel-major then row then column
//     (feature index c * p * p + py * p + px).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "vision/image_decode.h"
#include "vision/image_grid.h"

namespace ds41 {

inline constexpr uint8_t kLetterboxFill = 127;

struct PreparedImage {
  ImageGrid grid;
  std::vector<uint16_t> patches;  // bf16 [n_vit_h * n_vit_w][3 * p * p]
};

// Pillow ImageOps.pad(image, (width, height), BICUBIC, color=(fill, fill, fill), centering 0.5).
RgbImage letterbox(const RgbImage& image, int64_t width, int64_t height, uint8_t fill = kLetterboxFill);

// The uint8 image the normalisation sees: letterboxed (or stretched) to the grid's size.
RgbImage resize_for_grid(const RgbImage& image, const ImageGrid& grid);

// bf16 bits of ((v / 255) - 0.5) / 0.5 in fp32, for a uint8 sample v.
uint16_t normalized_pixel_bf16(uint8_t v);

// Patches of an image already at the grid's pixel size.
std::vector<uint16_t> patchify(const RgbImage& sized, const ImageGrid& grid, int64_t patch);

// The whole path: plan, resize, normalise, patchify.
PreparedImage prepare_image(const RgbImage& image, const ModelConfig& c);

}  // namespace ds41
