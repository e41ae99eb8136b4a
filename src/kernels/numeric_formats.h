// Scalar conversions between fp32 and the checkpoint's narrow formats (spec backbone.md §2.1, §3).
// These are the reference definitions every SIMD/CUDA path is tested against.
//  - bf16: upper 16 bits of an IEEE fp32; fp32 -> bf16 rounds to nearest, ties to even.
//  - F8_E4M3 (float8_e4m3fn): bias 7, no infinities, 0x7F/0xFF are NaN, max finite 448.
//  - F8_E8M0: byte e is the power of two 2^(e-127); 0xFF is NaN.
//  - E2M1 (FP4): sign bit 3, magnitude index bits 0-2 into {0,0.5,1,1.5,2,3,4,6}; packed two per
//    byte with the even element in the low nibble.
#pragma once

#include <cstdint>
#include <cstring>

namespace ds41 {

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// ---- bf16 -------------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
// Round to nearest even; NaN stays NaN (quietened), infinities stay infinite.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// fp32 -> bf16 -> fp32: the value a bf16 tensor would hold.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- F8_E4M3 (e4m3fn) ---------------------------------------------------------------------
float e4m3_to_f32(uint8_t code);
// Saturating RNE encode: |x| > 448 clamps to +-448 (the reference clamps before its cast),
// NaN -> 0x7F. Subnormals (exponent field 0) are m/8 * 2^-6.
uint8_t f32_to_e4m3(float x);
// Table of all 256 decoded values (NaN codes hold NaN), for hot loops.
extern const float kE4M3Table[256];
// A subnormal code: exponent field 0, mantissa not (magnitude 1..7; zero is not one).
inline bool is_subnormal_e4m3(uint8_t code) { return uint8_t((code & 0x7f) - 1) < 7; }
inline bool is_nan_e4m3(uint8_t code) { return (code & 0x7f) == 0x7f; }

// ---- F8_E8M0 ------------------------------------------------------------------------------
// 2^(code-127); 0xFF -> NaN. Inline: cache dequantization calls it once per 16-32 values.
inline float e8m0_to_f32(uint8_t code) {
  if (code == 0xff) return bits_to_f32(0x7fc00000u);  // quiet NaN
  // 2^-127 is below fp32's normal range: its bit pattern is the subnormal with mantissa 2^22.
  return bits_to_f32(code == 0 ? 1u << 22 : uint32_t(code) << 23);
}
// Encode an exact power of two 2^k (k in [-127, 127]); other values are rounded up to the next
// power of two, matching how the reference produces UE8M0 scales. Results are clamped to the
// representable range [2^-127, 2^127]: zero, negatives and anything <= 2^-127 give code 0,
// anything above 2^127 (including +inf) gives 254; NaN gives 0xFF.
uint8_t f32_to_e8m0(float pow2);

// ---- E2M1 (FP4) ---------------------------------------------------------------------------
extern const float kE2M1Table[16];
inline float e2m1_to_f32(uint8_t nibble) { return kE2M1Table[nibble & 0xf]; }
// RNE with ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4),
// saturating to +-6; -0 encodes as 8 only when x is -0 or rounds to zero from below.
// NaN has no code and encodes as +0 (code 0).
uint8_t f32_to_e2m1(float x);
// Packed pair access: element 2j is the low nibble of byte j, element 2j+1 the high nibble.
inline uint8_t fp4_get(const uint8_t* packed, int64_t i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf);
}
inline void fp4_set(uint8_t* packed, int64_t i, uint8_t nibble) {
  uint8_t& b = packed[i >> 1];
  b = (i & 1) ? uint8_t((b & 0x0f) | (nibble << 4)) : uint8_t((b & 0xf0) | (nibble & 0xf));
}

// ---- power-of-two scale rounding -----------------------------------------------------------
// 2^ceil(log2 v) computed exactly from the fp32 bit pattern (spec §3.1 step 3): E = exponent
// field - 127, plus one if any mantissa bit is set. Intended for positive, finite, normal v;
// elsewhere: the sign is ignored (result is 2^ceil(log2 |v|)); subnormals give the exact next
// power of two (which may itself be subnormal, e.g. 3*2^-149 -> 2^-147; the reference's bit
// formula would give 2^-126 there); +-0 -> +0; results above 2^127 and +-inf -> +inf; NaN -> NaN.
float ceil_pow2(float v);

}  // namespace ds41
