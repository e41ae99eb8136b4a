#include "vision/image_preprocess.h"

#include <array>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "vision/pillow_resize.h"

namespace ds41 {

namespace {

// Python's round() on a float: nearest, ties to even (the default FP rounding mode).
int64_t round_half_even(double x) { return int64_t(std::nearbyint(x)); }

}  // namespace

RgbImage letterbox(const RgbImage& image, int64_t width, int64_t height, uint8_t fill) {
  // ImageOps.contain: the largest size inside the target with the image's aspect ratio.
  const double im_ratio = double(image.width) / double(image.height);
  const double dest_ratio = double(width) / double(height);
  int64_t w = width, h = height;
  if (im_ratio != dest_ratio) {
    if (im_ratio > dest_ratio) {
      const int64_t nh = round_half_even(double(image.height) / double(image.width) * double(width));
      if (nh != height) h = nh;
    } else {
      const int64_t nw = round_half_even(double(image.width) / double(image.height) * double(height));
      if (nw != width) w = nw;
    }
  }
  if (w < 1 || h < 1)
    throw Error("image of " + std::to_string(image.width) + " x " + std::to_string(image.height) +
                " pixels: its aspect ratio is too extreme to fit a " + std::to_string(width) + " x " +
                std::to_string(height) + " letterbox (a side would be 0 pixels)");
  RgbImage resized = pillow_resize_bicubic(image, w, h);
  if (w == width && h == height) return resized;
  RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.assign(size_t(width * height * 3), fill);
  int64_t x0 = 0, y0 = 0;
  if (w != width) x0 = round_half_even(double(width - w) * 0.5);
  else y0 = round_half_even(double(height - h) * 0.5);
  for (int64_t y = 0; y < h; ++y)
    std::memcpy(out.rgb.data() + ((y + y0) * width + x0) * 3, resized.rgb.data() + y * w * 3, size_t(w * 3));
  return out;
}

RgbImage resize_for_grid(const RgbImage& image, const ImageGrid& grid) {
  if (grid.stretched) return pillow_resize_bicubic(image, grid.best_width, grid.best_height);
  return letterbox(image, grid.best_width, grid.best_height);
}

uint16_t normalized_pixel_bf16(uint8_t v) {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const float x = float(i) / 255.0f;
      t[size_t(i)] = f32_to_bf16((x - 0.5f) / 0.5f);
    }
    return t;
  }();
  return table[v];
}

std::vector<uint16_t> patchify(const RgbImage& sized, const ImageGrid& grid, int64_t p) {
  if (sized.width != grid.n_vit_w * p || sized.height != grid.n_vit_h * p)
    throw Error("patchify: the image is not at the planned size");
  const int64_t features = 3 * p * p;
  std::vector<uint16_t> out(size_t(grid.n_patches() * features));
  for (int64_t gy = 0; gy < grid.n_vit_h; ++gy)
    for (int64_t gx = 0; gx < grid.n_vit_w; ++gx) {
      uint16_t* patch = out.data() + (gy * grid.n_vit_w + gx) * features;
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t py = 0; py < p; ++py)
          for (int64_t px = 0; px < p; ++px) {
            const uint8_t v = sized.rgb[size_t(((gy * p + py) * sized.width + gx * p + px) * 3 + ch)];
            patch[ch * p * p + py * p + px] = normalized_pixel_bf16(v);
          }
    }
  return out;
}

PreparedImage prepare_image(const RgbImage& image, const ModelConfig& c) {
  PreparedImage out;
  out.grid = plan_image_grid(image.width, image.height, c);
  const RgbImage sized = resize_for_grid(image, out.grid);
  out.patches = patchify(sized, out.grid, c.vision_patch_size);
  return out;
}

}  // namespace ds41
