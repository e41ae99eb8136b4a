// The int8 arithmetic of the LM head screen (model/head_screen.h), which reads an int8 copy of the
// head instead of its bf16 values: exact dot products of int8 vectors with many int8 rows, and the
// quantization of a bf16 row into such a row.
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

// One bf16 row w [K] as int8 codes q [K] with the scale s = max|w| / 127 (fp32):
// q_k = round(w_k * (127 / max|w|)) (the factor and the product in double, ties to even, clamped to
// [-127, 127]; all zeros for a zero row), plus what the screen's error bounds need of it. Every
// field is the scalar twin's bit for bit at every ISA level: the maxima and the integer sums are
// exact in any order, the errors are exact differences, and the squares (exact in double) are
// summed in 8 lanes - lane j adds the w_k^2 with k mod 8 = j in order of k - combined as
// combine_lanes (softmax_exp.h) does. K is at most kInt8DotMaxK (the sums stay within int32).
// Returns false, the outputs unspecified, if a weight is inf or NaN.
struct Int8RowQuant {
  float max_abs = 0;        // max_k |w_k|
  float scale = 0;          // max_abs / 127
  double max_error = 0;     // max_k |w_k - scale * q_k|
  double sum_squares = 0;   // sum_k w_k^2
  int32_t sum = 0;          // sum_k q_k
  int32_t abs_sum = 0;      // sum_k |q_k|
};
bool int8_quantize_bf16_row(const uint16_t* w, int64_t K, int8_t* q, Int8RowQuant* out);
// The scalar twin.
bool int8_quantize_bf16_row_reference(const uint16_t* w, int64_t K, int8_t* q, Int8RowQuant* out);
// Weights [k0, K) of a row as the twin quantizes them (inv = 127 / max|w| in double, or 0), each
// code into q, continuing the running max_error, sum and abs_sum in *row and the squares' eight
// lanes: the twin's whole loop, and the SIMD kernels' ragged tail.
void int8_quantize_bf16_elements(const uint16_t* w, int64_t k0, int64_t K, double inv, int8_t* q, Int8RowQuant* row,
                                 double lanes[8]);

// v rounded to the nearest integer (ties to even, as in the default rounding mode) and clamped to
// the int8 codes [-127, 127], for |v| < 2^51: adding and taking off 1.5 * 2^52 leaves no fraction
// bits, without a libm call where the baseline has no rounding instruction.
inline int int8_code(double v) {
  const double r = (v + 0x1.8p52) - 0x1.8p52;
  return int(r < -127.0 ? -127.0 : r > 127.0 ? 127.0 : r);
}

}  // namespace ds41
