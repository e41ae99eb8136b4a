// Tests of the linear layers (spec backbone.md §3.3): closed-form cases whose exact result is
// derived by hand, the fast paths against their scalar twins bit for bit, and thread-count
// invariance.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/numeric_formats.h"
#include "kernels/simd_level.h"
#include "simd_levels.h"

namespace ds41 {
namespace {

float pow2f(int k) { return std::ldexp(1.0f, k); }
uint8_t e8m0_code(int k) { return uint8_t(k + 127); }  // scale 2^k

// ---- random operands ----------------------------------------------------------------------
// bf16 activations whose 32-blocks have random magnitudes 2^[-12, 12] (so scales differ per
// block), with some zero blocks.
std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12), kind(0, 15);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  float scale = 1.0f;
  bool zero = false;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) {
      scale = pow2f(exponent(rng));
      zero = kind(rng) == 0;
    }
    out[size_t(i)] = f32_to_bf16(zero ? 0.0f : normal(rng) * scale);
  }
  return out;
}

std::vector<float> random_f32(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = normal(rng);
  return out;
}

// Random E4M3 codes over the whole finite range (NaN codes 0x7F/0xFF excluded).
std::vector<uint8_t> random_e4m3(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) {
    do c = uint8_t(rng() & 0xff);
    while ((c & 0x7f) == 0x7f);
  }
  return out;
}

std::vector<uint8_t> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) c = uint8_t(rng() & 0xff);
  return out;
}

// E8M0 scales 2^[-8, 8].
std::vector<uint8_t> random_scales(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> k(-8, 8);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) c = e8m0_code(k(rng));
  return out;
}

struct Fp8Operands {
  std::vector<uint8_t> w, scale;
  Fp8Matrix matrix(int64_t N, int64_t K) const { return {w.data(), scale.data(), N, K}; }
};
Fp8Operands random_fp8(int64_t N, int64_t K, uint32_t seed) {
  return {random_e4m3(N * K, seed), random_scales(((N + 31) / 32) * ((K + 31) / 32), seed + 1)};
}

struct Fp4Operands {
  std::vector<uint8_t> w, scale;
  Fp4Matrix matrix(int64_t N, int64_t K) const { return {w.data(), scale.data(), N, K}; }
};
Fp4Operands random_fp4(int64_t N, int64_t K, uint32_t seed) {
  return {random_bytes(N * K / 2, seed), random_scales(N * (K / 32), seed + 1)};
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

// ---- closed-form cases ------------------------------------------------------------------------
TEST(LinearFp8, ClosedFormExactResult) {
  // M = 2, N = 40 (two weight-scale rows: n < 32 and 32 <= n < 40), K = 64 (two K blocks).
  // Weights: 1.0 (E4M3 0x38) for n < 32 with scales 2^0 (kb 0) and 2^-1 (kb 1);
  //          -2.0 (0xC0) for n >= 32 with scales 2^1 (kb 0) and 2^0 (kb 1).
  // x row 0: block 0 alternates 1.0 / -0.5 (amax 1 -> s = 2^-8, codes 256 / -128, exact);
  //          block 1 is all 2.0 (s = 2^-7, code 256). Block sums of x: 16 - 8 = 8 and 64.
  // x row 1: block 0 zero; block 1 all 0.25 (sum 8).
  //   y[0, n<32]  = 8 * 1 * 1 + 64 * 1 * 0.5   = 40
  //   y[0, n>=32] = 8 * -2 * 2 + 64 * -2 * 1   = -160
  //   y[1, n<32]  = 8 * 1 * 0.5                = 4
  //   y[1, n>=32] = 8 * -2 * 1                 = -16
  // Every intermediate is a small dyadic number, so the result is exact in any order and in bf16.
  const int64_t M = 2, N = 40, K = 64;
  std::vector<uint8_t> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[size_t(n * K + k)] = n < 32 ? 0x38 : 0xC0;
  const std::vector<uint8_t> scale = {e8m0_code(0), e8m0_code(-1), e8m0_code(1), e8m0_code(0)};
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  for (int64_t k = 0; k < 32; ++k) {
    x[size_t(k)] = f32_to_bf16(k % 2 == 0 ? 1.0f : -0.5f);
    x[size_t(32 + k)] = f32_to_bf16(2.0f);
    x[size_t(K + k)] = f32_to_bf16(0.0f);
    x[size_t(K + 32 + k)] = f32_to_bf16(0.25f);
  }
  const Fp8Matrix W{w.data(), scale.data(), N, K};
  std::vector<uint16_t> fast(static_cast<size_t>(M * N)), reference(static_cast<size_t>(M * N));
  ThreadPool pool(2);
  linear_fp8(x.data(), M, W, fast.data(), &pool);
  linear_fp8_reference(x.data(), M, W, reference.data());
  for (int64_t n = 0; n < N; ++n) {
    const float expected0 = n < 32 ? 40.0f : -160.0f, expected1 = n < 32 ? 4.0f : -16.0f;
    EXPECT_EQ(bf16_to_f32(fast[size_t(n)]), expected0) << "n=" << n;
    EXPECT_EQ(bf16_to_f32(fast[size_t(N + n)]), expected1) << "n=" << n;
    EXPECT_EQ(bf16_to_f32(reference[size_t(n)]), expected0) << "n=" << n;
    EXPECT_EQ(bf16_to_f32(reference[size_t(N + n)]), expected1) << "n=" << n;
  }
}

TEST(LinearFp4, ClosedFormExactResult) {
  // M = 1, N = 6, K = 64. Weight row n: 1.5 (nibble 3) at even k, -0.5 (nibble 9) at odd k, so
  // every byte is 0x93 (low nibble = even k, §2.1); scales [n][kb] = 2^(n % 3) and 2^-1.
  // x: block 0 is 1.0 at even k, 0.5 at odd k (s = 2^-8, exact); block 1 all 2.0 (s = 2^-7).
  //   block 0 partial: 16 * 1.0 * 1.5 + 16 * 0.5 * -0.5 = 24 - 4 = 20
  //   (with the nibbles swapped it would be 16 * -0.5 + 16 * 0.5 * 1.5 = 4)
  //   block 1 partial: 16 * 2 * 1.5 + 16 * 2 * -0.5 = 32
  //   y[n] = 20 * 2^(n % 3) + 32 * 0.5 = 36, 56, 96, 36, 56, 96
  const int64_t N = 6, K = 64;
  const std::vector<uint8_t> w(static_cast<size_t>(N * K / 2), 0x93);
  std::vector<uint8_t> scale;
  for (int64_t n = 0; n < N; ++n) {
    scale.push_back(e8m0_code(int(n % 3)));
    scale.push_back(e8m0_code(-1));
  }
  std::vector<uint16_t> x(static_cast<size_t>(K));
  for (int64_t k = 0; k < 32; ++k) {
    x[size_t(k)] = f32_to_bf16(k % 2 == 0 ? 1.0f : 0.5f);
    x[size_t(32 + k)] = f32_to_bf16(2.0f);
  }
  const Fp4Matrix W{w.data(), scale.data(), N, K};
  std::vector<uint16_t> fast(static_cast<size_t>(N)), reference(static_cast<size_t>(N));
  linear_fp4(x.data(), 1, W, fast.data(), nullptr);
  linear_fp4_reference(x.data(), 1, W, reference.data());
  const float expected[3] = {36.0f, 56.0f, 96.0f};
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(bf16_to_f32(fast[size_t(n)]), expected[n % 3]) << "n=" << n;
    EXPECT_EQ(bf16_to_f32(reference[size_t(n)]), expected[n % 3]) << "n=" << n;
  }
}

TEST(LinearFp8, ActivationsAreQuantizedFirst) {
  // x block = {1.75, 1.015625, 0, ...}: amax 1.75 = 448 * 2^-8 -> s = 2^-8. 1.015625 / s = 260
  // lies in E4M3's [256, 512) binade (step 32) and rounds to 256, i.e. the GEMM sees 1.0.
  // With all weights 1.0 (0x38) and scale 2^0: y = 1.75 + 1.0 = 2.75, where an unquantized
  // product would give 2.765625 (itself a bf16 value, so the difference is visible).
  const int64_t N = 3, K = 32;
  const std::vector<uint8_t> w(static_cast<size_t>(N * K), 0x38);
  const std::vector<uint8_t> scale = {e8m0_code(0)};
  std::vector<uint16_t> x(static_cast<size_t>(K), 0);
  x[0] = f32_to_bf16(1.75f);
  x[1] = f32_to_bf16(1.015625f);
  const Fp8Matrix W{w.data(), scale.data(), N, K};
  std::vector<uint16_t> fast(static_cast<size_t>(N)), reference(static_cast<size_t>(N));
  linear_fp8(x.data(), 1, W, fast.data(), nullptr);
  linear_fp8_reference(x.data(), 1, W, reference.data());
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(bf16_to_f32(fast[size_t(n)]), 2.75f) << n;
    EXPECT_EQ(bf16_to_f32(reference[size_t(n)]), 2.75f) << n;
  }
}

TEST(LinearFp8, BlockPartialIsTheExactSumRoundedOnce) {
  // One 32-block (x scale 1 since amax = 448) whose fp32 running sums lose bits: products
  // p0 = 448 * 448 = B = 200704, p2 = -B, and t = 2^-6 * 2^-6 = 2^-12 at k = 1, 3, 4, 5, 6, 7.
  // The ulp of B is 2^-6, so any fp32 order that adds a t to +-B drops it:
  //   k-sequential fp32: B + t - B + ... = 4t;  8-lane fp32 tree: 4t or 0.
  // The exact sum (the golden generator's semantics, gemm.h) is 6t = 3 * 2^-11, representable
  // in bf16, so y must be exactly that in both the fast path and the twin.
  const int64_t K = 32;
  std::vector<uint8_t> w(static_cast<size_t>(K), 0x00);
  std::vector<uint16_t> x(static_cast<size_t>(K), 0);
  for (int k : {1, 3, 4, 5, 6, 7}) {
    w[size_t(k)] = 0x08;  // 2^-6
    x[size_t(k)] = f32_to_bf16(pow2f(-6));
  }
  w[0] = 0x7E;  // 448
  w[2] = 0xFE;  // -448
  x[0] = x[2] = f32_to_bf16(448.0f);
  const std::vector<uint8_t> scale = {e8m0_code(0)};
  const Fp8Matrix W{w.data(), scale.data(), 1, K};
  uint16_t fast = 0, reference = 0;
  linear_fp8(x.data(), 1, W, &fast, nullptr);
  linear_fp8_reference(x.data(), 1, W, &reference);
  EXPECT_EQ(bf16_to_f32(fast), 3.0f * pow2f(-11));
  EXPECT_EQ(bf16_to_f32(reference), 3.0f * pow2f(-11));
}

TEST(LinearDense, ClosedFormExactResult) {
  // x = [1, 2, 3, ..., 11] (K = 11: two full groups of 4 lanes plus a 3-element tail),
  // W row 0 all 1 -> 66; row 1 = (-1)^k -> 1 - 2 + 3 - ... + 11 = 6; row 2 = 0.5 -> 33.
  const int64_t N = 3, K = 11;
  std::vector<float> x(static_cast<size_t>(K));
  std::vector<uint16_t> x_bf16(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    x[size_t(k)] = float(k + 1);
    x_bf16[size_t(k)] = f32_to_bf16(float(k + 1));
  }
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t k = 0; k < K; ++k) {
    w[size_t(k)] = 1.0f;
    w[size_t(K + k)] = k % 2 == 0 ? 1.0f : -1.0f;
    w[size_t(2 * K + k)] = 0.5f;
  }
  std::vector<uint16_t> w_bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w_bf16[i] = f32_to_bf16(w[i]);
  const float expected[3] = {66.0f, 6.0f, 33.0f};

  std::vector<float> y32(static_cast<size_t>(N));
  std::vector<uint16_t> y16(static_cast<size_t>(N));
  linear_f32(x.data(), 1, w.data(), N, K, y32.data(), nullptr);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(y32[size_t(n)], expected[n]) << "f32 n=" << n;
  linear_f32_wbf16(x.data(), 1, w_bf16.data(), N, K, y32.data(), nullptr);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(y32[size_t(n)], expected[n]) << "f32_wbf16 n=" << n;
  linear_bf16_f32out(x_bf16.data(), 1, w_bf16.data(), N, K, y32.data(), nullptr);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(y32[size_t(n)], expected[n]) << "bf16_f32out n=" << n;
  linear_bf16(x_bf16.data(), 1, w_bf16.data(), N, K, y16.data(), nullptr);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(bf16_to_f32(y16[size_t(n)]), expected[n]) << "bf16 n=" << n;
}

// The reference's F.linear, as the golden generator computes it: per output, an fp32 running sum
// over k ascending from +0, each product rounded before it is added. N = 40 identical weight rows
// and K = 12 run both the 8-output vector lanes (with their scalar k tail) and the scalar outputs.
void expect_dense_rows(const std::vector<float>& x, const std::vector<float>& w_row, float expected) {
  const int64_t N = 40, K = int64_t(x.size());
  std::vector<float> w;
  for (int64_t n = 0; n < N; ++n) w.insert(w.end(), w_row.begin(), w_row.end());
  std::vector<float> fast(static_cast<size_t>(N)), reference(static_cast<size_t>(N));
  linear_f32(x.data(), 1, w.data(), N, K, fast.data(), nullptr);
  linear_f32_reference(x.data(), 1, w.data(), N, K, reference.data());
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(fast[size_t(n)], expected) << "output " << n;
    EXPECT_EQ(reference[size_t(n)], expected) << "output " << n;
  }
}

TEST(LinearDense, SumsSequentiallyInFp32) {
  // x = [2^24, 1, 1, 1, -2^24, 1, 1, 1, 1, 1, 1, 1], W = 1: each +1 onto 2^24 rounds away (ties to
  // even), so left to right gives 0 + 7 = 7 (the exact sum is 10; pairwise or lane sums differ too).
  std::vector<float> x = {pow2f(24), 1, 1, 1, -pow2f(24), 1, 1, 1, 1, 1, 1, 1};
  expect_dense_rows(x, std::vector<float>(x.size(), 1.0f), 7.0f);
}

TEST(LinearDense, RoundsEachProductBeforeAdding) {
  // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (a tie, to even); adding -1 then gives
  // 2^-11 exactly. A fused multiply-add would keep the 2^-24.
  const float a = 1.0f + pow2f(-12);
  std::vector<float> x(12, 0.0f), w(12, 0.0f);
  x[0] = a, w[0] = a, x[1] = -1.0f, w[1] = 1.0f;
  expect_dense_rows(x, w, pow2f(-11));
}

TEST(LinearFp8, NaNWeightCodePropagates) {
  const int64_t N = 2, K = 32;
  std::vector<uint8_t> w(static_cast<size_t>(N * K), 0x38);
  w[5] = 0x7F;  // NaN code in row 0
  const std::vector<uint8_t> scale = {e8m0_code(0)};
  const std::vector<uint16_t> x(static_cast<size_t>(K), f32_to_bf16(1.0f));
  std::vector<uint16_t> fast(2), reference(2);
  linear_fp8(x.data(), 1, Fp8Matrix{w.data(), scale.data(), N, K}, fast.data(), nullptr);
  linear_fp8_reference(x.data(), 1, Fp8Matrix{w.data(), scale.data(), N, K}, reference.data());
  EXPECT_TRUE(std::isnan(bf16_to_f32(fast[0])));
  EXPECT_TRUE(std::isnan(bf16_to_f32(reference[0])));
  EXPECT_EQ(bf16_to_f32(fast[1]), 32.0f);
  EXPECT_EQ(bf16_to_f32(reference[1]), 32.0f);
}

TEST(DequantFp8ToBf16, ProductOfCodeAndBlockScale) {
  // N = 40: blocks are (n / 32, k / 32), scale [2, ceil(K / 32)]. K = 96 (whole blocks) takes the
  // SIMD row kernel, K = 48 the element loop; every level, NaN codes included.
  std::vector<SimdLevel> levels = supported_simd_levels();
  levels.insert(levels.begin(), SimdLevel::Scalar);
  for (int64_t K : {48, 96})
    for (SimdLevel level : levels) {
      ScopedSimdLevel scoped(level);
      const int64_t N = 40, scale_cols = (K + 31) / 32;
      Fp8Operands op = random_fp8(N, K, 5);
      op.w[7] = 0x7f;
      op.w[size_t(N * K - 1)] = 0xff;
      std::vector<uint16_t> out(static_cast<size_t>(N * K));
      dequant_fp8_to_bf16(op.matrix(N, K), out.data());
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const float s = e8m0_to_f32(op.scale[size_t((n / 32) * scale_cols + k / 32)]);
          ASSERT_EQ(out[size_t(n * K + k)], f32_to_bf16(e4m3_to_f32(op.w[size_t(n * K + k)]) * s))
              << simd_level_name(level) << " K=" << K << " at " << n << "," << k;
        }
    }
  // Hand values: 1.0 (0x38) * 2^3 = 8; -448 (0xFE) * 2^-2 = -112; 2^-9 (0x01) * 2^-127 = 2^-136
  // is below bf16's smallest subnormal 2^-133 by more than half of it and rounds to +0.
  const std::vector<uint8_t> w = {0x38, 0xFE, 0x01};
  for (auto [code, scale_code, expected] :
       {std::tuple{0, e8m0_code(3), 8.0f}, std::tuple{1, e8m0_code(-2), -112.0f},
        std::tuple{2, uint8_t{0}, 0.0f}}) {
    uint16_t value = 0xFFFF;
    dequant_fp8_to_bf16(Fp8Matrix{&w[size_t(code)], &scale_code, 1, 1}, &value);
    EXPECT_EQ(bf16_to_f32(value), expected) << "code index " << code;
  }
}

TEST(Linear, RejectsBadShapes) {
  std::vector<uint8_t> w(64 * 48), scale(4);
  std::vector<uint16_t> x(48), y(64);
  EXPECT_THROW(
      linear_fp8(x.data(), 1, Fp8Matrix{w.data(), scale.data(), 64, 48}, y.data(), nullptr), Error);
  EXPECT_THROW(
      linear_fp8_reference(x.data(), 1, Fp8Matrix{w.data(), scale.data(), 64, 48}, y.data()),
      Error);
  EXPECT_THROW(
      linear_fp4(x.data(), 1, Fp4Matrix{w.data(), scale.data(), 64, 48}, y.data(), nullptr), Error);
  EXPECT_THROW(linear_bf16(x.data(), -1, x.data(), 1, 1, y.data(), nullptr), Error);
}

// ---- fast path == reference twin, bit for bit --------------------------------------------------
struct Shape {
  int64_t M, N, K;
};
const Shape kQuantizedShapes[] = {{1, 40, 32},  {1, 40, 256},  {3, 40, 96}, {17, 40, 32},
                                  {17, 40, 96}, {17, 64, 256}, {3, 1, 256}, {130, 40, 64}};

TEST(LinearFp8, FastPathMatchesReferenceTwin) {
  uint32_t seed = 100;
  for (const Shape& s : kQuantizedShapes) {
    const std::vector<uint16_t> x = random_bf16(s.M * s.K, seed++);
    const Fp8Operands op = random_fp8(s.N, s.K, seed++);
    std::vector<uint16_t> fast(static_cast<size_t>(s.M * s.N)),
        reference(static_cast<size_t>(s.M * s.N));
    linear_fp8(x.data(), s.M, op.matrix(s.N, s.K), fast.data(), nullptr);
    linear_fp8_reference(x.data(), s.M, op.matrix(s.N, s.K), reference.data());
    EXPECT_EQ(first_difference(fast, reference), -1) << "M=" << s.M << " N=" << s.N << " K=" << s.K;
  }
}

TEST(LinearFp4, FastPathMatchesReferenceTwin) {
  uint32_t seed = 200;
  for (const Shape& s : kQuantizedShapes) {
    const std::vector<uint16_t> x = random_bf16(s.M * s.K, seed++);
    const Fp4Operands op = random_fp4(s.N, s.K, seed++);
    std::vector<uint16_t> fast(static_cast<size_t>(s.M * s.N)),
        reference(static_cast<size_t>(s.M * s.N));
    linear_fp4(x.data(), s.M, op.matrix(s.N, s.K), fast.data(), nullptr);
    linear_fp4_reference(x.data(), s.M, op.matrix(s.N, s.K), reference.data());
    EXPECT_EQ(first_difference(fast, reference), -1) << "M=" << s.M << " N=" << s.N << " K=" << s.K;
  }
}

// Output bytes are bf16, which hides most fp32-level differences in the summation order. Here the
// second K block is the first one permuted, with the weights negated: the exact result is 0 and
// what comes out is the fp32 rounding residual of the two orders, visible at any magnitude.
TEST(LinearQuantized, FastPathMatchesTwinOnCancellingBlocks) {
  const int64_t M = 3, N = 40, K = 64;
  std::mt19937 rng(77);
  std::vector<int> perm(32);
  for (int i = 0; i < 32; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);

  std::vector<uint16_t> x = random_bf16(M * K, 78);
  for (int64_t m = 0; m < M; ++m)
    for (int k = 0; k < 32; ++k) x[size_t(m * K + 32 + k)] = x[size_t(m * K + perm[size_t(k)])];

  Fp8Operands fp8 = random_fp8(N, K, 79);
  Fp4Operands fp4 = random_fp4(N, K, 80);
  for (int64_t n = 0; n < N; ++n) {
    for (int k = 0; k < 32; ++k) {
      fp8.w[size_t(n * K + 32 + k)] = uint8_t(fp8.w[size_t(n * K + perm[size_t(k)])] ^ 0x80);
      const uint8_t nibble = fp4_get(fp4.w.data() + n * K / 2, perm[size_t(k)]);
      fp4_set(fp4.w.data() + n * K / 2, 32 + k, uint8_t(nibble ^ 0x8));
    }
    fp4.scale[size_t(n * 2 + 1)] = fp4.scale[size_t(n * 2)];
  }
  for (int64_t nb = 0; nb < 2; ++nb) fp8.scale[size_t(nb * 2 + 1)] = fp8.scale[size_t(nb * 2)];

  std::vector<uint16_t> fast(static_cast<size_t>(M * N)), reference(static_cast<size_t>(M * N));
  linear_fp8(x.data(), M, fp8.matrix(N, K), fast.data(), nullptr);
  linear_fp8_reference(x.data(), M, fp8.matrix(N, K), reference.data());
  EXPECT_EQ(first_difference(fast, reference), -1) << "fp8";
  // The second block is the first one permuted with its weights negated: with exact block sums
  // its partial is exactly minus the first one's, so every output is exactly zero (an fp32
  // running sum would leave order-dependent residues here).
  for (uint16_t v : reference) EXPECT_EQ(v & 0x7fff, 0) << "fp8 block sums are not exact";

  linear_fp4(x.data(), M, fp4.matrix(N, K), fast.data(), nullptr);
  linear_fp4_reference(x.data(), M, fp4.matrix(N, K), reference.data());
  EXPECT_EQ(first_difference(fast, reference), -1) << "fp4";
  for (uint16_t v : reference) EXPECT_EQ(v & 0x7fff, 0) << "fp4 block sums are not exact";
}

// Dense shapes add K values that are not multiples of 4 (lane tail) or of 32.
const Shape kDenseShapes[] = {{1, 40, 32},  {1, 40, 256}, {3, 40, 96}, {17, 40, 256},
                              {17, 24, 37}, {5, 3, 7},    {3, 40, 1},  {130, 9, 40}};

TEST(LinearDense, FastPathsMatchReferenceTwins) {
  uint32_t seed = 300;
  for (const Shape& s : kDenseShapes) {
    const std::string where =
        "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
    const std::vector<uint16_t> x16 = random_bf16(s.M * s.K, seed++);
    const std::vector<uint16_t> w16 = random_bf16(s.N * s.K, seed++);
    const std::vector<float> x32 = random_f32(s.M * s.K, seed++);
    const std::vector<float> w32 = random_f32(s.N * s.K, seed++);
    const size_t out = size_t(s.M * s.N);

    std::vector<uint16_t> fast16(out), ref16(out);
    linear_bf16(x16.data(), s.M, w16.data(), s.N, s.K, fast16.data(), nullptr);
    linear_bf16_reference(x16.data(), s.M, w16.data(), s.N, s.K, ref16.data());
    EXPECT_EQ(first_difference(fast16, ref16), -1) << "bf16 " << where;

    std::vector<float> fast32(out), ref32(out);
    linear_bf16_f32out(x16.data(), s.M, w16.data(), s.N, s.K, fast32.data(), nullptr);
    linear_bf16_f32out_reference(x16.data(), s.M, w16.data(), s.N, s.K, ref32.data());
    EXPECT_EQ(first_difference(fast32, ref32), -1) << "bf16_f32out " << where;

    linear_f32(x32.data(), s.M, w32.data(), s.N, s.K, fast32.data(), nullptr);
    linear_f32_reference(x32.data(), s.M, w32.data(), s.N, s.K, ref32.data());
    EXPECT_EQ(first_difference(fast32, ref32), -1) << "f32 " << where;

    linear_f32_wbf16(x32.data(), s.M, w16.data(), s.N, s.K, fast32.data(), nullptr);
    linear_f32_wbf16_reference(x32.data(), s.M, w16.data(), s.N, s.K, ref32.data());
    EXPECT_EQ(first_difference(fast32, ref32), -1) << "f32_wbf16 " << where;
  }
}

// ---- thread-count invariance --------------------------------------------------------------------
TEST(Linear, ResultsDoNotDependOnThreadCount) {
  // M = 130 crosses the 128-row activation chunk; N = 40 leaves a partial column tile; K = 512
  // makes even the per-row activation preparation big enough to be split across threads.
  const int64_t M = 130, N = 40, K = 512;
  const std::vector<uint16_t> x = random_bf16(M * K, 7);
  const std::vector<float> x32 = random_f32(M * K, 8);
  const Fp8Operands fp8 = random_fp8(N, K, 9);
  const Fp4Operands fp4 = random_fp4(N, K, 10);
  const std::vector<uint16_t> wb = random_bf16(N * K, 11);

  struct Outputs {
    std::vector<uint16_t> fp8, fp4, bf16;
    std::vector<float> f32, f32_wbf16;
  };
  auto run = [&](ThreadPool* pool) {
    Outputs o{std::vector<uint16_t>(static_cast<size_t>(M * N)),
              std::vector<uint16_t>(static_cast<size_t>(M * N)),
              std::vector<uint16_t>(static_cast<size_t>(M * N)),
              std::vector<float>(static_cast<size_t>(M * N)),
              std::vector<float>(static_cast<size_t>(M * N))};
    linear_fp8(x.data(), M, fp8.matrix(N, K), o.fp8.data(), pool);
    linear_fp4(x.data(), M, fp4.matrix(N, K), o.fp4.data(), pool);
    linear_bf16(x.data(), M, wb.data(), N, K, o.bf16.data(), pool);
    linear_f32(x32.data(), M, random_f32(N * K, 12).data(), N, K, o.f32.data(), pool);
    linear_f32_wbf16(x32.data(), M, wb.data(), N, K, o.f32_wbf16.data(), pool);
    return o;
  };
  const Outputs inline_run = run(nullptr);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    const Outputs o = run(&pool);
    EXPECT_TRUE(same_bytes(o.fp8, inline_run.fp8)) << threads << " threads";
    EXPECT_TRUE(same_bytes(o.fp4, inline_run.fp4)) << threads << " threads";
    EXPECT_TRUE(same_bytes(o.bf16, inline_run.bf16)) << threads << " threads";
    EXPECT_TRUE(same_bytes(o.f32, inline_run.f32)) << threads << " threads";
    EXPECT_TRUE(same_bytes(o.f32_wbf16, inline_run.f32_wbf16)) << threads << " threads";
  }
  // And the multi-threaded result is the twin's.
  std::vector<uint16_t> reference(static_cast<size_t>(M * N));
  linear_fp8_reference(x.data(), M, fp8.matrix(N, K), reference.data());
  EXPECT_TRUE(same_bytes(inline_run.fp8, reference));
}

}  // namespace
}  // namespace ds41
