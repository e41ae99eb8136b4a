// The SIMD dense (bf16 / fp32 weight) and packed linear layers (kernels/simd_gemm_dense.inc,
// gemm_packed.cpp) against their scalar twins, bit for bit, at every ISA level this CPU supports:
// K with every remainder mod 16, N not a multiple of the row groups, packed groups of every width.
#include <gtest/gtest.h>

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

TEST(SimdGemm, DenseLinearsMatchTwinsBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(4);
  ThreadPool pool(3);
  for (const Shape& s : kDenseShapes) {
    const std::vector<float> xf = random_f32(s.M * s.K, rng), wf = random_f32(s.N * s.K, rng);
    std::vector<uint16_t> xb(xf.size()), wb(wf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
    const size_t out = size_t(s.M * s.N);
    std::vector<float> twin_f(out), fast_f(out);
    std::vector<uint16_t> twin_b(out), fast_b(out);
    linear_bf16_reference(xb.data(), s.M, wb.data(), s.N, s.K, twin_b.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      linear_bf16(xb.data(), s.M, wb.data(), s.N, s.K, fast_b.data(), &pool);
      EXPECT_EQ(first_difference(fast_b, twin_b), -1) << "bf16 " << describe(l, s);
    }
    linear_bf16_f32out_reference(xb.data(), s.M, wb.data(), s.N, s.K, twin_f.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      linear_bf16_f32out(xb.data(), s.M, wb.data(), s.N, s.K, fast_f.data(), &pool);
      EXPECT_EQ(first_difference(fast_f, twin_f), -1) << "bf16_f32out " << describe(l, s);
    }
    linear_f32_reference(xf.data(), s.M, wf.data(), s.N, s.K, twin_f.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      linear_f32(xf.data(), s.M, wf.data(), s.N, s.K, fast_f.data(), &pool);
      EXPECT_EQ(first_difference(fast_f, twin_f), -1) << "f32 " << describe(l, s);
    }
    linear_f32_wbf16_reference(xf.data(), s.M, wb.data(), s.N, s.K, twin_f.data());
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      linear_f32_wbf16(xf.data(), s.M, wb.data(), s.N, s.K, fast_f.data(), &pool);
      EXPECT_EQ(first_difference(fast_f, twin_f), -1) << "f32_wbf16 " << describe(l, s);
    }
    // The packed layout (whole 16-row blocks plus ragged tail rows) gives the same values, on
    // the scalar path too.
    std::vector<uint16_t> blocks(size_t((s.N / kPackedRows) * s.K * kPackedRows));
    pack_bf16_rows(wb.data(), s.N, s.K, blocks.data(), &pool);
    const PackedBf16Matrix packed{blocks.data(), wb.data(), s.N, s.K};
    for (SimdLevel l : with_scalar(levels)) {
      ScopedSimdLevel level(l);
      std::fill(fast_f.begin(), fast_f.end(), -1.0f);
      linear_f32_wbf16_packed(xf.data(), s.M, packed, fast_f.data(), &pool);
      EXPECT_EQ(first_difference(fast_f, twin_f), -1) << "f32_wbf16_packed " << describe(l, s);
    }
  }
}

// The packed layout itself, at every level and on the scalar path: group g (128 rows, the last
// one what is left of the whole 16-row blocks) holds row j's value at k at [k][j], for shapes
// with ragged positions (K not a multiple of 8 or 32) and rows past the last block (left out).
TEST(SimdGemm, PackedLayoutIsTheDefinition) {
  std::mt19937 rng(21);
  ThreadPool pool(2);
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{16, 1}, {16, 8}, {48, 37}, {130, 64}, {300, 33}, {517, 100}}) {
    std::vector<uint16_t> W(static_cast<size_t>(N * K));
    for (auto& v : W) v = uint16_t(rng());
    const int64_t blocks = N / kPackedRows;
    std::vector<uint16_t> want(static_cast<size_t>(blocks * kPackedRows * K));
    for (int64_t g = 0; g * kPackedGroupBlocks < blocks; ++g) {
      const int64_t row0 = g * kPackedGroupBlocks * kPackedRows;
      const int64_t rows = std::min(kPackedGroupBlocks, blocks - g * kPackedGroupBlocks) * kPackedRows;
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t k = 0; k < K; ++k) want[size_t(row0 * K + k * rows + j)] = W[size_t((row0 + j) * K + k)];
    }
    for (SimdLevel l : with_scalar(supported_simd_levels())) {
      ScopedSimdLevel level(l);
      std::vector<uint16_t> got(want.size() + 1, 0xabcd);
      pack_bf16_rows(W.data(), N, K, got.data(), &pool);
      EXPECT_EQ(got.back(), 0xabcd) << "wrote past the packed matrix";
      got.pop_back();
      EXPECT_EQ(got, want) << simd_level_name(l) << " N=" << N << " K=" << K;
    }
  }
}

// The kernel behind the packing on its own, for any shape: ragged rows and columns around the
// 8 x 8 tiles and 32-column strips, strides wider than the rows; nothing outside the
// destination rectangle is touched.
TEST(SimdGemm, TransposeU16MatchesTheDefinition) {
  std::mt19937 rng(22);
  for (SimdLevel l : supported_simd_levels()) {
    const simd::KernelTable* kt = simd::kernel_table(l);
    ASSERT_NE(kt, nullptr);
    for (int64_t rows : {1, 7, 8, 9, 16, 23})
      for (int64_t cols : {1, 7, 8, 31, 32, 33, 70}) {
        const int64_t src_stride = cols + 3, dst_stride = rows + 5;
        std::vector<uint16_t> src(static_cast<size_t>(rows * src_stride));
        for (auto& v : src) v = uint16_t(rng());
        std::vector<uint16_t> want(static_cast<size_t>(cols * dst_stride), 0x5a5a), got = want;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) want[size_t(c * dst_stride + r)] = src[size_t(r * src_stride + c)];
        kt->transpose_u16(src.data(), src_stride, rows, cols, got.data(), dst_stride);
        EXPECT_EQ(got, want) << simd_level_name(l) << " rows=" << rows << " cols=" << cols;
      }
  }
}

// Packed products batched into one parallel call (the grouped output projection at decode):
// every job's values are its own twin's, whatever the mix of group widths and tail rows (a job
// with fewer than 16 rows is all tail).
TEST(SimdGemm, PackedBatchMatchesTwinsBitForBit) {
  std::mt19937 rng(9);
  ThreadPool pool(3);
  const int64_t M = 2;
  const std::pair<int64_t, int64_t> shapes[] = {{229, 37}, {16, 40}, {5, 12}, {300, 64}, {128, 21}, {1000, 9}, {640, 3}};
  std::vector<std::vector<uint16_t>> weights, blocks;
  std::vector<std::vector<float>> xs, twins;
  std::vector<PackedBf16Matrix> matrices;
  for (const auto& [N, K] : shapes) {
    const std::vector<float> wf = random_f32(N * K, rng);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
    weights.push_back(wb);
    blocks.emplace_back(size_t((N / kPackedRows) * K * kPackedRows));
    pack_bf16_rows(weights.back().data(), N, K, blocks.back().data(), &pool);
    xs.push_back(random_f32(M * K, rng));
    twins.emplace_back(size_t(M * N));
    linear_f32_wbf16_reference(xs.back().data(), M, weights.back().data(), N, K, twins.back().data());
  }
  for (size_t j = 0; j < blocks.size(); ++j)
    matrices.push_back(PackedBf16Matrix{blocks[j].data(), weights[j].data(), shapes[j].first, shapes[j].second});
  for (SimdLevel l : with_scalar(supported_simd_levels())) {
    ScopedSimdLevel level(l);
    std::vector<std::vector<float>> outs;
    std::vector<PackedLinearJob> jobs;
    for (size_t j = 0; j < matrices.size(); ++j) outs.emplace_back(twins[j].size(), -1.0f);
    for (size_t j = 0; j < matrices.size(); ++j) jobs.push_back(PackedLinearJob{xs[j].data(), matrices[j], outs[j].data()});
    linear_f32_wbf16_packed_batch(jobs.data(), int(jobs.size()), M, &pool);
    for (size_t j = 0; j < matrices.size(); ++j)
      EXPECT_EQ(first_difference(outs[j], twins[j]), -1) << "job " << j << " at level " << int(l);
  }
}

// The packed FP8 products (wo_a at decode) against the twin they replace: the matrix dequantized
// to bf16 (dequant_fp8_to_bf16), then linear_f32_wbf16's sequential chains - bit for bit, at
// every level and on the scalar path, for all E4M3 codes but NaN (subnormals included), scales
// at both ends of the allowed range, groups of 2 to 8 blocks, 1-3 rows, several jobs in one call,
// and bytes before the matrix that are not codes of it. Three scale ranges: the whole allowed one
// (the AVX2 kernel's folded scales would overflow: its unfolded products), and a high and a low
// one where the folded products apply - in the high one row 1 holds an activation that would
// overflow when scaled, so that row takes the unfolded products; in the low one an activation
// that scaled leaves the normal range (its products are zeros either way).
class PackedFp8Twin : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(ScaleRanges, PackedFp8Twin, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return std::string(info.param == 0 ? "Whole" : info.param == 1 ? "High" : "Low"); });
TEST_P(PackedFp8Twin, MatchesTheDequantizedTwinBitForBit) {
  const int range = GetParam();
  std::mt19937 rng(31 + uint32_t(range));
  ThreadPool pool(3);
  const std::pair<int64_t, int64_t> shapes[] = {{32, 32}, {64, 96}, {160, 64}, {256, 1024}, {288, 160}};
  struct Case {
    std::vector<uint8_t> codes, scales, packed;
    std::vector<uint16_t> dequantized;
    Fp8Matrix W;
  };
  std::vector<Case> cases(std::size(shapes));
  for (size_t j = 0; j < cases.size(); ++j) {
    const auto [N, K] = shapes[j];
    Case& c = cases[j];
    c.codes.resize(size_t(N * K));
    for (auto& v : c.codes) {
      v = uint8_t(rng());
      if ((v & 0x7f) == 0x7f) v ^= 0x01;  // no NaN codes
    }
    c.scales.resize(size_t((N / 32) * (K / 32)));
    const int lowest = range == 0 ? 3 : range == 1 ? 110 : 3, count = range == 0 ? 132 : range == 1 ? 11 : 8;
    for (auto& v : c.scales) v = uint8_t(lowest + int(rng() % uint32_t(count)));  // 2^-124 .. 2^7 at most
    c.scales.front() = uint8_t(lowest);
    c.scales.back() = uint8_t(lowest + count - 1);
    c.W = Fp8Matrix{c.codes.data(), c.scales.data(), N, K};
    ASSERT_TRUE(fp8_packable(c.W));
    c.dequantized.resize(size_t(N * K));
    dequant_fp8_to_bf16(c.W, c.dequantized.data());
    c.packed.assign(size_t(kPackedFp8Front + N * K), 0xff);  // NaN codes in front: never values
    pack_fp8_rows(c.W, c.packed.data() + kPackedFp8Front, &pool);
  }
  for (int64_t M : {1, 2, 3}) {
    std::vector<std::vector<float>> xs, twins;
    for (const Case& c : cases) {
      xs.push_back(random_f32(M * c.W.K, rng));
      xs.back()[0] = 0.0f;
      if (M > 1 && range == 1) xs.back()[size_t(c.W.K + 5)] = 0x1p25f;   // scaled: past 2^128
      if (M > 1 && range == 2) xs.back()[size_t(c.W.K + 5)] = 0x1.abcdeep-124f;  // scaled: subnormal
      twins.emplace_back(size_t(M * c.W.N));
      linear_f32_wbf16_reference(xs.back().data(), M, c.dequantized.data(), c.W.N, c.W.K, twins.back().data());
    }
    for (SimdLevel l : with_scalar(supported_simd_levels())) {
      ScopedSimdLevel level(l);
      std::vector<std::vector<float>> outs;
      std::vector<PackedFp8LinearJob> jobs;
      for (size_t j = 0; j < cases.size(); ++j) outs.emplace_back(twins[j].size(), -1.0f);
      for (size_t j = 0; j < cases.size(); ++j) {
        const PackedFp8Matrix packed{cases[j].packed.data() + kPackedFp8Front, cases[j].scales.data(), cases[j].W.N,
                                     cases[j].W.K};
        jobs.push_back(PackedFp8LinearJob{xs[j].data(), packed, outs[j].data()});
      }
      linear_f32_wfp8_packed_batch(jobs.data(), int(jobs.size()), M, &pool);
      for (size_t j = 0; j < cases.size(); ++j)
        EXPECT_EQ(first_difference(outs[j], twins[j]), -1)
            << "job " << j << " (" << cases[j].W.N << " x " << cases[j].W.K << "), M=" << M << " at level "
            << simd_level_name(l);
    }
  }
}

// What the FP8 packing refuses: a NaN code, a scale outside [2^-124, 2^7], shapes that are not
// whole 32 x 32 scale blocks; the product refuses such shapes too.
TEST(SimdGemm, PackedFp8RefusesWhatItCannotReproduce) {
  ThreadPool pool(2);
  std::vector<uint8_t> codes(64 * 64, 0x38), scales(4, 120);
  const Fp8Matrix ok{codes.data(), scales.data(), 64, 64};
  EXPECT_TRUE(fp8_packable(ok));
  for (uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
    codes[777] = nan;
    EXPECT_FALSE(fp8_packable(ok));
    codes[777] = 0x38;
  }
  for (uint8_t s : {uint8_t(0), uint8_t(2), uint8_t(135), uint8_t(255)}) {
    scales[3] = s;
    EXPECT_FALSE(fp8_packable(ok)) << int(s);
    scales[3] = 120;
  }
  EXPECT_FALSE(fp8_packable(Fp8Matrix{codes.data(), scales.data(), 48, 64}));
  EXPECT_FALSE(fp8_packable(Fp8Matrix{codes.data(), scales.data(), 64, 48}));
  std::vector<uint8_t> out(codes.size());
  scales[2] = 140;
  EXPECT_THROW(pack_fp8_rows(ok, out.data(), nullptr), Error);
  scales[2] = 120;
  codes[5] = 0x7f;
  EXPECT_THROW(pack_fp8_rows(ok, out.data(), nullptr), Error);
  codes[5] = 0xff;
  EXPECT_THROW(pack_fp8_rows(ok, out.data(), &pool), Error);
  std::vector<float> x(64), y(48);
  const PackedFp8LinearJob job{x.data(), PackedFp8Matrix{out.data(), scales.data(), 48, 64}, y.data()};
  EXPECT_THROW(linear_f32_wfp8_packed_batch(&job, 1, 1, nullptr), Error);
}

// Lane sums that round and then cancel: in every lane a large product B (~2^40) is followed by a
// small one and then by -B, so the small product keeps only the bits that survived next to B.
// The fp32 result therefore shows the order in which each lane took its products: any change of
// lane assignment or order (k = j mod 4, increasing k) changes it.
TEST(SimdGemm, DenseLaneOrderIsKept) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t M = 3, N = 10, K = 203;
  std::vector<float> x(size_t(M * K)), w(size_t(N * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[size_t(m * K + k)] = std::ldexp(1.0f, int(m));
  for (int64_t n = 0; n < N; ++n) {
    float big[4] = {0, 0, 0, 0};
    for (int64_t k = 0; k < K; ++k) {
      const int64_t chunk = k / 4, lane = k % 4;
      float& v = w[size_t(n * K + k)];
      switch ((chunk + n) % 3) {
        case 0:  // a big product only where its negation (two chunks on) exists
          v = big[lane] = k + 8 < K ? normal(rng) * std::ldexp(1.0f, 40) : normal(rng);
          break;
        case 1: v = normal(rng); break;
        default: v = -big[lane]; break;
      }
    }
  }
  std::vector<float> twin(size_t(M * N)), fast(size_t(M * N));
  linear_f32_reference(x.data(), M, w.data(), N, K, twin.data());
  for (SimdLevel l : levels) {
    ScopedSimdLevel level(l);
    for (int64_t rows : {int64_t{1}, M}) {
      linear_f32(x.data(), rows, w.data(), N, K, fast.data(), nullptr);
      EXPECT_EQ(std::memcmp(fast.data(), twin.data(), size_t(rows * N) * 4), 0) << simd_level_name(l) << " rows " << rows;
    }
  }
  // The construction does what it says: summing the lanes in another order changes the result.
  double lanes[4] = {0, 0, 0, 0}, swapped[4] = {0, 0, 0, 0};
  for (int64_t k = 0; k < K; ++k) lanes[k % 4] += double(w[size_t(k)]);
  for (int64_t c = 0; c * 4 < K; c += 2)  // each pair of chunks taken in the other order
    for (int64_t k : {(c + 1) * 4, (c + 1) * 4 + 1, (c + 1) * 4 + 2, (c + 1) * 4 + 3, c * 4, c * 4 + 1, c * 4 + 2, c * 4 + 3})
      if (k < K) swapped[k % 4] += double(w[size_t(k)]);
  EXPECT_NE(float((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])), float((swapped[0] + swapped[1]) + (swapped[2] + swapped[3])));
}

}  // namespace
}  // namespace ds41
