// RoPE / YaRN tests (spec backbone.md §6, §12.3). Expected values: the spec's printed
// frequencies (6 significant digits, so compared within half a unit of the last printed digit),
// closed forms, double-precision evaluations, and the documented fp32 formulas written out here.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/numeric_formats.h"

#include "base/fp_contract_off.h"

namespace ds41 {
namespace {

// Released configurations (spec §1.1, §5.1): compressed layers and ratio-0 (SWA-only) layers.
std::vector<float> compressed_freqs() { return rope_inv_freq(64, 160000.0, 65536, 16.0, 32, 1); }
std::vector<float> swa_freqs() { return rope_inv_freq(64, 10000.0, 0, 16.0, 32, 1); }

constexpr double kBf16U = 1.0 / 256.0;  // bf16 unit roundoff (8 significant bits)

TEST(Rope, ReleasedYarnCorrectionRange) {
  // Spec §6: base 160000, L0 65536, beta 32/1, dim 64 -> low 15, high 25.
  const YarnRange r = yarn_correction_range(64, 160000.0, 65536, 32, 1);
  EXPECT_EQ(r.low, 15);
  EXPECT_EQ(r.high, 25);
}

TEST(Rope, ReleasedCompressedLayerFrequencies) {
  const auto f = compressed_freqs();
  ASSERT_EQ(f.size(), 32u);
  // Spec §6 values (printed to 6 digits).
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[15], 3.63554e-3, 0.5e-8);
  EXPECT_NEAR(f[25], 5.37231e-6, 0.5e-11);
  EXPECT_NEAR(f[31], 5.68053e-7, 0.5e-12);
  // Structure of the blend: ramp 0 below low keeps f exactly ((f/16)*0 + f*1); ramp 1 from high
  // on gives exactly f/16 ((f/16)*1 + f*0); fp32 arithmetic, so exact equalities.
  const auto plain = rope_inv_freq(64, 160000.0, 0, 16.0, 32, 1);
  for (int i = 0; i <= 15; ++i) EXPECT_EQ(f[i], plain[i]) << i;
  for (int i = 25; i < 32; ++i) EXPECT_EQ(f[i], plain[i] / 16.0f) << i;
  // In between: ramp = (i - 15) / 10 strictly between 0 and 1, so f is strictly between.
  for (int i = 16; i < 25; ++i) {
    EXPECT_LT(f[i], plain[i]) << i;
    EXPECT_GT(f[i], plain[i] / 16.0f) << i;
  }
}

TEST(Rope, YarnBlendFollowsTheReferenceAssociation) {
  // f_i = (f/factor)*(1-smooth) + f*smooth, fp32, smooth = 1 - clamp((i-15)/10, 0, 1), written
  // out with one rounding per step (double op on fp32 operands, rounded: exact emulation).
  const auto f = compressed_freqs();
  const auto plain = rope_inv_freq(64, 160000.0, 0, 16.0, 32, 1);
  for (int i = 0; i < 32; ++i) {
    float ramp = float((double(float(i)) - 15.0) / 10.0);
    ramp = std::fmin(std::fmax(ramp, 0.0f), 1.0f);
    const float smooth = float(1.0 - ramp);
    const float a = float(double(float(double(plain[i]) / 16.0)) * double(float(1.0 - smooth)));
    const float b = float(double(plain[i]) * smooth);
    EXPECT_EQ(f[i], float(double(a) + double(b))) << i;
  }
}

TEST(Rope, SlidingWindowLayersUsePlainBase10000) {
  const auto f = swa_freqs();
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[31], 1.33352e-4, 0.5e-9);  // spec §6
  // Plain frequencies against double 1/base^(2i/dim): fp32 pow + reciprocal, within 2 fp32 ulps.
  for (int i = 0; i < 32; ++i) {
    const double ref = 1.0 / std::pow(10000.0, double(2 * i) / 64.0);
    EXPECT_NEAR(f[i], ref, 2.0 * std::ldexp(1.0, -23) * ref) << i;
  }
}

TEST(Rope, PlainFrequenciesAreTheFp32ReciprocalOfTheFp32Power) {
  // torch: 1.0 / (base ** (arange(0, dim, 2, fp32) / dim)): fp32 exponent 2i/dim, fp32 power
  // (taken here as the correctly rounded power, evaluated in double), then an fp32 reciprocal.
  for (double base : {10000.0, 160000.0}) {
    const auto f = rope_inv_freq(64, base, 0, 1.0, 32, 1);
    for (int i = 0; i < 32; ++i) {
      const double e = float(double(2 * i) / 64.0);
      const float power = float(std::pow(double(float(base)), e));
      EXPECT_EQ(f[i], float(1.0 / double(power))) << base << " " << i;
    }
  }
}

TEST(Rope, AnglesAreFp32ProductsOfFp32Position) {
  // theta = fp32(p) * f in fp32 (spec §6, §12.3): 2^24 + 1 is not an fp32 integer and becomes
  // 2^24, so positions 2^24 and 2^24 + 1 share an angle; a double product would not.
  const auto f = compressed_freqs();
  for (int i : {0, 7, 20, 31}) {
    EXPECT_EQ(rope_angle(16777217, f[i]), rope_angle(16777216, f[i])) << i;
    EXPECT_EQ(rope_angle(1000, f[i]), float(double(1000.0f) * double(f[i]))) << i;
  }
}

TEST(Rope, TableHoldsCosSinOfTheFp32Angle) {
  // cos/sin are libm's fp32 functions of the fp32 angle (torch.polar on CPU): within 1 fp32 ulp
  // (of 1.0, the largest magnitude) of the double cos/sin of that same fp32 angle.
  const auto f = compressed_freqs();
  const int64_t n_pos = 300;
  const RopeTable t = make_rope_table(f, n_pos);
  ASSERT_EQ(t.dim, 64);
  ASSERT_EQ(t.cos.size(), size_t(n_pos * 32));
  const double tol = std::ldexp(1.0, -24);
  for (int64_t p = 0; p < n_pos; p += 7) {
    for (int i = 0; i < 32; ++i) {
      const double theta = double(float(double(float(p)) * double(f[i])));
      EXPECT_NEAR(t.cos_row(p)[i], std::cos(theta), tol) << p << " " << i;
      EXPECT_NEAR(t.sin_row(p)[i], std::sin(theta), tol) << p << " " << i;
    }
  }
  // Position 0: angle 0, cos 1, sin 0 exactly.
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(t.cos_row(0)[i], 1.0f);
    EXPECT_EQ(t.sin_row(0)[i], 0.0f);
  }
}

TEST(Rope, OnDemandMatchesTable) {
  const auto f = swa_freqs();
  const RopeTable t = make_rope_table(f, 64);
  for (int64_t p : {0, 1, 17, 63}) {
    for (int i = 0; i < 32; ++i) {
      const auto [c, s] = rope_cos_sin(f, p, i);
      EXPECT_EQ(c, t.cos_row(p)[i]);
      EXPECT_EQ(s, t.sin_row(p)[i]);
    }
  }
  // Beyond the table: rope_apply_at computes the same values on demand.
  const RopeTable big = make_rope_table(f, 200);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(64);
  for (auto& v : x) v = f32_to_bf16(dist(rng));
  for (int64_t p : {64, 100, 199}) {
    auto a = x, b = x;
    rope_apply_at(a.data(), t, p, false);    // p >= 64: on demand
    rope_apply_at(b.data(), big, p, false);  // from the table
    EXPECT_EQ(a, b) << p;
  }
}

TEST(Rope, RotatesAPairByAKnownAngle) {
  // (a + ib)(c + is) with exact values: (2 + 4i)(0.5 + 0.75i) = (1 - 3) + (1.5 + 2)i = -2 + 3.5i;
  // conjugate: (2 + 4i)(0.5 - 0.75i) = (1 + 3) + (2 - 1.5)i = 4 + 0.5i.
  const float c[1] = {0.5f}, s[1] = {0.75f};
  uint16_t x[2] = {f32_to_bf16(2.0f), f32_to_bf16(4.0f)};
  rope_apply(x, c, s, 2, false);
  EXPECT_EQ(bf16_to_f32(x[0]), -2.0f);
  EXPECT_EQ(bf16_to_f32(x[1]), 3.5f);
  uint16_t y[2] = {f32_to_bf16(2.0f), f32_to_bf16(4.0f)};
  rope_apply(y, c, s, 2, true);
  EXPECT_EQ(bf16_to_f32(y[0]), 4.0f);
  EXPECT_EQ(bf16_to_f32(y[1]), 0.5f);
  // A real rotation: (1, 0) by pi/2 at the table's own angle -> (cos, sin) rounded to bf16.
  const float theta = float(std::numbers::pi / 2);
  const float cc[1] = {std::cos(theta)}, ss[1] = {std::sin(theta)};
  uint16_t z[2] = {f32_to_bf16(1.0f), 0};
  rope_apply(z, cc, ss, 2, false);
  EXPECT_EQ(z[0], f32_to_bf16(cc[0]));
  EXPECT_EQ(bf16_to_f32(z[1]), 1.0f);
}

TEST(Rope, PairsAreInterleavedAdjacentElements) {
  // Rotating only pair 0 by +90 degrees must move x[0] into x[1] (interleaved, spec §6 and
  // pitfall §12.3). A half-split pairing (x[i], x[i + dim/2]) would move it into x[4] instead.
  const int dim = 8;
  const float c[4] = {0.0f, 1.0f, 1.0f, 1.0f}, s[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  std::vector<uint16_t> x(dim, 0);
  x[0] = f32_to_bf16(1.0f);
  rope_apply(x.data(), c, s, dim, false);
  std::vector<float> got(dim);
  for (int i = 0; i < dim; ++i) got[i] = bf16_to_f32(x[i]);
  EXPECT_EQ(got, (std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0}));
  // Pair 1 = (x[2], x[3]), identity rotation there leaves it untouched.
  std::vector<uint16_t> y(dim, 0);
  y[2] = f32_to_bf16(5.0f);
  y[3] = f32_to_bf16(-3.0f);
  rope_apply(y.data(), c, s, dim, false);
  EXPECT_EQ(bf16_to_f32(y[2]), 5.0f);
  EXPECT_EQ(bf16_to_f32(y[3]), -3.0f);
}

TEST(Rope, ApplyFollowsTheDocumentedFp32Formula) {
  // re = fl(fl(a c) - fl(b s)), im = fl(fl(a s) + fl(b c)) (inverse: re = fl(ac) + fl(bs),
  // im = fl(bc) - fl(as)), then bf16 - torch's complex64 multiply, emulated with one rounding
  // per step.
  const auto f = compressed_freqs();
  const RopeTable t = make_rope_table(f, 4096);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::uniform_int_distribution<int64_t> pos(0, 4095);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint16_t> x(64);
    for (auto& v : x) v = f32_to_bf16(dist(rng));
    const int64_t p = pos(rng);
    for (bool inverse : {false, true}) {
      auto got = x;
      rope_apply(got.data(), t.cos_row(p), t.sin_row(p), 64, inverse);
      for (int i = 0; i < 32; ++i) {
        const double a = bf16_to_f32(x[2 * i]), b = bf16_to_f32(x[2 * i + 1]);
        const double c = t.cos_row(p)[i], s = t.sin_row(p)[i];
        const double ac = float(a * c), bs = float(b * s), as = float(a * s), bc = float(b * c);
        const float re = inverse ? float(ac + bs) : float(ac - bs);
        const float im = inverse ? float(bc - as) : float(as + bc);
        ASSERT_EQ(got[2 * i], f32_to_bf16(re)) << trial << " " << i << " inv " << inverse;
        ASSERT_EQ(got[2 * i + 1], f32_to_bf16(im)) << trial << " " << i << " inv " << inverse;
      }
    }
  }
}

TEST(Rope, InverseUndoesForwardWithinBf16Rounding) {
  // Each pass rounds both components to bf16 (error <= 2^-8 |component| <= 2^-8 |pair|) and the
  // rotation is orthonormal up to fp32 error, so after forward + inverse each component is
  // within 2 * sqrt(2) * 2^-8 |pair| (+ fp32 slack) of the original: bound 3 * 2^-8 |pair|.
  const auto f = compressed_freqs();
  const RopeTable t = make_rope_table(f, 4096);  // larger positions: on demand
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int64_t p : {0, 1, 5, 127, 4095, 65535, 69999}) {
    std::vector<uint16_t> x(64);
    for (auto& v : x) v = f32_to_bf16(dist(rng));
    auto y = x;
    rope_apply_at(y.data(), t, p, false);
    rope_apply_at(y.data(), t, p, true);
    for (int i = 0; i < 32; ++i) {
      const double a = bf16_to_f32(x[2 * i]), b = bf16_to_f32(x[2 * i + 1]);
      const double norm = std::hypot(a, b);
      EXPECT_NEAR(bf16_to_f32(y[2 * i]), a, 3 * kBf16U * norm) << p << " " << i;
      EXPECT_NEAR(bf16_to_f32(y[2 * i + 1]), b, 3 * kBf16U * norm) << p << " " << i;
    }
  }
}

TEST(Rope, RejectsOddDims) {
  EXPECT_THROW(rope_inv_freq(63, 10000.0, 0, 1.0, 32, 1), Error);
  EXPECT_THROW(rope_inv_freq(0, 10000.0, 0, 1.0, 32, 1), Error);
}

}  // namespace
}  // namespace ds41
