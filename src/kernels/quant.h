// Activation / cache quantizers of the reference (spec backbone.md §3.1, §3.2), one row at a time.
// Inputs are bf16 bit patterns (uint16_t); all arithmetic is fp32 on the widened values.
//
//  * act_quant (FP8 E4M3 codes, one power-of-two scale per 32 elements): the activation side of
//    every FP8/FP4 GEMM and the window-KV QDQ (§3.1).
//  * MXFP4 (E2M1 codes, E8M0 scale per 32, never clips): indexer Q and K (§3.2, pitfall 2).
//  * NVFP4-style (E2M1 codes, E4M3 scale per 16, RNE scale so it may clip): compressed main KV
//    (§3.2, pitfall 2). No second-level per-tensor scale.
//
// For every format, <fmt>_quant_row followed by <fmt>_dequant_row gives exactly the bf16 bytes of
// <fmt>_qdq_row (tested), which is what lets the engine keep packed caches while the reference
// keeps bf16 QDQ tensors (§3.4). Row lengths must be multiples of the block size; anything else
// throws ds41::Error. Inputs are expected to be finite: with inf the reference's scale itself is
// inf, which the byte formats cannot store.
#pragma once

#include <cstdint>

namespace ds41 {

constexpr int64_t kActQuantBlock = 32;  // act_block_size of the reference
constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kNvfp4Block = 16;

// ---- act_quant: E4M3 codes, UE8M0 scale per 32 (§3.1) --------------------------------------
// s = ceil_pow2(max(amax, 1e-4) * fp32(1/448)). A power-of-two product maps to itself.
float act_quant_scale(float amax);
// codes[K] = e4m3_rne(clamp(x / s, -448, 448)); scales[K/32] = s (an exact power of two). The
// active SIMD level's kernel where there is one (the same bytes), else act_quant_row_scalar.
void act_quant_row(const uint16_t* x, int64_t K, uint8_t* codes, float* scales);
// The scalar twin (and the SIMD kernels' path for blocks holding inf or NaN).
void act_quant_row_scalar(const uint16_t* x, int64_t K, uint8_t* codes, float* scales);
// x <- bf16(e4m3(code) * s) in place.
void act_quant_qdq_row(uint16_t* x, int64_t K);
// out[k] = bf16(e4m3(codes[k]) * 2^(e8m0[k/32] - 127)): the FP8 window-KV ring back to the bf16
// values act_quant_qdq_row gives (§5.3).
void fp8_dequant_row(const uint8_t* codes, const uint8_t* e8m0, int64_t K, uint16_t* out);

// ---- MXFP4: E2M1 codes, E8M0 scale per 32 (§3.2, indexer Q/K) --------------------------------
// s = ceil_pow2(max(amax, 6 * 2^-126) * fp32(1/6)); s >= amax / 6 for bf16 inputs, so no clipping.
float mxfp4_scale(float amax);
// packed[K/2]: element 2j in the low nibble of byte j (§2.1); e8m0[K/32] holds s exactly.
void mxfp4_quant_row(const uint16_t* x, int64_t K, uint8_t* packed, uint8_t* e8m0);
void mxfp4_dequant_row(const uint8_t* packed, const uint8_t* e8m0, int64_t K, uint16_t* out);
void mxfp4_qdq_row(uint16_t* x, int64_t K);

// ---- NVFP4-style: E2M1 codes, E4M3 scale per 16 (§3.2, compressed main KV) -------------------
// Scale code of one block: e4m3_rne(max(amax, 6 * 2^-9) / 6) with a true fp32 division,
// saturating at 448. Because the scale is rounded to nearest, x / s can exceed 6 and is clipped.
uint8_t nvfp4_scale_code(float amax);
// packed[K/2] as for MXFP4; e4m3_scales[K/16] are E4M3 codes.
void nvfp4_quant_row(const uint16_t* x, int64_t K, uint8_t* packed, uint8_t* e4m3_scales);
void nvfp4_dequant_row(const uint8_t* packed, const uint8_t* e4m3_scales, int64_t K, uint16_t* out);
void nvfp4_qdq_row(uint16_t* x, int64_t K);

}  // namespace ds41
