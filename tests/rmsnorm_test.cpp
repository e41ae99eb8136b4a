// RMSNorm kernel tests (spec backbone.md §4). Expected values come from closed forms, from a
// double-precision evaluation of the spec formula, or from a step-by-step evaluation of the
// reference's fp32 operation sequence (model.py RMSNorm.forward) written out here.
#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/numeric_formats.h"

// The fp32 emulations below must round every step like the kernel is supposed to.
#include "base/fp_contract_off.h"

namespace ds41 {
namespace {

std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float sigma, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(rng));
  return v;
}

// bf16 unit roundoff: 8 significant bits, so RNE is within 2^-8 relative.
constexpr double kBf16U = 1.0 / 256.0;

TEST(RmsNorm, ConstantRowNormalizesToTheWeight) {
  // x = c everywhere: mean(x^2) = c^2, r = 1/|c| (eps 1e-20 is far below c^2's ulp), y = w*sign(c).
  // All values are powers of two, so every fp32 step is exact.
  const int n = 16;
  std::vector<uint16_t> x(n, f32_to_bf16(-4.0f)), w(n), y(n);
  for (int i = 0; i < n; ++i) w[i] = f32_to_bf16(0.25f * float(i + 1));
  rmsnorm_row(x.data(), w.data(), n, kNormEps, y.data());
  for (int i = 0; i < n; ++i) EXPECT_EQ(bf16_to_f32(y[i]), -0.25f * float(i + 1)) << i;
}

TEST(RmsNorm, MatchesDoublePrecisionWithinOneBf16Rounding) {
  // y_ref = w x / sqrt(mean(x^2) + eps) in double. The kernel's fp32 chain (5120-term sum,
  // sqrt, division, two products) is within ~1e-5 relative of it (sequential-sum worst case
  // n * 2^-24 = 3e-4 is far from typical; the observed fp32 error is ~1e-6), and the output
  // rounding adds at most 2^-8 relative. Bound: 2^-8 |y_ref| + 1e-5 |y_ref|.
  std::mt19937 rng(1234);
  const int n = 5120;
  auto x = random_bf16(rng, n, 3.0f);
  auto w = random_bf16(rng, n, 0.1f, 1.0f);
  std::vector<uint16_t> y(n);
  rmsnorm_row(x.data(), w.data(), n, kNormEps, y.data());
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(bf16_to_f32(x[i])) * bf16_to_f32(x[i]);
  const double r = 1.0 / std::sqrt(ss / n + 1e-20);
  for (int i = 0; i < n; ++i) {
    const double ref = double(bf16_to_f32(w[i])) * bf16_to_f32(x[i]) * r;
    EXPECT_LE(std::fabs(bf16_to_f32(y[i]) - ref), (kBf16U + 1e-5) * std::fabs(ref)) << i;
  }
}

// The reference's fp32 sequence, one rounding per step. Each double op on fp32 operands rounded
// to fp32 is the correctly rounded fp32 op (53 >= 2*24+2 bits), so this is an exact emulation.
float emulate_r(const std::vector<uint16_t>& x, float eps) {
  // The sum of the (exact) squares, rounded once to fp32: accumulated here in long double,
  // independently of the kernel's double accumulation (both are exact for such rows).
  long double exact = 0;
  for (uint16_t xi : x) {
    const long double v = bf16_to_f32(xi);
    exact += v * v;
  }
  const float sum = float(exact);
  const float mean = float(double(sum) / double(x.size()));
  const float shifted = float(double(mean) + double(eps));
  return float(1.0 / double(float(std::sqrt(double(shifted)))));
}
// weight * (x * r) (reference) or the other association (w * x) * r.
uint16_t emulate_out(uint16_t x, uint16_t w, float r, bool reference_association) {
  const double xv = bf16_to_f32(x), wv = bf16_to_f32(w);
  const float out =
      reference_association ? float(wv * double(float(xv * r))) : float(double(float(wv * xv)) * r);
  return f32_to_bf16(out);
}

TEST(RmsNorm, FollowsTheReferenceFp32OperationOrderBitExactly) {
  // Expected: the documented sequence (sum of squares rounded once, / n, + eps, sqrt,
  // reciprocal, x*r, then w*(x*r)), emulated above, on realistic rows.
  std::mt19937 rng(77);
  const int n = 4096, rows = 8;
  for (int row = 0; row < rows; ++row) {
    auto x = random_bf16(rng, n, 1.0f + row);
    auto w = random_bf16(rng, n, 0.5f, 1.0f);
    const float r = emulate_r(x, kNormEps);
    std::vector<uint16_t> y(n);
    rmsnorm_row(x.data(), w.data(), n, kNormEps, y.data());
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(y[i], emulate_out(x[i], w[i], r, true)) << "row " << row << " i " << i;
  }
}

TEST(RmsNorm, UsesWeightTimesNormalizedAssociation) {
  // weight * (x * r) and (weight * x) * r differ in bf16 only when the fp32 results straddle a
  // bf16 rounding midpoint (about 6 in a million random triples), so random rows almost never
  // tell them apart. Search rows of one pair (x0, x1) with weights (w, 1) until the two emulated
  // associations differ, then require the kernel to give the reference one on exactly those rows:
  // as 2 elements (the scalar loop) and as the pair 8 times over (16 elements: the SIMD lanes).
  std::mt19937 rng(2024);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  int checked = 0;
  for (int attempt = 0; attempt < 4000000 && checked < 3; ++attempt) {
    const std::vector<uint16_t> x = {f32_to_bf16(dist(rng)), f32_to_bf16(dist(rng))};
    const std::vector<uint16_t> w = {f32_to_bf16(1.0f + 0.3f * dist(rng)), f32_to_bf16(1.0f)};
    const float r = emulate_r(x, kNormEps);
    const uint16_t ref = emulate_out(x[0], w[0], r, true);
    if (ref == emulate_out(x[0], w[0], r, false)) continue;
    std::vector<uint16_t> y(2);
    rmsnorm_row(x.data(), w.data(), 2, kNormEps, y.data());
    EXPECT_EQ(y[0], ref) << "x0 " << bf16_to_f32(x[0]) << " x1 " << bf16_to_f32(x[1]) << " w "
                         << bf16_to_f32(w[0]);
    std::vector<uint16_t> x16, w16, y16(16);
    for (int i = 0; i < 8; ++i) x16.insert(x16.end(), x.begin(), x.end()), w16.insert(w16.end(), w.begin(), w.end());
    const float r16 = emulate_r(x16, kNormEps);
    rmsnorm_row(x16.data(), w16.data(), 16, kNormEps, y16.data());
    for (int i = 0; i < 16; i += 2) EXPECT_EQ(y16[size_t(i)], emulate_out(x[0], w[0], r16, true)) << "16 elements, i " << i;
    if (r16 == r) EXPECT_EQ(y16[0], ref);
    ++checked;
  }
  EXPECT_EQ(checked, 3) << "search found too few distinguishing rows";
}

TEST(RmsNorm, EpsIsAddedInsideTheRootAndZeroRowsStayFinite) {
  // Zero row: mean 0, r = 1/sqrt(1e-20) = 1e10, y = w * 0 = 0 (not NaN).
  const int n = 8;
  std::vector<uint16_t> zero(n, 0), w(n, f32_to_bf16(1.5f)), y(n, 0xffff);
  rmsnorm_row(zero.data(), w.data(), n, kNormEps, y.data());
  for (int i = 0; i < n; ++i) EXPECT_EQ(y[i], 0) << i;
  // Tiny row x = 2^-60: mean(x^2) = 2^-120 ~ 7.5e-37 is negligible next to eps = 1e-20, so
  // y = x / sqrt(1e-20) = 2^-60 * 1e10 (closed form, double); with eps 1e-6 it would be 1e-15x.
  std::vector<uint16_t> tiny(n, f32_to_bf16(std::ldexp(1.0f, -60)));
  std::vector<uint16_t> one(n, f32_to_bf16(1.0f));
  rmsnorm_row(tiny.data(), one.data(), n, kNormEps, y.data());
  const double ref = std::ldexp(1.0, -60) / std::sqrt(std::ldexp(1.0, -120) + 1e-20);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(bf16_to_f32(y[i]), ref, kBf16U * ref) << i;
}

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  std::mt19937 rng(5);
  const int n = 512;
  auto x = random_bf16(rng, n, 2.0f);
  auto w = random_bf16(rng, n, 0.3f, 1.0f);
  std::vector<uint16_t> y(n);
  rmsnorm_row(x.data(), w.data(), n, kNormEps, y.data());
  rmsnorm_row(x.data(), w.data(), n, kNormEps, x.data());
  EXPECT_EQ(x, y);
}

TEST(RmsNorm, Fp32WeightVariantMatchesBf16VariantOnBf16Weights) {
  // Same arithmetic: with weights that are exactly bf16 values the two entry points agree bit
  // for bit (fp32(w) is the same number either way).
  std::mt19937 rng(6);
  const int n = 1024;
  auto x = random_bf16(rng, n, 1.0f);
  auto w = random_bf16(rng, n, 0.2f, 1.0f);
  std::vector<float> wf(n);
  for (int i = 0; i < n; ++i) wf[i] = bf16_to_f32(w[i]);
  std::vector<uint16_t> a(n), b(n);
  rmsnorm_row(x.data(), w.data(), n, kVisionNormEps, a.data());
  rmsnorm_row_f32w(x.data(), wf.data(), n, kVisionNormEps, b.data());
  EXPECT_EQ(a, b);
}

TEST(RmsNorm, VisionEpsClosedForm) {
  // Vision: eps 1e-6, fp32 weight. x = 1e-3 (as bf16) everywhere, w = 3:
  // y = 3 x / sqrt(x^2 + 1e-6) (double); x^2 ~ 1e-6 so eps visibly matters (y ~ 2.12, not 3).
  const int n = 4;
  std::vector<uint16_t> x(n, f32_to_bf16(1e-3f)), y(n);
  std::vector<float> w(n, 3.0f);
  rmsnorm_row_f32w(x.data(), w.data(), n, kVisionNormEps, y.data());
  const double xv = bf16_to_f32(x[0]);
  const double ref = 3.0 * xv / std::sqrt(xv * xv + double(kVisionNormEps));
  for (int i = 0; i < n; ++i) EXPECT_NEAR(bf16_to_f32(y[i]), ref, kBf16U * ref) << i;
}

TEST(RmsNorm, RowsVariantNormalizesEachRowIndependently) {
  std::mt19937 rng(9);
  const int rows = 3, n = 64;
  auto x = random_bf16(rng, rows * n, 1.0f);
  auto w = random_bf16(rng, n, 0.2f, 1.0f);
  std::vector<uint16_t> y(rows * n), single(n);
  rmsnorm_rows(x.data(), w.data(), rows, n, kNormEps, y.data());
  for (int r = 0; r < rows; ++r) {
    rmsnorm_row(x.data() + r * n, w.data(), n, kNormEps, single.data());
    EXPECT_EQ(std::vector<uint16_t>(y.begin() + r * n, y.begin() + (r + 1) * n), single) << r;
  }
}

}  // namespace
}  // namespace ds41
