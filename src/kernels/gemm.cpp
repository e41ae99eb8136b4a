// Linear layers (spec backbone.md §3.3). See gemm.h for the summation order both paths follow.
//
// No fused multiply-add anywhere in this file: the order in gemm.h rounds every product to fp32
// before it is added, as the reference's fp32 accumulation does. GCC contracts a*b+c into an FMA
// by default whenever the target has one (e.g. with DS41_NATIVE / -march=native), even in ISO
// mode, and clang does so inside an expression; the pragmas below switch that off for this
// translation unit, so the fast path and its twin stay bit-identical on every target. They come
// before the includes so that inline helpers from headers are compiled under the same setting.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "base/scratch.h"
#include "kernels/gemm_shape.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/simd_kernels.h"

namespace ds41 {
namespace {

using gemm_detail::check_dims;
using gemm_detail::check_quantized_dims;
using gemm_detail::kBlock;


// ============================================================================================
// Reference twins: literal loops. Lane j of a run takes the products k with k % 8 == j in
// increasing k; nothing here is tiled, cached or vectorized on purpose.
// ============================================================================================

float reference_dense_dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

// One 32-element block of an FP8/FP4 GEMM: E4M3 activation codes times E4M3/E2M1 weight codes.
// Every product is exact in fp32 (at most 4 x 4 significant bits) and lies in [2^-18, 2^18), so
// their sum is exact in double whatever the order; it is rounded to fp32 once. This is the
// golden generator's semantics ("block dot products exact then rounded once to fp32") and makes
// the result independent of any SIMD or tiling order.
float exact_block_dot(const float* a, const float* w) {
  double lane[4] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t k = 0; k < kBlock; ++k) lane[k % 4] += double(a[k] * w[k]);
  return float((lane[0] + lane[1]) + (lane[2] + lane[3]));
}

// §3.3 for either weight format: decode_weight(n, k) gives the E4M3/E2M1 value, weight_scale(n, kb)
// the E8M0 scale as fp32.
template <class DecodeWeight, class WeightScale>
void reference_quantized_linear(const uint16_t* x, int64_t M, int64_t N, int64_t K,
                                DecodeWeight decode_weight, WeightScale weight_scale, uint16_t* y) {
  const int64_t KB = K / kBlock;
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  std::vector<float> a_scale(static_cast<size_t>(KB));
  float a[kBlock], w[kBlock];
  for (int64_t m = 0; m < M; ++m) {
    act_quant_row(x + m * K, K, codes.data(), a_scale.data());
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < KB; ++kb) {
        for (int64_t i = 0; i < kBlock; ++i) {
          a[i] = e4m3_to_f32(codes[size_t(kb * kBlock + i)]);
          w[i] = decode_weight(n, kb * kBlock + i);
        }
        const float partial = exact_block_dot(a, w);
        acc += (partial * a_scale[size_t(kb)]) * weight_scale(n, kb);
      }
      y[m * N + n] = f32_to_bf16(acc);
    }
  }
}

// ============================================================================================
// Fast path.
//
// Work is cut into tasks of (up to kTileRows rows of x) x (up to kTileCols rows of W), with the
// activation rows prepared once per chunk of kChunkRows rows (quantized+decoded or widened to
// fp32) and each weight row decoded to fp32 once per task, then reused for every x row of the
// task. Tiling only changes which element is computed when, never how: each y[m, n] is still the
// gemm.h order over the same fp32 values, so results equal the twins for any tiling or threads.
// ============================================================================================

constexpr int64_t kChunkRows = 128;  // bounds the prepared-activation buffer to 128*K floats
constexpr int64_t kTileRows = 32;
constexpr int64_t kTileCols = 16;
constexpr int kMicroRows = 4;  // x rows that share each loaded weight vector in the inner loop

// Grow-only per-thread scratch: no allocation once a thread has seen the largest K.
template <class T>
T* scratch(std::vector<T>& buffer, int64_t n) {
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

// Dense dot products (gemm.h): one sequential fp32 chain per output, R rows sharing each weight
// load. Compiled without FP contraction, so the multiply and the add round separately.
template <int R>
inline void dense_dot_rows(const float* const* a, const float* w, int64_t n, float* out) {
  float acc[R];
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float wk = w[k];
    for (int r = 0; r < R; ++r) acc[r] += a[r][k] * wk;
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Exact block sums of R rows for the quantized paths: products of E4M3/E2M1 codes are exact, and
// so is their double sum in any order; rounded once to fp32 (exact_block_dot's semantics).
template <int R>
inline void exact_block_dot_rows(const float* const* a, const float* w, float* out) {
  double acc[R];
  for (int r = 0; r < R; ++r) acc[r] = 0.0;
  for (int64_t k = 0; k < kBlock; ++k)
    for (int r = 0; r < R; ++r) acc[r] += double(a[r][k]) * double(w[k]);
  for (int r = 0; r < R; ++r) out[r] = float(acc[r]);
}

// E4M3 decode without a table lookup, written so that it vectorizes (integer ops, one compare
// and blend, one int->float conversion). For magnitude codes >= 8 (normal numbers) the E4M3
// exponent and mantissa bits are moved into place in an fp32 pattern and the exponent rebiased
// by 127 - 7; below 8 (subnormals, m * 2^-9) the 3-bit integer is converted and scaled, which is
// exact and involves no fp32 subnormal, so flush-to-zero modes cannot change it. The two NaN codes
// give the same quiet NaN as kE4M3Table, so results stay bit-identical to the twin even then.
inline float e4m3_decode_arith(uint8_t c) {
  const uint32_t magnitude = c & 0x7fu;
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t normal_bits = (magnitude << 20) + (uint32_t(127 - 7) << 23);
  const uint32_t subnormal_bits = std::bit_cast<uint32_t>(float(int32_t(magnitude)) * 0x1p-9f);
  // Masks instead of ?: so that GCC if-converts and vectorizes the decode loop.
  const uint32_t normal_mask = 0u - uint32_t(magnitude >= 8);
  const uint32_t nan_mask = 0u - uint32_t(magnitude == 0x7f);
  const uint32_t bits = (normal_bits & normal_mask) | (subnormal_bits & ~normal_mask) | sign;
  return std::bit_cast<float>((bits & ~nan_mask) | (0x7fc00000u & nan_mask));
}

// Decoded E2M1 values of both nibbles of every byte (low nibble = even k, §2.1).
struct Fp4PairTable {
  float v[256][2];
};
constexpr Fp4PairTable make_fp4_pair_table() {
  constexpr float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  Fp4PairTable t{};
  for (int b = 0; b < 256; ++b)
    for (int h = 0; h < 2; ++h) {
      const int nibble = h == 0 ? (b & 0xf) : (b >> 4);
      const float mag = magnitudes[nibble & 7];
      t.v[b][h] = (nibble & 8) ? -mag : mag;
    }
  return t;
}
constexpr Fp4PairTable kFp4Pairs = make_fp4_pair_table();

// ---- weight row decoders: fill a K-float row (and K/32 scales for the quantized formats) ---
struct Fp8Rows {
  const Fp8Matrix& W;
  int64_t scale_cols;  // ceil(K/32)
  void decode(int64_t n, float* row, float* scales) const {
    const uint8_t* src = W.w + n * W.K;
    for (int64_t k = 0; k < W.K; ++k) row[k] = e4m3_decode_arith(src[k]);
    const uint8_t* s = W.scale + (n / kBlock) * scale_cols;
    for (int64_t kb = 0; kb < W.K / kBlock; ++kb) scales[kb] = e8m0_to_f32(s[kb]);
  }
};

struct Fp4Rows {
  const Fp4Matrix& W;
  void decode(int64_t n, float* row, float* scales) const {
    const uint8_t* src = W.w + n * (W.K / 2);
    for (int64_t j = 0; j < W.K / 2; ++j) {
      row[2 * j] = kFp4Pairs.v[src[j]][0];
      row[2 * j + 1] = kFp4Pairs.v[src[j]][1];
    }
    const uint8_t* s = W.scale + n * (W.K / kBlock);
    for (int64_t kb = 0; kb < W.K / kBlock; ++kb) scales[kb] = e8m0_to_f32(s[kb]);
  }
};

// Runs task(row_begin, row_end, col_begin, col_end) over the tiles of an [rows, N] output whose
// elements each cost K multiply-adds. Tiles are numbered column-tile major, so each thread's
// contiguous range of tiles covers a contiguous slice of W's rows.
template <class Task>
void for_each_tile(int64_t rows, int64_t N, int64_t K, ThreadPool* pool, const Task& task) {
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (N + kTileCols - 1) / kTileCols;
  parallel_for(pool_for_work(pool, rows * N * K), row_tiles * col_tiles,
               [&](int64_t begin, int64_t end) {
                 for (int64_t t = begin; t < end; ++t) {
                   const int64_t ct = t / row_tiles, rt = t % row_tiles;
                   task(rt * kTileRows, std::min(rows, (rt + 1) * kTileRows), ct * kTileCols,
                        std::min(N, (ct + 1) * kTileCols));
                 }
               });
}

// R consecutive activation rows (starting at row r of the prepared chunk) against one decoded
// weight row: per K block the lane-ordered partials, then acc += (partial * a_s) * w_s (§3.3).
template <int R>
inline void quantized_rows(const float* act, const float* act_scale, int64_t r, int64_t K,
                           const float* w_row, const float* w_scale, uint16_t* y,
                           int64_t y_stride) {
  const int64_t KB = K / kBlock;
  float acc[R];
  const float* a[R];
  for (int i = 0; i < R; ++i) {
    acc[i] = 0.0f;
    a[i] = act + (r + i) * K;
  }
  for (int64_t kb = 0; kb < KB; ++kb) {
    const float* a_kb[R];
    for (int i = 0; i < R; ++i) a_kb[i] = a[i] + kb * kBlock;
    float partial[R];
    exact_block_dot_rows<R>(a_kb, w_row + kb * kBlock, partial);
    for (int i = 0; i < R; ++i) acc[i] += (partial[i] * act_scale[(r + i) * KB + kb]) * w_scale[kb];
  }
  for (int i = 0; i < R; ++i) y[i * y_stride] = f32_to_bf16(acc[i]);
}

// §3.3 fast path shared by FP8 and FP4 weights.
template <class WeightRows>
void quantized_linear(const char* what, const uint16_t* x, int64_t M, int64_t N, int64_t K,
                      const WeightRows& weights, uint16_t* y, ThreadPool* pool) {
  check_quantized_dims(what, M, N, K);
  if (M == 0 || N == 0) return;
  const int64_t KB = K / kBlock;
  thread_local std::vector<float> act_values_buffer, act_scales_buffer;
  for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, M - m0);
    float* act = scratch(act_values_buffer, rows * K);
    float* act_scale = scratch(act_scales_buffer, rows * KB);
    // act_quant every row (§3.1); the GEMM consumes the decoded E4M3 values.
    parallel_for(pool_for_work(pool, rows * K), rows, [&](int64_t r0, int64_t r1) {
      thread_local std::vector<uint8_t> codes;
      if (int64_t(codes.size()) < K) codes.resize(size_t(K));
      for (int64_t r = r0; r < r1; ++r) {
        act_quant_row(x + (m0 + r) * K, K, codes.data(), act_scale + r * KB);
        for (int64_t k = 0; k < K; ++k) act[r * K + k] = kE4M3Table[codes[size_t(k)]];
      }
    });
    for_each_tile(rows, N, K, pool, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      thread_local std::vector<float> row_buffer, scale_buffer;
      float* w_row = scratch(row_buffer, K);
      float* w_scale = scratch(scale_buffer, KB);
      for (int64_t n = n0; n < n1; ++n) {
        weights.decode(n, w_row, w_scale);
        int64_t r = r0;
        for (; r + kMicroRows <= r1; r += kMicroRows)
          quantized_rows<kMicroRows>(act, act_scale, r, K, w_row, w_scale, y + (m0 + r) * N + n, N);
        for (; r < r1; ++r)
          quantized_rows<1>(act, act_scale, r, K, w_row, w_scale, y + (m0 + r) * N + n, N);
      }
    });
  }
}

// Fast path of the plain linears. XRows::prepare(m0, rows, buffer) returns a pointer to `rows`
// fp32 activation rows; WRows::row(n, buffer) a pointer to weight row n as fp32.
template <class XRows, class WRows, class Store>
void dense_linear(const char* what, int64_t M, int64_t N, int64_t K, const XRows& x_rows,
                  const WRows& w_rows, const Store& store, ThreadPool* pool) {
  check_dims(what, M, N, K);
  if (M == 0 || N == 0) return;
  thread_local std::vector<float> act_buffer;
  for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, M - m0);
    const float* act = x_rows.prepare(m0, rows, act_buffer, pool);
    for_each_tile(rows, N, K, pool, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      thread_local std::vector<float> row_buffer;
      for (int64_t n = n0; n < n1; ++n) {
        const float* w = w_rows.row(n, row_buffer);
        int64_t r = r0;
        for (; r + kMicroRows <= r1; r += kMicroRows) {
          const float* a[kMicroRows] = {act + r * K, act + (r + 1) * K, act + (r + 2) * K,
                                        act + (r + 3) * K};
          float out[kMicroRows];
          dense_dot_rows<kMicroRows>(a, w, K, out);
          for (int i = 0; i < kMicroRows; ++i) store(m0 + r + i, n, out[i]);
        }
        for (; r < r1; ++r) {
          const float* a[1] = {act + r * K};
          float out[1];
          dense_dot_rows<1>(a, w, K, out);
          store(m0 + r, n, out[0]);
        }
      }
    });
  }
}

struct Bf16XRows {
  const uint16_t* x;
  int64_t K;
  const float* prepare(int64_t m0, int64_t rows, std::vector<float>& buffer,
                       ThreadPool* pool) const {
    float* out = scratch(buffer, rows * K);
    parallel_for(pool_for_work(pool, rows * K), rows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * K; i < r1 * K; ++i) out[i] = bf16_to_f32(x[m0 * K + i]);
    });
    return out;
  }
};

struct F32XRows {
  const float* x;
  int64_t K;
  const float* prepare(int64_t m0, int64_t, std::vector<float>&, ThreadPool*) const {
    return x + m0 * K;
  }
};

struct Bf16WRows {
  const uint16_t* W;
  int64_t K;
  const float* row(int64_t n, std::vector<float>& buffer) const {
    float* out = scratch(buffer, K);
    for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(W[n * K + k]);
    return out;
  }
};

struct Bf16At {
  const uint16_t* x;
  float operator()(int64_t i) const { return bf16_to_f32(x[i]); }
};
struct F32At {
  const float* x;
  float operator()(int64_t i) const { return x[i]; }
};

struct F32WRows {
  const float* W;
  int64_t K;
  const float* row(int64_t n, std::vector<float>&) const { return W + n * K; }
};

// ============================================================================================
// SIMD paths (simd_kernels.h): activations prepared per call here, kernels per ISA level.
// ============================================================================================

constexpr int64_t kSimdTileRows = 16;  // activation rows that share each decoded weight row

// Columns per SIMD tile of an N-column output: enough tiles to keep every thread busy (which
// thread computes an element never changes its value), a multiple of col_multiple. Decode tiles
// (`decode`: one or a few activation rows) are larger - about two per thread, up to 128 rows: each
// tile starts its weight stream cold and pays the kernel's set-up, and a decode step's matrices
// are small (two Xeon cores, cold 256 x 1024 FP8: 14.3 -> 16.0 GB/s, 4096 x 256: 13.0 -> 13.9).
int64_t simd_col_tile(int64_t N, int64_t threads, int64_t col_multiple, bool decode = false) {
  const int64_t per_thread = decode ? 2 : 4;
  const int64_t col_tile =
      std::clamp<int64_t>((N + per_thread * threads - 1) / (per_thread * threads), 8, decode ? 128 : 64);
  return (col_tile + col_multiple - 1) / col_multiple * col_multiple;
}

// A product of a few rows is bound by reading its weights, which a decode step finds in memory:
// it counts as this many rows of multiply-adds when deciding whether to share it out. (The
// router's 32 x 1024 bf16 gate of the small preset, 64 KB, took ~10 us on one thread each layer
// with the other idle.)
constexpr int64_t kWeightStreamRows = 4;

// Tiles of an [rows, N] output for the dense SIMD kernels.
template <class Task>
void for_each_simd_tile(int64_t rows, int64_t N, int64_t K, ThreadPool* pool, const Task& task) {
  ThreadPool* p = pool_for_work(pool, std::max(rows, kWeightStreamRows) * N * K);
  const int64_t threads = p ? p->size() : 1;
  const int64_t row_tiles = (rows + kSimdTileRows - 1) / kSimdTileRows;
  const int64_t col_tile = simd_col_tile(N, threads, 8);
  const int64_t col_tiles = (N + col_tile - 1) / col_tile;
  parallel_for(p, row_tiles * col_tiles, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ct = t / row_tiles, rt = t % row_tiles;
      task(rt * kSimdTileRows, std::min(rows, (rt + 1) * kSimdTileRows), ct * col_tile,
           std::min(N, (ct + 1) * col_tile));
    }
  });
}

// Dense SIMD path: activations widened to fp32 per chunk of rows.
template <class XAt, class WT>
void simd_dense_linear(const char* what, void (*kernel)(const float*, int64_t, const WT*, int64_t, int64_t, int64_t,
                                                        const simd::DenseOutput&),
                       int64_t M, int64_t N, int64_t K, const XAt& x_at, const WT* W, float* y_f32,
                       uint16_t* y_bf16, ThreadPool* pool) {
  check_dims(what, M, N, K);
  if (M == 0 || N == 0) return;
  thread_local std::vector<float> x_buffer;
  for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, M - m0);
    float* xd = scratch(x_buffer, rows * K);
    parallel_for(pool_for_work(pool, rows * K * 4), rows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * K; i < r1 * K; ++i) xd[i] = float(x_at(m0 * K + i));
    });
    for_each_simd_tile(rows, N, K, pool, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      const simd::DenseOutput out{y_f32 ? y_f32 + (m0 + r0) * N : nullptr,
                                  y_bf16 ? y_bf16 + (m0 + r0) * N : nullptr, N};
      kernel(xd + r0 * K, r1 - r0, W, K, n0, n1, out);
    });
  }
}

}  // namespace

// ---- scalar elements for the SIMD paths (simd_kernels.h) ------------------------------------
namespace simd {

uint16_t fp8_element_scalar(const uint8_t* codes, const float* scales, const Fp8Matrix& W, int64_t n) {
  const int64_t KB = W.K / kBlock;
  float a[kBlock], w[kBlock], acc = 0.0f;
  for (int64_t kb = 0; kb < KB; ++kb) {
    for (int64_t i = 0; i < kBlock; ++i) {
      a[i] = e4m3_to_f32(codes[kb * kBlock + i]);
      w[i] = e4m3_to_f32(W.w[n * W.K + kb * kBlock + i]);
    }
    acc += (exact_block_dot(a, w) * scales[kb]) * e8m0_to_f32(W.scale[(n / kBlock) * KB + kb]);
  }
  return f32_to_bf16(acc);
}

uint16_t fp4_element_scalar(const uint8_t* codes, const float* scales, const Fp4Matrix& W, int64_t n) {
  const int64_t KB = W.K / kBlock;
  float a[kBlock], w[kBlock], acc = 0.0f;
  for (int64_t kb = 0; kb < KB; ++kb) {
    for (int64_t i = 0; i < kBlock; ++i) {
      a[i] = e4m3_to_f32(codes[kb * kBlock + i]);
      w[i] = e2m1_to_f32(fp4_get(W.w + n * (W.K / 2), kb * kBlock + i));
    }
    acc += (exact_block_dot(a, w) * scales[kb]) * e8m0_to_f32(W.scale[n * KB + kb]);
  }
  return f32_to_bf16(acc);
}

}  // namespace simd

// ---- public fast paths -----------------------------------------------------------------------
namespace {

// A job's prepared activations: FP8 uses f1 = values, f2 = scales, i8 = digit planes (a lone
// row on a level with the integer decode kernel), f64 = the values widened to double (several
// rows; amx: the tile digits instead, amx), FP4 f1 = raw scales, f2 = scales, i8 = chunk planes,
// i32 = offsets (and amx: the tile digits, amx).
struct Prepared {
  uint8_t* codes;
  uint8_t* special;
  float *f1, *f2;
  int8_t* i8;
  int32_t* i32;
  double* f64;
  int8_t* amx;
  int16_t* i16;
  simd::Fp8NarrowBlock* narrow;
  simd::Fp8NarrowRows* narrow_tiles;
  int64_t K;
  bool digits;
  int shares = -1;  // the earlier job whose preparation this one uses
  simd::Fp8Activations a8() const {
    return {f1, f2, codes, special, K, digits ? i8 : nullptr, f64, amx, i16, narrow, narrow_tiles};
  }
  simd::Fp4Activations a4() const { return {i8, i32, f2, codes, f1, special, K, amx}; }
};
struct Tile {
  int job;
  int64_t n0, n1;
};
struct PrepRow {
  int job;
  int64_t r;
};

// The calling thread's buffers of simd_linear_quantized_batch (grown on demand, or ahead by
// reserve_quantized_batch).
struct BatchBuffers {
  std::vector<Prepared> prepared;
  std::vector<Tile> tiles;
  std::vector<PrepRow> prep_rows;
  std::vector<uint8_t> codes, special;
  std::vector<float> f1, f2;
  std::vector<int8_t> i8;
  std::vector<int32_t> i32;
  std::vector<double> f64;
  std::vector<int8_t> amx;
  std::vector<int16_t> i16;
  std::vector<simd::Fp8NarrowBlock> narrow;
  std::vector<simd::Fp8NarrowRows> narrow_tiles;
};
thread_local BatchBuffers batch_buffers;

// The last tiles of a decode batch, split: the last `threads` into tiles of kTailTileRows rows, the
// `threads` before them in halves (multiples of `multiple` rows, which the kernels' groups need).
// A decode tile of 128 FP8 rows x 1024 takes ~12 us on a core, and the pool's last pieces are
// single tiles, so a thread finishing first waited up to a tile for the other (with the head's
// single-item pieces and the MoE batches' order, the two threads' waits at the ends of a
// small-preset decode's loops fell from ~0.8 to ~0.43 ms a token on two Xeon vCPUs). Which
// thread computes a row never changes its value.
constexpr int64_t kTailTileRows = 32;
void split_tail_tiles(std::vector<Tile>& tiles, int64_t threads, int64_t multiple) {
  const int64_t rows_min = std::max(kTailTileRows, multiple);
  const size_t tail = std::min(tiles.size(), size_t(2 * threads));
  DS41_SCRATCH_EMPTY(Tile, last);
  scratch_reserve(last, tail);
  last.assign(tiles.end() - std::ptrdiff_t(tail), tiles.end());
  tiles.resize(tiles.size() - tail);
  for (size_t i = 0; i < last.size(); ++i) {
    const Tile t = last[i];
    const bool final_round = last.size() - i <= size_t(threads);
    const int64_t rows = t.n1 - t.n0;
    int64_t size = final_round ? rows_min : (rows / 2 + multiple - 1) / multiple * multiple;
    size = std::max(size, rows_min);
    for (int64_t n0 = t.n0; n0 < t.n1; n0 += size) tiles.push_back(Tile{t.job, n0, std::min(t.n1, n0 + size)});
  }
}

// linear_quantized_batch on the SIMD kernels (jobs of at most kChunkRows rows): every job's
// activation rows prepared once (in parallel over rows; a job with the same activations as an
// earlier one shares its preparation), then one parallel loop over the tiles of all jobs. A tile
// takes all of its job's rows (a prefill tile decodes its weights once for all of them) and up
// to 64 columns.
void simd_linear_quantized_batch(const simd::KernelTable& kt, const QuantizedLinearJob* jobs, int count,
                                 ThreadPool* pool) {
  BatchBuffers& buffers = batch_buffers;
  auto& [prepared, tiles, prep_rows, codes_buffer, special_buffer, f1_buffer, f2_buffer, i8_buffer, i32_buffer,
         f64_buffer, amx_buffer, i16_buffer, narrow_buffer, narrow_tiles_buffer] = buffers;
  auto dims = [&](int j, int64_t& N, int64_t& K) {
    N = jobs[j].fp8 ? jobs[j].fp8->N : jobs[j].fp4->N;
    K = jobs[j].fp8 ? jobs[j].fp8->K : jobs[j].fp4->K;
  };
  // Up to simd::kDecodeRowsMax rows the decode kernels run row by row (faster than the prefill
  // tiles until their weight decode is shared by enough rows): digit planes at the VBMI level,
  // the widened values for the tiles only beyond that.
  // Beyond that the prefill tiles: doubles, or AMX tile digits (rows padded to whole tiles; FP8
  // and FP4 alike), which FP8 takes from simd::kAmxFp8MinRows rows.
  auto amx_digits = [&](const QuantizedLinearJob& job) {
    return job.M >= (job.fp8 ? simd::kAmxFp8MinRows : simd::kDecodeRowsMax + 1) && kt.prepare_fp8_amx;
  };
  auto fp8_digits = [&](const QuantizedLinearJob& job) {
    return job.fp8 && job.M <= simd::kDecodeRowsMax && kt.prepare_fp8_digits && !amx_digits(job);
  };
  auto fp8_wide = [&](const QuantizedLinearJob& job) {
    return job.fp8 && job.M > simd::kDecodeRowsMax && !kt.prepare_fp8_amx;
  };
  // ... and beside them the int16 tile's operands (every level without AMX prepares them).
  auto fp8_narrow = fp8_wide;
  auto narrow_tile_count = [](int64_t M) { return (M + simd::kFp8NarrowTileRows - 1) / simd::kFp8NarrowTileRows; };
  if (int64_t(prepared.size()) < count) prepared.resize(size_t(count));
  // Sizes, and which jobs share a preparation.
  int64_t codes_n = 0, special_n = 0, f1_n = 0, f2_n = 0, i8_n = 0, i32_n = 0, f64_n = 0, amx_n = 0, i16_n = 0,
          narrow_n = 0, narrow_tiles_n = 0, work = 0, prep_work = 0;
  for (int j = 0; j < count; ++j) {
    const QuantizedLinearJob& job = jobs[j];
    int64_t N, K;
    dims(j, N, K);
    check_quantized_dims(job.fp8 ? "linear_fp8" : "linear_fp4", job.M, N, K);
    if (fp8_narrow(job) && !kt.prepare_fp8_narrow)
      throw Error("linear_fp8: this kernel level has no prepare_fp8_narrow, which its prefill tile needs");
    work += job.M * N * K;
    prepared[size_t(j)].shares = -1;
    for (int e = 0; e < j; ++e) {
      int64_t Ne, Ke;
      dims(e, Ne, Ke);
      if (jobs[e].x == job.x && jobs[e].M == job.M && !jobs[e].fp8 == !job.fp8 && Ke == K) {
        prepared[size_t(j)].shares = e;
        break;
      }
    }
    if (prepared[size_t(j)].shares >= 0) continue;
    prep_work += job.M * K * 8;
    codes_n += job.M * K;
    special_n += job.M;
    f1_n += job.fp8 ? job.M * K : job.M * (K / kBlock);  // values | raw scales
    f2_n += job.M * (K / kBlock);                        // scales
    i8_n += job.fp8 ? (fp8_digits(job) ? job.M * 3 * K : 0) : job.M * simd::fp4_chunk_row_bytes(K);
    i32_n += job.fp8 ? 0 : job.M * (K / kBlock);
    f64_n += fp8_wide(job) ? job.M * K : 0;
    amx_n += amx_digits(job) ? simd::fp8_amx_bytes(job.M, K) : 0;
    i16_n += fp8_narrow(job) ? job.M * K : 0;
    narrow_n += fp8_narrow(job) ? job.M * (K / kBlock) : 0;
    narrow_tiles_n += fp8_narrow(job) ? narrow_tile_count(job.M) * (K / kBlock) : 0;
  }
  uint8_t* codes = scratch(codes_buffer, codes_n);
  uint8_t* special = scratch(special_buffer, special_n);
  float* f1 = scratch(f1_buffer, f1_n);
  float* f2 = scratch(f2_buffer, f2_n);
  int8_t* i8 = scratch(i8_buffer, i8_n);
  int32_t* i32 = scratch(i32_buffer, i32_n);
  double* f64 = scratch(f64_buffer, f64_n);
  // AMX tile rows 64-byte aligned: a tile load of rows split across cache lines took 1.5x as long.
  int8_t* amx = scratch(amx_buffer, amx_n + 64);
  amx += (64 - reinterpret_cast<uintptr_t>(amx) % 64) % 64;
  int16_t* i16 = scratch(i16_buffer, i16_n);
  simd::Fp8NarrowBlock* narrow = scratch(narrow_buffer, narrow_n);
  simd::Fp8NarrowRows* narrow_tiles = scratch(narrow_tiles_buffer, narrow_tiles_n);
  // Buffers of each job, and the rows to prepare.
  prep_rows.clear();
  for (int j = 0; j < count; ++j) {
    const QuantizedLinearJob& job = jobs[j];
    Prepared& p = prepared[size_t(j)];
    if (p.shares >= 0) continue;
    int64_t N, K;
    dims(j, N, K);
    const int64_t KB = K / kBlock;
    p = Prepared{codes,
                 special,
                 f1,
                 f2,
                 i8,
                 i32,
                 fp8_wide(job) ? f64 : nullptr,
                 amx_digits(job) ? amx : nullptr,
                 fp8_narrow(job) ? i16 : nullptr,
                 fp8_narrow(job) ? narrow : nullptr,
                 fp8_narrow(job) ? narrow_tiles : nullptr,
                 K,
                 fp8_digits(job),
                 -1};
    if (p.amx) {  // the padding rows are zero digits: the last tile zeroed, its rows then written
      const int64_t bytes = simd::fp8_amx_bytes(job.M, K), tile = simd::fp8_amx_bytes(1, K);
      if (job.M % 16) std::memset(amx + bytes - tile, 0, size_t(tile));
      amx += bytes;
    }
    if (job.fp8) {
      f1 += job.M * K;
      i8 += p.digits ? job.M * 3 * K : 0;
      f64 += p.f64 ? job.M * K : 0;
      i16 += p.narrow ? job.M * K : 0;
      narrow += p.narrow ? job.M * KB : 0;
      narrow_tiles += p.narrow ? narrow_tile_count(job.M) * KB : 0;
    } else {
      f1 += job.M * KB;
      i8 += job.M * simd::fp4_chunk_row_bytes(K);
      i32 += job.M * KB;
    }
    codes += job.M * K;
    special += job.M;
    f2 += job.M * KB;
    for (int64_t r = 0; r < job.M; ++r) prep_rows.push_back(PrepRow{j, r});
  }
  // The workers read this thread's lists (thread_local names would be their own, empty, ones).
  const Prepared* prepared_list = prepared.data();
  const PrepRow* prep_list = prep_rows.data();
  parallel_for(pool_for_work(pool, prep_work), int64_t(prep_rows.size()),
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i) {
                   const QuantizedLinearJob& job = jobs[prep_list[i].job];
                   const Prepared& p = prepared_list[prep_list[i].job];
                   const int64_t r = prep_list[i].r, K = p.K, KB = K / kBlock;
                   if (job.fp8) {
                     kt.prepare_fp8_row(job.x + r * K, K, p.codes + r * K, p.f2 + r * KB, p.f1 + r * K,
                                        p.f64 ? p.f64 + r * K : nullptr, p.special + r);
                     if (p.narrow)
                       kt.prepare_fp8_narrow(p.codes + r * K, p.f2 + r * KB, K, p.i16 + r * K, p.narrow + r * KB);
                   } else
                     kt.prepare_fp4_row(job.x + r * K, K, p.codes + r * K, p.f1 + r * KB,
                                        p.i8 + r * simd::fp4_chunk_row_bytes(K), p.i32 + r * KB, p.f2 + r * KB,
                                        p.special + r, job.M <= simd::kDecodeRowsMax || kt.fp4_prefill_narrow);
                   if (p.amx) kt.prepare_fp8_amx(p.codes + r * K, K, p.amx + simd::fp8_amx_row_offset(r, K));
                 }
               });
  // Digit planes of the few-row FP8 jobs, the int16 tiles' row bounds; shared preparations
  // copied; the tiles.
  tiles.clear();
  int64_t tile_multiple = 0;  // the decode jobs' largest tile multiple
  bool all_decode = true;
  const int64_t threads = pool_for_work(pool, work) ? pool->size() : 1;
  for (int j = 0; j < count; ++j) {
    Prepared& p = prepared[size_t(j)];
    if (p.shares >= 0) {
      const int shares = p.shares;
      p = prepared[size_t(shares)];
      p.shares = shares;
    } else if (p.digits) {
      for (int64_t r = 0; r < jobs[j].M; ++r) kt.prepare_fp8_digits(p.codes + r * p.K, p.K, p.i8 + r * 3 * p.K);
    } else if (p.narrow) {
      simd::fp8_narrow_row_tiles(p.narrow, jobs[j].M, p.K / kBlock, p.narrow_tiles);
    }
    int64_t N, K;
    dims(j, N, K);
    if (jobs[j].M == 0) continue;
    // Prefill tiles: a multiple of 32 outputs, so the 32-wide AVX-512 FP8 register tile is never
    // cut short inside a tile.
    const bool decode = jobs[j].M <= simd::kDecodeRowsMax && !prepared[size_t(j)].amx;
    // Decode tiles: a multiple of the VBMI FP8 and AVX-512 FP4 decodes' runs of rows (two or more
    // per thread).
    // (From a rows16 copy both read groups of 16 adjacent rows.)
    const int64_t group = prepared[size_t(j)].digits && !jobs[j].fp8->rows16
                              ? 16 * simd::fp8_decode_row_step(K, N / (2 * threads))
                          : jobs[j].fp4 && kt.fp4_decode_runs && !jobs[j].fp4->rows16
                              ? 16 * simd::fp4_decode_row_step(K, N / (2 * threads))
                              : 16;
    const int64_t col_tile = simd_col_tile(N, threads, decode ? group : 32, decode);
    for (int64_t n0 = 0; n0 < N; n0 += col_tile) tiles.push_back(Tile{j, n0, std::min(N, n0 + col_tile)});
    if (decode) tile_multiple = std::max(tile_multiple, group);
    else all_decode = false;
  }
  if (threads > 1 && all_decode && tile_multiple > 0) split_tail_tiles(tiles, threads, tile_multiple);
  const Tile* tile_list = tiles.data();
  parallel_for(pool_for_work(pool, work), int64_t(tiles.size()), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const Tile& tile = tile_list[t];
      const QuantizedLinearJob& job = jobs[tile.job];
      const Prepared& p = prepared_list[tile.job];
      if (job.fp8) kt.fp8(p.a8(), job.M, *job.fp8, tile.n0, tile.n1, job.y, job.fp8->N);
      else kt.fp4(p.a4(), job.M, *job.fp4, tile.n0, tile.n1, job.y, job.fp4->N);
    }
  });
}

// One FP8/FP4 linear on the SIMD kernels: chunks of kChunkRows rows, each a batch of one job.
template <class Matrix>
void simd_linear_quantized(const simd::KernelTable& kt, const char* what, const uint16_t* x, int64_t M,
                           const Matrix& W, uint16_t* y, ThreadPool* pool) {
  check_quantized_dims(what, M, W.N, W.K);
  if (M == 0 || W.N == 0) return;
  for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) {
    QuantizedLinearJob job{x + m0 * W.K, std::min(kChunkRows, M - m0), nullptr, nullptr, y + m0 * W.N};
    if constexpr (std::is_same_v<Matrix, Fp8Matrix>) job.fp8 = &W;
    else job.fp4 = &W;
    simd_linear_quantized_batch(kt, &job, 1, pool);
  }
}

}  // namespace

void linear_fp8(const uint16_t* x, int64_t M, const Fp8Matrix& W, uint16_t* y, ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_linear_quantized(*kt, "linear_fp8", x, M, W, y, pool);
  quantized_linear("linear_fp8", x, M, W.N, W.K, Fp8Rows{W, (W.K + kBlock - 1) / kBlock}, y, pool);
}

void linear_fp4(const uint16_t* x, int64_t M, const Fp4Matrix& W, uint16_t* y, ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_linear_quantized(*kt, "linear_fp4", x, M, W, y, pool);
  quantized_linear("linear_fp4", x, M, W.N, W.K, Fp4Rows{W}, y, pool);
}

void linear_quantized_batch(const QuantizedLinearJob* jobs, int count, ThreadPool* pool) {
  for (int j = 0; j < count; ++j)
    if (!jobs[j].fp8 == !jobs[j].fp4) throw Error("linear_quantized_batch: a job needs exactly one of fp8 / fp4");
  const simd::KernelTable* kt = simd::active_kernels();
  bool small = kt != nullptr;  // the batched path holds each job's rows in one prepared chunk
  for (int j = 0; j < count; ++j) small = small && jobs[j].M <= kChunkRows;
  if (small) return simd_linear_quantized_batch(*kt, jobs, count, pool);
  for (int j = 0; j < count; ++j) {
    if (jobs[j].fp8) linear_fp8(jobs[j].x, jobs[j].M, *jobs[j].fp8, jobs[j].y, pool);
    else linear_fp4(jobs[j].x, jobs[j].M, *jobs[j].fp4, jobs[j].y, pool);
  }
}

void reserve_quantized_batch(int jobs, int64_t rows, int64_t max_k, int64_t max_n) {
  BatchBuffers& b = batch_buffers;
  const int64_t kb = max_k / kBlock;
  b.prepared.reserve(size_t(jobs));
  // A job's tiles are at least 16 columns wide.
  b.tiles.reserve(size_t(int64_t(jobs) * ((max_n + 15) / 16)));
  b.prep_rows.reserve(size_t(rows));
  b.codes.reserve(size_t(rows * max_k));
  b.special.reserve(size_t(rows));
  b.f1.reserve(size_t(rows * max_k));
  b.f2.reserve(size_t(rows * kb));
  b.i8.reserve(size_t(rows * std::max<int64_t>(3 * max_k, simd::fp4_chunk_row_bytes(max_k))));
  b.i32.reserve(size_t(rows * kb));
  b.f64.reserve(size_t(rows * max_k));
  b.i16.reserve(size_t(rows * max_k));
  b.narrow.reserve(size_t(rows * kb));
  b.narrow_tiles.reserve(size_t((rows / simd::kFp8NarrowTileRows + jobs) * kb));
  // Each job's AMX rows are padded to a whole tile of 16; + 64 for the alignment.
  b.amx.reserve(size_t(simd::fp8_amx_bytes(rows + 16 * int64_t(jobs), max_k) + 64));
}

void linear_bf16(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K, uint16_t* y,
                 ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_dense_linear("linear_bf16", kt->dense_bf16w, M, N, K, Bf16At{x}, W, nullptr, y, pool);
  dense_linear(
      "linear_bf16", M, N, K, Bf16XRows{x, K}, Bf16WRows{W, K},
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = f32_to_bf16(v); }, pool);
}

void linear_bf16_f32out(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                        float* y, ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_dense_linear("linear_bf16_f32out", kt->dense_bf16w, M, N, K, Bf16At{x}, W, y, nullptr, pool);
  dense_linear(
      "linear_bf16_f32out", M, N, K, Bf16XRows{x, K}, Bf16WRows{W, K},
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; }, pool);
}

void linear_f32(const float* x, int64_t M, const float* W, int64_t N, int64_t K, float* y,
                ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_dense_linear("linear_f32", kt->dense_f32w, M, N, K, F32At{x}, W, y, nullptr, pool);
  dense_linear(
      "linear_f32", M, N, K, F32XRows{x, K}, F32WRows{W, K},
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; }, pool);
}

void linear_f32_wbf16(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K, float* y,
                      ThreadPool* pool) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return simd_dense_linear("linear_f32_wbf16", kt->dense_bf16w, M, N, K, F32At{x}, W, y, nullptr, pool);
  dense_linear(
      "linear_f32_wbf16", M, N, K, F32XRows{x, K}, Bf16WRows{W, K},
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; }, pool);
}

// ---- public reference twins ------------------------------------------------------------------
void linear_fp8_reference(const uint16_t* x, int64_t M, const Fp8Matrix& W, uint16_t* y) {
  check_quantized_dims("linear_fp8_reference", M, W.N, W.K);
  const int64_t scale_cols = W.K / kBlock;
  reference_quantized_linear(
      x, M, W.N, W.K, [&](int64_t n, int64_t k) { return e4m3_to_f32(W.w[n * W.K + k]); },
      [&](int64_t n, int64_t kb) { return e8m0_to_f32(W.scale[(n / kBlock) * scale_cols + kb]); },
      y);
}

void linear_fp4_reference(const uint16_t* x, int64_t M, const Fp4Matrix& W, uint16_t* y) {
  check_quantized_dims("linear_fp4_reference", M, W.N, W.K);
  reference_quantized_linear(
      x, M, W.N, W.K,
      [&](int64_t n, int64_t k) { return e2m1_to_f32(fp4_get(W.w + n * (W.K / 2), k)); },
      [&](int64_t n, int64_t kb) { return e8m0_to_f32(W.scale[n * (W.K / kBlock) + kb]); }, y);
}

namespace {
// y[m, n] = reference_lane_dot over K of fp32(x[m, k]) * fp32(W[n, k]).
template <class XAt, class WAt, class Store>
void reference_dense_linear(int64_t M, int64_t N, int64_t K, XAt x_at, WAt w_at, Store store) {
  std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        a[size_t(k)] = x_at(m, k);
        b[size_t(k)] = w_at(n, k);
      }
      store(m, n, reference_dense_dot(a.data(), b.data(), K));
    }
}
}  // namespace

void linear_bf16_reference(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                           uint16_t* y) {
  check_dims("linear_bf16_reference", M, N, K);
  reference_dense_linear(
      M, N, K, [&](int64_t m, int64_t k) { return bf16_to_f32(x[m * K + k]); },
      [&](int64_t n, int64_t k) { return bf16_to_f32(W[n * K + k]); },
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = f32_to_bf16(v); });
}

void linear_bf16_f32out_reference(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N,
                                  int64_t K, float* y) {
  check_dims("linear_bf16_f32out_reference", M, N, K);
  reference_dense_linear(
      M, N, K, [&](int64_t m, int64_t k) { return bf16_to_f32(x[m * K + k]); },
      [&](int64_t n, int64_t k) { return bf16_to_f32(W[n * K + k]); },
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; });
}

void linear_f32_reference(const float* x, int64_t M, const float* W, int64_t N, int64_t K,
                          float* y) {
  check_dims("linear_f32_reference", M, N, K);
  reference_dense_linear(
      M, N, K, [&](int64_t m, int64_t k) { return x[m * K + k]; },
      [&](int64_t n, int64_t k) { return W[n * K + k]; },
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; });
}

void linear_f32_wbf16_reference(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                                float* y) {
  check_dims("linear_f32_wbf16_reference", M, N, K);
  reference_dense_linear(
      M, N, K, [&](int64_t m, int64_t k) { return x[m * K + k]; },
      [&](int64_t n, int64_t k) { return bf16_to_f32(W[n * K + k]); },
      [&](int64_t m, int64_t n, float v) { y[m * N + n] = v; });
}

}  // namespace ds41
