#include "kernels/int8_dot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "kernels/simd_kernels.h"
#include "kernels/softmax_exp.h"

namespace ds41 {

namespace {
void check_shape(int64_t x_count, int64_t n_rows, int64_t K) {
  if (x_count < 0 || n_rows < 0 || K < 0 || K % 64 != 0 || K > kInt8DotMaxK)
    throw Error("int8_row_dots: K must be a multiple of 64 up to " + std::to_string(kInt8DotMaxK) + " (got " +
                std::to_string(K) + ", " + std::to_string(n_rows) + " rows)");
}
void check_quantize_length(int64_t K) {
  if (K < 0 || K > kInt8DotMaxK)
    throw Error("int8_quantize_bf16_row: row length " + std::to_string(K) + " is outside [0, " +
                std::to_string(kInt8DotMaxK) + "]");
}
}  // namespace

void int8_row_dots(const int8_t* x, int64_t x_count, const int8_t* rows, const int32_t* row_sums, int64_t n_rows,
                   int64_t K, int32_t* out) {
  check_shape(x_count, n_rows, K);
  if (const simd::KernelTable* kt = simd::active_kernels())
    return kt->int8_row_dots(x, x_count, rows, row_sums, n_rows, K, out);
  int8_row_dots_reference(x, x_count, rows, n_rows, K, out);
}

void int8_row_dots_reference(const int8_t* x, int64_t x_count, const int8_t* rows, int64_t n_rows, int64_t K,
                             int32_t* out) {
  check_shape(x_count, n_rows, K);
  for (int64_t i = 0; i < x_count; ++i)
    for (int64_t r = 0; r < n_rows; ++r) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int64_t(x[i * K + k]) * rows[r * K + k];
      out[i * n_rows + r] = int32_t(acc);
    }
}

bool int8_quantize_bf16_row(const uint16_t* w, int64_t K, int8_t* q, Int8RowQuant* out) {
  check_quantize_length(K);
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->int8_quantize_bf16_row(w, K, q, out);
  return int8_quantize_bf16_row_reference(w, K, q, out);
}

bool int8_quantize_bf16_row_reference(const uint16_t* w, int64_t K, int8_t* q, Int8RowQuant* out) {
  check_quantize_length(K);
  float m = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    const float a = std::fabs(bf16_to_f32(w[k]));
    if (!(a <= std::numeric_limits<float>::max())) return false;  // inf or NaN
    m = std::max(m, a);
  }
  Int8RowQuant row;
  row.max_abs = m;
  row.scale = m / 127.0f;
  double lanes[8] = {};
  int8_quantize_bf16_elements(w, 0, K, m > 0 ? 127.0 / double(m) : 0.0, q, &row, lanes);  // finite for subnormal m
  row.sum_squares = combine_lanes(lanes);
  *out = row;
  return true;
}

void int8_quantize_bf16_elements(const uint16_t* w, int64_t k0, int64_t K, double inv, int8_t* q, Int8RowQuant* row,
                                 double lanes[8]) {
  const double s = double(row->scale);
  for (int64_t k = k0; k < K; ++k) {
    const double wk = double(bf16_to_f32(w[k]));
    const int code = int8_code(wk * inv);  // |wk * inv| <= 127 and a rounding
    q[k] = int8_t(code);
    // wk and s * code (<= 32 significant bits) are doubles of similar size: exact differences
    // save for rare exceptions, which the screen's margin covers.
    row->max_error = std::max(row->max_error, std::fabs(wk - s * code));
    lanes[k % 8] += wk * wk;
    row->sum += code;
    row->abs_sum += code < 0 ? -code : code;
  }
}

}  // namespace ds41
