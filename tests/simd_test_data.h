// Random operands, shapes and comparison helpers shared by the SIMD-vs-twin tests of the linear
// layers (simd_gemm_test.cpp: quantized; simd_dense_test.cpp: dense and packed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric_formats.h"
#include "kernels/simd_level.h"

namespace ds41::simd_test {

inline std::vector<SimdLevel> with_scalar(std::vector<SimdLevel> levels) {
  levels.insert(levels.begin(), SimdLevel::Scalar);
  return levels;
}

// bf16 values whose 32-blocks have random magnitudes 2^[-20, 20] (act scales differ per block,
// E4M3 subnormals appear), with some zero and some negative-zero blocks.
inline std::vector<uint16_t> random_bf16(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20), kind(0, 15);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  float scale = 1.0f;
  int block_kind = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) {
      scale = std::ldexp(1.0f, exponent(rng));
      block_kind = kind(rng);
    }
    const float v = block_kind == 0 ? 0.0f : block_kind == 1 ? -0.0f : normal(rng) * scale;
    out[size_t(i)] = f32_to_bf16(v);
  }
  return out;
}

inline std::vector<float> random_f32(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = normal(rng) * std::ldexp(1.0f, exponent(rng) / 4);
  return out;
}

inline std::vector<uint8_t> random_bytes(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) c = uint8_t(rng() & 0xff);
  return out;
}

inline std::vector<uint8_t> random_e4m3(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) {
    do c = uint8_t(rng() & 0xff);
    while ((c & 0x7f) == 0x7f);
  }
  return out;
}

// E4M3 codes of normal draws quantized as a checkpoint's weights are (per 32-block, the block's
// largest magnitude near 448), the kind of blocks whose exponent spread is narrow enough for the
// int16 FP8 prefill tile; one block in `wide_every` instead spans the whole code range
// (uniform random codes), which that tile leaves to the double path.
inline std::vector<uint8_t> normal_e4m3(int64_t n, std::mt19937& rng, int wide_every = 8) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, wide_every - 1);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += 32) {
    const bool wide = kind(rng) == 0;
    float block[32], amax = 0.0f;
    for (float& v : block) amax = std::max(amax, std::fabs(v = normal(rng)));
    for (int64_t i = b; i < std::min(n, b + 32); ++i) {
      uint8_t c;
      if (wide) {
        do c = uint8_t(rng() & 0xff);
        while ((c & 0x7f) == 0x7f);
      } else {
        c = f32_to_e4m3(block[i - b] * (440.0f / amax));
      }
      out[size_t(i)] = c;
    }
  }
  return out;
}

// E8M0 scales 2^[-20, 20], with the edge codes 0 (2^-127) and 254 (2^127) now and then.
inline std::vector<uint8_t> random_scales(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-20, 20), edge(0, 63);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (uint8_t& c : out) {
    const int e = edge(rng);
    c = e == 0 ? 0 : e == 1 ? 254 : uint8_t(k(rng) + 127);
  }
  return out;
}

// Differences are reported as the first differing index; -1 = identical bytes.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

struct Shape {
  int64_t M, N, K;
};

inline std::string describe(SimdLevel l, const Shape& s) {
  return std::string(simd_level_name(l)) + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
         " K=" + std::to_string(s.K);
}

// K multiples of 32 with 1..13 blocks (tails of the 4- and 8-block reductions), N odd and even.
inline const Shape kQuantizedShapes[] = {{1, 1, 32},   {1, 37, 96},   {1, 64, 256},   {1, 19, 416},
                                  {2, 21, 160}, {3, 40, 288},  {5, 33, 224},   {17, 9, 64},
                                  {16, 24, 352}, {33, 17, 128}, {130, 11, 96}, {1, 200, 1024},
                                  {4, 29, 192},  {4, 8, 32},    {3, 13, 32},
                                  // one block with prefill rows; whole 16-row tiles and 3 panels
                                  {6, 20, 32},   {32, 48, 64},
                                  // a last tile of one row after whole 6-row tiles (prefill)
                                  {7, 27, 96},   {13, 35, 64}};

// K with every remainder mod 16, N not a multiple of the 8- or 2-row groups; packed groups (8
// blocks of 16 rows) of every width from 1 to 8, with and without tail rows.
inline const Shape kDenseShapes[] = {{1, 1, 1},     {1, 9, 3},     {1, 13, 16},   {1, 17, 21},  {1, 31, 130},
                              {2, 5, 7},     {3, 11, 33},   {4, 7, 64},    {5, 3, 45},   {7, 19, 100},
                              {17, 10, 77},  {33, 9, 258},  {130, 5, 31},  {1, 300, 1024}, {3, 16, 40},
                              {2, 70, 129},  {2, 229, 37},  {1, 112, 64},  {1, 82, 18},  {3, 176, 11},
                              // packed: bundles of 3, 2 and 1 full groups (one row: read side by
                              // side; two: one group at a time), then a partial group
                              {2, 1000, 24}, {1, 1000, 24}, {1, 640, 7},   {1, 1152, 5},  {1, 520, 6},
                              {1, 256, 53},  {1, 384, 40}};

}  // namespace ds41::simd_test
