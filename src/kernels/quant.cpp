// Scalar quantizers (spec backbone.md §3.1, §3.2). They touch K elements per row against the
// N*K of the GEMM they feed, so they favour being literal over being fast - except the cache
// dequantizers, which run over the whole visible cache every decode step: those use the SIMD
// kernels (simd_attention.inc) when simd_level() is not Scalar, with these loops as their twins.
#include "kernels/quant.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "kernels/simd_kernels.h"

namespace ds41 {
namespace {

constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
// The reference multiplies by reciprocals rounded to fp32 (a constant, not a division) (§3.1 step
// 2).
constexpr float kInv448 = 1.0f / 448.0f;
constexpr float kInv6 = 1.0f / 6.0f;
constexpr float kActAmaxFloor = 1e-4f;
// 6 * 2^-126: the smallest amax for which s = ceil_pow2(amax / 6) is a normal fp32 (§3.2).
constexpr float kMxfp4AmaxFloor = 6.0f * 0x1p-126f;
// 6 * 2^-9: gives the smallest positive E4M3 scale 2^-9 (§3.2).
constexpr float kNvfp4AmaxFloor = 6.0f * 0x1p-9f;

void check_row_length(int64_t K, int64_t block, const char* what) {
  if (K < 0 || K % block != 0)
    throw Error(std::string(what) + ": row length " + std::to_string(K) +
                " is not a multiple of the block size " + std::to_string(block));
}

// max |x_i| over a block of bf16 values, in fp32. NaN propagates as in torch's amax.
float block_amax(const uint16_t* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(bf16_to_f32(x[i]));
    if (std::isnan(a)) return a;
    if (a > amax) amax = a;
  }
  return amax;
}

// clamp(v, -limit, limit) that keeps NaN (torch.clamp does; std::clamp's result is unspecified).
float clamp_symmetric(float v, float limit) {
  if (v > limit) return limit;
  if (v < -limit) return -limit;
  return v;
}

uint8_t pack_nibbles(uint8_t even, uint8_t odd) { return uint8_t((even & 0xf) | (odd << 4)); }

}  // namespace

// ---- act_quant (§3.1) ----------------------------------------------------------------------
float act_quant_scale(float amax) {
  const float a = amax < kActAmaxFloor ? kActAmaxFloor : amax;  // NaN stays NaN
  return ceil_pow2(a * kInv448);
}

void act_quant_row(const uint16_t* x, int64_t K, uint8_t* codes, float* scales) {
  check_row_length(K, kActQuantBlock, "act_quant");
  if (const simd::KernelTable* kt = simd::active_kernels()) {
    kt->act_quant_row(x, K, codes, scales);
    return;
  }
  act_quant_row_scalar(x, K, codes, scales);
}

void act_quant_row_scalar(const uint16_t* x, int64_t K, uint8_t* codes, float* scales) {
  check_row_length(K, kActQuantBlock, "act_quant");
  for (int64_t b = 0; b < K / kActQuantBlock; ++b) {
    const uint16_t* xb = x + b * kActQuantBlock;
    const float s = act_quant_scale(block_amax(xb, kActQuantBlock));
    scales[b] = s;
    // s is a power of two, so x / s is exact; the clamp matters because a plain E4M3 cast of an
    // out-of-range value is NaN in the reference (§3.4). The amax element lands at <= 448.
    for (int64_t i = 0; i < kActQuantBlock; ++i)
      codes[b * kActQuantBlock + i] =
          f32_to_e4m3(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE4M3Max));
  }
}

void fp8_dequant_row(const uint8_t* codes, const uint8_t* e8m0, int64_t K, uint16_t* out) {
  check_row_length(K, kActQuantBlock, "fp8_dequant");
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->fp8_dequant_row(codes, e8m0, K, out);
  for (int64_t k = 0; k < K; ++k) out[k] = f32_to_bf16(e4m3_to_f32(codes[k]) * e8m0_to_f32(e8m0[k / kActQuantBlock]));
}

void act_quant_qdq_row(uint16_t* x, int64_t K) {
  check_row_length(K, kActQuantBlock, "act_quant_qdq");
  for (int64_t b = 0; b < K / kActQuantBlock; ++b) {
    uint16_t* xb = x + b * kActQuantBlock;
    const float s = act_quant_scale(block_amax(xb, kActQuantBlock));
    for (int64_t i = 0; i < kActQuantBlock; ++i) {
      const uint8_t q = f32_to_e4m3(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE4M3Max));
      xb[i] = f32_to_bf16(e4m3_to_f32(q) * s);
    }
  }
}

// ---- MXFP4 (§3.2) --------------------------------------------------------------------------
float mxfp4_scale(float amax) {
  const float a = amax < kMxfp4AmaxFloor ? kMxfp4AmaxFloor : amax;
  return ceil_pow2(a * kInv6);
}

void mxfp4_quant_row(const uint16_t* x, int64_t K, uint8_t* packed, uint8_t* e8m0) {
  check_row_length(K, kMxfp4Block, "mxfp4_quant");
  for (int64_t b = 0; b < K / kMxfp4Block; ++b) {
    const uint16_t* xb = x + b * kMxfp4Block;
    const float s = mxfp4_scale(block_amax(xb, kMxfp4Block));
    // s is a power of two in [2^-126, 2^126] for finite bf16 input: E8M0 holds it exactly.
    e8m0[b] = f32_to_e8m0(s);
    for (int64_t i = 0; i < kMxfp4Block; i += 2) {
      const uint8_t even = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE2M1Max));
      const uint8_t odd = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i + 1]) / s, kE2M1Max));
      packed[(b * kMxfp4Block + i) / 2] = pack_nibbles(even, odd);
    }
  }
}

void mxfp4_dequant_row(const uint8_t* packed, const uint8_t* e8m0, int64_t K, uint16_t* out) {
  check_row_length(K, kMxfp4Block, "mxfp4_dequant");
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->mxfp4_dequant_row(packed, e8m0, K, out);
  for (int64_t i = 0; i < K; ++i)
    out[i] = f32_to_bf16(e2m1_to_f32(fp4_get(packed, i)) * e8m0_to_f32(e8m0[i / kMxfp4Block]));
}

void mxfp4_qdq_row(uint16_t* x, int64_t K) {
  check_row_length(K, kMxfp4Block, "mxfp4_qdq");
  for (int64_t b = 0; b < K / kMxfp4Block; ++b) {
    uint16_t* xb = x + b * kMxfp4Block;
    const float s = mxfp4_scale(block_amax(xb, kMxfp4Block));
    for (int64_t i = 0; i < kMxfp4Block; ++i) {
      const uint8_t q = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE2M1Max));
      xb[i] = f32_to_bf16(e2m1_to_f32(q) * s);
    }
  }
}

// ---- NVFP4-style (§3.2) --------------------------------------------------------------------
uint8_t nvfp4_scale_code(float amax) {
  const float a = amax < kNvfp4AmaxFloor ? kNvfp4AmaxFloor : amax;
  // A true division here (not a reciprocal multiply), as in the ports (§3.2 [port]).
  return f32_to_e4m3(a / 6.0f);  // f32_to_e4m3 saturates at 448
}

void nvfp4_quant_row(const uint16_t* x, int64_t K, uint8_t* packed, uint8_t* e4m3_scales) {
  check_row_length(K, kNvfp4Block, "nvfp4_quant");
  for (int64_t b = 0; b < K / kNvfp4Block; ++b) {
    const uint16_t* xb = x + b * kNvfp4Block;
    const uint8_t scale_code = nvfp4_scale_code(block_amax(xb, kNvfp4Block));
    const float s = e4m3_to_f32(scale_code);
    e4m3_scales[b] = scale_code;
    // s is not a power of two: x / s is rounded in fp32 before the E2M1 rounding, like the port.
    for (int64_t i = 0; i < kNvfp4Block; i += 2) {
      const uint8_t even = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE2M1Max));
      const uint8_t odd = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i + 1]) / s, kE2M1Max));
      packed[(b * kNvfp4Block + i) / 2] = pack_nibbles(even, odd);
    }
  }
}

void nvfp4_dequant_row(const uint8_t* packed, const uint8_t* e4m3_scales, int64_t K,
                       uint16_t* out) {
  check_row_length(K, kNvfp4Block, "nvfp4_dequant");
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->nvfp4_dequant_row(packed, e4m3_scales, K, out);
  // q has 2 significant bits and s 4, so q * s is exact in fp32 and in bf16; the rounding call
  // only mirrors the reference's cast.
  for (int64_t i = 0; i < K; ++i)
    out[i] =
        f32_to_bf16(e2m1_to_f32(fp4_get(packed, i)) * e4m3_to_f32(e4m3_scales[i / kNvfp4Block]));
}

void nvfp4_qdq_row(uint16_t* x, int64_t K) {
  check_row_length(K, kNvfp4Block, "nvfp4_qdq");
  for (int64_t b = 0; b < K / kNvfp4Block; ++b) {
    uint16_t* xb = x + b * kNvfp4Block;
    const float s = e4m3_to_f32(nvfp4_scale_code(block_amax(xb, kNvfp4Block)));
    for (int64_t i = 0; i < kNvfp4Block; ++i) {
      const uint8_t q = f32_to_e2m1(clamp_symmetric(bf16_to_f32(xb[i]) / s, kE2M1Max));
      xb[i] = f32_to_bf16(e2m1_to_f32(q) * s);
    }
  }
}

}  // namespace ds41
