// Scalar reference RoPE/YaRN; see rope.h for the exact fp32 operation order it reproduces.
#include "kernels/rope.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <string>

#include "base/error.h"
#include "kernels/numeric_formats.h"

// Each fp32 product/sum must round on its own (torch's complex multiply and YaRN blend are
// separate roundings): forbid FMA contraction, which -march=native would otherwise allow.
#include "base/fp_contract_off.h"

namespace ds41 {
namespace {

void check_dim(int dim) {
  if (dim <= 0 || dim % 2 != 0)
    throw Error("rope: rotary dim must be a positive even number, got " + std::to_string(dim));
}

// The rope dim at which a wavelength completes `rotations` turns over the training context,
// evaluated in double with the reference's association: dim * log(L0 / (r * 2 * pi)) / (2 log b).
double correction_dim(double rotations, int dim, double base, int64_t original_seq_len) {
  const double turns = rotations * 2.0 * std::numbers::pi;
  return static_cast<double>(dim) * std::log(static_cast<double>(original_seq_len) / turns) /
         (2.0 * std::log(base));
}

}  // namespace

YarnRange yarn_correction_range(int dim, double base, int64_t original_seq_len, double beta_fast,
                                double beta_slow) {
  check_dim(dim);
  YarnRange r;
  r.low = std::max<int64_t>(
      static_cast<int64_t>(std::floor(correction_dim(beta_fast, dim, base, original_seq_len))), 0);
  r.high = std::min<int64_t>(
      static_cast<int64_t>(std::ceil(correction_dim(beta_slow, dim, base, original_seq_len))),
      dim - 1);
  return r;
}

std::vector<float> rope_inv_freq(int dim, double base, int64_t original_seq_len, double factor,
                                 double beta_fast, double beta_slow) {
  check_dim(dim);
  const int half = dim / 2;
  const float base_f = static_cast<float>(base);  // torch casts the Python base to fp32
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    // fp32 pow (glibc powf); for the released dims/bases it equals the correctly rounded pow.
    f[i] = 1.0f / std::pow(base_f, exponent);
  }
  if (original_seq_len <= 0) return f;

  const YarnRange range = yarn_correction_range(dim, base, original_seq_len, beta_fast, beta_slow);
  // max(high - low, 1e-3) is a Python number; dividing the fp32 tensor by it uses its fp32 value.
  const float span =
      static_cast<float>(std::max(static_cast<double>(range.high - range.low), 1e-3));
  const float low_f = static_cast<float>(range.low);
  const float factor_f = static_cast<float>(factor);
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span, 0.0f, 1.0f);
    const float smooth = 1.0f - ramp;
    const float extrapolated = f[i] / factor_f;
    const float a = extrapolated * (1.0f - smooth);
    const float b = f[i] * smooth;
    f[i] = a + b;
  }
  return f;
}

float rope_angle(int64_t p, float inv_freq) { return static_cast<float>(p) * inv_freq; }

void rope_cos_sin_row(const float* inv_freq, int half, int64_t p, float* cos, float* sin) {
  for (int i = 0; i < half; ++i) {
    const float theta = rope_angle(p, inv_freq[i]);
    cos[i] = std::cos(theta);  // float overloads = cosf/sinf, like torch.polar on CPU
    sin[i] = std::sin(theta);
  }
}

std::pair<float, float> rope_cos_sin(const std::vector<float>& inv_freq, int64_t p, int i) {
  const float theta = rope_angle(p, inv_freq.at(static_cast<size_t>(i)));
  return {std::cos(theta), std::sin(theta)};
}

RopeTable make_rope_table(const std::vector<float>& inv_freq, int64_t n_positions) {
  RopeTable t;
  const int half = static_cast<int>(inv_freq.size());
  t.dim = 2 * half;
  check_dim(t.dim);
  t.n_positions = std::max<int64_t>(n_positions, 0);
  t.inv_freq = inv_freq;
  t.cos.resize(static_cast<size_t>(t.n_positions * half));
  t.sin.resize(static_cast<size_t>(t.n_positions * half));
  for (int64_t p = 0; p < t.n_positions; ++p)
    rope_cos_sin_row(inv_freq.data(), half, p, t.cos.data() + p * half, t.sin.data() + p * half);
  return t;
}

void rope_apply(uint16_t* x, const float* cos, const float* sin, int dim, bool inverse) {
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    const float a = bf16_to_f32(x[2 * i]);
    const float b = bf16_to_f32(x[2 * i + 1]);
    const float c = cos[i], s = sin[i];
    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
    float re, im;
    if (!inverse) {
      re = ac - bs;
      im = as + bc;
    } else {  // multiply by the conjugate c - i*s
      re = ac + bs;
      im = bc - as;
    }
    x[2 * i] = f32_to_bf16(re);
    x[2 * i + 1] = f32_to_bf16(im);
  }
}

void rope_apply_at(uint16_t* x, const RopeTable& table, int64_t p, bool inverse) {
  if (p >= 0 && p < table.n_positions) {
    rope_apply(x, table.cos_row(p), table.sin_row(p), table.dim, inverse);
    return;
  }
  constexpr int kMaxHalf = 512;
  const int half = table.dim / 2;
  if (half > kMaxHalf)
    throw Error("rope: on-demand rotation supports at most " + std::to_string(2 * kMaxHalf) +
                " rotary dims, got " + std::to_string(table.dim));
  std::array<float, kMaxHalf> c, s;
  rope_cos_sin_row(table.inv_freq.data(), half, p, c.data(), s.data());
  rope_apply(x, c.data(), s.data(), table.dim, inverse);
}

}  // namespace ds41
