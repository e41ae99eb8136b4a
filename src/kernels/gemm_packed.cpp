// Packed weight layouts of the linear layers (gemm.h: PackedBf16Matrix, PackedFp8Matrix, the
// lane-ordered rows16 copies) and their products. Split from gemm.cpp; the same rules hold.
//
// No fused multiply-add here either (gemm.cpp says why): the pragma comes first, so that inline
// helpers from the headers below are compiled under it too.
#include "base/fp_contract_off.h"  // first, on purpose

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
#include "kernels/gemm_shape.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/simd_kernels.h"
namespace ds41 {

using gemm_detail::check_dims;
using gemm_detail::kBlock;

namespace {
// Group g of a packed matrix with NB blocks: its first block and its width in blocks.
struct PackedGroup {
  int64_t first_block;
  int width;
};
PackedGroup packed_group(int64_t NB, int64_t g) {
  const int64_t first = g * kPackedGroupBlocks;
  return {first, int(std::min(kPackedGroupBlocks, NB - first))};
}

// The items of several jobs (items_of(j) each, `items` in all) shared out in one parallel loop:
// run(j, item of job j). An item is at least a whole group of rows over all of K (tens of
// microseconds at decode), so the loop's last pieces may be single items (ThreadPool's
// min_piece).
template <class ItemsOf, class Run>
void parallel_job_items(ThreadPool* pool, int64_t items, const ItemsOf& items_of, const Run& run) {
  constexpr int64_t kOneItem = 1;
  parallel_for(
      pool, items,
      [&](int64_t i0, int64_t i1) {
        int j = 0;
        int64_t first = 0;  // the first item of job j
        for (int64_t i = i0; i < i1; ++i) {
          while (i >= first + items_of(j)) first += items_of(j++);
          run(j, i - first);
        }
      },
      kOneItem);
}
}  // namespace

void pack_bf16_rows(const uint16_t* W, int64_t N, int64_t K, uint16_t* out, ThreadPool* pool) {
  check_dims("pack_bf16_rows", 1, N, K);
  const int64_t NB = N / kPackedRows, NG = (NB + kPackedGroupBlocks - 1) / kPackedGroupBlocks;
  const simd::KernelTable* kt = simd::active_kernels();
  parallel_for(pool_for_work(pool, NB * K * kPackedRows), NG, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const PackedGroup pg = packed_group(NB, g);
      const int64_t rows = pg.width * kPackedRows, row0 = pg.first_block * kPackedRows;
      uint16_t* group = out + row0 * K;
      if (kt) {
        kt->transpose_u16(W + row0 * K, K, rows, K, group, rows);
        continue;
      }
      // 32 positions (a cache line of each source row) at a time for 16 rows: element by element
      // over whole rows every value read missed the cache.
      for (int64_t k0 = 0; k0 < K; k0 += 32)
        for (int64_t j0 = 0; j0 < rows; j0 += kPackedRows)
          for (int64_t k = k0; k < std::min(K, k0 + 32); ++k)
            for (int64_t j = j0; j < j0 + kPackedRows; ++j) group[k * rows + j] = W[(row0 + j) * K + k];
    }
  });
}

void linear_f32_wbf16_packed(const float* x, int64_t M, const PackedBf16Matrix& W, float* y, ThreadPool* pool) {
  const PackedLinearJob job{x, W, y};
  linear_f32_wbf16_packed_batch(&job, 1, M, pool);
}

void linear_f32_wbf16_maybe_packed(const float* x, int64_t M, const PackedBf16Matrix& W, float* y, ThreadPool* pool) {
  if (M < kPackedMaxRows && W.blocks) return linear_f32_wbf16_packed(x, M, W, y, pool);
  if (W.rows == nullptr) throw Error("linear_f32_wbf16_maybe_packed: the matrix was not loaded");
  linear_f32_wbf16(x, M, W.rows, W.N, W.K, y, pool);
}

void linear_f32_wbf16_packed_batch(const PackedLinearJob* jobs, int count, int64_t M, ThreadPool* pool) {
  // Work items: each job's full groups `bundle` at a time (the last bundle what is left), its
  // partial group if any, then one item for its tail rows (N % 16, possibly none). A bundle is
  // kPackedStreamGroups groups (read side by side at one row) where there are enough for two
  // bundles per thread, fewer otherwise: a compressor's 512 rows (four groups) as bundles of three
  // and one had one thread read three quarters of the matrix.
  int64_t work = 0, full_groups = 0;
  for (int j = 0; j < count; ++j) {
    check_dims("linear_f32_wbf16_packed", M, jobs[j].W.N, jobs[j].W.K);
    work += M * jobs[j].W.N * jobs[j].W.K;
    full_groups += jobs[j].W.N / kPackedRows / kPackedGroupBlocks;
  }
  ThreadPool* const run_pool = pool_for_work(pool, work);
  const int64_t threads = run_pool ? run_pool->size() : 1;
  const int64_t bundle = std::clamp<int64_t>(full_groups / (2 * threads), 1, kPackedStreamGroups);
  const auto bundles_of = [&](int j) {
    const int64_t full = jobs[j].W.N / kPackedRows / kPackedGroupBlocks;
    return (full + bundle - 1) / bundle;
  };
  const auto items_of = [&](int j) {
    const int64_t NB = jobs[j].W.N / kPackedRows;
    return bundles_of(j) + (NB % kPackedGroupBlocks != 0 ? 1 : 0) + 1;
  };
  int64_t items = 0;
  for (int j = 0; j < count; ++j) items += items_of(j);
  if (M == 0 || items == 0) return;
  const simd::KernelTable* kt = simd::active_kernels();
  const auto run_item = [&](int j, int64_t g) {
    const PackedBf16Matrix& W = jobs[j].W;
    const float* x = jobs[j].x;
    float* y = jobs[j].y;
    const int64_t N = W.N, K = W.K, NB = N / kPackedRows;
    if (g == items_of(j) - 1) {  // the tail rows, from the row-major matrix
      for (int64_t n = NB * kPackedRows; n < N; ++n)
        for (int64_t m = 0; m < M; ++m) {
          float acc = 0.0f;
          for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * bf16_to_f32(W.rows[n * K + k]);
          y[m * N + n] = acc;
        }
      return;
    }
    // Item g < bundles: full groups [first, first + groups); else the partial group.
    const int64_t bundles = bundles_of(j), full = NB / kPackedGroupBlocks;
    const int64_t first = g < bundles ? g * bundle : full;
    const int groups = g < bundles ? int(std::min<int64_t>(bundle, full - first)) : 1;
    const PackedGroup pg = packed_group(NB, first);
    const int64_t row0 = pg.first_block * kPackedRows, rows = pg.width * kPackedRows;
    if (kt) {
      kt->dense_packed_bf16(x, M, W.blocks + row0 * K, K, pg.width, groups, y + row0, N);
      return;
    }
    for (int i = 0; i < groups; ++i) {
      const uint16_t* group = W.blocks + (row0 + i * rows) * K;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < rows; ++r) {
          float acc = 0.0f;  // the twin's chain: product rounded, then added
          for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * bf16_to_f32(group[k * rows + r]);
          y[m * N + row0 + i * rows + r] = acc;
        }
    }
  };
  parallel_job_items(run_pool, items, items_of, run_item);
}

namespace {
// Scale exponents t = code - 127 for which e4m3 * 2^t is exact in bf16 and, as w * 2^-120 times
// 2^(t + 120), in the SIMD kernel's fp32 (gemm.h): t >= -124 keeps every product on bf16's grid
// (multiples of 2^-9 * 2^t >= 2^-133), t <= 7 keeps 2^(t + 120) finite.
constexpr int kPackedFp8MinScale = 127 - 124, kPackedFp8MaxScale = 127 + 7;

// fp8_packable but for the codes: the shape and every scale.
bool fp8_shape_and_scales_packable(const Fp8Matrix& W) {
  if (W.N <= 0 || W.K <= 0 || W.N % 32 != 0 || W.K % kBlock != 0) return false;
  for (int64_t i = 0; i < (W.N / 32) * (W.K / kBlock); ++i)
    if (W.scale[i] < kPackedFp8MinScale || W.scale[i] > kPackedFp8MaxScale) return false;
  return true;
}
}  // namespace

bool fp8_packable(const Fp8Matrix& W) {
  if (!fp8_shape_and_scales_packable(W)) return false;
  for (int64_t i = 0; i < W.N * W.K; ++i)
    if (is_nan_e4m3(W.w[i])) return false;  // dequantized to a NaN, which the packed decode would not give
  return true;
}

namespace {
// The rows16 layout of both formats over a matrix's bytes (row_bytes a multiple of 4): each group
// of 16 rows, 4 bytes of each row in turn, written in order (16 forward read streams).
void pack_rows16(const uint8_t* w, int64_t N, int64_t row_bytes, uint8_t* out) {
  for (int64_t g = 0; g + 16 <= N; g += 16) {
    const uint8_t* rows = w + g * row_bytes;
    uint8_t* at = out + g * row_bytes;
    for (int64_t k = 0; k < row_bytes; k += 4)
      for (int64_t l = 0; l < 16; ++l, at += 4) std::memcpy(at, rows + l * row_bytes + k, 4);
  }
}
}  // namespace

void pack_fp8_rows16(const Fp8Matrix& W, uint8_t* out) {
  if (W.K % kBlock != 0) throw Error("pack_fp8_rows16: K = " + std::to_string(W.K) + " is not a multiple of 32");
  pack_rows16(W.w, W.N, W.K, out);
  uint8_t* flags = out + fp8_rows16_code_bytes(W);
  const int64_t KB = W.K / kBlock;
  for (int64_t g = 0; g + 16 <= W.N; g += 16)
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* block = out + (g / 16 * KB + b) * kFp8Rows16BlockBytes;
      flags[g / 16 * KB + b] = uint8_t(
          (std::any_of(block, block + kFp8Rows16BlockBytes, is_subnormal_e4m3) ? kFp8BlockSubnormal : 0) |
          (std::any_of(block, block + kFp8Rows16BlockBytes, is_nan_e4m3) ? kFp8BlockNan : 0));
    }
}

void pack_fp4_rows16(const Fp4Matrix& W, uint8_t* out) {
  if (W.K % kBlock != 0) throw Error("pack_fp4_rows16: K = " + std::to_string(W.K) + " is not a multiple of 32");
  pack_rows16(W.w, W.N, W.K / 2, out);
  uint8_t* scales = out + fp4_rows16_code_bytes(W);
  uint8_t* special = scales + W.N / 16 * 16 * (W.K / kBlock);
  const int64_t KB = W.K / kBlock;
  for (int64_t g = 0; g + 16 <= W.N; g += 16) {
    bool any = false;
    for (int64_t b = 0; b < KB; ++b)
      for (int64_t l = 0; l < 16; ++l) {
        const uint8_t code = W.scale[(g + l) * KB + b];
        any = any || code == 0 || code == 0xff;
        *scales++ = code;
      }
    special[g / 16] = any;
  }
}

bool fp8_decode_reads_rows16() {
  const simd::KernelTable* kt = simd::active_kernels();
  return kt && kt->fp8_decode_rows16;  // the copy kernels (AVX2 and avx512, VBMI)
}

bool fp4_decode_reads_rows16() {
  const simd::KernelTable* kt = simd::active_kernels();
  return kt && kt->fp4_decode_rows16;
}

void pack_fp8_rows(const Fp8Matrix& W, uint8_t* out, ThreadPool* pool) {
  if (!fp8_shape_and_scales_packable(W))
    throw Error("pack_fp8_rows: the matrix cannot be packed (shape or scales, see fp8_packable)");
  const int64_t N = W.N, K = W.K, NB = N / kPackedRows, NG = (NB + kPackedGroupBlocks - 1) / kPackedGroupBlocks;
  // The codes are checked as they are copied (the caller has usually checked them already: one
  // pass over the matrix instead of two).
  std::atomic<bool> nan_code{false};
  parallel_for(pool_for_work(pool, N * K), NG, [&](int64_t g0, int64_t g1) {
    bool nan = false;
    for (int64_t g = g0; g < g1; ++g) {
      const PackedGroup pg = packed_group(NB, g);
      const int64_t rows = pg.width * kPackedRows, row0 = pg.first_block * kPackedRows;
      uint8_t* group = out + row0 * K;
      for (int64_t k0 = 0; k0 < K; k0 += 64)  // a cache line of each source row at a time
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t k = k0; k < std::min(K, k0 + 64); ++k) {
            const uint8_t code = W.w[(row0 + j) * K + k];
            nan |= is_nan_e4m3(code);
            group[k * rows + j] = code;
          }
    }
    if (nan) nan_code = true;
  });
  if (nan_code) throw Error("pack_fp8_rows: the matrix has a NaN code (fp8_packable)");
}

void linear_f32_wfp8_packed_batch(const PackedFp8LinearJob* jobs, int count, int64_t M, ThreadPool* pool) {
  const auto groups_of = [&](int j) {
    return (jobs[j].W.N / kPackedRows + kPackedGroupBlocks - 1) / kPackedGroupBlocks;
  };
  int64_t items = 0, work = 0;
  for (int j = 0; j < count; ++j) {
    const PackedFp8Matrix& W = jobs[j].W;
    check_dims("linear_f32_wfp8_packed", M, W.N, W.K);
    if (W.N % 32 != 0 || W.K % kBlock != 0)
      throw Error("linear_f32_wfp8_packed: N and K must be multiples of 32 (got " + std::to_string(W.N) + " x " +
                  std::to_string(W.K) + ")");
    items += groups_of(j);
    work += M * W.N * W.K;
  }
  if (M == 0 || items == 0) return;
  const simd::KernelTable* kt = simd::active_kernels();
  const auto run_group = [&](int j, int64_t g) {
    const PackedFp8Matrix& W = jobs[j].W;
    const float* x = jobs[j].x;
    float* y = jobs[j].y;
    const int64_t N = W.N, K = W.K, KB = K / kBlock;
    const PackedGroup pg = packed_group(N / kPackedRows, g);
    const int64_t row0 = pg.first_block * kPackedRows, rows = pg.width * kPackedRows;
    const uint8_t* group = W.blocks + row0 * K;
    const uint8_t* scale = W.scale + (row0 / 32) * KB;
    if (kt && kt->dense_packed_fp8) {
      kt->dense_packed_fp8(x, M, group, scale, K, pg.width, y + row0, N);
      return;
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;  // linear_f32_wbf16's chain over the dequantized (exact) values
        for (int64_t k = 0; k < K; ++k) {
          const float w = e4m3_to_f32(group[k * rows + r]) * e8m0_to_f32(scale[(r / 32) * KB + k / kBlock]);
          acc += x[m * K + k] * w;
        }
        y[m * N + row0 + r] = acc;
      }
  };
  parallel_job_items(pool_for_work(pool, work), items, groups_of, run_group);
}

void dequant_fp8_to_bf16(const Fp8Matrix& W, uint16_t* out) {
  check_dims("dequant_fp8_to_bf16", 0, W.N, W.K);
  const int64_t scale_cols = (W.K + kBlock - 1) / kBlock;
  if (W.K % kBlock == 0) {  // rows of whole blocks: the cache's row kernel (SIMD), the same values
    for (int64_t n = 0; n < W.N; ++n)
      fp8_dequant_row(W.w + n * W.K, W.scale + (n / kBlock) * scale_cols, W.K, out + n * W.K);
    return;
  }
  for (int64_t n = 0; n < W.N; ++n)
    for (int64_t k = 0; k < W.K; ++k) {
      const float scale = e8m0_to_f32(W.scale[(n / kBlock) * scale_cols + k / kBlock]);
      out[n * W.K + k] = f32_to_bf16(e4m3_to_f32(W.w[n * W.K + k]) * scale);
    }
}

}  // namespace ds41
