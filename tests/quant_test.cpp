// Tests of the row quantizers (spec backbone.md §3.1, §3.2). Expected values in the hand examples
// are derived in the comments from the spec's definitions, not from the implementation.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/numeric_formats.h"

namespace ds41 {
namespace {

float pow2f(int k) { return std::ldexp(1.0f, k); }

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(f32_to_bf16(v));
  return out;
}

// A bf16 row padded with zeros to `length`, the given values first.
std::vector<uint16_t> padded_row(std::vector<float> head, size_t length) {
  head.resize(length, 0.0f);
  for (float v : head) EXPECT_EQ(round_bf16(v), v) << v << " is not a bf16 value";
  return to_bf16(head);
}

// Rows whose 16/32-element blocks span many magnitudes: a random scale 2^e per block (e in
// [-20, 20]), normal-distributed values, with zero blocks, single-spike blocks and exact block
// maxima mixed in, so that every scale-rounding path is exercised.
std::vector<uint16_t> random_rows(int64_t rows, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20), kind(0, 9);
  std::vector<uint16_t> out(static_cast<size_t>(rows * K));
  for (int64_t b = 0; b < rows * K / 16; ++b) {
    const float scale = pow2f(exponent(rng));
    const int block_kind = kind(rng);
    for (int64_t i = 0; i < 16; ++i) {
      float v = normal(rng) * scale;
      if (block_kind == 0) v = 0.0f;                                // all-zero block: scale floors
      if (block_kind == 1) v = (i == 5) ? v * 1000.0f : v * 1e-3f;  // one spike
      if (block_kind == 2 && i == 0) v = 448.0f * scale;  // act_quant exact power-of-two scale
      if (block_kind == 3 && i == 0) v = -6.0f * scale;   // FP4 exact power-of-two scale
      out[size_t(b * 16 + i)] = f32_to_bf16(v);
    }
  }
  return out;
}

// ---- act_quant scale (§3.1) ------------------------------------------------------------------
TEST(ActQuantScale, ExactPowersOfTwoMapToThemselves) {
  // fp32(1/448) = fp32(1/7) * 2^-6 is 1/448 * (1 + 4.47e-8): 448 * 2^k times it is
  // 2^k * (1 + 4.47e-8), below half an ulp (2^-24 = 5.96e-8) above 2^k, so it rounds back to
  // exactly 2^k and ceil_pow2 keeps it (§3.1 step 3: a power of two maps to itself).
  for (int k = -20; k <= 20; ++k) {
    EXPECT_EQ(act_quant_scale(448.0f * pow2f(k)), pow2f(k)) << "k=" << k;
  }
}

TEST(ActQuantScale, SlightlyAboveAPowerOfTwoRoundsUp) {
  for (int k = -20; k <= 20; ++k) {
    const float exact = 448.0f * pow2f(k);
    // The next bf16 above 448 * 2^k is 450 * 2^k; v = 450/448 * 2^k > 2^k.
    EXPECT_EQ(act_quant_scale(450.0f * pow2f(k)), pow2f(k + 1)) << "k=" << k;
    // Even one fp32 ulp above: v = 2^k (1 + 4.47e-8)(1 + 2^-23) rounds to at least 2^k + 1 ulp.
    EXPECT_EQ(act_quant_scale(std::nextafter(exact, INFINITY)), pow2f(k + 1)) << "k=" << k;
    // Below: 446 * 2^k (the bf16 below) gives v < 2^k, so the scale is still 2^k.
    EXPECT_EQ(act_quant_scale(446.0f * pow2f(k)), pow2f(k)) << "k=" << k;
  }
}

TEST(ActQuantScale, AmaxIsFlooredAt1e4) {
  // 1e-4 * fp32(1/448) = 2.23e-7 lies in (2^-23, 2^-22] = (1.19e-7, 2.38e-7]: s = 2^-22.
  EXPECT_EQ(act_quant_scale(0.0f), pow2f(-22));
  EXPECT_EQ(act_quant_scale(1e-6f), pow2f(-22));
  EXPECT_EQ(act_quant_scale(1e-4f), pow2f(-22));
  // Above the floor the floor no longer matters: 448 * 2^-20 = 4.27e-4 -> 2^-20.
  EXPECT_EQ(act_quant_scale(448.0f * pow2f(-20)), pow2f(-20));

  // An all-zero block gets that floor scale and zero codes.
  std::vector<uint16_t> x(32, f32_to_bf16(0.0f));
  std::vector<uint8_t> codes(32, 0xAA);
  float scale = 0.0f;
  act_quant_row(x.data(), 32, codes.data(), &scale);
  EXPECT_EQ(scale, pow2f(-22));
  for (uint8_t c : codes) EXPECT_EQ(c, 0x00);
}

// ---- act_quant rows ---------------------------------------------------------------------------
TEST(ActQuantRow, HandComputedBlock) {
  // Block 0 has amax 28 = 448 * 2^-4, so s = 2^-4 exactly and x / s = 16 x:
  //   1.0      -> 16    = 2^4            -> exponent field 4+7 = 11, mantissa 0 -> 0x58
  //   -3.5     -> -56   = -1.75 * 2^5    -> sign, field 12, mantissa 6          -> 0xE6
  //   0.30078125 (bf16 of 0.3) -> 4.8125: grid step in [4,8) is 0.5; nearest 5 = 1.25*2^2
  //                                     -> field 9, mantissa 2                   -> 0x4A
  //   28       -> 448   (max finite)                                             -> 0x7E
  //   0.265625 -> 4.25: tie between 4 (mantissa 0) and 4.5 (mantissa 1) -> even -> 0x48
  // Block 1 is all zero: floor scale 2^-22, codes 0.
  const std::vector<uint16_t> x = padded_row({1.0f, -3.5f, 0.30078125f, 28.0f, 0.265625f}, 64);
  std::vector<uint8_t> codes(64);
  float scales[2];
  act_quant_row(x.data(), 64, codes.data(), scales);
  EXPECT_EQ(scales[0], 0.0625f);
  EXPECT_EQ(scales[1], pow2f(-22));
  EXPECT_EQ(codes[0], 0x58);
  EXPECT_EQ(codes[1], 0xE6);
  EXPECT_EQ(codes[2], 0x4A);
  EXPECT_EQ(codes[3], 0x7E);
  EXPECT_EQ(codes[4], 0x48);
  for (int i = 5; i < 64; ++i) EXPECT_EQ(codes[size_t(i)], 0x00) << i;

  // QDQ writes back q * s: 1.0, -3.5, 5/16 = 0.3125, 28, 4/16 = 0.25.
  std::vector<uint16_t> y = x;
  act_quant_qdq_row(y.data(), 64);
  const float expected[5] = {1.0f, -3.5f, 0.3125f, 28.0f, 0.25f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(bf16_to_f32(y[size_t(i)]), expected[i]) << i;
}

TEST(ActQuantRow, EveryBf16MaximumStaysInRangeAndNeverCastsToNaN) {
  // §3.1 step 4 clamps x / s to +-448 before the E4M3 cast because a plain cast of an overflow is
  // NaN. For every finite bf16 value as the block maximum, the element's code must be finite
  // and decode to at most 448; and x / s itself never exceeds 448 for bf16 input (the clamp is a
  // guard, not a clipping step; contrast with the NVFP4 variant below).
  std::vector<uint16_t> x(32, 0);
  std::vector<uint8_t> codes(32);
  float scale = 0.0f;
  for (uint32_t bits = 0; bits < 0x7f80u; ++bits) {
    for (uint32_t sign : {0u, 0x8000u}) {
      x[7] = uint16_t(bits | sign);
      act_quant_row(x.data(), 32, codes.data(), &scale);
      const float v = bf16_to_f32(x[7]);
      ASSERT_LE(std::fabs(v / scale), 448.0f) << "bf16 bits " << bits;
      ASSERT_NE(codes[7] & 0x7f, 0x7f) << "NaN code for bf16 bits " << bits;
      ASSERT_EQ(codes[7], f32_to_e4m3(v / scale)) << "bf16 bits " << bits;
    }
  }
  // The exact maximum 448 * 2^k lands on the top code.
  x[7] = f32_to_bf16(448.0f * pow2f(-3));
  act_quant_row(x.data(), 32, codes.data(), &scale);
  EXPECT_EQ(codes[7], 0x7E);
}

TEST(ActQuantRow, QuantThenDecodeEqualsQdq) {
  const int64_t rows = 64, K = 256;
  const std::vector<uint16_t> x = random_rows(rows, K, 11);
  std::vector<uint16_t> qdq = x;
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  std::vector<float> scales(static_cast<size_t>(K / 32));
  for (int64_t r = 0; r < rows; ++r) {
    act_quant_qdq_row(qdq.data() + r * K, K);
    act_quant_row(x.data() + r * K, K, codes.data(), scales.data());
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t expected = f32_to_bf16(e4m3_to_f32(codes[size_t(k)]) * scales[size_t(k / 32)]);
      ASSERT_EQ(qdq[size_t(r * K + k)], expected) << "row " << r << " k " << k;
    }
  }
}

TEST(ActQuantRow, RejectsRowsThatAreNotWholeBlocks) {
  std::vector<uint16_t> x(48, 0);
  std::vector<uint8_t> codes(48);
  float scales[2];
  EXPECT_THROW(act_quant_row(x.data(), 48, codes.data(), scales), Error);
  EXPECT_THROW(act_quant_qdq_row(x.data(), 40), Error);
}

// ---- MXFP4 (§3.2, indexer Q/K) ---------------------------------------------------------------
TEST(Mxfp4, ScaleOfExactAndNearPowersOfTwo) {
  // fp32(1/6) = 1/6 * (1 + 2.98e-8): 6 * 2^k times it rounds back to exactly 2^k.
  for (int k = -30; k <= 30; ++k) {
    EXPECT_EQ(mxfp4_scale(6.0f * pow2f(k)), pow2f(k)) << "k=" << k;
    // next bf16 above 6 is 6.03125: v > 2^k, so the scale doubles
    EXPECT_EQ(mxfp4_scale(6.03125f * pow2f(k)), pow2f(k + 1)) << "k=" << k;
  }
  // amax floor 6 * 2^-126 gives the smallest normal scale 2^-126 (E8M0 code 1).
  EXPECT_EQ(mxfp4_scale(0.0f), pow2f(-126));
  EXPECT_EQ(f32_to_e8m0(mxfp4_scale(0.0f)), 1);
}

TEST(Mxfp4, NeverClipsForAnyBf16Maximum) {
  // §3.2: s >= amax / 6, so x / s never exceeds 6 and the clamp never bites.
  for (uint32_t bits = 1; bits < 0x7f80u; ++bits) {
    const float amax = bf16_to_f32(uint16_t(bits));
    ASSERT_LE(amax / mxfp4_scale(amax), 6.0f) << "bf16 bits " << bits;
  }
}

TEST(Mxfp4, HandComputedBlock) {
  // amax 3: 3 * fp32(1/6) = 0.5 + 1.49e-8, less than half an ulp (2.98e-8) above 0.5, so it
  // rounds to 0.5 and s = 0.5 (E8M0 code 126). x / s = 2x:
  //   3.0 -> 6 -> code 7;  1.0 -> 2 -> code 4;
  //   -0.375 -> -0.75: tie between 0.5 (index 1) and 1.0 (index 2) -> even index 2 -> 0xA
  //   0.125 -> 0.25: tie between 0 and 0.5 -> 0;   1.25 -> 2.5: tie 2/3 -> 2 (index 4)
  //   2.5 -> 5: tie 4/6 -> 4 (index 6);  0 -> 0;  -3.0 -> -6 -> 0xF
  // Packed with the even element in the low nibble: 0x47, 0x0A, 0x64, 0xF0, then zeros.
  const std::vector<uint16_t> x =
      padded_row({3.0f, 1.0f, -0.375f, 0.125f, 1.25f, 2.5f, 0.0f, -3.0f}, 32);
  std::vector<uint8_t> packed(16, 0xEE);
  uint8_t e8m0 = 0;
  mxfp4_quant_row(x.data(), 32, packed.data(), &e8m0);
  EXPECT_EQ(e8m0, 126);
  const uint8_t expected_packed[4] = {0x47, 0x0A, 0x64, 0xF0};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(packed[size_t(j)], expected_packed[j]) << j;
  for (int j = 4; j < 16; ++j) EXPECT_EQ(packed[size_t(j)], 0x00) << j;

  // Dequantized: q * 0.5 = 3, 1, -0.5, 0, 1, 2, 0, -3.
  std::vector<uint16_t> out(32);
  mxfp4_dequant_row(packed.data(), &e8m0, 32, out.data());
  const float expected[8] = {3.0f, 1.0f, -0.5f, 0.0f, 1.0f, 2.0f, 0.0f, -3.0f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bf16_to_f32(out[size_t(i)]), expected[i]) << i;
}

TEST(Mxfp4, QuantDequantEqualsQdq) {
  const int64_t rows = 64, K = 128;
  const std::vector<uint16_t> x = random_rows(rows, K, 12);
  std::vector<uint16_t> qdq = x, roundtrip(static_cast<size_t>(K));
  std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), scales(static_cast<size_t>(K / 32));
  for (int64_t r = 0; r < rows; ++r) {
    mxfp4_qdq_row(qdq.data() + r * K, K);
    mxfp4_quant_row(x.data() + r * K, K, packed.data(), scales.data());
    mxfp4_dequant_row(packed.data(), scales.data(), K, roundtrip.data());
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(roundtrip[size_t(k)], qdq[size_t(r * K + k)]) << "row " << r << " k " << k;
  }
}

// ---- NVFP4-style (§3.2, compressed main KV) ---------------------------------------------------
TEST(Nvfp4, ScaleCodes) {
  EXPECT_EQ(nvfp4_scale_code(6.0f), 0x38);  // 6 / 6 = 1.0 = E4M3 0x38
  // Floor 6 * 2^-9: (6 * 2^-9) / 6 = 2^-9, the smallest E4M3 subnormal, code 1.
  EXPECT_EQ(nvfp4_scale_code(0.0f), 0x01);
  EXPECT_EQ(nvfp4_scale_code(1e-6f), 0x01);
  // 4.5 / 6 = 0.75 = 1.5 * 2^-1: field 6, mantissa 4 -> 0x34.
  EXPECT_EQ(nvfp4_scale_code(4.5f), 0x34);
  // 7 / 6 = 1.1667 lies between 1.125 and 1.25 and is nearer 1.125: code 0x39 (rounds DOWN).
  EXPECT_EQ(nvfp4_scale_code(7.0f), 0x39);
  // 3000 / 6 = 500 saturates to 448 (0x7E).
  EXPECT_EQ(nvfp4_scale_code(3000.0f), 0x7E);
}

TEST(Nvfp4, HandComputedBlock) {
  // amax 4.5 -> s = 0.75 (code 0x34); x / s as a true division:
  //   1.0 -> 1.333: above the 1.25 midpoint of 1 and 1.5 -> 1.5 (index 3) -> 1.125
  //   -4.5 -> -6 -> 0xF -> -4.5
  //   0.5 -> 0.667: below the 0.75 midpoint of 0.5 and 1 -> 0.5 (index 1) -> 0.375
  //   2.0 -> 2.667: above the 2.5 midpoint of 2 and 3 -> 3 (index 5) -> 2.25
  // Packed: 0xF3, 0x51.
  const std::vector<uint16_t> x = padded_row({1.0f, -4.5f, 0.5f, 2.0f}, 16);
  std::vector<uint8_t> packed(8, 0xEE);
  uint8_t scale = 0;
  nvfp4_quant_row(x.data(), 16, packed.data(), &scale);
  EXPECT_EQ(scale, 0x34);
  EXPECT_EQ(packed[0], 0xF3);
  EXPECT_EQ(packed[1], 0x51);
  for (int j = 2; j < 8; ++j) EXPECT_EQ(packed[size_t(j)], 0x00) << j;
  std::vector<uint16_t> out(16);
  nvfp4_dequant_row(packed.data(), &scale, 16, out.data());
  const float expected[4] = {1.125f, -4.5f, 0.375f, 2.25f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_f32(out[size_t(i)]), expected[i]) << i;
}

TEST(Nvfp4, RoundedDownScaleClipsTheMaximum) {
  // amax 7: s = 1.125 (see ScaleCodes); 7 / 1.125 = 6.22 > 6 is clipped to 6 -> 6.75.
  std::vector<uint16_t> x = padded_row({7.0f, -7.0f, 1.0f}, 16);
  nvfp4_qdq_row(x.data(), 16);
  EXPECT_EQ(bf16_to_f32(x[0]), 6.75f);
  EXPECT_EQ(bf16_to_f32(x[1]), -6.75f);
  // 1 / 1.125 = 0.889: above the 0.75 midpoint -> 1.0 -> 1.125.
  EXPECT_EQ(bf16_to_f32(x[2]), 1.125f);

  // The MXFP4 scale of the same block never clips: s = ceil_pow2(7/6) = 2, 7 / 2 = 3.5 ties
  // between 3 (index 5) and 4 (index 6) -> 4 -> 8.
  std::vector<uint16_t> m = padded_row({7.0f}, 32);
  mxfp4_qdq_row(m.data(), 32);
  EXPECT_EQ(bf16_to_f32(m[0]), 8.0f);

  // Saturated scale: amax 3008 (a bf16 value) -> 3008 / 6 = 501 saturates to s = 448;
  // 3008 / 448 = 6.71 -> clipped to 6 -> 2688.
  std::vector<uint16_t> big = padded_row({3008.0f, 448.0f}, 16);
  nvfp4_qdq_row(big.data(), 16);
  EXPECT_EQ(bf16_to_f32(big[0]), 2688.0f);
  EXPECT_EQ(bf16_to_f32(big[1]), 448.0f);
}

TEST(Nvfp4, QuantDequantEqualsQdq) {
  const int64_t rows = 64, K = 128;
  const std::vector<uint16_t> x = random_rows(rows, K, 13);
  std::vector<uint16_t> qdq = x, roundtrip(static_cast<size_t>(K));
  std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), scales(static_cast<size_t>(K / 16));
  for (int64_t r = 0; r < rows; ++r) {
    nvfp4_qdq_row(qdq.data() + r * K, K);
    nvfp4_quant_row(x.data() + r * K, K, packed.data(), scales.data());
    nvfp4_dequant_row(packed.data(), scales.data(), K, roundtrip.data());
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(roundtrip[size_t(k)], qdq[size_t(r * K + k)]) << "row " << r << " k " << k;
  }
}

TEST(Fp4Rows, RejectRowsThatAreNotWholeBlocks) {
  std::vector<uint16_t> x(40, 0);
  std::vector<uint8_t> packed(20), scales(3);
  EXPECT_THROW(mxfp4_quant_row(x.data(), 40, packed.data(), scales.data()), Error);
  EXPECT_THROW(nvfp4_quant_row(x.data(), 40, packed.data(), scales.data()), Error);
  EXPECT_THROW(nvfp4_qdq_row(x.data(), 24), Error);
  EXPECT_NO_THROW(nvfp4_qdq_row(x.data(), 32));
}

}  // namespace
}  // namespace ds41
