// The resize plan of an image (spec engram_dspark_vision.md §C.2 "Plan"; image_processor.py
// plan_image_grid / safe_resize / solve_resize_ratio): the pixel size the image is letterboxed to,
// its ViT patch grid and its LLM token grid, as a pure function of the original size and the
// vision config.
//
// Every expression is evaluated in IEEE double in the reference's order, because the reference
// runs them in Python floats and its results sit on exact-integer edges (note (a) of §C.2: the
// golden vision-a's second image has floor(79 * beta / 14) = floor(2.9999999999999996) = 2, one
// patch short of the real-arithmetic answer). The minimum-area ratio is pow(x, 0.5), as Python's
// `** 0.5`, not sqrt (note (b)).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace ds41 {

struct ImageGrid {
  int64_t best_width = 0, best_height = 0;  // letterbox target in pixels (multiples of the patch)
  int64_t n_vit_h = 0, n_vit_w = 0;         // ViT patch grid
  int64_t n_llm_h = 0, n_llm_w = 0;         // aligner output grid (tokens)
  bool stretched = false;  // vision_max_wh_ratio path: plain resize to the target, no letterbox
  // Positions of the image's span in the prompt: start, n_llm_h rows of (n_llm_w + newline), end.
  int64_t span_length() const { return n_llm_h * (n_llm_w + 1) + 2; }
  int64_t n_patches() const { return n_vit_h * n_vit_w; }
};

// Throws ds41::Error when the config has no usable vision geometry or the plan degenerates
// (an aspect ratio so extreme that a side becomes zero pixels).
ImageGrid plan_image_grid(int64_t width, int64_t height, const ModelConfig& c);

}  // namespace ds41
