// Scalar reference RMSNorm; see rmsnorm.h for the exact fp32 operation order it reproduces.
#include "kernels/rmsnorm.h"

#include <cmath>

#include "kernels/numeric_formats.h"
#include "kernels/simd_kernels.h"
#include "kernels/torch_sum.h"

// Every fp32 operation below must round on its own, as torch's separate tensor ops do: forbid
// fusing a*b+c into an FMA (which -march=native would otherwise allow GCC to do).
#include "base/fp_contract_off.h"

namespace ds41 {

float rms_rsqrt_bf16(const uint16_t* x, int64_t n, float eps) {
  // x.square().mean(-1): the fp32 sum in PyTorch's reduction order (torch_sum.h), then / n.
  const float sum = torch_sum_squares_bf16(x, n);
  const float mean = sum / static_cast<float>(n);  // torch's CPU mean is sum().div_(n)
  const float shifted = mean + eps;
  return 1.0f / std::sqrt(shifted);  // torch.rsqrt on CPU: 1 / sqrt, two roundings
}

void rmsnorm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* y) {
  const float r = rms_rsqrt_bf16(x, n, eps);
  int64_t i0 = 0;
  if (const simd::KernelTable* kt = simd::active_kernels()) i0 = kt->rmsnorm_apply(x, w, n, r, y);  // the same steps
  for (int64_t i = i0; i < n; ++i) {
    const float normed = bf16_to_f32(x[i]) * r;      // x * rsqrt(var + eps)
    y[i] = f32_to_bf16(bf16_to_f32(w[i]) * normed);  // weight * x, then .to(bf16)
  }
}

void rmsnorm_row_f32w(const uint16_t* x, const float* w, int64_t n, float eps, uint16_t* y) {
  const float r = rms_rsqrt_bf16(x, n, eps);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = bf16_to_f32(x[i]) * r;
    y[i] = f32_to_bf16(w[i] * normed);
  }
}

void rmsnorm_rows(const uint16_t* x, const uint16_t* w, int64_t rows, int64_t n, float eps,
                  uint16_t* y) {
  for (int64_t r = 0; r < rows; ++r) rmsnorm_row(x + r * n, w, n, eps, y + r * n);
}

}  // namespace ds41
