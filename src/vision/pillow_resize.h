// Pillow's resampling (libImaging/Resample.c, the 8-bit path), reproduced bit for bit: the
// reference resizes with Pillow's BICUBIC (ImageOps.pad), and the ViT input must equal its pixels
// exactly (spec §C.2 note (c)). Read from Pillow's source to understand; our own code.
//
// Per axis, for output index i of a resize from `in` to `out` samples:
//   scale = in / out (in taken as an fp32 box coordinate, as Pillow passes the box), fs = max(scale, 1)
//   support = 2 * fs; center = (i + 0.5) * scale
//   taps x in [trunc(center - support + 0.5) clamped to 0, trunc(center + support + 0.5) clamped to in)
//   w_x = bicubic((x - center + 0.5) / fs), a = -0.5; normalised by their sum (double)
//   integer coefficient = trunc(w * 2^22 +- 0.5) (away from zero)
//   value = clip8((2^21 + sum coefficient * sample) >> 22), 32-bit integer sums
// Two passes, horizontal first, with the 8-bit clipped intermediate between them; an axis whose
// size does not change is not resampled at all, and an unchanged size is a plain copy.
#pragma once

#include <cstdint>

#include "vision/image_decode.h"

namespace ds41 {

// BICUBIC resize of an RGB image to width x height (both >= 1).
RgbImage pillow_resize_bicubic(const RgbImage& in, int64_t width, int64_t height);

// The bicubic kernel Pillow uses (a = -0.5), exposed for tests.
double pillow_bicubic_kernel(double x);

}  // namespace ds41
