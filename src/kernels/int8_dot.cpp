#include "kernels/int8_dot.h"

#include <string>

#include "base/error.h"
#include "kernels/simd_kernels.h"

namespace ds41 {

namespace {
void check_shape(int64_t x_count, int64_t n_rows, int64_t K) {
  if (x_count < 0 || n_rows < 0 || K < 0 || K % 64 != 0 || K > kInt8DotMaxK)
    throw Error("int8_row_dots: K must be a multiple of 64 up to " + std::to_string(kInt8DotMaxK) + " (got " +
                std::to_string(K) + ", " + std::to_string(n_rows) + " rows)");
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

}  // namespace ds41
