#include "vision/image_grid.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace ds41 {

namespace {

struct LlmGrid {
  int64_t h, w;
};

// ceil((best // patch) / ratio) per side; the division is a float one in the reference.
LlmGrid llm_grid(int64_t best_h, int64_t best_w, int64_t p, int64_t r) {
  return {int64_t(std::ceil(double(best_h / p) / double(r))), int64_t(std::ceil(double(best_w / p) / double(r)))};
}

int64_t tokens(const LlmGrid& g) { return g.h * (g.w + 1) + 2; }

}  // namespace

ImageGrid plan_image_grid(int64_t width_px, int64_t height_px, const ModelConfig& c) {
  const int64_t p = c.vision_patch_size, r = c.vision_downsample_ratio, T = c.vision_max_n_token;
  if (p < 1 || r < 1 || T < 4)
    throw Error("vision config: patch size, downsample ratio and max image tokens must be positive (max tokens >= 4)");
  if (width_px < 1 || height_px < 1) throw Error("image of zero size");
  // Python keeps these as ints until a ratio makes them floats; doubles hold both exactly here.
  double width = double(width_px), height = double(height_px);
  if (c.vision_max_wh_ratio && width > height * *c.vision_max_wh_ratio) width = height * *c.vision_max_wh_ratio;
  const double area = width * height;
  if (0 < area && area < double(c.vision_min_pixels)) {
    const double ratio = std::pow(double(c.vision_min_pixels) / area, 0.5);
    width = std::trunc(width * ratio);
    height = std::trunc(height * ratio);
  }
  int64_t best_w = int64_t(std::ceil(width / double(p))) * p;
  int64_t best_h = int64_t(std::ceil(height / double(p))) * p;
  LlmGrid g = llm_grid(best_h, best_w, p, r);
  if (tokens(g) > T) {
    // Largest aspect-preserving size whose grid fits: r*w^2 + r*w + 2 = T for w cells wide.
    const double ar = height / width;
    const double max_w = std::sqrt(double(T - 2) / ar + 0.25) - 0.5;
    const double max_h = max_w * ar;
    const int64_t cell = p * r;
    if (max_w < 1.0) {  // very tall: one column
      best_h = (T - 2) / 2 * cell;
      best_w = cell;
    } else if (max_h < 1.0) {  // very wide: one row
      best_h = cell;
      best_w = (T - 3) * cell;
    } else {
      const double beta = std::min(double(int64_t(std::floor(max_w)) * cell) / width,
                                   double(int64_t(std::floor(max_h)) * cell) / height);
      best_h = int64_t(std::floor(height * beta / double(p))) * p;
      best_w = int64_t(std::floor(width * beta / double(p))) * p;
    }
    g = llm_grid(best_h, best_w, p, r);
    if (tokens(g) > T)
      throw Error("image plan: " + std::to_string(width_px) + " x " + std::to_string(height_px) + " still needs " +
                  std::to_string(tokens(g)) + " tokens after re-solving (limit " + std::to_string(T) + ")");
  }
  if (best_w < p || best_h < p)
    throw Error("image of " + std::to_string(width_px) + " x " + std::to_string(height_px) +
                " pixels: its aspect ratio is too extreme to give a patch grid (a side would be " +
                std::to_string(best_w < p ? best_w : best_h) + " pixels)");
  ImageGrid out;
  out.best_width = best_w;
  out.best_height = best_h;
  out.n_vit_h = best_h / p;
  out.n_vit_w = best_w / p;
  out.n_llm_h = g.h;
  out.n_llm_w = g.w;
  out.stretched = c.vision_max_wh_ratio && double(width_px) >= *c.vision_max_wh_ratio * double(height_px);
  return out;
}

}  // namespace ds41
