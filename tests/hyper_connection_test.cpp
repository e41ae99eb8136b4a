// Hyper-connection kernel tests (spec backbone.md §7, §12.8, §12.9). Expected values come from
// closed forms (all-zero projections, hand-computed small cases), double-precision evaluations
// of the spec formulas, and the documented fp32 operation sequence written out here with one
// rounding per step (a double op on fp32 operands rounded to fp32 is the correctly rounded fp32
// op, since 53 >= 2*24+2).
#include "kernels/hyper_connection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "kernels/torch_sum.h"
#include "kernels/vector_exp.h"

#include "base/fp_contract_off.h"

namespace ds41 {
namespace {

constexpr float kHcEps = 1e-6f;             // spec §1.1 hc_eps
constexpr float kNormEps = 1e-20f;          // spec §7 step 2
constexpr double kF32U = 1.0 / 16777216.0;  // fp32 unit roundoff 2^-24

struct Coeffs {
  std::vector<float> pre, post, comb;
  explicit Coeffs(int hc) : pre(hc), post(hc), comb(hc * hc) {}
};

std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(rng));
  return v;
}
std::vector<float> random_f32(std::mt19937& rng, size_t n, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Double-precision Sinkhorn exactly as spec §7 step 6 (row softmax + eps, column normalization,
// then (iters - 1) x (rows, columns)), on fp32 logits.
std::vector<double> sinkhorn_d(const std::vector<float>& logits, int hc, int iters, double eps) {
  std::vector<double> C(hc * hc);
  for (int i = 0; i < hc; ++i) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < hc; ++j) mx = std::fmax(mx, logits[i * hc + j]);
    for (int j = 0; j < hc; ++j) s += std::exp(double(logits[i * hc + j]) - mx);
    for (int j = 0; j < hc; ++j)
      C[i * hc + j] = std::exp(double(logits[i * hc + j]) - mx) / s + eps;
  }
  auto cols = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += C[i * hc + j];
      for (int i = 0; i < hc; ++i) C[i * hc + j] /= s + eps;
    }
  };
  auto rows = [&] {
    for (int i = 0; i < hc; ++i) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += C[i * hc + j];
      for (int j = 0; j < hc; ++j) C[i * hc + j] /= s + eps;
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) {
    rows();
    cols();
  }
  return C;
}

TEST(HyperConnection, ZeroProjectionClosedForm) {
  // hc 4, D 8, fn = 0 -> mixes = 0, so pre[c] = sigmoid(base[c]) + eps, post[c] =
  // 2 sigmoid(base[4 + c]) and comb = Sinkhorn(base[8..]) (spec §7 steps 4-6). Tolerances: the
  // fp32 sigmoid is exp + add + divide (+ eps add), each within an ulp of values <= 1: 5 * 2^-24.
  // The Sinkhorn's 20 passes round each entry ~3 times per pass, errors at most adding up:
  // 60 * 2^-24 relative.
  const int hc = 4, D = 8;
  std::mt19937 rng(1);
  const auto X = random_bf16(rng, hc * D, 1.0f);
  const std::vector<float> fn(hc_mix_count(hc) * hc * D, 0.0f);
  auto base = random_f32(rng, hc_mix_count(hc), 1.5f);
  const float scale[3] = {0.7f, 1.3f, 2.0f};
  Coeffs k(hc);
  hc_coefficients(X.data(), hc, D, fn.data(), base.data(), scale, 20, kHcEps, kNormEps,
                  k.pre.data(), k.post.data(), k.comb.data());
  for (int c = 0; c < hc; ++c) {
    EXPECT_NEAR(k.pre[c], sigmoid_d(base[c]) + 1e-6, 5 * kF32U) << c;
    EXPECT_NEAR(k.post[c], 2 * sigmoid_d(base[hc + c]), 10 * kF32U) << c;
  }
  const std::vector<float> logits(base.begin() + 2 * hc, base.end());
  const auto C = sinkhorn_d(logits, hc, 20, 1e-6);
  for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(k.comb[i], C[i], 60 * kF32U * C[i]) << i;
}

TEST(HyperConnection, UniformLogitsGiveTheScalarRecurrence) {
  // All comb logits equal: every entry stays equal, softmax gives 1/4 + eps and each of the 20
  // normalizations maps v -> v / (4 v + eps) (closed form in double). Tolerance as above.
  const int hc = 4;
  const std::vector<float> mixes(hc_mix_count(hc), 0.0f), base(hc_mix_count(hc), 0.0f);
  const float scale[3] = {1, 1, 1};
  Coeffs k(hc);
  hc_split_sinkhorn(mixes.data(), hc, base.data(), scale, 20, kHcEps, k.pre.data(), k.post.data(),
                    k.comb.data());
  double v = 0.25 + 1e-6;
  for (int pass = 0; pass < 20; ++pass) v = v / (4 * v + 1e-6);
  for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(k.comb[i], v, 60 * kF32U * v) << i;
  for (int c = 0; c < hc; ++c) {
    EXPECT_NEAR(k.pre[c], 0.5 + 1e-6, 2 * kF32U);  // sigmoid(0) = 1/2 exactly in fp32
    EXPECT_EQ(k.post[c], 1.0f);                    // 2 * sigmoid(0) = 1 exactly
  }
}

TEST(HyperConnection, SoftmaxRunsOverRowsAndColumnsAreNormalizedFirst) {
  // hc 2, logits [[0, ln 3], [0, 0]]: row softmax -> [[1/4, 3/4], [1/2, 1/2]] + eps, then one
  // column normalization (iters = 1): C[i][j] = (p_ij + eps) / (sum_i (p_ij + eps) + eps).
  // A column softmax (or a row normalization last) would give other numbers (C00 = 1/3 here).
  // Tolerance: values <= 1 through exp, sums and divisions, <= 6 roundings: 6 * 2^-24.
  const int hc = 2;
  const float ln3 = std::log(3.0f);
  std::vector<float> mixes(hc_mix_count(hc), 0.0f), base(hc_mix_count(hc), 0.0f);
  base[2 * hc + 1] = ln3;
  const float scale[3] = {1, 1, 1};
  for (int iters : {1, 2, 20}) {
    Coeffs k(hc);
    hc_split_sinkhorn(mixes.data(), hc, base.data(), scale, iters, kHcEps, k.pre.data(),
                      k.post.data(), k.comb.data());
    const auto C = sinkhorn_d({0.0f, ln3, 0.0f, 0.0f}, hc, iters, 1e-6);
    for (int i = 0; i < hc * hc; ++i)
      EXPECT_NEAR(k.comb[i], C[i], 6 * iters * kF32U) << "iters " << iters << " entry " << i;
    if (iters == 1) {
      const double e = 1e-6, d0 = 0.75 + 3 * e, d1 = 1.25 + 3 * e;
      EXPECT_NEAR(k.comb[0], (0.25 + e) / d0, 6 * kF32U);  // ~1/3
      EXPECT_NEAR(k.comb[1], (0.75 + e) / d1, 6 * kF32U);  // ~0.6
      EXPECT_NEAR(k.comb[2], (0.50 + e) / d0, 6 * kF32U);  // ~2/3
      EXPECT_NEAR(k.comb[3], (0.50 + e) / d1, 6 * kF32U);  // ~0.4
    }
  }
}

TEST(HyperConnection, CoefficientRangesAndColumnStochasticComb) {
  // Random streams and parameters at the released hc = 4 (D kept small), logits up to ~+-10.
  //  * pre in (eps, 1 + eps), post in (0, 2): sigmoid ranges (inputs stay moderate, so the fp32
  //    sigmoid never saturates to exactly 0 or 1 here).
  //  * column sums: the last pass is a column normalization, sum = s / (s + eps) = 1 - ~1e-6,
  //    plus ~8 fp32 roundings of values <= 1 (5e-7): within 2e-6 of 1, however peaked C is.
  //  * rows are NOT near-stochastic in general: 19 rounds do not converge for peaked logits
  //    (row sums off by up to ~1e-2 here). The kernel must then agree with the same 20 passes in
  //    double: 60 * 2^-24 relative, as in ZeroProjectionClosedForm (passes are contractions, so
  //    rounding errors do not grow).
  const int hc = 4, D = 64;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const auto X = random_bf16(rng, hc * D, 1.0f + trial % 5);
    const auto fn = random_f32(rng, hc_mix_count(hc) * hc * D, 0.1f);
    const auto base = random_f32(rng, hc_mix_count(hc), 1.0f);
    const auto s = random_f32(rng, 3, 1.0f);
    Coeffs k(hc);
    hc_coefficients(X.data(), hc, D, fn.data(), base.data(), s.data(), 20, kHcEps, kNormEps,
                    k.pre.data(), k.post.data(), k.comb.data());
    for (int c = 0; c < hc; ++c) {
      EXPECT_GT(k.pre[c], kHcEps);
      EXPECT_LT(k.pre[c], 1.0f + kHcEps);
      EXPECT_GT(k.post[c], 0.0f);
      EXPECT_LT(k.post[c], 2.0f);
    }
    for (int j = 0; j < hc; ++j) {
      double col = 0;
      for (int i = 0; i < hc; ++i) col += k.comb[i * hc + j];
      EXPECT_NEAR(col, 1.0, 2e-6) << "trial " << trial << " col " << j;
    }
    std::vector<float> mixes(hc_mix_count(hc)), logits(hc * hc);
    hc_mixes(X.data(), hc, D, fn.data(), kNormEps, mixes.data());
    for (int i = 0; i < hc * hc; ++i) logits[i] = mixes[2 * hc + i] * s[2] + base[2 * hc + i];
    const auto C = sinkhorn_d(logits, hc, 20, 1e-6);
    for (int i = 0; i < hc * hc; ++i)
      EXPECT_NEAR(k.comb[i], C[i], 60 * kF32U * C[i]) << "trial " << trial << " entry " << i;
  }
}

TEST(HyperConnection, WellConditionedCombIsDoublyStochastic) {
  // Logits within ~+-1 (entries within a factor ~e^2 of each other): 19 Sinkhorn rounds
  // converge far below the eps effect, so rows sum to 1 within 1e-5 (each pass's eps shifts sums
  // by ~1e-6; 10 eps of room) and columns within 2e-6 (see the test above).
  const int hc = 4;
  std::mt19937 rng(17);
  for (int trial = 0; trial < 50; ++trial) {
    const auto m = random_f32(rng, hc_mix_count(hc), 1.0f);
    const auto base = random_f32(rng, hc_mix_count(hc), 0.3f);
    const float scale[3] = {1.0f, 1.0f, 0.5f};
    Coeffs k(hc);
    hc_split_sinkhorn(m.data(), hc, base.data(), scale, 20, kHcEps, k.pre.data(), k.post.data(),
                      k.comb.data());
    for (int a = 0; a < hc; ++a) {
      double col = 0, row = 0;
      for (int b = 0; b < hc; ++b) {
        col += k.comb[b * hc + a];
        row += k.comb[a * hc + b];
      }
      EXPECT_NEAR(col, 1.0, 2e-6) << "trial " << trial << " col " << a;
      EXPECT_NEAR(row, 1.0, 1e-5) << "trial " << trial << " row " << a;
    }
  }
}

// fp32 emulation of the port's hc_split_sinkhorn, one rounding per step; exp is PyTorch's
// vectorized exp (vector_exp.h, checked against torch itself in vector_exp_test.cpp).
void split_emulated(const std::vector<float>& m, int hc, const std::vector<float>& base,
                    const float* scale, int iters, float eps, Coeffs& out) {
  auto f = [](double v) { return float(v); };
  auto sig = [&](float x) { return f(1.0 / double(f(1.0 + double(torch_vec_expf(0.0f - x))))); };
  for (int c = 0; c < hc; ++c) {
    out.pre[c] = f(double(sig(f(double(f(double(m[c]) * scale[0])) + base[c]))) + eps);
    out.post[c] = f(2.0 * sig(f(double(f(double(m[hc + c]) * scale[1])) + base[hc + c])));
  }
  std::vector<float>& C = out.comb;
  for (int k = 0; k < hc * hc; ++k)
    C[k] = f(double(f(double(m[2 * hc + k]) * scale[2])) + base[2 * hc + k]);
  for (int i = 0; i < hc; ++i) {
    float mx = C[i * hc];
    for (int j = 1; j < hc; ++j) mx = std::fmax(mx, C[i * hc + j]);
    float s = 0;
    for (int j = 0; j < hc; ++j) {
      C[i * hc + j] = torch_vec_expf(f(double(C[i * hc + j]) - mx));
      s = f(double(s) + C[i * hc + j]);
    }
    for (int j = 0; j < hc; ++j) C[i * hc + j] = f(double(f(double(C[i * hc + j]) / s)) + eps);
  }
  auto norm = [&](bool rows) {
    for (int a = 0; a < hc; ++a) {
      float s = 0;
      for (int b = 0; b < hc; ++b) s = f(double(s) + (rows ? C[a * hc + b] : C[b * hc + a]));
      const float d = f(double(s) + eps);
      for (int b = 0; b < hc; ++b) {
        float& v = rows ? C[a * hc + b] : C[b * hc + a];
        v = f(double(v) / d);
      }
    }
  };
  norm(false);
  for (int it = 1; it < iters; ++it) {
    norm(true);
    norm(false);
  }
}

TEST(HyperConnection, SplitSinkhornFollowsThePortsFp32Sequence) {
  std::mt19937 rng(8);
  for (int hc : {1, 2, 4, 5}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto m = random_f32(rng, hc_mix_count(hc), 2.0f);
      const auto base = random_f32(rng, hc_mix_count(hc), 1.0f);
      const auto s = random_f32(rng, 3, 1.0f);
      Coeffs k(hc), e(hc);
      hc_split_sinkhorn(m.data(), hc, base.data(), s.data(), 20, kHcEps, k.pre.data(),
                        k.post.data(), k.comb.data());
      split_emulated(m, hc, base, s.data(), 20, kHcEps, e);
      ASSERT_EQ(k.pre, e.pre) << hc << " " << trial;
      ASSERT_EQ(k.post, e.post) << hc << " " << trial;
      ASSERT_EQ(k.comb, e.comb) << hc << " " << trial;
    }
  }
}

TEST(HyperConnection, MixesUseOneJointStatisticOverAllCopies) {
  // hc 4, D 8: copy 0 all ones, copies 1-3 zero. Joint mean(x^2) = 8/32 = 1/4, r = 2 (exact:
  // 1/4 + 1e-20 rounds to 1/4). fn row k = k+1 on copy 0, anything on the zero copies:
  // dot = 8 (k+1), mixes[k] = 16 (k+1). A per-copy statistic would give 8 (k+1).
  const int hc = 4, D = 8, n = hc * D;
  std::vector<uint16_t> X(n, 0);
  for (int d = 0; d < D; ++d) X[d] = f32_to_bf16(1.0f);
  std::vector<float> fn(hc_mix_count(hc) * n, 0.0f);
  for (int k = 0; k < hc_mix_count(hc); ++k)
    for (int t = 0; t < n; ++t) fn[k * n + t] = t < D ? float(k + 1) : 123.0f;
  std::vector<float> mixes(hc_mix_count(hc));
  hc_mixes(X.data(), hc, D, fn.data(), kNormEps, mixes.data());
  for (int k = 0; k < hc_mix_count(hc); ++k) EXPECT_EQ(mixes[k], 16.0f * (k + 1)) << k;
}

TEST(HyperConnection, MixesProjectFirstThenScaleBitExactly) {
  // Expected: mixes[k] = dot_k * r, dot_k the reference's F.linear (an fp32 running sum over t,
  // each product rounded, written out here with one rounding per step), r = 1 / sqrt(mean(x^2) +
  // eps) from the sum of squares in PyTorch's order (torch_sum.h, tested against torch), at the
  // released D = 5120. Scaling x by r before the projection (the other order) changes the fp32
  // result, and so does an exact dot product: the last checks show both.
  const int hc = 4, D = 5120, n = hc * D;
  std::mt19937 rng(9);
  const auto X = random_bf16(rng, n, 0.8f);
  const auto fn = random_f32(rng, hc_mix_count(hc) * n, 0.02f);
  std::vector<float> mixes(hc_mix_count(hc));
  hc_mixes(X.data(), hc, D, fn.data(), kNormEps, mixes.data());
  const float ss = torch_sum_squares_bf16(X.data(), n);
  const float r = float(
      1.0 /
      double(float(std::sqrt(double(float(double(float(double(ss) / n)) + double(kNormEps)))))));
  int other_order_differs = 0, exact_dot_differs = 0;
  for (int k = 0; k < hc_mix_count(hc); ++k) {
    float acc = 0, acc_scaled = 0;
    long double exact = 0;
    for (int t = 0; t < n; ++t) {
      const double x = bf16_to_f32(X[t]);
      acc = float(double(acc) + double(float(double(fn[k * n + t]) * x)));
      exact += (long double)fn[k * n + t] * (long double)x;
      acc_scaled =
          float(double(acc_scaled) + double(float(double(fn[k * n + t]) * double(float(x * r)))));
    }
    const float expect = float(double(acc) * r);
    EXPECT_EQ(mixes[k], expect) << k;
    other_order_differs += acc_scaled != expect;
    exact_dot_differs += float(double(float(exact)) * r) != expect;
  }
  EXPECT_GT(other_order_differs, 0);
  EXPECT_GT(exact_dot_differs, 0);
}

TEST(HyperConnection, PreHandComputed) {
  // hc 4, D 3, exact arithmetic: y[d] = sum_c a[c] X[c][d].
  const int hc = 4, D = 3;
  const float a[4] = {0.5f, 0.25f, 1.0f, 2.0f};
  const float xs[4][3] = {{2, 4, -6}, {4, 0, 8}, {1, -1, 0.5f}, {0.5f, 0.25f, -1}};
  std::vector<uint16_t> X(hc * D), y(D);
  for (int c = 0; c < hc; ++c)
    for (int d = 0; d < D; ++d) X[c * D + d] = f32_to_bf16(xs[c][d]);
  hc_pre(X.data(), a, hc, D, y.data());
  EXPECT_EQ(bf16_to_f32(y[0]), 1 + 1 + 1 + 1.0f);   // 0.5*2 + 0.25*4 + 1*1 + 2*0.5
  EXPECT_EQ(bf16_to_f32(y[1]), 2 + 0 - 1 + 0.5f);   // 0.5*4 + 0 + 1*(-1) + 2*0.25
  EXPECT_EQ(bf16_to_f32(y[2]), -3 + 2 + 0.5f - 2);  // 0.5*(-6) + 0.25*8 + 0.5 + 2*(-1)
  // Layer 0's pre-mix is one-hot [1, 0, 0, 0] (spec §7): the output is copy 0 exactly.
  std::mt19937 rng(10);
  const auto R = random_bf16(rng, hc * 16, 3.0f);
  std::vector<uint16_t> z(16);
  const float onehot[4] = {1, 0, 0, 0};
  hc_pre(R.data(), onehot, hc, 16, z.data());
  EXPECT_EQ(z, std::vector<uint16_t>(R.begin(), R.begin() + 16));
}

TEST(HyperConnection, PreSumsCopiesInAscendingOrder) {
  // a = [1 + 2^-8, 2^-24, 2^-24], X = 1: ascending, ((1 + 2^-8) + 2^-24) + 2^-24 hits two fp32
  // ties that round to even (stay 1 + 2^-8), then bf16 ties to even: 1.0. Summing the small
  // terms first gives 1 + 2^-8 + 2^-23 and bf16 1.0078125 instead.
  const int hc = 3, D = 1;
  const float a[3] = {1.0f + std::ldexp(1.0f, -8), std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)};
  const std::vector<uint16_t> X(hc, f32_to_bf16(1.0f));
  uint16_t y = 0;
  hc_pre(X.data(), a, hc, D, &y);
  EXPECT_EQ(bf16_to_f32(y), 1.0f);
}

TEST(HyperConnection, MeanOverCopiesHandComputedAndRoundedOnce) {
  // hc 4, D 3: y = bf16((X0 + X1 + X2 + X3) / 4).
  const int hc = 4, D = 3;
  const float xs[4][3] = {{2, 4, -6}, {4, 0, 8}, {1, -1, 0.5f}, {0.5f, 0.25f, -1}};
  std::vector<uint16_t> X(hc * D), y(D);
  for (int c = 0; c < hc; ++c)
    for (int d = 0; d < D; ++d) X[c * D + d] = f32_to_bf16(xs[c][d]);
  hc_mean(X.data(), hc, D, y.data());
  EXPECT_EQ(bf16_to_f32(y[0]), 7.5f / 4);
  EXPECT_EQ(bf16_to_f32(y[1]), 3.25f / 4);
  EXPECT_EQ(bf16_to_f32(y[2]), 1.5f / 4);
  // The sum is kept in fp32: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly, mean 0.25 + 2^-9 (a bf16 value).
  // A bf16 running sum would round 1 + 2^-8 (a tie) to 1 twice and give 0.25.
  const float tiny = std::ldexp(1.0f, -8);
  const std::vector<uint16_t> Z = {f32_to_bf16(1), f32_to_bf16(tiny), f32_to_bf16(tiny), 0};
  uint16_t z = 0;
  hc_mean(Z.data(), hc, 1, &z);
  EXPECT_EQ(bf16_to_f32(z), 0.25f + std::ldexp(1.0f, -9));
  EXPECT_THROW(hc_mean(Z.data(), 0, 1, &z), Error);
}

TEST(HyperConnection, PostHandComputedAppliesCombTransposed) {
  // hc 2, D 2, y = [1, 2], X0 = [1, 0], X1 = [0, 4], post = [0.5, 2], C = [[0.25, 0.75],
  // [0.5, 0.5]] (C[i][j]: source i -> destination j):
  //   X'0 = 0.5 y + 0.25 X0 + 0.5 X1 = [0.75, 3];  X'1 = 2 y + 0.75 X0 + 0.5 X1 = [2.75, 6].
  // Applying C instead of C^T would give X'0[1] = 1 + 0.75 * 4 = 4.
  const int hc = 2, D = 2;
  const std::vector<uint16_t> y = {f32_to_bf16(1), f32_to_bf16(2)};
  const std::vector<uint16_t> X = {f32_to_bf16(1), 0, 0, f32_to_bf16(4)};
  const float post[2] = {0.5f, 2.0f};
  const float comb[4] = {0.25f, 0.75f, 0.5f, 0.5f};
  std::vector<uint16_t> out(hc * D);
  hc_post(y.data(), X.data(), post, comb, hc, D, out.data());
  std::vector<float> got(hc * D);
  for (int i = 0; i < hc * D; ++i) got[i] = bf16_to_f32(out[i]);
  EXPECT_EQ(got, (std::vector<float>{0.75f, 3.0f, 2.75f, 6.0f}));
}

TEST(HyperConnection, PostAddsTheSummedResidualMixToPostTimesY) {
  // post[0] y = 1 + 2^-8 (a bf16 midpoint), residual terms 2^-24 + 2^-24 = 2^-23 summed first:
  // 1 + 2^-8 + 2^-23 -> bf16 1.0078125. Adding the terms one at a time onto post*y would hit
  // fp32 ties (staying at 1 + 2^-8) and give bf16 1.0.
  const int hc = 2, D = 1;
  const uint16_t y = f32_to_bf16(1.0f);
  const std::vector<uint16_t> X = {f32_to_bf16(std::ldexp(1.0f, -24)),
                                   f32_to_bf16(std::ldexp(1.0f, -24))};
  const float post[2] = {1.0f + std::ldexp(1.0f, -8), 0.5f};
  const float comb[4] = {1.0f, 0.0f, 1.0f, 0.0f};
  std::vector<uint16_t> out(hc);
  hc_post(&y, X.data(), post, comb, hc, D, out.data());
  EXPECT_EQ(bf16_to_f32(out[0]), 1.0078125f);
  EXPECT_EQ(bf16_to_f32(out[1]), 0.5f);
}

TEST(HyperConnection, PostInPlaceEqualsOutOfPlace) {
  const int hc = 4, D = 256;
  std::mt19937 rng(12);
  const auto y = random_bf16(rng, D, 1.0f);
  auto X = random_bf16(rng, hc * D, 2.0f);
  const auto post = random_f32(rng, hc, 1.0f);
  const auto comb = random_f32(rng, hc * hc, 0.5f);
  std::vector<uint16_t> out(hc * D);
  hc_post(y.data(), X.data(), post.data(), comb.data(), hc, D, out.data());
  hc_post(y.data(), X.data(), post.data(), comb.data(), hc, D, X.data());
  EXPECT_EQ(X, out);
}

TEST(HyperConnection, CoefficientsComposeMixesAndSplit) {
  const int hc = 4, D = 32;
  std::mt19937 rng(13);
  const auto X = random_bf16(rng, hc * D, 1.0f);
  const auto fn = random_f32(rng, hc_mix_count(hc) * hc * D, 0.1f);
  const auto base = random_f32(rng, hc_mix_count(hc), 1.0f);
  const auto s = random_f32(rng, 3, 1.0f);
  Coeffs a(hc), b(hc);
  hc_coefficients(X.data(), hc, D, fn.data(), base.data(), s.data(), 20, kHcEps, kNormEps,
                  a.pre.data(), a.post.data(), a.comb.data());
  std::vector<float> mixes(hc_mix_count(hc));
  hc_mixes(X.data(), hc, D, fn.data(), kNormEps, mixes.data());
  hc_split_sinkhorn(mixes.data(), hc, base.data(), s.data(), 20, kHcEps, b.pre.data(),
                    b.post.data(), b.comb.data());
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.post, b.post);
  EXPECT_EQ(a.comb, b.comb);
}

TEST(HyperConnection, RejectsUnsupportedHc) {
  std::vector<float> m(hc_mix_count(17)), base(hc_mix_count(17)), out(17 * 17);
  const float scale[3] = {1, 1, 1};
  EXPECT_THROW(hc_split_sinkhorn(m.data(), 17, base.data(), scale, 20, kHcEps, out.data(),
                                 out.data(), out.data()),
               Error);
  EXPECT_THROW(hc_split_sinkhorn(m.data(), 0, base.data(), scale, 20, kHcEps, out.data(),
                                 out.data(), out.data()),
               Error);
}

}  // namespace
}  // namespace ds41
