// RMSNorm over one row (spec backbone.md §4, §12.16; vision: engram_dspark_vision.md, ViT blocks).
//
// Reference (model.py RMSNorm.forward), every step an fp32 tensor op rounded on its own:
//   xf  = fp32(x)
//   var = sum(xf * xf) / n            (x.square().mean(-1): squares rounded, then summed, then / n)
//   r   = 1 / sqrt(var + eps)         (torch.rsqrt = a correctly rounded sqrt, then a division)
//   y   = bf16( fp32(w) * (xf * r) )  (x * rsqrt first, then weight * x; one bf16 rounding)
// Summation: the (exact) squares are summed in fp32 in PyTorch's reduction order (torch_sum.h),
// bit for bit what the reference computes; neither a running fp32 sum nor the exact sum is.
#pragma once

#include <cstdint>

namespace ds41 {

// LLM-side norms use this eps (spec §4: norm_eps = 1e-20, NOT 1e-6).
inline constexpr float kNormEps = 1e-20f;
// Vision-tower RMSNorm eps (engram_dspark_vision.md: eps 1e-6, fp32 weights).
inline constexpr float kVisionNormEps = 1e-6f;

// r = 1 / sqrt(mean(fp32(x)^2) + eps) over n bf16 values, fp32 throughout (order above).
// eps is the fp32 value the reference adds (torch casts the Python float to the tensor's fp32).
float rms_rsqrt_bf16(const uint16_t* x, int64_t n, float eps);

// One row, bf16 weights (attn_norm, ffn_norm, q_norm, kv_norm, compressor/indexer norms, final
// norm). y may alias x (each element is read before it is written).
void rmsnorm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* y);

// One row, fp32 weights (vision RMSNorm: eps kVisionNormEps). Same arithmetic as rmsnorm_row.
void rmsnorm_row_f32w(const uint16_t* x, const float* w, int64_t n, float eps, uint16_t* y);

// rows x n, row-major, contiguous; y may alias x.
void rmsnorm_rows(const uint16_t* x, const uint16_t* w, int64_t rows, int64_t n, float eps,
                  uint16_t* y);

}  // namespace ds41
