// Tests of the scalar reference conversions. Expected values come from closed forms and brute-force
// nearest-value searches written here, independently of the bit tricks in numeric_formats.cpp.
#include "kernels/numeric_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ds41 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- independent E4M3 model -----------------------------------------------------------------
bool e4m3_is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// sign * 2^(e-7) * (1 + m/8) for e > 0, sign * m/8 * 2^-6 for e == 0; evaluated in double.
double e4m3_closed_form(int code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int e = (code >> 3) & 0xf;
  const int m = code & 0x7;
  if (e == 0) return sign * (m / 8.0) * std::ldexp(1.0, -6);
  return sign * std::ldexp(1.0, e - 7) * (1.0 + m / 8.0);
}

// Clamp to +-448, then pick the nearest finite code; on an exact tie the code with the even
// mantissa (even code) wins. The sign bit follows the input's sign, zero included.
uint8_t e4m3_reference_encode(float x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  static const std::vector<double> finite_magnitudes = [] {
    std::vector<double> values;
    for (int code = 0; code <= 0x7e; ++code) values.push_back(e4m3_closed_form(code));
    return values;
  }();
  const double magnitude = std::fmin(std::fabs(double(x)), 448.0);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7e; ++code) {
    const double distance = std::fabs(magnitude - finite_magnitudes[code]);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return uint8_t(sign | best);
}

// ---- independent E2M1 model -----------------------------------------------------------------
constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t e2m1_reference_encode(float x) {
  const int sign = std::signbit(x) ? 8 : 0;
  const double magnitude = std::fmin(std::fabs(double(x)), 6.0);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int index = 0; index < 8; ++index) {
    const double distance = std::fabs(magnitude - kE2M1Magnitudes[index]);
    if (distance < best_distance || (distance == best_distance && index % 2 == 0)) {
      best = index;
      best_distance = distance;
    }
  }
  return uint8_t(sign | best);
}

float pow2f(int k) { return std::ldexp(1.0f, k); }

// ---- E4M3 -------------------------------------------------------------------------------------
TEST(NumericFormatsE4M3, EveryCodeDecodesToClosedForm) {
  for (int code = 0; code < 256; ++code) {
    const float decoded = e4m3_to_f32(uint8_t(code));
    const float from_table = kE4M3Table[code];
    if (e4m3_is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(decoded)) << "code " << code;
      EXPECT_TRUE(std::isnan(from_table)) << "code " << code;
      continue;
    }
    const double expected = e4m3_closed_form(code);
    EXPECT_EQ(double(decoded), expected) << "code " << code;
    EXPECT_EQ(double(from_table), expected) << "code " << code;
    EXPECT_EQ(std::signbit(decoded), (code & 0x80) != 0) << "code " << code;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), pow2f(-9));
  EXPECT_EQ(e4m3_to_f32(0x08), pow2f(-6));
}

TEST(NumericFormatsE4M3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (e4m3_is_nan_code(code)) continue;
    EXPECT_EQ(int(f32_to_e4m3(e4m3_to_f32(uint8_t(code)))), code) << "code " << code;
  }
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(NumericFormatsE4M3, NaNEncodesAs0x7F) {
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(bits_to_f32(0x7f800001u)), 0x7f);  // signalling-style payload
  EXPECT_EQ(f32_to_e4m3(bits_to_f32(0xffc00000u)), 0x7f);
}

TEST(NumericFormatsE4M3, MidpointsTieToEvenMantissa) {
  // Every pair of adjacent non-negative finite codes, subnormal/normal boundary included.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = kE4M3Table[code];
    const float high = kE4M3Table[code + 1];
    const float midpoint = 0.5f * (low + high);  // exact: needs one bit more than E4M3 has
    ASSERT_EQ(double(midpoint), 0.5 * (double(low) + double(high)));
    const int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(int(f32_to_e4m3(midpoint)), even) << "between codes " << code << " and " << code + 1;
    EXPECT_EQ(int(f32_to_e4m3(-midpoint)), 0x80 | even) << "negative, code " << code;
    // Off the tie by one ulp the nearer value wins.
    EXPECT_EQ(int(f32_to_e4m3(std::nextafter(midpoint, 0.0f))), code);
    EXPECT_EQ(int(f32_to_e4m3(std::nextafter(midpoint, kInf))), code + 1);
  }
}

TEST(NumericFormatsE4M3, SaturatesToMaxFinite) {
  EXPECT_EQ(f32_to_e4m3(500.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(kInf), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-kInf), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(448.0f, kInf)), 0x7e);
  // 464 is halfway between 448 and 480 (which does not exist); must not reach the NaN code.
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(479.0f), 0x7e);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1e30f)), 448.0f);
}

TEST(NumericFormatsE4M3, UnderflowAndSignedZero) {
  const float smallest_subnormal = pow2f(-9);
  // Exactly half the smallest subnormal ties to the even code 0.
  EXPECT_EQ(f32_to_e4m3(pow2f(-10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(-pow2f(-10)), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(pow2f(-10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(pow2f(-10), 0.0f)), 0x00);
  EXPECT_EQ(f32_to_e4m3(1.5f * smallest_subnormal), 0x02);  // tie between codes 1 and 2
  EXPECT_EQ(f32_to_e4m3(2.5f * smallest_subnormal), 0x02);  // tie between codes 2 and 3
  EXPECT_EQ(f32_to_e4m3(1e-20f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-1e-20f), 0x80);
  // fp32 subnormal inputs are far below the E4M3 grid.
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(f32_to_e4m3(bits_to_f32(0x007fffffu)), 0x00);
  // Rounding up out of the subnormal range lands on the smallest normal 2^-6 (code 0x08).
  EXPECT_EQ(f32_to_e4m3(std::nextafter(pow2f(-6), 0.0f)), 0x08);
  EXPECT_EQ(f32_to_e4m3(7.5f * smallest_subnormal), 0x08);
}

TEST(NumericFormatsE4M3, MatchesBruteForceNearestOnDenseSample) {
  // Every bf16 bit pattern (all binades, both signs, inf, NaN), plus a dense fp32 sweep of
  // [0, ~512] with a stride that is not a multiple of any power of two.
  std::vector<float> inputs;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) inputs.push_back(bits_to_f32(hi << 16));
  for (uint32_t bits = 0; bits < 0x44000000u; bits += 9973u) {
    inputs.push_back(bits_to_f32(bits));
    inputs.push_back(bits_to_f32(bits | 0x80000000u));
  }
  int mismatches = 0;
  for (float x : inputs) {
    const uint8_t got = f32_to_e4m3(x);
    const uint8_t want = e4m3_reference_encode(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x bits 0x" << std::hex << f32_to_bits(x) << ": got 0x" << int(got)
                    << ", want 0x" << int(want);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- E2M1 -------------------------------------------------------------------------------------
TEST(NumericFormatsE2M1, EveryCodeDecodesAndRoundTrips) {
  for (int code = 0; code < 16; ++code) {
    const float expected = (code & 8) ? -kE2M1Magnitudes[code & 7] : kE2M1Magnitudes[code & 7];
    EXPECT_EQ(e2m1_to_f32(uint8_t(code)), expected) << "code " << code;
    EXPECT_EQ(kE2M1Table[code], expected) << "code " << code;
    EXPECT_EQ(std::signbit(e2m1_to_f32(uint8_t(code))), code >= 8) << "code " << code;
    EXPECT_EQ(int(f32_to_e2m1(e2m1_to_f32(uint8_t(code)))), code) << "code " << code;
  }
  // Only the low nibble selects the value.
  EXPECT_EQ(e2m1_to_f32(0xf7), 6.0f);
}

TEST(NumericFormatsE2M1, MidpointsTieToEvenCode) {
  struct Case { float x; float want; };
  const Case cases[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                        {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
  for (const Case& c : cases) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(c.x)), c.want) << "x = " << c.x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-c.x)), -c.want) << "x = " << -c.x;
    // Just past the midpoint (away from the chosen value) the other neighbour wins.
    const float past = c.want < c.x ? std::nextafter(c.x, kInf) : std::nextafter(c.x, 0.0f);
    EXPECT_NE(e2m1_to_f32(f32_to_e2m1(past)), c.want) << "x = " << past;
  }
  EXPECT_EQ(f32_to_e2m1(-0.25f), 8);  // rounds to zero from below: -0
}

TEST(NumericFormatsE2M1, SaturationZeroAndNaN) {
  EXPECT_EQ(f32_to_e2m1(6.0f), 7);
  EXPECT_EQ(f32_to_e2m1(7.0f), 7);
  EXPECT_EQ(f32_to_e2m1(1e9f), 7);
  EXPECT_EQ(f32_to_e2m1(kInf), 7);
  EXPECT_EQ(f32_to_e2m1(-kInf), 15);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
  EXPECT_EQ(f32_to_e2m1(0.0f), 0);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 8);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);
  EXPECT_EQ(f32_to_e2m1(kNaN), 0);
  EXPECT_EQ(f32_to_e2m1(-kNaN), 0);
}

TEST(NumericFormatsE2M1, MatchesBruteForceNearestOnDenseSample) {
  int mismatches = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    const float x = bits_to_f32(hi << 16);
    if (std::isnan(x)) continue;
    if (f32_to_e2m1(x) != e2m1_reference_encode(x) && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x;
  }
  for (int step = -7000; step <= 7000; ++step) {  // multiples of 1/1024 across [-6.8, 6.8]
    const float x = float(step) / 1024.0f;
    if (f32_to_e2m1(x) != e2m1_reference_encode(x) && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- E8M0 -------------------------------------------------------------------------------------
TEST(NumericFormatsE8M0, DecodesSelectedCodes) {
  for (int code : {0, 1, 126, 127, 128, 254}) {
    const float expected = std::ldexp(1.0f, code - 127);
    EXPECT_EQ(f32_to_bits(e8m0_to_f32(uint8_t(code))), f32_to_bits(expected)) << "code " << code;
  }
  EXPECT_EQ(f32_to_bits(e8m0_to_f32(0)), 0x00400000u);  // 2^-127: an fp32 subnormal, exact
  EXPECT_EQ(e8m0_to_f32(1), std::numeric_limits<float>::min());
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(254), pow2f(127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(NumericFormatsE8M0, EncodeRoundTripsAndRoundsUp) {
  for (int code = 0; code < 255; ++code)
    EXPECT_EQ(int(f32_to_e8m0(e8m0_to_f32(uint8_t(code)))), code) << "code " << code;
  EXPECT_EQ(f32_to_e8m0(3.0f), 129);                            // -> 4
  EXPECT_EQ(f32_to_e8m0(std::nextafter(1.0f, kInf)), 128);      // -> 2
  EXPECT_EQ(f32_to_e8m0(std::nextafter(1.0f, 0.0f)), 127);      // -> 1
  EXPECT_EQ(f32_to_e8m0(0.75f), 127);                           // -> 1
  EXPECT_EQ(f32_to_e8m0(1.5f * pow2f(-127)), 1);                // subnormal -> 2^-126
  EXPECT_EQ(f32_to_e8m0(std::nextafter(pow2f(-127), 0.0f)), 0);  // just below 2^-127 -> 2^-127
}

TEST(NumericFormatsE8M0, EncodeClampsToRepresentableRange) {
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-4.0f), 0);
  EXPECT_EQ(f32_to_e8m0(pow2f(-140)), 0);
  EXPECT_EQ(f32_to_e8m0(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(f32_to_e8m0(std::nextafter(pow2f(127), kInf)), 254);
  EXPECT_EQ(f32_to_e8m0(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(f32_to_e8m0(kInf), 254);
  EXPECT_EQ(f32_to_e8m0(kNaN), 255);
}

// ---- ceil_pow2 ----------------------------------------------------------------------------------
TEST(NumericFormatsCeilPow2, ExactPowersMapToThemselves) {
  for (int k = -149; k <= 127; ++k) {
    const float p = pow2f(k);
    EXPECT_EQ(f32_to_bits(ceil_pow2(p)), f32_to_bits(p)) << "2^" << k;
  }
}

TEST(NumericFormatsCeilPow2, NonPowersRoundUp) {
  for (int k = -126; k <= 126; ++k) {
    const float p = pow2f(k);
    EXPECT_EQ(ceil_pow2(std::nextafter(p, kInf)), 2.0f * p) << "just above 2^" << k;
    EXPECT_EQ(ceil_pow2(1.5f * p), 2.0f * p) << "1.5 * 2^" << k;
    EXPECT_EQ(ceil_pow2(std::nextafter(2.0f * p, 0.0f)), 2.0f * p) << "just below 2^" << k + 1;
  }
  EXPECT_EQ(ceil_pow2(3.0f), 4.0f);
  EXPECT_EQ(ceil_pow2(448.0f), 512.0f);
  EXPECT_EQ(ceil_pow2(0.1f), 0.125f);
}

TEST(NumericFormatsCeilPow2, SubnormalInputs) {
  const float tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  EXPECT_EQ(ceil_pow2(tiny), tiny);
  EXPECT_EQ(ceil_pow2(3.0f * tiny), 4.0f * tiny);
  EXPECT_EQ(ceil_pow2(5.0f * tiny), 8.0f * tiny);
  EXPECT_EQ(ceil_pow2(bits_to_f32(0x00400001u)), std::numeric_limits<float>::min());
  EXPECT_EQ(ceil_pow2(bits_to_f32(0x007fffffu)), std::numeric_limits<float>::min());
  EXPECT_EQ(f32_to_bits(ceil_pow2(bits_to_f32(0x00300000u))), 0x00400000u);  // -> 2^-127
}

TEST(NumericFormatsCeilPow2, LargeAndSpecialInputs) {
  EXPECT_EQ(ceil_pow2(1e30f), pow2f(100));  // 2^99 < 1e30 < 2^100
  EXPECT_EQ(ceil_pow2(pow2f(127)), pow2f(127));
  EXPECT_EQ(ceil_pow2(std::nextafter(pow2f(127), kInf)), kInf);
  EXPECT_EQ(ceil_pow2(std::numeric_limits<float>::max()), kInf);
  EXPECT_EQ(ceil_pow2(kInf), kInf);
  EXPECT_TRUE(std::isnan(ceil_pow2(kNaN)));
  EXPECT_EQ(f32_to_bits(ceil_pow2(0.0f)), 0u);
  EXPECT_EQ(f32_to_bits(ceil_pow2(-0.0f)), 0u);
  EXPECT_EQ(ceil_pow2(-3.0f), 4.0f);  // sign ignored
}

// ---- bf16 ----------------------------------------------------------------------------------------
TEST(NumericFormatsBF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F807FFFu)), 0x3F80);  // below the tie
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0xBF818000u)), 0xBF82);  // negative tie
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(round_bf16(bits_to_f32(0x3F818000u)), bits_to_f32(0x3F820000u));
  // Rounding up past the largest finite bf16 overflows to infinity, as IEEE RNE does.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(NumericFormatsBF16, NaNAndInfinityArePreserved) {
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  // Payload only in bits the truncation drops: must stay NaN rather than become infinity.
  for (uint32_t bits : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FFFFFFFu}) {
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(bits))))) << std::hex << bits;
    EXPECT_EQ(f32_to_bf16(bits_to_f32(bits)) & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
  }
}

// ---- FP4 packing -----------------------------------------------------------------------------------
TEST(NumericFormatsFP4, EvenElementIsLowNibble) {
  const uint8_t packed[2] = {0x21, 0xF3};
  EXPECT_EQ(fp4_get(packed, 0), 0x1);
  EXPECT_EQ(fp4_get(packed, 1), 0x2);
  EXPECT_EQ(fp4_get(packed, 2), 0x3);
  EXPECT_EQ(fp4_get(packed, 3), 0xF);

  uint8_t buffer[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) fp4_set(buffer, i, uint8_t(i + 8));
  EXPECT_EQ(buffer[0], 0x98);
  EXPECT_EQ(buffer[1], 0xBA);
  EXPECT_EQ(buffer[2], 0xDC);
  EXPECT_EQ(buffer[3], 0xFE);
  // Overwriting one nibble leaves its neighbour alone.
  fp4_set(buffer, 2, 0x0);
  fp4_set(buffer, 5, 0x1);
  EXPECT_EQ(buffer[1], 0xB0);
  EXPECT_EQ(buffer[2], 0x1C);
  for (int64_t i = 0; i < 8; ++i) {
    const uint8_t want = (i == 2) ? 0x0 : (i == 5) ? 0x1 : uint8_t(i + 8);
    EXPECT_EQ(fp4_get(buffer, i), want) << "element " << i;
  }
}

}  // namespace
}  // namespace ds41
