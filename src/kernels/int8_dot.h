// Exact dot products of one int8 vector with many int8 rows: the screening pass of the LM head
// (model/head_screen.h), which reads an int8 copy of the head instead of its bf16 values.
//
//   out[i * n_rows + r] = sum_k x[i * K + k] * rows[r * K + k]      (exact int32)
//
// for x_count vectors x (each row is read once for a group of up to four of them). x and every
// row hold values in [-127, 127] (never -128: the SIMD kernels rely on it), K is a multiple of 64
// (rows are padded with zeros) and at most kInt8DotMaxK, so |out| < 2^31. row_sums[r] = sum_k
// rows[r * K + k] (the AVX-512 kernel works on x + 128 as unsigned bytes and takes 128 * row_sums
// back). Integer sums are exact in any order: every ISA level returns the scalar twin's values.
#pragma once

#include <cstdint>

namespace ds41 {

inline constexpr int64_t kInt8DotMaxK = int64_t{1} << 17;  // 2^17 * 127 * 127 < 2^31

void int8_row_dots(const int8_t* x, int64_t x_count, const int8_t* rows, const int32_t* row_sums, int64_t n_rows,
                   int64_t K, int32_t* out);
// The scalar twin (plain loop, int64 sums).
void int8_row_dots_reference(const int8_t* x, int64_t x_count, const int8_t* rows, int64_t n_rows, int64_t K,
                             int32_t* out);

}  // namespace ds41
