// The SIMD quantized linear layers and act_quant (kernels/simd_gemm_*.inc) against their scalar twins, bit for bit, at every
// ISA level this CPU supports, over random shapes with ragged tails: K not a multiple of the
// 4-lane chunk or the 16-wide decode (dense), block counts not multiples of the 4- or 8-block
// reductions (FP8/FP4), odd N, M = 1 (decode) and M > 1 (prefill tiles), plus the NaN rows the
// kernels hand to the scalar arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/simd_kernels.h"
#include "kernels/simd_level.h"
#include "simd_levels.h"
#include "simd_test_data.h"

namespace ds41 {
namespace {
using namespace simd_test;

TEST(SimdGemm, Fp8MatchesTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(1);
  ThreadPool pool(3);
  for (const Shape& s : kQuantizedShapes) {
    const std::vector<uint16_t> x = random_bf16(s.M * s.K, rng);
    const std::vector<uint8_t> w = random_e4m3(s.N * s.K, rng);
    const std::vector<uint8_t> scale = random_scales(((s.N + 31) / 32) * (s.K / 32), rng);
    const Fp8Matrix W{w.data(), scale.data(), s.N, s.K};
    std::vector<uint16_t> twin(size_t(s.M * s.N)), fast(size_t(s.M * s.N));
    linear_fp8_reference(x.data(), s.M, W, twin.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      std::fill(fast.begin(), fast.end(), 0xdead);
      linear_fp8(x.data(), s.M, W, fast.data(), &pool);
      EXPECT_EQ(first_difference(fast, twin), -1) << describe(l, s);
    }
  }
}

TEST(SimdGemm, Fp4MatchesTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(2);
  ThreadPool pool(3);
  for (const Shape& s : kQuantizedShapes) {
    const std::vector<uint16_t> x = random_bf16(s.M * s.K, rng);
    const std::vector<uint8_t> w = random_bytes(s.N * s.K / 2, rng);
    const std::vector<uint8_t> scale = random_scales(s.N * (s.K / 32), rng);
    const Fp4Matrix W{w.data(), scale.data(), s.N, s.K};
    std::vector<uint16_t> twin(size_t(s.M * s.N)), fast(size_t(s.M * s.N));
    linear_fp4_reference(x.data(), s.M, W, twin.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      std::fill(fast.begin(), fast.end(), 0xdead);
      linear_fp4(x.data(), s.M, W, fast.data(), &pool);
      EXPECT_EQ(first_difference(fast, twin), -1) << describe(l, s);
    }
  }
}

// Batched jobs (MoE experts at decode): FP8 and FP4 jobs of different shapes and row counts in
// one call give each job's single-call bits (and so the twins'), at every level and the scalar one.
TEST(SimdGemm, BatchedJobsMatchSingleCalls) {
  std::mt19937 rng(4);
  ThreadPool pool(3);
  struct JobShape {
    bool fp8;
    int64_t M, N, K;
  };
  const JobShape shapes[] = {{false, 1, 48, 128}, {false, 1, 48, 128}, {true, 1, 37, 96},
                             {false, 2, 16, 224}, {true, 3, 70, 256},  {true, 1, 200, 1024}, {false, 0, 8, 64}};
  struct Data {
    std::vector<uint16_t> x;
    std::vector<uint8_t> w, scale;
    Fp8Matrix w8{};
    Fp4Matrix w4{};
    std::vector<uint16_t> twin, out;
  };
  std::vector<Data> data(std::size(shapes));
  for (size_t j = 0; j < data.size(); ++j) {
    const JobShape& s = shapes[j];
    Data& d = data[j];
    d.x = random_bf16(std::max<int64_t>(s.M, 1) * s.K, rng);
    if (j == 1) d.x = data[0].x;  // w1 and w3 of one expert: the same activations (shared preparation)
    if (s.fp8) {
      d.w = random_e4m3(s.N * s.K, rng);
      d.scale = random_scales(((s.N + 31) / 32) * (s.K / 32), rng);
      d.w8 = Fp8Matrix{d.w.data(), d.scale.data(), s.N, s.K};
    } else {
      d.w = random_bytes(s.N * s.K / 2, rng);
      d.scale = random_scales(s.N * (s.K / 32), rng);
      d.w4 = Fp4Matrix{d.w.data(), d.scale.data(), s.N, s.K};
    }
    d.twin.assign(size_t(s.M * s.N), 0);
    if (s.fp8) linear_fp8_reference(d.x.data(), s.M, d.w8, d.twin.data());
    else linear_fp4_reference(d.x.data(), s.M, d.w4, d.twin.data());
  }
  for (SimdLevel l : with_scalar(supported_simd_levels())) {
    ScopedSimdLevel level(l);
    std::vector<QuantizedLinearJob> jobs;
    for (size_t j = 0; j < data.size(); ++j) {
      Data& d = data[j];
      d.out.assign(d.twin.size(), 0xdead);
      jobs.push_back({(j == 1 ? data[0] : d).x.data(), shapes[j].M, shapes[j].fp8 ? &d.w8 : nullptr, shapes[j].fp8 ? nullptr : &d.w4,
                      d.out.data()});
    }
    linear_quantized_batch(jobs.data(), int(jobs.size()), &pool);
    for (size_t j = 0; j < data.size(); ++j)
      EXPECT_EQ(first_difference(data[j].out, data[j].twin), -1) << simd_level_name(l) << " job " << j;
  }
  QuantizedLinearJob neither{data[0].x.data(), 1, nullptr, nullptr, data[0].out.data()};
  EXPECT_THROW(linear_quantized_batch(&neither, 1, &pool), Error);
}

// Rows [0, rows) of x through W8 and W4 at every SIMD level, against the scalar twins.
void expect_quantized_twins(const std::vector<uint16_t>& x, int64_t rows, const Fp8Matrix& W8, const Fp4Matrix& W4,
                            ThreadPool* pool, const std::string& what) {
  std::vector<uint16_t> twin8(size_t(rows * W8.N)), twin4(size_t(rows * W4.N));
  linear_fp8_reference(x.data(), rows, W8, twin8.data());
  linear_fp4_reference(x.data(), rows, W4, twin4.data());
  for (SimdLevel l : supported_simd_levels()) {
    ScopedSimdLevel level(l);
    std::vector<uint16_t> fast(twin8.size(), 0xdead);
    linear_fp8(x.data(), rows, W8, fast.data(), pool);
    EXPECT_EQ(first_difference(fast, twin8), -1) << simd_level_name(l) << " fp8 " << what;
    fast.assign(twin4.size(), 0xdead);
    linear_fp4(x.data(), rows, W4, fast.data(), pool);
    EXPECT_EQ(first_difference(fast, twin4), -1) << simd_level_name(l) << " fp4 " << what;
  }
}

// The int16 FP8 prefill tile (AVX2 levels, fp8_tile_rows_narrow in simd_gemm_fp8.inc): a block
// whose activation rows and weight columns fit int16 and whose int32 sum bound holds takes integer
// products, every other block double ones, tile by tile and block by block. Checkpoint-like
// weights with some wide blocks (normal_e4m3), activation blocks of every spread (random_bf16),
// and blocks at the bound: two values of 240 (of one sign) and thirty of 2^-7 in an activation
// block and in a weight block give a' = w' = 30720 and |T| = 2 * 30720^2 +- 30, just under 2^31
// (the int path); three of 240 on either side put the bound over it (the double path; an int32
// sum would wrap there, which a bound four times too loose lets through and this test catches). Every row count of a tile
// (5-13, and 50 rows: ragged), K from one block up, one block of zeros; the twin's bits at every
// level, and the preparation against its closed form where a level has it.
TEST(SimdGemm, Fp8NarrowPrefillTileMatchesTwin) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(48);
  ThreadPool pool(2);
  int64_t narrow_blocks = 0, wide_blocks = 0;
  for (const int64_t K : {int64_t{32}, int64_t{96}, int64_t{256}, int64_t{1056}}) {
    for (const int64_t M : {int64_t{5}, int64_t{6}, int64_t{7}, int64_t{13}, int64_t{50}}) {
      const int64_t N = 45, KB = K / 32;
      std::vector<uint16_t> x = random_bf16(M * K, rng);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t b = m % KB, big = m % 3 == 0 ? 2 : m % 3 == 1 ? 3 : 0;
        if (big > 0)
          for (int64_t i = 0; i < 32; ++i)
            x[size_t(m * K + b * 32 + i)] = f32_to_bf16(i < big ? (m % 2 ? -240.0f : 240.0f) : std::ldexp(1.0f, -7));
      }
      // Every eighth block wide, or none: the AVX-512 tiles span 32 columns, so with wide blocks
      // most of their blocks take the double products.
      std::vector<uint8_t> w = normal_e4m3(N * K, rng, M % 2 ? 8 : 1 << 30);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t b = n % KB, big = n % 4 == 0 ? 2 : n % 4 == 1 ? 3 : 0;
        if (big > 0)
          for (int64_t i = 0; i < 32; ++i) w[size_t(n * K + b * 32 + i)] = i < big ? 0x77 : 0x04;  // 240, 2^-7
        if (n == 7) std::fill(w.begin() + n * K, w.begin() + n * K + 32, uint8_t{0});
      }
      const std::vector<uint8_t> scale = random_scales(((N + 31) / 32) * KB, rng);
      const Fp8Matrix W{w.data(), scale.data(), N, K};
      std::vector<uint16_t> twin(size_t(M * N)), fast(size_t(M * N));
      linear_fp8_reference(x.data(), M, W, twin.data());
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        std::fill(fast.begin(), fast.end(), 0xdead);
        linear_fp8(x.data(), M, W, fast.data(), &pool);
        EXPECT_EQ(first_difference(fast, twin), -1) << simd_level_name(l) << " M=" << M << " K=" << K;
        const simd::KernelTable* kt = simd::kernel_table(l);
        if (!kt->prepare_fp8_narrow) continue;
        // The preparation: a' * 2^sh = a9 and factor = 2^sh * scale where the block fits.
        std::vector<uint8_t> codes(static_cast<size_t>(K)), special(1);
        std::vector<float> scales(static_cast<size_t>(KB)), values(static_cast<size_t>(K));
        std::vector<int16_t> narrow(static_cast<size_t>(K));
        std::vector<simd::Fp8NarrowBlock> blocks(static_cast<size_t>(KB));
        for (int64_t m = 0; m < M; ++m) {
          kt->prepare_fp8_row(x.data() + m * K, K, codes.data(), scales.data(), values.data(), nullptr, special.data());
          kt->prepare_fp8_narrow(codes.data(), scales.data(), K, narrow.data(), blocks.data());
          if (special[0]) continue;
          for (int64_t b = 0; b < KB; ++b) {
            const simd::Fp8NarrowBlock& e = blocks[size_t(b)];
            int64_t most = 0, l1 = 0, any = 0;
            for (int64_t i = 0; i < 32; ++i) {
              const int64_t a9 = std::llround(double(e4m3_to_f32(codes[size_t(b * 32 + i)])) * 512.0);
              most = std::max<int64_t>(most, std::llabs(a9));
              l1 += std::llabs(a9);
              any |= std::llabs(a9);
            }
            const int sh = any ? std::countr_zero(uint64_t(any)) : 0;
            const bool fits = (most >> sh) <= 32767;
            ASSERT_EQ(e.factor != 0.0f, fits) << "row " << m << " block " << b;
            if (!fits) {
              ++wide_blocks;
              continue;
            }
            ++narrow_blocks;
            ASSERT_EQ(e.factor, std::ldexp(scales[size_t(b)], sh));
            ASSERT_EQ(e.max, most >> sh);
            ASSERT_EQ(e.l1, l1 >> sh);
            for (int64_t i = 0; i < 32; ++i)
              ASSERT_EQ(int64_t(narrow[size_t(b * 32 + i)]) << sh,
                        std::llround(double(e4m3_to_f32(codes[size_t(b * 32 + i)])) * 512.0));
          }
        }
      }
    }
  }
  // Where a level prepares them, both kinds of activation block were met.
  if (narrow_blocks + wide_blocks > 0) {
    EXPECT_GT(narrow_blocks, 10 * wide_blocks / 100);
    EXPECT_GT(wide_blocks, 0);
  }
}

// Extreme activation blocks: the largest E4M3 magnitudes (a9 = +-448 * 2^9, the int32 limits of
// the FP4 chunks), the smallest subnormals, and +-448 against 2^-9 in one block (the widest
// exponent spread an exact FP8 block sum must hold).
TEST(SimdGemm, ExtremeBlocksMatchTwin) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  const int64_t M = 3, N = 11, K = 96;
  std::vector<uint16_t> x(size_t(M * K));
  for (int64_t k = 0; k < K; ++k) {
    x[size_t(k)] = f32_to_bf16(k % 2 ? -448.0f : 448.0f);            // all at the E4M3 maximum
    x[size_t(K + k)] = f32_to_bf16(k == 0 ? 448.0f : std::ldexp(1.0f, -9) * float(k % 8));
    x[size_t(2 * K + k)] = f32_to_bf16(k % 3 ? -448.0f : std::ldexp(1.0f, -12));
  }
  std::vector<uint8_t> w8(size_t(N * K)), w4(size_t(N * K / 2));
  for (int64_t i = 0; i < N * K; ++i) w8[size_t(i)] = i % 5 == 0 ? 0xFE : i % 5 == 1 ? 0x7E : i % 5 == 2 ? 0x01 : 0x81;
  for (int64_t i = 0; i < N * K / 2; ++i) w4[size_t(i)] = i % 3 == 0 ? 0x7F : i % 3 == 1 ? 0xF7 : 0x88;
  const std::vector<uint8_t> s8(size_t(3), 127), s4(size_t(N * 3), 127);
  const Fp8Matrix W8{w8.data(), s8.data(), N, K};
  const Fp4Matrix W4{w4.data(), s4.data(), N, K};
  for (int64_t rows : {int64_t{1}, M}) expect_quantized_twins(x, rows, W8, W4, nullptr, std::to_string(rows) + " rows");
}

// Blocks at the bounds of the kernels' exactness arguments, which random data seldom reaches:
// activations all at the E4M3 maximum, or one maximum setting the scale and the rest at the
// smallest subnormal (-2^-9: every base-2^7 digit of a * 2^9 is 127, the largest 8-bit products)
// or the largest one; weights all +max, all -max, alternating, or the smallest code. These give
// the largest running sums of the AVX2 FP8 chain (4 * 448^2 per lane) and the largest int16 pair
// sums of the FP4 kernels (4 * 2 * 24 * 127 for four groups), at decode and prefill row counts.
TEST(SimdGemm, WorstCaseSumsMatchTwinAtEveryRowCount) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  ThreadPool pool(2);
  const int64_t N = 40, K = 256;
  const float tiny = std::ldexp(1.0f, -9);
  for (int64_t M : {1, 2, 4, 5, 64}) {
    std::vector<uint16_t> x(size_t(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t pattern = (k / 32 + m) % 4, i = k % 32;
        const float v = pattern == 0 ? 448.0f
                        : pattern == 1 ? (i == 0 ? 448.0f : -tiny)
                        : pattern == 2 ? (i % 2 ? -448.0f : 448.0f)
                                       : (i == 0 ? 448.0f : 7.0f * tiny);
        x[size_t(m * K + k)] = f32_to_bf16(v);
      }
    std::vector<uint8_t> w8(size_t(N * K)), w4(size_t(N * K / 2));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t pattern = (n + k / 32) % 4;
        w8[size_t(n * K + k)] = pattern == 0 ? 0x7e : pattern == 1 ? 0xfe : pattern == 2 ? (k % 2 ? 0xfe : 0x7e) : 0x01;
        const uint8_t nibble = pattern == 0 ? 0x7 : pattern == 1 ? 0xf : pattern == 2 ? (k % 2 ? 0xf : 0x7) : 0x1;
        w4[size_t(n * K / 2 + k / 2)] |= uint8_t(k % 2 ? nibble << 4 : nibble);
      }
    const std::vector<uint8_t> scale8(size_t(((N + 31) / 32) * (K / 32)), 127), scale4(size_t(N * (K / 32)), 127);
    const Fp8Matrix W8{w8.data(), scale8.data(), N, K};
    const Fp4Matrix W4{w4.data(), scale4.data(), N, K};
    expect_quantized_twins(x, M, W8, W4, &pool, "M=" + std::to_string(M));
  }
}

// The row ranges of 600 outputs that take a one-row decode through every tier of its rows (runs
// of 16 s rows, adjacent groups of 16, single rows): decode(n0, n1, y) writes rows [n0, n1) of y,
// which must hold the twin's values there and nothing written anywhere else (from a rows16 copy
// the ranges hold 37, 32, 16, 36, 31, 3 and 6 whole groups: every count of side-by-side streams
// with runs left over). step(rows): the decode's s for a range of `rows`, for the message.
template <class Decode, class Step>
void expect_row_ranges_match(const std::vector<uint16_t>& twin, const Decode& decode, const Step& step,
                             const std::string& what) {
  constexpr uint16_t kUnwritten = 0xdead;
  ASSERT_EQ(twin.size(), 600u);
  for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, 600}, {0, 512}, {256, 512}, {3, 600}, {17, 530},
                               {240, 290}, {40, 150}, {100, 116}, {7, 20}, {590, 600}}) {
    std::vector<uint16_t> fast(twin.size(), kUnwritten);
    decode(n0, n1, fast.data());
    for (int64_t n = 0; n < int64_t(fast.size()); ++n) {
      const uint16_t want = n >= n0 && n < n1 ? twin[size_t(n)] : kUnwritten;
      ASSERT_EQ(fast[size_t(n)], want) << what << " step " << step(n1 - n0) << " rows [" << n0 << ", " << n1
                                       << ") row " << n;
    }
  }
}

// Activation rows prepared for a level's fp8 kernel (codes, scales, decode-order values, and the
// VBMI digit planes where the level reads them), [M][K].
struct Fp8DecodeRows {
  std::vector<uint8_t> codes, special;
  std::vector<float> scales, values;
  std::vector<int8_t> digits;
  simd::Fp8Activations a;
  Fp8DecodeRows(const simd::KernelTable& kt, const uint16_t* x, int64_t M, int64_t K)
      : codes(size_t(M * K)), special(size_t(M)), scales(size_t(M * K / 32)), values(size_t(M * K)),
        digits(size_t(3 * M * K)) {
    for (int64_t r = 0; r < M; ++r) {
      kt.prepare_fp8_row(x + r * K, K, codes.data() + r * K, scales.data() + r * K / 32, values.data() + r * K,
                         nullptr, special.data() + r);
      if (kt.prepare_fp8_digits) kt.prepare_fp8_digits(codes.data() + r * K, K, digits.data() + 3 * r * K);
    }
    a = simd::Fp8Activations{values.data(), scales.data(), codes.data(), special.data(), K,
                             kt.prepare_fp8_digits ? digits.data() : nullptr};
  }
  Fp8DecodeRows(const Fp8DecodeRows&) = delete;  // `a` points into this object's vectors
  Fp8DecodeRows& operator=(const Fp8DecodeRows&) = delete;
};

// One activation row prepared for the FP4 kernels (act_quant codes and scales, chunk planes).
struct Fp4DecodeRow {
  std::vector<uint8_t> codes, special;
  std::vector<float> raw_scales, scales;
  std::vector<int8_t> chunks;
  std::vector<int32_t> offsets;
  simd::Fp4Activations a;
  Fp4DecodeRow(const simd::KernelTable& kt, const uint16_t* x, int64_t K, bool narrow = true)
      : codes(size_t(K)), special(1), raw_scales(size_t(K / 32)), scales(size_t(K / 32)),
        chunks(size_t(simd::fp4_chunk_row_bytes(K))), offsets(size_t(K / 32)) {
    kt.prepare_fp4_row(x, K, codes.data(), raw_scales.data(), chunks.data(), offsets.data(), scales.data(),
                       special.data(), narrow);
    a = simd::Fp4Activations{chunks.data(), offsets.data(), scales.data(), codes.data(), raw_scales.data(),
                             special.data(), K};
  }
  Fp4DecodeRow(const Fp4DecodeRow&) = delete;  // `a` points into this object's vectors
  Fp4DecodeRow& operator=(const Fp4DecodeRow&) = delete;
};

// NaN weight codes, NaN activations and NaN (0xFF) scales leave the SIMD arithmetic: the results
// must still be the twin's bits (NaN payloads included), and only where the NaN reaches.
// The VBMI FP8 decode reads runs of 16 s rows with lanes s rows apart (s = 1..16 by K and the
// range, fp8_decode_row_step), then groups of 16 adjacent rows, then single rows: every kind of
// range, with NaN codes inside a strided group, an adjacent group and a single row, must give the
// twin's values, and nothing outside the range may be written.
TEST(SimdGemm, Fp8DecodeRowRangesMatchTwin) {
  std::mt19937 rng(8);
  for (SimdLevel l : supported_simd_levels()) {
    const simd::KernelTable* kt = simd::kernel_table(l);
    ASSERT_NE(kt, nullptr);
    if (!kt->prepare_fp8_digits) continue;  // the avx512vbmi levels only
    // K: s = 16, 8, 4, 2 (3072 = rows 1.5 pages apart), 1; with the ranges below: every tier.
    for (const int64_t K : {int64_t{256}, int64_t{512}, int64_t{1024}, int64_t{3072}, int64_t{4128}}) {
      const int64_t N = 600, KB = K / 32;
      const std::vector<uint16_t> x = random_bf16(K, rng);
      std::vector<uint8_t> w = random_e4m3(N * K, rng);
      for (const int64_t row : {int64_t{19}, int64_t{262}, int64_t{517}, int64_t{593}})
        w[size_t(row * K + (row * 7) % K)] = (row % 2) ? 0x7f : 0xff;
      const std::vector<uint8_t> scale = random_scales(((N + 31) / 32) * KB, rng);
      const Fp8Matrix W{w.data(), scale.data(), N, K};
      std::vector<uint16_t> twin(static_cast<size_t>(N));
      linear_fp8_reference(x.data(), 1, W, twin.data());
      const Fp8DecodeRows row(*kt, x.data(), 1, K);
      ASSERT_EQ(row.special[0], 0);
      const simd::Fp8Activations& a = row.a;
      expect_row_ranges_match(
          twin, [&](int64_t n0, int64_t n1, uint16_t* y) { kt->fp8(a, 1, W, n0, n1, y, N); },
          [&](int64_t rows) { return simd::fp8_decode_row_step(K, rows); },
          std::string(simd_level_name(l)) + " K=" + std::to_string(K));
    }
  }
}

// linear_fp8 / linear_fp4 of `W` (a matrix with a rows16 copy) and the batched call, at 1-4 rows
// of x, give the twin's rows (twin: 4 rows of outputs).
template <class Matrix>
void expect_linear_rows_match_twin(const std::vector<uint16_t>& x, const Matrix& W, const std::vector<uint16_t>& twin,
                                   const std::string& what) {
  ThreadPool pool(3);
  const int64_t N = W.N;
  for (int64_t rows = 1; rows <= 4; ++rows) {
    std::vector<uint16_t> fast(size_t(rows * N)), batched(size_t(rows * N));
    QuantizedLinearJob job{x.data(), rows, nullptr, nullptr, batched.data()};
    if constexpr (std::is_same_v<Matrix, Fp8Matrix>) {
      linear_fp8(x.data(), rows, W, fast.data(), &pool);
      job.fp8 = &W;
    } else {
      linear_fp4(x.data(), rows, W, fast.data(), &pool);
      job.fp4 = &W;
    }
    EXPECT_EQ(first_difference(fast, std::vector<uint16_t>(twin.begin(), twin.begin() + rows * N)), -1)
        << what << " linear, rows " << rows;
    linear_quantized_batch(&job, 1, &pool);
    EXPECT_EQ(first_difference(batched, fast), -1) << what << " batch, rows " << rows;
  }
}

// The one-row FP8 decode from a rows16 copy (the AVX2 copy kernel, the VBMI streams) at every
// level, 1 and 3 activation rows (and 1-4 through linear_fp8 and the batched call), every kind of range (groups of 16 from the copy, rows before
// and after them from the rows), NaN codes inside copied groups, K from one block up, and the
// largest block sums E4M3 allows (every code 448, both signs, against activations of 448: the
// AVX2 kernel's 16-product chains at their bound): the twin's bits, nothing written outside.
TEST(SimdGemm, Fp8DecodeFromRows16CopyMatchesTwin) {
  std::mt19937 rng(21);
  for (SimdLevel l : supported_simd_levels()) {
    const simd::KernelTable* kt = simd::kernel_table(l);
    ASSERT_NE(kt, nullptr);
    for (const int64_t K : {int64_t{32}, int64_t{96}, int64_t{256}, int64_t{1024}, int64_t{4128}}) {
      for (const bool extreme : {false, true}) {
        const int64_t N = 600, KB = K / 32;
        std::vector<uint8_t> w = random_e4m3(N * K, rng);
        std::vector<uint16_t> x = random_bf16(4 * K, rng);
        if (extreme) {
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < K; ++k) w[size_t(n * K + k)] = (n / 16) % 2 ? 0xfe : 0x7e;  // -448 / 448
          for (uint16_t& v : x) v = 0x4000;  // 2.0: act_quant maps every block to codes of 448
        } else {
          for (const int64_t row : {int64_t{19}, int64_t{262}, int64_t{517}, int64_t{593}})
            w[size_t(row * K + (row * 7) % K)] = (row % 2) ? 0x7f : 0xff;
        }
        const std::vector<uint8_t> scale = random_scales(((N + 31) / 32) * KB, rng);
        Fp8Matrix W{w.data(), scale.data(), N, K};
        std::vector<uint8_t> copy(size_t(fp8_rows16_bytes(W)));
        pack_fp8_rows16(W, copy.data());
        W.rows16 = copy.data();
        for (const int64_t M : {int64_t{1}, int64_t{3}}) {
          std::vector<uint16_t> twin(size_t(M * N));
          linear_fp8_reference(x.data(), M, W, twin.data());
          const Fp8DecodeRows rows(*kt, x.data(), M, K);
          for (int64_t r = 0; r < M; ++r) {
            const std::vector<uint16_t> twin_row(twin.begin() + r * N, twin.begin() + (r + 1) * N);
            expect_row_ranges_match(
                twin_row,
                [&](int64_t n0, int64_t n1, uint16_t* y) {
                  // All M rows are decoded; row r's outputs are compared (the others to a scratch).
                  std::vector<uint16_t> all(size_t(M * N), 0xdead);
                  for (int64_t n = 0; n < N; ++n) all[size_t(r * N + n)] = y[n];
                  kt->fp8(rows.a, M, W, n0, n1, all.data(), N);
                  for (int64_t n = 0; n < N; ++n) y[n] = all[size_t(r * N + n)];
                },
                [&](int64_t) { return 1; },
                std::string(simd_level_name(l)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) +
                    " row " + std::to_string(r) + (extreme ? " extreme" : ""));
          }
        }
        // And linear_fp8 / the batched call at 1-4 rows (the thread split's ranges).
        std::vector<uint16_t> twin4(size_t(4 * N));
        linear_fp8_reference(x.data(), 4, W, twin4.data());
        ScopedSimdLevel level(l);
        expect_linear_rows_match_twin(x, W, twin4, std::string(simd_level_name(l)) + " fp8 rows16 K=" + std::to_string(K));
      }
    }
  }
}

// The AVX2 FP8 decode's two ways with subnormal weight codes (simd_gemm_fp8.inc): with
// subnormal_inputs_slow() off every block takes the fp32 decode, with it on the blocks holding a
// subnormal code take the F16C one (in the copy kernel by the copy's flags, in the row kernels by a
// check per pass). Weights without subnormals except in some blocks (one code of 1..7, either sign,
// at a random place; NaN codes in some such blocks of rows 48 and on), so both ways alternate
// within a row and a group; the first three groups free of NaN codes, so that the copy kernel
// decodes them whole (a group with a NaN code goes row by row: with NaN codes anywhere, almost
// every group had, and the copy's F16C way went untested); ragged N (rows outside the copy's
// groups), K of 1 to 129 blocks (tails of the 4-block passes); 1-4 activation rows with and
// without the copy: the twin's bits at every level, each way.
TEST(SimdGemm, Fp8DecodeSubnormalWaysMatchTwin) {
  std::mt19937 rng(33);
  for (const int64_t K : {int64_t{32}, int64_t{160}, int64_t{1024}, int64_t{4128}}) {
    const int64_t N = 83, KB = K / 32;
    std::vector<uint8_t> w = random_e4m3(N * K, rng);
    for (uint8_t& c : w)
      if ((c & 0x78) == 0 && (c & 7) != 0) c = uint8_t((c & 0x80) | 0x38);  // subnormals -> +-1.0
    std::uniform_int_distribution<int> pick(0, 4), code(1, 7), at(0, 31);
    int64_t flagged = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < KB; ++b)
        if (pick(rng) == 0) {
          w[size_t(n * K + b * 32 + at(rng))] = uint8_t(code(rng) | (rng() & 0x80));
          if (n >= 48 && pick(rng) == 0) w[size_t(n * K + b * 32 + at(rng))] = (rng() & 1) ? 0x7f : 0xff;
          ++flagged;
        }
    ASSERT_GT(flagged, 0);
    const std::vector<uint8_t> scale = random_scales(((N + 31) / 32) * KB, rng);
    const std::vector<uint16_t> x = random_bf16(4 * K, rng);
    std::vector<uint16_t> twin(size_t(4 * N));
    Fp8Matrix W{w.data(), scale.data(), N, K};
    linear_fp8_reference(x.data(), 4, W, twin.data());
    std::vector<uint8_t> copy(size_t(fp8_rows16_bytes(W)));
    pack_fp8_rows16(W, copy.data());
    for (SimdLevel l : supported_simd_levels()) {
      ScopedSimdLevel level(l);
      for (const bool slow : {false, true}) {
        ScopedSubnormalInputs inputs(slow);
        const std::string what = std::string(simd_level_name(l)) + (slow ? " slow" : " fast") +
                                 " subnormal inputs, K=" + std::to_string(K);
        W.rows16 = nullptr;
        expect_linear_rows_match_twin(x, W, twin, what + " rows");
        W.rows16 = copy.data();
        expect_linear_rows_match_twin(x, W, twin, what + " rows16 copy");
      }
    }
  }
}

// subnormal_inputs_slow() answers what it was set to, and a scope restores the answer before it;
// DS41_SUBNORMAL_INPUTS's values (auto is neither: the CPU decides).
TEST(SimdLevel, SubnormalInputsCanBeSet) {
  EXPECT_EQ(parse_subnormal_inputs("slow"), std::optional<bool>(true));
  EXPECT_EQ(parse_subnormal_inputs("fast"), std::optional<bool>(false));
  EXPECT_FALSE(parse_subnormal_inputs("auto").has_value());
  EXPECT_FALSE(parse_subnormal_inputs("Slow").has_value());
  const bool before = subnormal_inputs_slow();
  {
    ScopedSubnormalInputs slow(true);
    EXPECT_TRUE(subnormal_inputs_slow());
    set_subnormal_inputs_slow(false);
    EXPECT_FALSE(subnormal_inputs_slow());
  }
  EXPECT_EQ(subnormal_inputs_slow(), before);
}

// The rows16 layout (gemm.h) of a matrix of `row_bytes` bytes a row whose 32-column blocks take
// block_row_bytes of them (32 codes FP8, 16 bytes FP4): pack(out) must write, for each group of
// 16 rows and block b, the block's 16 x block_row_bytes bytes at (g / 16 * blocks + b) * 16 *
// block_row_bytes, 4 bytes of each row in turn, then (FP8) a flag byte per group and block or
// (FP4) the 16 rows' scale codes per group and block (fp4_scales: the matrix's [N, blocks]) and a
// flag byte per group (a code 0 or 255 among them), and nothing past copy_bytes.
template <class Pack>
void expect_rows16_layout(const std::vector<uint8_t>& w, int64_t N, int64_t row_bytes, int64_t block_row_bytes,
                          int64_t copy_bytes, const Pack& pack, const std::string& what,
                          const std::vector<uint8_t>& fp4_scales = {}) {
  const int64_t blocks = row_bytes / block_row_bytes;
  const bool fp8 = block_row_bytes == 32;
  ASSERT_EQ(copy_bytes, N / 16 * 16 * row_bytes + (fp8 ? N / 16 * blocks : N / 16 * 16 * blocks + N / 16)) << what;
  std::vector<uint8_t> out(size_t(copy_bytes) + 1, 0xa5);
  pack(out.data());
  for (int64_t g = 0; g + 16 <= N; g += 16)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t d = 0; d < block_row_bytes / 4; ++d)
        for (int64_t l = 0; l < 16; ++l)
          for (int64_t j = 0; j < 4; ++j)
            ASSERT_EQ(out[size_t((g / 16 * blocks + b) * 16 * block_row_bytes + 64 * d + 4 * l + j)],
                      w[size_t((g + l) * row_bytes + block_row_bytes * b + 4 * d + j)])
                << what << " g=" << g << " b=" << b << " d=" << d << " l=" << l;
  if (fp8)
    for (int64_t g = 0; g + 16 <= N; g += 16)
      for (int64_t b = 0; b < blocks; ++b) {
        bool subnormal = false, nan = false;
        for (int64_t l = 0; l < 16; ++l)
          for (int64_t k = 0; k < 32; ++k) {
            const uint8_t c = w[size_t((g + l) * row_bytes + 32 * b + k)] & 0x7f;
            subnormal |= c >= 1 && c <= 7;
            nan |= c == 0x7f;
          }
        ASSERT_EQ(out[size_t(N / 16 * 16 * row_bytes + g / 16 * blocks + b)], (subnormal ? 1 : 0) | (nan ? 2 : 0))
            << what << " flags of g=" << g << " b=" << b;
      }
  else
    for (int64_t g = 0; g + 16 <= N; g += 16)
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t l = 0; l < 16; ++l)
          ASSERT_EQ(out[size_t(N / 16 * 16 * row_bytes + (g / 16 * blocks + b) * 16 + l)],
                    fp4_scales[size_t((g + l) * blocks + b)])
              << what << " scale of g=" << g << " b=" << b << " l=" << l;
  if (!fp8)
    for (int64_t g = 0; g + 16 <= N; g += 16) {
      bool special = false;
      for (int64_t l = 0; l < 16; ++l)
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t code = fp4_scales[size_t((g + l) * blocks + b)];
          special |= code == 0 || code == 255;
        }
      ASSERT_EQ(out[size_t(N / 16 * 16 * row_bytes + N / 16 * 16 * blocks + g / 16)], special ? 1 : 0)
          << what << " special-scale flag of g=" << g;
    }
  EXPECT_EQ(out.back(), 0xa5) << what << ": wrote past the copy's size";
}

// pack_fp8_rows16 and pack_fp4_rows16 lay out each group of 16 rows and 32-column block as gemm.h
// defines it (512 and 256 bytes a block), and refuse a K that is not a multiple of 32.
TEST(SimdGemm, Rows16LayoutIsTheDefinition) {
  static_assert(kFp8Rows16BlockBytes == 16 * 32 && kFp4Rows16BlockBytes == 16 * 16);
  std::mt19937 rng(21);
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{16, 32}, {37, 96}, {64, 256}, {15, 64}}) {
    const std::string what = "N=" + std::to_string(N) + " K=" + std::to_string(K);
    std::vector<uint8_t> w8 = random_bytes(N * K, rng);
    const std::vector<uint8_t> w4 = random_bytes(N * K / 2, rng);
    std::vector<uint8_t> s4 = random_bytes(N * K / 32, rng);
    for (int64_t n = 16; n < std::min<int64_t>(N, 32); ++n)  // the second group (if any) without codes 0 and 255
      for (int64_t b = 0; b < K / 32; ++b) {
        uint8_t& c = s4[size_t(n * (K / 32) + b)];
        if (c == 0 || c == 255) c = 127;
      }
    s4[0] = 255;  // the first group with one
    // The groups' blocks in turn without subnormal codes, without NaN codes, without either, or
    // random (nearly all of those hold both): every combination of the two flags.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        uint8_t& c = w8[size_t(n * K + k)];
        const int64_t kind = (n / 16 + k / 32) % 4;
        if ((kind == 0 || kind == 2) && (c & 0x78) == 0) c &= 0x80;
        if ((kind == 1 || kind == 2) && (c & 0x7f) == 0x7f) c &= 0xfe;
      }
    const Fp8Matrix W8{w8.data(), nullptr, N, K};
    const Fp4Matrix W4{w4.data(), s4.data(), N, K};
    expect_rows16_layout(w8, N, K, 32, fp8_rows16_bytes(W8), [&](uint8_t* out) { pack_fp8_rows16(W8, out); },
                         "fp8 " + what);
    expect_rows16_layout(w4, N, K / 2, 16, fp4_rows16_bytes(W4), [&](uint8_t* out) { pack_fp4_rows16(W4, out); },
                         "fp4 " + what, s4);
  }
  const std::vector<uint8_t> w(16 * 40);
  std::vector<uint8_t> out(16 * 40);
  EXPECT_THROW(pack_fp8_rows16(Fp8Matrix{w.data(), nullptr, 16, 40}, out.data()), Error);
  EXPECT_THROW(pack_fp4_rows16(Fp4Matrix{w.data(), nullptr, 16, 40}, out.data()), Error);
}

// The AVX-512 FP4 decode reads runs of 16 s rows with lanes s rows apart (fp4_decode_row_step:
// s = 1..16 by K and the range), then groups of 16 adjacent rows, then single rows: every kind of
// range must give the twin's values, with NaN (0xFF) scale codes in a strided group, an adjacent
// group and a single row, block counts that leave the 16-block scale loads ragged, and nothing
// outside the range written. Run on every level (AVX2 reads row by row: the same values).
TEST(SimdGemm, Fp4DecodeRowRangesMatchTwin) {
  std::mt19937 rng(9);
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  // K / 2 bytes per row: 128 (s up to 16), 512 (8), 1168 (the long-row rule, 73 blocks: a
  // ragged 16-block step of scale codes and of the row kernel's 8-block steps), 2048.
  for (const int64_t K : {int64_t{256}, int64_t{1024}, int64_t{2336}, int64_t{4096}}) {
    const int64_t N = 600, KB = K / 32;
    const std::vector<uint16_t> x = random_bf16(K, rng);
    const std::vector<uint8_t> w = random_bytes(N * K / 2, rng);
    std::vector<uint8_t> scale = random_scales(N * KB, rng);
    for (const int64_t row : {int64_t{19}, int64_t{262}, int64_t{517}, int64_t{593}})
      scale[size_t(row * KB + (row * 7) % KB)] = 0xFF;
    const Fp4Matrix W{w.data(), scale.data(), N, K};
    std::vector<uint16_t> twin(static_cast<size_t>(N));
    linear_fp4_reference(x.data(), 1, W, twin.data());
    for (SimdLevel l : levels) {
      const simd::KernelTable* kt = simd::kernel_table(l);
      ASSERT_NE(kt, nullptr);
      const Fp4DecodeRow row(*kt, x.data(), K);
      ASSERT_EQ(row.special[0], 0);
      const simd::Fp4Activations& a = row.a;
      expect_row_ranges_match(
          twin, [&](int64_t n0, int64_t n1, uint16_t* y) { kt->fp4(a, 1, W, n0, n1, y, N); },
          [&](int64_t rows) { return simd::fp4_decode_row_step(K, rows); },
          std::string(simd_level_name(l)) + " K=" + std::to_string(K));
    }
  }
}

// Activation blocks that drop their third digit plane (prepare_fp4_row `narrow`: the block's
// integers a9 >> sh in [-2^14, 2^14), the scale times 2^sh) and the kernels that skip a zero
// plane (the AVX2 copy kernel block by block, the row kernels by pairs / quads of blocks, the
// AVX2 tile): rows whose blocks cycle through values of a few binades (narrow), Gaussian with one tiny value
// (three planes), zero, an outlier, and the edges -2^14 (narrow) and +2^14 (not), so that pairs
// and quads of blocks mix both kinds; ragged block counts (a lone last block), 1-4 rows through
// the decode kernels and 5-17 through the tiles, with and without a rows16 copy, at every
// level: the twin's bits, and the same as preparing every block with three planes.
TEST(SimdGemm, Fp4NarrowActivationBlocksMatchTwin) {
  std::mt19937 rng(48);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  for (const int64_t K : {int64_t{32}, int64_t{96}, int64_t{160}, int64_t{1056}}) {
    const int64_t KB = K / 32, N = 70, M = 17;
    std::vector<uint16_t> x(size_t(M * K));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < KB; ++b) {
        uint16_t* v = x.data() + r * K + b * 32;
        const int kind = int((r * 5 + b * 3) % 6);
        const float scale = std::ldexp(1.0f, int(rng() % 9) - 4);
        for (int i = 0; i < 32; ++i) {
          const float n = normal(rng);  // kind 0: |values| in [0.25, ~4] x scale, always narrow
          v[i] = f32_to_bf16(kind == 2 ? 0.0f : kind == 0 ? std::copysign(0.25f + std::fabs(n), n) * scale : n * scale);
        }
        if (kind == 1) v[7] = f32_to_bf16(std::ldexp(scale, -14));  // a value 2^-14 of the rest: three planes
        if (kind == 3) v[19] = f32_to_bf16(-40.0f * scale);         // an outlier
        if (kind == 4 || kind == 5) {
          // E4M3 values -256 or +256 beside 2^-6 (after the block's scale, amax 256 -> 256):
          // a9 = -+2^17 and 2^3, so a = a9 >> 3 = -+2^14: -2^14 is the narrow form's least
          // integer, +2^14 one past its greatest.
          for (int i = 0; i < 32; ++i) v[i] = f32_to_bf16(i == 0 ? (kind == 4 ? -256.0f : 256.0f) * scale
                                                           : i == 1 ? std::ldexp(scale, -6) : 0.0f);
        }
      }
    const std::vector<uint8_t> w = random_bytes(N * K / 2, rng);
    const std::vector<uint8_t> scale = random_scales(N * KB, rng);
    Fp4Matrix W{w.data(), scale.data(), N, K};
    std::vector<uint16_t> twin(size_t(M * N));
    linear_fp4_reference(x.data(), M, W, twin.data());
    std::vector<uint8_t> copy(size_t(fp4_rows16_bytes(W)));
    pack_fp4_rows16(W, copy.data());
    for (SimdLevel l : levels) {
      const simd::KernelTable* kt = simd::kernel_table(l);
      ASSERT_NE(kt, nullptr);
      const std::string what = std::string(simd_level_name(l)) + " K=" + std::to_string(K);
      // The prepared rows: narrow blocks have a zero third plane and their integers in range;
      // both kinds occur (the test is not vacuous); without `narrow` the outputs are the same.
      int narrow_blocks = 0, wide_blocks = 0;
      for (int64_t r = 0; r < M; ++r) {
        const Fp4DecodeRow narrow(*kt, x.data() + r * K, K, true), plain(*kt, x.data() + r * K, K, false);
        for (int64_t b = 0; b < KB; ++b) {
          bool zero = true;
          for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 16; ++i) zero = zero && narrow.chunks[size_t(simd::fp4_chunk_offset(b, 2, h) + i)] == 0;
          const bool plain_zero = [&] {
            for (int h = 0; h < 2; ++h)
              for (int i = 0; i < 16; ++i)
                if (plain.chunks[size_t(simd::fp4_chunk_offset(b, 2, h) + i)] != 0) return false;
            return true;
          }();
          const int kind = int((r * 5 + b * 3) % 6);
          if (kind == 0 || kind == 4) {
            EXPECT_TRUE(zero) << what << " row " << r << " block " << b;
          }
          if (kind == 1 || kind == 5) {
            EXPECT_FALSE(zero) << what << " row " << r << " block " << b;
          }
          (zero && !plain_zero ? narrow_blocks : wide_blocks) += 1;
        }
        for (int64_t n0 : {int64_t{0}, int64_t{5}}) {
          std::vector<uint16_t> a(size_t(N), 0), b(size_t(N), 0);
          kt->fp4(narrow.a, 1, W, n0, N, a.data(), N);
          kt->fp4(plain.a, 1, W, n0, N, b.data(), N);
          EXPECT_EQ(first_difference(a, b), -1) << what << " row " << r << " from " << n0;
          EXPECT_EQ(first_difference(std::vector<uint16_t>(a.begin() + n0, a.end()),
                                     std::vector<uint16_t>(twin.begin() + r * N + n0, twin.begin() + (r + 1) * N)),
                    -1)
              << what << " row " << r << " from " << n0;
        }
      }
      EXPECT_GT(narrow_blocks, 0) << what;
      EXPECT_GT(wide_blocks, 0) << what;
      ScopedSimdLevel level(l);
      ThreadPool pool(2);
      for (const bool with_copy : {false, true}) {
        W.rows16 = with_copy ? copy.data() : nullptr;
        for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{17}}) {
          std::vector<uint16_t> y(size_t(rows * N));
          linear_fp4(x.data(), rows, W, y.data(), &pool);
          EXPECT_EQ(first_difference(y, std::vector<uint16_t>(twin.begin(), twin.begin() + rows * N)), -1)
              << what << " rows " << rows << (with_copy ? " rows16" : "");
        }
      }
      W.rows16 = nullptr;
    }
  }
}

// The FP4 decodes reading the rows16 copy (AVX2: one group of 16 rows at a time; AVX-512: up to
// four streams side by side): every kind of range (groups of 16 from the copy, the rows around them and the N % 16 tail from the
// checkpoint layout), NaN (0xFF) and 2^-127 (0) scale codes inside copied groups and in the tail
// and groups with neither, block counts that leave the 16-block scale loads ragged: the twin's
// values and nothing written outside the range; and so for linear_fp4 and the batched call at
// 1-4 rows.
TEST(SimdGemm, Fp4DecodeFromRows16CopyMatchesTwin) {
  std::mt19937 rng(24);
  for (SimdLevel l : supported_simd_levels()) {
    const simd::KernelTable* kt = simd::kernel_table(l);
    ASSERT_NE(kt, nullptr);
    if (!kt->fp4_decode_rows16) continue;
    for (const int64_t K : {int64_t{32}, int64_t{256}, int64_t{1024}, int64_t{2336}}) {
      const int64_t N = 600, KB = K / 32;
      const std::vector<uint16_t> x = random_bf16(4 * K, rng);
      const std::vector<uint8_t> w = random_bytes(N * K / 2, rng);
      std::vector<uint8_t> scale = random_scales(N * KB, rng);
      // Rows below 300 without code 0 (2^-127): their groups without a NaN code take the AVX2
      // copy kernel's way for groups with neither (fp4_rows16_special_scales), the others the other way.
      for (int64_t i = 0; i < 300 * KB; ++i)
        if (scale[size_t(i)] == 0) scale[size_t(i)] = 1;
      for (const int64_t row : {int64_t{19}, int64_t{262}, int64_t{517}, int64_t{598}})
        scale[size_t(row * KB + (row * 7) % KB)] = 0xFF;
      Fp4Matrix W{w.data(), scale.data(), N, K};
      std::vector<uint8_t> copy(size_t(fp4_rows16_bytes(W)));
      pack_fp4_rows16(W, copy.data());
      W.rows16 = copy.data();
      std::vector<uint16_t> twin(static_cast<size_t>(4 * N));
      linear_fp4_reference(x.data(), 4, W, twin.data());
      const Fp4DecodeRow row(*kt, x.data(), K);
      ASSERT_EQ(row.special[0], 0);
      const simd::Fp4Activations& a = row.a;
      expect_row_ranges_match(
          std::vector<uint16_t>(twin.begin(), twin.begin() + N),
          [&](int64_t n0, int64_t n1, uint16_t* y) { kt->fp4(a, 1, W, n0, n1, y, N); }, [](int64_t) { return 1; },
          std::string(simd_level_name(l)) + " rows16 K=" + std::to_string(K));
      ScopedSimdLevel level(l);
      expect_linear_rows_match_twin(x, W, twin, std::string(simd_level_name(l)) + " fp4 rows16 K=" + std::to_string(K));
    }
  }
}

TEST(SimdGemm, NaNsTakeTheTwinsArithmetic) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(3);
  // N = 41: the prefill tiles hold 32 (AVX-512) or 8 (AVX2) outputs, read 16 or 8 rows per gather.
  // K = 96 is one partial 8-block step of the decode kernels; K = 352 a whole step and a partial
  // one, so the NaN codes at positions 0 and 40 lie in the whole step.
  for (const int64_t K : {int64_t{96}, int64_t{352}}) {
    // M = 21: decode rows (up to 4) and prefill tiles, the AMX ones with a part-filled second tile.
    const int64_t M = 21, N = 41, KB = K / 32;
    std::vector<uint16_t> x = random_bf16(M * K, rng);
    x[size_t(K + 5)] = 0x7fc1;        // NaN in activation rows 1 and 18
    x[size_t(18 * K + K - 3)] = 0xffc0;
    std::vector<uint8_t> w8 = random_e4m3(N * K, rng), w4 = random_bytes(N * K / 2, rng);
    w8[size_t(3 * K + 40)] = 0xFF;      // NaN codes in weight rows 3, 21 (second gather of a tile)
    w8[size_t(21 * K + K - 1)] = 0x7F;  // and 38 (second tile), at the first, middle and last
    w8[size_t(38 * K + 0)] = 0xFF;      // positions of a 4-position group
    std::vector<uint8_t> s8 = random_scales(2 * KB, rng), s4 = random_scales(N * KB, rng);
    s4[size_t(5 * KB + 1)] = 0xFF;  // NaN scale of FP4 row 5
    const Fp8Matrix W8{w8.data(), s8.data(), N, K};
    const Fp4Matrix W4{w4.data(), s4.data(), N, K};
    std::vector<uint16_t> twin(size_t(M * N)), fast(size_t(M * N));
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{4}, M}) {
        linear_fp8_reference(x.data(), rows, W8, twin.data());
        linear_fp8(x.data(), rows, W8, fast.data(), nullptr);
        EXPECT_EQ(std::memcmp(fast.data(), twin.data(), size_t(rows * N) * 2), 0)
            << simd_level_name(l) << " fp8 " << rows << " K " << K;
        linear_fp4_reference(x.data(), rows, W4, twin.data());
        linear_fp4(x.data(), rows, W4, fast.data(), nullptr);
        EXPECT_EQ(std::memcmp(fast.data(), twin.data(), size_t(rows * N) * 2), 0)
            << simd_level_name(l) << " fp4 " << rows << " K " << K;
      }
      for (int64_t rows : {int64_t{1}, M}) {
        linear_fp8(x.data(), rows, W8, fast.data(), nullptr);
        for (int64_t n = 0; n < N; ++n)
          EXPECT_EQ(std::isnan(bf16_to_f32(fast[size_t(n)])), n == 3 || n == 21 || n == 38) << n << " rows " << rows;
      }
    }
  }
}

// act_quant (§3.1) vectorised: codes and scales byte for byte, over blocks of every magnitude
// (E4M3 subnormal codes, the 1e-4 amax floor, bf16 subnormals, the bf16 maximum) and blocks
// holding NaN or inf (left to the scalar code, whose NaN payloads it defines).
TEST(SimdGemm, ActQuantMatchesScalarBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(6);
  const int64_t K = 32 * 64;
  std::vector<uint16_t> x = random_bf16(K, rng);
  std::uniform_int_distribution<int> any(0, 0xffff);
  for (int64_t k = 32 * 40; k < 32 * 48; ++k) x[size_t(k)] = uint16_t(any(rng));  // every bit pattern
  for (int64_t k = 32 * 48; k < 32 * 49; ++k) x[size_t(k)] = uint16_t(k % 4);     // bf16 subnormals
  x[32 * 50 + 3] = 0x7f7f;                                                         // bf16 max
  x[32 * 51 + 7] = 0x7f80;                                                         // +inf
  x[32 * 52 + 9] = 0xffc3;                                                         // NaN
  for (int64_t k = 32 * 53; k < 32 * 54; ++k) x[size_t(k)] = f32_to_bf16(1e-6f * float(k % 7));  // amax floor
  std::vector<uint8_t> codes_twin(static_cast<size_t>(K)), codes(static_cast<size_t>(K));
  std::vector<float> scales_twin(size_t(K / 32)), scales(size_t(K / 32));
  act_quant_row_scalar(x.data(), K, codes_twin.data(), scales_twin.data());
  for (SimdLevel l : levels) {
    const simd::KernelTable* kt = simd::kernel_table(l);
    ASSERT_NE(kt, nullptr);
    EXPECT_FALSE(kt->act_quant_row(x.data(), K, codes.data(), scales.data()));  // inf/NaN blocks present
    EXPECT_EQ(first_difference(codes, codes_twin), -1) << simd_level_name(l);
    EXPECT_EQ(first_difference(scales, scales_twin), -1) << simd_level_name(l);
    EXPECT_TRUE(kt->act_quant_row(x.data(), 32 * 40, codes.data(), scales.data()));
    // act_quant_row takes the level's kernel.
    ScopedSimdLevel level(l);
    std::fill(codes.begin(), codes.end(), uint8_t{0});
    act_quant_row(x.data(), K, codes.data(), scales.data());
    EXPECT_EQ(first_difference(codes, codes_twin), -1) << simd_level_name(l);
    EXPECT_EQ(first_difference(scales, scales_twin), -1) << simd_level_name(l);
  }
}

TEST(SimdLevel, ParsesNamesAndCapsAtTheSupportedLevel) {
  EXPECT_EQ(parse_simd_level("scalar"), SimdLevel::Scalar);
  EXPECT_EQ(parse_simd_level("avx2"), SimdLevel::Avx2);
  EXPECT_EQ(parse_simd_level("avx2vnni"), SimdLevel::Avx2Vnni);
  EXPECT_EQ(parse_simd_level("avx512"), SimdLevel::Avx512);
  EXPECT_EQ(parse_simd_level("avx512vbmi"), SimdLevel::Avx512Vbmi);
  EXPECT_EQ(parse_simd_level("amx"), SimdLevel::Amx);
  EXPECT_FALSE(parse_simd_level("sse9").has_value());
  const SimdLevel before = simd_level();
  EXPECT_EQ(set_simd_level(SimdLevel::Amx), simd_level_supported());  // the highest level
  // avx2vnni is the one level not implied by those above it (AVX-512 CPUs before Sapphire Rapids
  // and Zen 5 lack AVX-VNNI): where missing it falls to avx2, never to a level the CPU cannot run.
  const SimdLevel vnni = set_simd_level(SimdLevel::Avx2Vnni);
  if (simd_level_available(SimdLevel::Avx2Vnni)) {
    EXPECT_EQ(vnni, SimdLevel::Avx2Vnni);
  } else {
    EXPECT_EQ(vnni, simd_level_available(SimdLevel::Avx2) ? SimdLevel::Avx2 : SimdLevel::Scalar);
  }
  EXPECT_TRUE(simd_level_available(simd_level_supported()));
  EXPECT_TRUE(simd_level_available(SimdLevel::Scalar));
  EXPECT_EQ(set_simd_level(SimdLevel::Scalar), SimdLevel::Scalar);
  EXPECT_EQ(simd_level(), SimdLevel::Scalar);
  set_simd_level(before);
}

}  // namespace
}  // namespace ds41
