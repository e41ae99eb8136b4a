// Reference scalar conversions for the checkpoint's narrow formats. Everything here works on the
// fp32 bit pattern with integer arithmetic, so results never depend on the FPU rounding mode,
// flush-to-zero settings or the compiler's choice of x87/SSE, and the decode tables are built at
// compile time (no static-initialisation order hazard for code that uses them during startup).
#include "kernels/numeric_formats.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ds41 {
namespace {

constexpr uint32_t kF32SignBit = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32MantissaMask = 0x007fffffu;
constexpr uint32_t kF32InfBits = 0x7f800000u;
constexpr int kF32Bias = 127;
constexpr int kF32MantissaBits = 23;

// ---- E4M3 layout --------------------------------------------------------------------------
constexpr int kE4M3Bias = 7;
constexpr int kE4M3MantissaBits = 3;
constexpr uint8_t kE4M3NaN = 0x7f;
constexpr uint8_t kE4M3Sign = 0x80;
constexpr float kE4M3MaxFinite = 448.0f;
// Smallest E4M3 normal, 2^-6: below it the grid is uniform with spacing 2^-9.
constexpr uint32_t kE4M3MinNormalF32Bits = uint32_t(1 - kE4M3Bias + kF32Bias) << kF32MantissaBits;

constexpr float e4m3_decode(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80) << 24;
  const uint32_t exp_field = (code >> kE4M3MantissaBits) & 0xf;
  const uint32_t mantissa = code & 0x7;
  if (exp_field == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp_field == 0) {
    // Subnormal m/8 * 2^-6 = m * 2^-9: exact in fp32, and the product keeps the sign of zero.
    const float magnitude = float(mantissa) * (1.0f / 512.0f);
    return sign ? -magnitude : magnitude;
  }
  // Normal: rebias the exponent and left-align the 3 mantissa bits in fp32's 23.
  const uint32_t f32_exp = exp_field - kE4M3Bias + kF32Bias;
  return std::bit_cast<float>(sign | (f32_exp << kF32MantissaBits) |
                              (mantissa << (kF32MantissaBits - kE4M3MantissaBits)));
}

// ceil(log2 |x|) for a finite, non-zero fp32 given its magnitude bits, exact for subnormals too.
constexpr int ceil_log2_of_magnitude_bits(uint32_t abs_bits) {
  const uint32_t exp_field = abs_bits >> kF32MantissaBits;
  const uint32_t mantissa = abs_bits & kF32MantissaMask;
  if (exp_field == 0) {
    // Subnormal m * 2^-149; ceil(log2 m) == bit_width(m - 1) for m >= 1.
    return int(std::bit_width(mantissa - 1)) - (kF32Bias - 1 + kF32MantissaBits);
  }
  return int(exp_field) - kF32Bias + (mantissa != 0 ? 1 : 0);
}

}  // namespace

// The table is the compile-time image of e4m3_decode; the macros only spell out the 256
// initialisers because a C array (the header's type) cannot be initialised from a function.
#define DS41_E4M3_4(b) e4m3_decode(b), e4m3_decode(b + 1), e4m3_decode(b + 2), e4m3_decode(b + 3)
#define DS41_E4M3_16(b) DS41_E4M3_4(b), DS41_E4M3_4(b + 4), DS41_E4M3_4(b + 8), DS41_E4M3_4(b + 12)
#define DS41_E4M3_64(b) \
  DS41_E4M3_16(b), DS41_E4M3_16(b + 16), DS41_E4M3_16(b + 32), DS41_E4M3_16(b + 48)
constexpr float kE4M3Table[256] = {DS41_E4M3_64(0), DS41_E4M3_64(64), DS41_E4M3_64(128),
                                   DS41_E4M3_64(192)};
#undef DS41_E4M3_64
#undef DS41_E4M3_16
#undef DS41_E4M3_4

static_assert(kE4M3Table[0x7e] == 448.0f && kE4M3Table[0xfe] == -448.0f);
static_assert(kE4M3Table[0x01] == 1.0f / 512.0f && kE4M3Table[0x08] == 1.0f / 64.0f);
static_assert(kE4M3Table[0x38] == 1.0f && kE4M3Table[0x80] == 0.0f);

constexpr float kE2M1Table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ---- F8_E4M3 ------------------------------------------------------------------------------
float e4m3_to_f32(uint8_t code) { return kE4M3Table[code]; }

uint8_t f32_to_e4m3(float x) {
  const uint32_t bits = f32_to_bits(x);
  if ((bits & kF32AbsMask) > kF32InfBits) return kE4M3NaN;
  const uint8_t sign = (bits & kF32SignBit) ? kE4M3Sign : uint8_t{0};
  // Saturate first, as the reference does before its cast; this also maps +-inf to +-448 and
  // guarantees the rounding below can never carry into the NaN code.
  uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > f32_to_bits(kE4M3MaxFinite)) abs_bits = f32_to_bits(kE4M3MaxFinite);

  if (abs_bits >= kE4M3MinNormalF32Bits) {
    // Normal range: drop the low 20 mantissa bits with round-to-nearest-even. A carry out of the
    // mantissa bumps the exponent, which is exactly the next binade's first value.
    constexpr int kDropped = kF32MantissaBits - kE4M3MantissaBits;
    const uint32_t lsb = (abs_bits >> kDropped) & 1u;
    const uint32_t rounded = (abs_bits + ((1u << (kDropped - 1)) - 1u) + lsb) >> kDropped;
    // rounded = fp32 exponent field : 3 mantissa bits; rebias the exponent from 127 to 7.
    const uint32_t code = rounded - (uint32_t(kF32Bias - kE4M3Bias) << kE4M3MantissaBits);
    return uint8_t(sign | code);
  }

  // Subnormal range: the grid is the integers q in units of 2^-9 (code = q, and q == 8 is the
  // code of 2^-6, so rounding up into the normal range needs no special case).
  if (abs_bits == 0) return sign;
  const uint32_t exp_field = abs_bits >> kF32MantissaBits;
  const uint32_t significand =
      exp_field ? ((abs_bits & kF32MantissaMask) | (1u << kF32MantissaBits)) : abs_bits;
  // value = significand * 2^(e - 150) with e = max(exp_field, 1); in 2^-9 units shift right by
  // 141 - e. Here e <= 120, so the shift is at least 21.
  const int shift = 141 - int(exp_field ? exp_field : 1);
  // significand < 2^24, so with a shift of 25 or more it is below half a unit: rounds to zero.
  if (shift >= 25) return sign;
  uint32_t q = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (q & 1u))) ++q;
  return uint8_t(sign | q);
}

// ---- F8_E8M0 ------------------------------------------------------------------------------

uint8_t f32_to_e8m0(float pow2) {
  const uint32_t bits = f32_to_bits(pow2);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return 0xff;
  // A scale is a positive magnitude; zero and negatives have no power of two at or above them
  // inside the format other than its floor, so they clamp to the smallest scale, 2^-127.
  if (abs_bits == 0 || (bits & kF32SignBit)) return 0;
  if (abs_bits == kF32InfBits) return 254;  // clamp to the largest finite scale, 2^127
  const int exponent = ceil_log2_of_magnitude_bits(abs_bits);
  if (exponent < -127) return 0;
  if (exponent > 127) return 254;
  return uint8_t(exponent + 127);
}

// ---- E2M1 (FP4) ---------------------------------------------------------------------------
uint8_t f32_to_e2m1(float x) {
  // NaN has no FP4 code; zero is the value least able to poison a dot product.
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float magnitude = std::fabs(x);
  // Walk the midpoints of the 8 magnitudes (all exact in fp32). A value exactly on a midpoint
  // goes to the even index, which for this table is the value with a zero mantissa bit.
  for (uint8_t index = 0; index < 7; ++index) {
    const float midpoint = 0.5f * (kE2M1Table[index] + kE2M1Table[index + 1]);
    if (magnitude < midpoint) return uint8_t(sign | index);
    if (magnitude == midpoint) return uint8_t(sign | (index % 2 == 0 ? index : index + 1));
  }
  return uint8_t(sign | 7);  // saturate (includes +-inf) to +-6
}

// ---- power-of-two scale rounding -----------------------------------------------------------
float ceil_pow2(float v) {
  const uint32_t abs_bits = f32_to_bits(v) & kF32AbsMask;
  if (abs_bits >= kF32InfBits) return bits_to_f32(abs_bits);  // inf stays inf, NaN stays NaN
  if (abs_bits == 0) return 0.0f;  // same as the reference bit formula: 2^(-127) built as 0
  const int exponent = ceil_log2_of_magnitude_bits(abs_bits);
  if (exponent > 127) return std::numeric_limits<float>::infinity();
  if (exponent >= -126) return bits_to_f32(uint32_t(exponent + kF32Bias) << kF32MantissaBits);
  // Powers of two below 2^-126 are single-bit subnormals.
  return bits_to_f32(1u << (exponent + 149));
}

}  // namespace ds41
