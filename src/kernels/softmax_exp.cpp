#include "kernels/softmax_exp.h"

#include <cmath>

#include "kernels/simd_kernels.h"
#include "kernels/vector_exp.h"

namespace ds41 {

double combine_lanes(const double* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

double scaled_exp_sum(const float* x, int64_t n, float scale, float shift, float* out) {
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->scaled_exp_sum(x, n, scale, shift, out);
  return scaled_exp_sum_reference(x, n, scale, shift, out);
}

double scaled_exp_sum_reference(const float* x, int64_t n, float scale, float shift, float* out) {
  double lanes[8] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float z = x[i] * scale;
    out[i] = torch_vec_expf(z - shift);
    lanes[i % 8] += double(out[i]);
  }
  return combine_lanes(lanes);
}

double lane_sum(const float* x, int64_t n) {
  double lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += double(x[i + j]);
  for (; i < n; ++i) lanes[i % 8] += double(x[i]);
  return combine_lanes(lanes);
}

float scaled_max(const float* x, int64_t n, float scale) {
  // Eight independent lanes instead of one chain of dependent compares; a comparison with NaN is
  // false, so a NaN product never replaces a lane's value.
  float lanes[8];
  for (float& v : lanes) v = -INFINITY;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float z = x[i + j] * scale;
      lanes[j] = z > lanes[j] ? z : lanes[j];
    }
  for (; i < n; ++i) {
    const float z = x[i] * scale;
    lanes[i % 8] = z > lanes[i % 8] ? z : lanes[i % 8];
  }
  float top = -INFINITY;
  for (const float v : lanes) top = v > top ? v : top;
  return top;
}

}  // namespace ds41
