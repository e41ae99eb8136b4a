#include "vision/pillow_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"

namespace ds41 {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS

struct AxisCoefficients {
  int ksize = 0;
  std::vector<int32_t> first, count;  // per output index: first input tap and number of taps
  std::vector<int32_t> k;             // [out][ksize] fixed-point coefficients
};

AxisCoefficients axis_coefficients(int64_t in_size, int64_t out_size) {
  // Pillow receives the box as fp32 coordinates: (in - 0) is formed in fp32, then widened.
  const double in_span = double(static_cast<float>(in_size));
  const double scale = in_span / double(out_size);
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 2.0 * filterscale;  // bicubic support 2
  AxisCoefficients a;
  a.ksize = int(std::ceil(support)) * 2 + 1;
  a.first.resize(size_t(out_size));
  a.count.resize(size_t(out_size));
  a.k.assign(size_t(out_size) * size_t(a.ksize), 0);
  std::vector<double> w(size_t(a.ksize));
  const double ss = 1.0 / filterscale;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (double(i) + 0.5) * scale;
    // C casts truncate toward zero.
    int64_t xmin = int64_t(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = int64_t(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    if (xmax > a.ksize) xmax = a.ksize;  // cannot happen; keeps the buffer safe
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[size_t(x)] = pillow_bicubic_kernel((double(x + xmin) - center + 0.5) * ss);
      ww += w[size_t(x)];
    }
    int32_t* kk = a.k.data() + i * a.ksize;
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
      kk[x] = v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    a.first[size_t(i)] = int32_t(xmin);
    a.count[size_t(i)] = int32_t(xmax);
  }
  return a;
}

inline uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecisionBits);
}

// Rows [y0, y1) of `in` resampled horizontally into `out` (width out_w, rows from 0).
void resample_horizontal(const RgbImage& in, int64_t y0, int64_t y1, const AxisCoefficients& a, int64_t out_w,
                         uint8_t* out) {
  for (int64_t y = y0; y < y1; ++y) {
    const uint8_t* src = in.rgb.data() + y * in.width * 3;
    uint8_t* dst = out + (y - y0) * out_w * 3;
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* k = a.k.data() + x * a.ksize;
      const uint8_t* p = src + int64_t(a.first[size_t(x)]) * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int32_t t = 0; t < a.count[size_t(x)]; ++t) {
        s0 += int32_t(p[3 * t]) * k[t];
        s1 += int32_t(p[3 * t + 1]) * k[t];
        s2 += int32_t(p[3 * t + 2]) * k[t];
      }
      dst[3 * x] = clip8(s0);
      dst[3 * x + 1] = clip8(s1);
      dst[3 * x + 2] = clip8(s2);
    }
  }
}

// Vertical pass over an image of width w whose row 0 is input row `row0` of the coefficients.
void resample_vertical(const uint8_t* in, int64_t w, int64_t row0, const AxisCoefficients& a, int64_t out_h,
                       uint8_t* out) {
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* k = a.k.data() + y * a.ksize;
    const int64_t first = a.first[size_t(y)] - row0;
    const int32_t n = a.count[size_t(y)];
    uint8_t* dst = out + y * w * 3;
    for (int64_t x = 0; x < w * 3; ++x) {
      int32_t s = 1 << (kPrecisionBits - 1);
      const uint8_t* p = in + first * w * 3 + x;
      for (int32_t t = 0; t < n; ++t) s += int32_t(p[t * w * 3]) * k[t];
      dst[x] = clip8(s);
    }
  }
}

}  // namespace

double pillow_bicubic_kernel(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

RgbImage pillow_resize_bicubic(const RgbImage& in, int64_t width, int64_t height) {
  if (width < 1 || height < 1)
    throw Error("image resize to " + std::to_string(width) + " x " + std::to_string(height) +
                ": height and width must be > 0");
  if (in.width < 1 || in.height < 1) throw Error("image resize: the source image is empty");
  if (width == in.width && height == in.height) return in;
  const bool horizontal = width != in.width, vertical = height != in.height;
  const AxisCoefficients ch = horizontal ? axis_coefficients(in.width, width) : AxisCoefficients{};
  const AxisCoefficients cv = vertical ? axis_coefficients(in.height, height) : AxisCoefficients{};
  // Only the input rows the vertical pass reads go through the horizontal pass (as in Pillow;
  // every row is resampled independently, so this changes no value).
  int64_t y0 = 0, y1 = in.height;
  if (vertical) {
    y0 = cv.first.front();
    y1 = int64_t(cv.first.back()) + cv.count.back();
  }
  RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.resize(size_t(width * height * 3));
  if (horizontal && vertical) {
    std::vector<uint8_t> tmp(size_t(width * (y1 - y0) * 3));
    resample_horizontal(in, y0, y1, ch, width, tmp.data());
    resample_vertical(tmp.data(), width, y0, cv, height, out.rgb.data());
  } else if (horizontal) {
    resample_horizontal(in, 0, in.height, ch, width, out.rgb.data());
  } else {
    resample_vertical(in.rgb.data(), in.width, 0, cv, height, out.rgb.data());
  }
  return out;
}

}  // namespace ds41
