// kernels/softmax_exp.h: the SIMD scaled_exp_sum against its scalar twin bit for bit at every ISA
// level this CPU supports (ragged lengths, special values, shifts that push results to
// subnormals and zero), the twin against closed forms (libm's exp within SLEEF's 1 ulp, the sum
// within double rounding), and the lane order of the sums and the max against plain scans.
#include "kernels/softmax_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/simd_level.h"
#include "kernels/vector_exp.h"
#include "simd_levels.h"

namespace ds41 {
namespace {

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

std::vector<float> random_logits(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> d(0.f, 4.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(rng);
  return x;
}

// The documented lane order, written out independently of the library's helpers.
double lane_order_sum(const std::vector<float>& v) {
  double l[8] = {};
  for (size_t i = 0; i < v.size(); ++i) l[i % 8] += double(v[i]);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

TEST(SoftmaxExp, ScalarTwinIsExpOfTheRoundedArgumentAndItsLaneSum) {
  std::mt19937 rng(7);
  for (int64_t n : {0, 1, 7, 8, 9, 100, 1001}) {
    const auto x = random_logits(rng, n);
    const float scale = 1.f / 0.7f, shift = 3.25f;
    std::vector<float> out(static_cast<size_t>(n), -1.f);
    const double sum = scaled_exp_sum_reference(x.data(), n, scale, shift, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const float z = x[size_t(i)] * scale;
      const float arg = z - shift;
      EXPECT_EQ(bits(out[size_t(i)]), bits(torch_vec_expf(arg))) << i;
      // SLEEF's u10: within 1 ulp of the correctly rounded value (libm's expf is within 1 too).
      EXPECT_NEAR(out[size_t(i)], std::exp(double(arg)), 2.5e-7 * std::exp(double(arg)) + 1e-44) << i;
    }
    EXPECT_EQ(sum, lane_order_sum(out)) << n;
    EXPECT_EQ(lane_sum(out.data(), n), lane_order_sum(out)) << n;
  }
}

TEST(SoftmaxExp, EveryLevelGivesTheTwinsValuesBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(11);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {0, 1, 5, 8, 15, 16, 17, 63, 1000, 129280}) {
    for (int variant = 0; variant < 3; ++variant) {
      auto x = random_logits(rng, n);
      float scale = 1.f, shift = 0.f;
      if (variant == 1) {  // arguments down to -100: subnormal and zero results
        for (auto& v : x) v = v * 8.f - 20.f;
        scale = 1.3f;
        shift = 10.f;
      } else if (variant == 2 && n >= 8) {  // special values among ordinary ones
        x[0] = -inf;
        x[size_t(n / 2)] = 88.f;
        x[size_t(n - 1)] = -87.5f;
        x[3] = -0.f;
        if (n > 16) {
          x[9] = nan;
          x[12] = inf;
        }
        scale = 0.5f;
        shift = 1.f;
      }
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      const double want_sum = scaled_exp_sum_reference(x.data(), n, scale, shift, want.data());
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        std::fill(got.begin(), got.end(), -1.f);
        const double got_sum = scaled_exp_sum(x.data(), n, scale, shift, got.data());
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bits(got[size_t(i)]), bits(want[size_t(i)]))
              << simd_level_name(l) << " n " << n << " variant " << variant << " i " << i << " x " << x[size_t(i)];
        if (std::isnan(want_sum))
          EXPECT_TRUE(std::isnan(got_sum)) << simd_level_name(l);
        else
          EXPECT_EQ(got_sum, want_sum) << simd_level_name(l) << " n " << n << " variant " << variant;
      }
    }
  }
}

TEST(SoftmaxExp, ScaledMaxIsTheSequentialScansMaximumIgnoringNaN) {
  std::mt19937 rng(3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 7, 8, 9, 33, 1000}) {
    auto x = random_logits(rng, n);
    x[size_t(n / 2)] = nan;
    const float scale = 1.7f;
    float want = -INFINITY;
    for (float v : x) want = std::max(want, v * scale);  // std::max keeps the left operand on NaN
    EXPECT_EQ(scaled_max(x.data(), n, scale), want) << n;
  }
  EXPECT_EQ(scaled_max(nullptr, 0, 1.f), -INFINITY);
  const std::vector<float> all_nan(9, nan);
  EXPECT_EQ(scaled_max(all_nan.data(), 9, 1.f), -INFINITY);
  const std::vector<float> minus_inf(9, -INFINITY);
  EXPECT_EQ(scaled_max(minus_inf.data(), 9, 1.f), -INFINITY);
}

}  // namespace
}  // namespace ds41
