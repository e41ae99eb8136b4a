// The LM head screen (model/head_screen.h) and its int8 kernel (kernels/int8_dot.h):
//  - int8_row_dots equals its scalar twin at every ISA level, extremes included (no saturation);
//  - int8_quantize_bf16_row's twin is what its definition says (checked in long double), and every
//    ISA level returns the twin's codes and fields bit for bit, ties and ragged tails included;
//  - top_logits returns exactly the full product's logits for the tokens it computes and -inf for
//    the others, and its k largest (order and lowest-id ties) are the full product's, over random
//    heads and vectors of many shapes and scales, exact ties and near-ties (rows one ulp apart);
//  - it refuses (decided = false) what it cannot decide soundly, and build refuses heads with
//    non-finite values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/int8_dot.h"
#include "kernels/numeric_formats.h"
#include "kernels/simd_level.h"
#include "model/head_screen.h"

namespace ds41 {
namespace {

std::vector<SimdLevel> all_levels() {
  std::vector<SimdLevel> out{SimdLevel::Scalar};
  for (SimdLevel l : {SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Avx512Vbmi, SimdLevel::Amx})
    if (static_cast<int>(l) <= static_cast<int>(simd_level_supported())) out.push_back(l);
  return out;
}

std::vector<int32_t> row_sums_of(const std::vector<int8_t>& rows, int64_t n, int64_t K) {
  std::vector<int32_t> s(static_cast<size_t>(n), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < K; ++k) s[size_t(r)] += rows[size_t(r * K + k)];
  return s;
}

TEST(Int8RowDots, EveryLevelEqualsTheScalarTwin) {
  std::mt19937 rng(11);
  int cases = 0;
  for (int64_t K : {0, 64, 128, 192, 256, 320, 1024, 1088})
    for (int64_t n : {1, 2, 3, 4, 5, 9, 17})  // rows in three parts side by side, and what is left
      for (int64_t vectors : {1, 2, 3, 4, 5, 9}) {  // groups of up to four, and what is left
        if (vectors > 1 && n > 5 && K > 320) continue;
        std::vector<int8_t> x(static_cast<size_t>(vectors * K)), rows(static_cast<size_t>(n * K));
        for (auto& v : x) v = int8_t(int(rng() % 255) - 127);
        for (auto& v : rows) v = int8_t(int(rng() % 255) - 127);
        if (K > 0 && n > 2) {  // extremes: products of +-127 everywhere (saturation would show)
          std::fill(x.begin(), x.begin() + K / 2, int8_t(-127));
          std::fill(rows.begin(), rows.begin() + K, int8_t(127));
          std::fill(rows.begin() + K, rows.begin() + 2 * K, int8_t(-127));
        }
        const std::vector<int32_t> sums = row_sums_of(rows, n, K);
        std::vector<int32_t> want(static_cast<size_t>(vectors * n));
        int8_row_dots_reference(x.data(), vectors, rows.data(), n, K, want.data());
        for (int64_t i = 0; i < vectors; ++i)
          for (int64_t r = 0; r < n; ++r) {  // the twin is the plain sum
            int64_t s = 0;
            for (int64_t k = 0; k < K; ++k) s += int64_t(x[size_t(i * K + k)]) * rows[size_t(r * K + k)];
            ASSERT_EQ(want[size_t(i * n + r)], s);
          }
        for (SimdLevel level : all_levels()) {
          ScopedSimdLevel scoped(level);
          std::vector<int32_t> got(static_cast<size_t>(vectors * n), -1);
          int8_row_dots(x.data(), vectors, rows.data(), sums.data(), n, K, got.data());
          EXPECT_EQ(got, want) << simd_level_name(level) << " K=" << K << " n=" << n << " vectors=" << vectors;
          ++cases;
        }
      }
  EXPECT_GT(cases, 200);
}

// The longest rows, all products at +-127 * 127: the exact sums come close to 2^31 and the
// AVX-512 kernel's biased sums pass it (they wrap back exactly).
TEST(Int8RowDots, LongestRowsStayExact) {
  const int64_t K = kInt8DotMaxK, n = 3;
  std::vector<int8_t> x(static_cast<size_t>(K), int8_t(127)), rows(static_cast<size_t>(n * K), int8_t(127));
  std::fill(rows.begin() + K, rows.begin() + 2 * K, int8_t(-127));
  for (int64_t k = 0; k < K; k += 2) rows[size_t(2 * K + k)] = int8_t(-127);
  const std::vector<int32_t> sums = row_sums_of(rows, n, K);
  const std::vector<int32_t> want = {int32_t(127 * 127 * K), int32_t(-127 * 127 * K), 0};
  for (SimdLevel level : all_levels()) {
    ScopedSimdLevel scoped(level);
    std::vector<int32_t> got(static_cast<size_t>(n));
    int8_row_dots(x.data(), 1, rows.data(), sums.data(), n, K, got.data());
    EXPECT_EQ(got, want) << simd_level_name(level);
  }
}

TEST(Int8RowDots, RejectsShapesItCannotSum) {
  std::vector<int8_t> x(128), rows(128);
  std::vector<int32_t> s(1), out(1);
  EXPECT_THROW(int8_row_dots(x.data(), 1, rows.data(), s.data(), 1, 100, out.data()), Error);
  EXPECT_THROW(int8_row_dots(x.data(), 1, rows.data(), s.data(), 1, kInt8DotMaxK + 64, out.data()), Error);
  EXPECT_THROW(int8_row_dots(x.data(), -1, rows.data(), s.data(), 1, 64, out.data()), Error);
  EXPECT_THROW(int8_row_dots_reference(x.data(), 1, rows.data(), 1, 65, out.data()), Error);
}

// Rows to quantize: scales from subnormal to huge, zeros, exact ties (max 127, weights k + 1/2),
// and the largest weight anywhere (in a vector block or the scalar tail).
std::vector<std::vector<uint16_t>> quantize_test_rows(std::mt19937& rng) {
  std::vector<std::vector<uint16_t>> rows;
  for (int64_t K : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1024, 1031})
    for (float sigma : {1e-39f, 1e-3f, 1.f, 3e37f}) {
      std::normal_distribution<float> normal(0.f, sigma);
      std::vector<uint16_t> w(static_cast<size_t>(K));
      for (auto& v : w) v = f32_to_bf16(normal(rng));
      if (K > 0) w[size_t(rng() % uint64_t(K))] = f32_to_bf16(sigma * (rng() % 2 ? 9.f : -9.f));
      rows.push_back(w);
    }
  // Magnitudes spread over 2^-20 .. 2^20: the double sums of squares round, so a different
  // summation order would show.
  for (int64_t K : {9, 31, 100, 1031})
    for (int copy = 0; copy < 12; ++copy) {
      std::vector<uint16_t> w(static_cast<size_t>(K));
      for (auto& v : w) {
        const float mantissa = rng() % 2 ? 1.f + float(rng() % 1000) / 999.f : -1.f;
        v = f32_to_bf16(std::ldexp(mantissa, int(rng() % 41) - 20));
      }
      rows.push_back(w);
    }
  for (int64_t K : {16, 37, 256}) {
    std::vector<uint16_t> ties(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) ties[size_t(k)] = f32_to_bf16(float(k % 127) + (k % 2 ? 0.5f : -0.5f));
    ties[size_t(K / 2)] = f32_to_bf16(127.f);
    rows.push_back(ties);
    rows.push_back(std::vector<uint16_t>(static_cast<size_t>(K), 0x8000));  // -0: a zero row
  }
  return rows;
}

bool same_fields(const Int8RowQuant& a, const Int8RowQuant& b) {
  return std::memcmp(&a.max_abs, &b.max_abs, 4) == 0 && std::memcmp(&a.scale, &b.scale, 4) == 0 &&
         std::memcmp(&a.max_error, &b.max_error, 8) == 0 && std::memcmp(&a.sum_squares, &b.sum_squares, 8) == 0 &&
         a.sum == b.sum && a.abs_sum == b.abs_sum;
}

TEST(Int8QuantizeRow, TwinIsItsDefinition) {
  std::mt19937 rng(5);
  int rows_checked = 0;
  for (const std::vector<uint16_t>& w : quantize_test_rows(rng)) {
    const int64_t K = int64_t(w.size());
    std::vector<int8_t> q(w.size() + 1, 99);
    Int8RowQuant f;
    ASSERT_TRUE(int8_quantize_bf16_row_reference(w.data(), K, q.data(), &f));
    EXPECT_EQ(q[w.size()], 99) << "wrote past the row";
    long double m = 0, max_err = 0, squares = 0;
    int64_t sum = 0, abs_sum = 0;
    for (uint16_t v : w) m = std::max(m, std::fabs((long double)bf16_to_f32(v)));
    ASSERT_EQ((long double)f.max_abs, m);
    ASSERT_EQ(f.scale, float(m) / 127.0f);
    for (int64_t k = 0; k < K; ++k) {
      const long double wk = bf16_to_f32(w[size_t(k)]);
      const int code = q[size_t(k)];
      ASSERT_LE(std::abs(code), 127);
      if (m > 0) {  // the nearest code to w * 127 / max (within the double roundings of the factor
                    // and the product); where the factor is exactly 1 (max 127), ties to the even one
        const long double exact = wk * 127.0L / m, gap = std::fabs(exact - code);
        ASSERT_LE(gap, 0.5L + 1e-12L) << "k=" << k;
        if (m == 127 && gap == 0.5L) {
          ASSERT_EQ(code % 2, 0) << "tie at k=" << k;
        }
      } else {
        ASSERT_EQ(code, 0);
      }
      max_err = std::max(max_err, std::fabs(wk - (long double)f.scale * code));
      squares += wk * wk;
      sum += code;
      abs_sum += std::abs(code);
    }
    EXPECT_EQ((long double)f.max_error, max_err);
    EXPECT_LE(std::fabs((long double)f.sum_squares - squares), squares * 1e-13L);
    EXPECT_EQ(f.sum, sum);
    EXPECT_EQ(f.abs_sum, abs_sum);
    ++rows_checked;
  }
  EXPECT_GT(rows_checked, 60);
}

TEST(Int8QuantizeRow, EveryLevelEqualsTheScalarTwin) {
  std::mt19937 rng(6);
  int cases = 0;
  for (const std::vector<uint16_t>& w : quantize_test_rows(rng)) {
    const int64_t K = int64_t(w.size());
    std::vector<int8_t> want(w.size());
    Int8RowQuant fw;
    ASSERT_TRUE(int8_quantize_bf16_row_reference(w.data(), K, want.data(), &fw));
    for (SimdLevel level : all_levels()) {
      ScopedSimdLevel scoped(level);
      std::vector<int8_t> got(w.size(), 99);
      Int8RowQuant fg;
      ASSERT_TRUE(int8_quantize_bf16_row(w.data(), K, got.data(), &fg));
      EXPECT_EQ(got, want) << simd_level_name(level) << " K=" << K;
      EXPECT_TRUE(same_fields(fg, fw)) << simd_level_name(level) << " K=" << K << ": error " << fg.max_error << " / "
                                       << fw.max_error << ", squares " << fg.sum_squares << " / " << fw.sum_squares;
      ++cases;
    }
  }
  EXPECT_GT(cases, 60);
}

TEST(Int8QuantizeRow, RefusesNonFiniteWeightsAndOverlongRows) {
  for (int64_t K : {1, 16, 40})
    for (uint16_t bad : {uint16_t(0x7f80), uint16_t(0xff80), uint16_t(0x7fc1), uint16_t(0xffff)})
      for (int64_t at : {int64_t(0), K / 2, K - 1}) {
        std::vector<uint16_t> w(static_cast<size_t>(K), f32_to_bf16(1.f));
        w[size_t(at)] = bad;
        std::vector<int8_t> q(static_cast<size_t>(K));
        Int8RowQuant f;
        EXPECT_FALSE(int8_quantize_bf16_row_reference(w.data(), K, q.data(), &f));
        for (SimdLevel level : all_levels()) {
          ScopedSimdLevel scoped(level);
          EXPECT_FALSE(int8_quantize_bf16_row(w.data(), K, q.data(), &f)) << simd_level_name(level) << " K=" << K;
        }
      }
  std::vector<uint16_t> w(1);
  std::vector<int8_t> q(1);
  Int8RowQuant f;
  EXPECT_THROW(int8_quantize_bf16_row(w.data(), kInt8DotMaxK + 1, q.data(), &f), Error);
  EXPECT_THROW(int8_quantize_bf16_row(w.data(), -1, q.data(), &f), Error);
}

// The full product the screen must agree with.
std::vector<float> full_logits(const std::vector<float>& x, const std::vector<uint16_t>& head, int64_t V, int64_t K) {
  std::vector<float> y(static_cast<size_t>(V));
  linear_f32_wbf16_reference(x.data(), 1, head.data(), V, K, y.data());
  return y;
}

// Token ids of the k largest values, by value then lowest id (the sampler's order).
std::vector<int64_t> top_ids(const std::vector<float>& v, int k) {
  std::vector<int64_t> idx(v.size());
  for (size_t i = 0; i < v.size(); ++i) idx[i] = int64_t(i);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

// Checks one screened call against the full product; returns whether it decided.
bool check_screen(const HeadScreen& screen, const std::vector<float>& x, const std::vector<uint16_t>& head, int64_t V,
                  int64_t K, int k, ThreadPool* pool, const std::string& what) {
  const std::vector<float> want = full_logits(x, head, V, K);
  std::vector<float> got(static_cast<size_t>(V), 12345.f);
  const HeadScreen::Result r = screen.top_logits(x.data(), 1, k, head.data(), got.data(), pool);
  if (!r.decided) return false;
  int64_t computed = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (std::isinf(got[size_t(v)]) && got[size_t(v)] < 0) continue;
    ++computed;
    uint32_t a, b;
    std::memcpy(&a, &got[size_t(v)], 4);
    std::memcpy(&b, &want[size_t(v)], 4);
    EXPECT_EQ(a, b) << what << ": token " << v << " screened " << got[size_t(v)] << " full " << want[size_t(v)];
  }
  EXPECT_EQ(computed, r.candidates) << what;
  EXPECT_LE(r.candidates, screen.max_candidates()) << what;
  const int kk = int(std::min<int64_t>(k, V));
  EXPECT_EQ(top_ids(got, kk), top_ids(want, kk)) << what << " k=" << k;
  return true;
}

uint16_t bf16(float v) { return f32_to_bf16(v); }

// A head [V][K] of normal bf16 weights with standard deviation sigma.
std::vector<uint16_t> normal_head(int64_t V, int64_t K, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<uint16_t> head(static_cast<size_t>(V * K));
  for (auto& w : head) w = bf16(normal(rng));
  return head;
}

TEST(HeadScreen, TopLogitsAreTheFullProductsOnes) {
  std::mt19937 rng(5);
  ThreadPool pool(3);
  int decided = 0, calls = 0;
  for (int64_t K : {16, 64, 100, 256, 1024})
    for (int64_t V : {1, 7, 300, 5000}) {
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<uint16_t> head(static_cast<size_t>(V * K));
      // Rows of different scales, some with outliers, one all zero.
      for (int64_t v = 0; v < V; ++v) {
        const float scale = std::ldexp(1.f, int(rng() % 12) - 8);
        for (int64_t k = 0; k < K; ++k) head[size_t(v * K + k)] = bf16(normal(rng) * scale);
        if (v % 5 == 1) head[size_t(v * K + int64_t(rng() % uint64_t(K)))] = bf16(40.f * scale);
        if (v == V / 2 && V > 3) std::fill(head.begin() + v * K, head.begin() + (v + 1) * K, uint16_t(0));
      }
      // Exact ties (a duplicated row) and near-ties (one element one bf16 ulp apart).
      if (V >= 7) {
        std::copy(head.begin(), head.begin() + K, head.begin() + 3 * K);
        std::copy(head.begin() + K, head.begin() + 2 * K, head.begin() + 5 * K);
        head[size_t(5 * K + K / 2)] = uint16_t(head[size_t(5 * K + K / 2)] + 1);
      }
      auto screen = HeadScreen::build(head.data(), V, K, &pool);
      ASSERT_NE(screen, nullptr);
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<float> x(static_cast<size_t>(K));
        for (auto& v : x) v = normal(rng);
        if (trial == 1) x[size_t(rng() % uint64_t(K))] = 300.f;                 // one huge activation
        if (trial == 2) for (auto& v : x) v *= std::ldexp(1.f, int(rng() % 40) - 20);  // mixed scales
        if (trial == 3) for (auto& v : x) v = bf16_to_f32(bf16(v));            // bf16-valued, as the model's
        // Make a listed row the best one by aiming x at it: exact ties / near-ties at the top.
        if (trial >= 4 && V >= 7) {
          const int64_t aim = trial == 4 ? 0 : 1;
          for (int64_t k = 0; k < K; ++k) x[size_t(k)] = bf16_to_f32(head[size_t(aim * K + k)]) * 3.f;
        }
        for (int k : {1, 5}) {
          const std::string what = "V=" + std::to_string(V) + " K=" + std::to_string(K) + " trial " + std::to_string(trial);
          decided += check_screen(*screen, x, head, V, K, k, trial % 2 ? &pool : nullptr, what);
          ++calls;
        }
      }
    }
  // Most calls narrow the vocabulary (the small ones and the flat ones may not: they fall back).
  EXPECT_GT(decided, calls / 2);
}

// A head where the int8 approximation alone ranks the two best tokens the wrong way round: rows
// built so that one's rounding errors all go up and the other's all go down (x constant, so its
// own quantization is exact). The screen must still return the exact winner.
TEST(HeadScreen, FindsTheWinnerTheApproximationMisranks) {
  const int64_t K = 256, V = 400;
  const std::vector<float> x(static_cast<size_t>(K), 1.0f);
  // The screen's documented quantization: s = max|w| / 127, q = round(w / s); with x = 1,
  // approx = sum_k s q_k and exact = sum_k w_k.
  const auto approx_of = [&](float top, float rest) {
    const float s = top / 127.0f;
    return double(s) * (std::nearbyint(top / s) + double(K - 1) * std::nearbyint(rest / s));
  };
  const auto exact_of = [&](float top, float rest) { return double(top) + double(K - 1) * double(rest); };
  // Search bf16 pairs (top, rest) for two rows A, B with exact_A > exact_B but approx_A < approx_B.
  float best_gap = 0;
  std::pair<float, float> A, B;
  for (float top_a : {1.0f, 0.9375f})
    for (float top_b : {1.0f, 0.96875f, 0.90625f})
      for (uint16_t ra = 0x3e80; ra < 0x3f00; ra += 3)
        for (uint16_t rb = ra - 6; rb < ra + 6; ++rb) {
          const float a = bf16_to_f32(ra), b = bf16_to_f32(rb);
          const double ea = exact_of(top_a, a), eb = exact_of(top_b, b);
          const double gap = approx_of(top_b, b) - approx_of(top_a, a);
          if (ea > eb && gap > best_gap) best_gap = float(gap), A = {top_a, a}, B = {top_b, b};
        }
  ASSERT_GT(best_gap, 0.f) << "no misranked pair found";
  std::vector<uint16_t> head(static_cast<size_t>(V * K));
  for (int64_t v = 0; v < V; ++v)  // the rest: far below both
    for (int64_t k = 0; k < K; ++k) head[size_t(v * K + k)] = bf16(k == 0 ? 1.0f : 0.0625f * float(v % 7) / 7.0f);
  const auto put = [&](int64_t v, std::pair<float, float> r) {
    for (int64_t k = 0; k < K; ++k) head[size_t(v * K + k)] = bf16(k == 0 ? r.first : r.second);
  };
  put(123, B);  // the approximation's favourite, earlier in the vocabulary
  put(321, A);  // the exact winner
  auto screen = HeadScreen::build(head.data(), V, K, nullptr);
  ASSERT_NE(screen, nullptr);
  const std::vector<float> want = full_logits(x, head, V, K);
  ASSERT_EQ(top_ids(want, 1), std::vector<int64_t>{321});
  std::vector<float> got(static_cast<size_t>(V));
  ASSERT_TRUE(screen->top_logits(x.data(), 1, 1, head.data(), got.data(), nullptr).decided);
  EXPECT_EQ(top_ids(got, 1), std::vector<int64_t>{321});
  EXPECT_EQ(top_ids(got, 2), top_ids(want, 2));
}

// Several vectors in one call (a batched step, a verify block): each vector's logits are the
// ones a call of its own returns, bit for bit, whatever the group of four it falls in.
TEST(HeadScreen, SeveralVectorsAtOnceEqualOneByOne) {
  std::mt19937 rng(21);
  const int64_t V = 3000, K = 128;
  std::normal_distribution<float> normal(0.f, 0.1f);
  const std::vector<uint16_t> head = normal_head(V, K, 0.1f, rng);
  ThreadPool pool(2);
  auto screen = HeadScreen::build(head.data(), V, K, &pool);
  ASSERT_NE(screen, nullptr);
  for (int64_t n : {int64_t{2}, int64_t{5}, HeadScreen::kMaxVectors}) {
    std::vector<float> x(static_cast<size_t>(n * K));
    for (auto& v : x) v = bf16_to_f32(bf16(normal(rng) * 30.f));
    std::vector<float> together(static_cast<size_t>(n * V));
    const HeadScreen::Result r = screen->top_logits(x.data(), n, 3, head.data(), together.data(), &pool);
    ASSERT_TRUE(r.decided) << n;
    int64_t candidates = 0;
    for (int64_t m = 0; m < n; ++m) {
      std::vector<float> alone(static_cast<size_t>(V));
      const HeadScreen::Result one = screen->top_logits(x.data() + m * K, 1, 3, head.data(), alone.data(), nullptr);
      ASSERT_TRUE(one.decided);
      candidates += one.candidates;
      EXPECT_EQ(std::memcmp(alone.data(), together.data() + m * V, size_t(V) * 4), 0) << n << " vectors, vector " << m;
      const std::vector<float> xm(x.begin() + m * K, x.begin() + (m + 1) * K);
      EXPECT_EQ(top_ids(alone, 3), top_ids(full_logits(xm, head, V, K), 3));
    }
    EXPECT_EQ(r.candidates, candidates);
  }
  std::vector<float> x(static_cast<size_t>((HeadScreen::kMaxVectors + 1) * K), 1.f),
      out(static_cast<size_t>((HeadScreen::kMaxVectors + 1) * V));
  EXPECT_FALSE(screen->top_logits(x.data(), HeadScreen::kMaxVectors + 1, 1, head.data(), out.data(), nullptr).decided);
}

TEST(HeadScreen, EveryLevelGivesTheSameLogits) {
  std::mt19937 rng(9);
  const int64_t V = 2000, K = 192;
  std::normal_distribution<float> normal(0.f, 0.05f);
  const std::vector<uint16_t> head = normal_head(V, K, 0.05f, rng);
  std::vector<float> x(static_cast<size_t>(K));
  for (auto& v : x) v = bf16_to_f32(bf16(normal(rng) * 20.f));
  auto screen = HeadScreen::build(head.data(), V, K, nullptr);
  ASSERT_NE(screen, nullptr);
  std::vector<float> first;
  for (SimdLevel level : all_levels()) {
    ScopedSimdLevel scoped(level);
    std::vector<float> got(static_cast<size_t>(V));
    ASSERT_TRUE(screen->top_logits(x.data(), 1, 1, head.data(), got.data(), nullptr).decided) << simd_level_name(level);
    if (first.empty()) first = got;
    EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0) << simd_level_name(level);
  }
}

TEST(HeadScreen, RefusesWhatItCannotDecide) {
  const int64_t V = 600, K = 64;
  std::mt19937 rng(3);
  const std::vector<uint16_t> head = normal_head(V, K, 1.f, rng);
  auto screen = HeadScreen::build(head.data(), V, K, nullptr);
  ASSERT_NE(screen, nullptr);
  std::vector<float> x(static_cast<size_t>(K), 1.f), out(static_cast<size_t>(V));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    x[7] = bad;
    EXPECT_FALSE(screen->top_logits(x.data(), 1, 1, head.data(), out.data(), nullptr).decided);
  }
  std::fill(x.begin(), x.end(), 0.f);  // every logit is 0: all tokens tie, too many candidates
  EXPECT_FALSE(screen->top_logits(x.data(), 1, 1, head.data(), out.data(), nullptr).decided);
  std::fill(x.begin(), x.end(), 1.f);
  EXPECT_FALSE(screen->top_logits(x.data(), 1, 0, head.data(), out.data(), nullptr).decided);
  EXPECT_FALSE(screen->top_logits(x.data(), 1, HeadScreen::kMaxTopK + 1, head.data(), out.data(), nullptr).decided);
  // Heads with a non-finite weight get no screen.
  for (uint16_t bad : {uint16_t(0x7fc0), uint16_t(0x7f80), uint16_t(0xff80)}) {
    std::vector<uint16_t> h = head;
    h[size_t(V * K - 3)] = bad;
    EXPECT_EQ(HeadScreen::build(h.data(), V, K, nullptr), nullptr);
  }
  EXPECT_EQ(HeadScreen::build(head.data(), V, kInt8DotMaxK + 1, nullptr), nullptr);
  // Rows of subnormal bf16 weights (the row scale's reciprocal overflows fp32) still screen soundly.
  std::vector<uint16_t> tiny = head;
  for (int64_t k = 0; k < K; ++k) tiny[size_t(5 * K + k)] = uint16_t((k % 3) == 0 ? 0x0001 : (k % 3) == 1 ? 0x8003 : 0);
  auto tiny_screen = HeadScreen::build(tiny.data(), V, K, nullptr);
  ASSERT_NE(tiny_screen, nullptr);
  std::vector<float> xs(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) xs[size_t(k)] = float(k % 5) - 2.f;
  EXPECT_TRUE(check_screen(*tiny_screen, xs, tiny, V, K, 3, nullptr, "subnormal row"));
  EXPECT_EQ(screen->bytes(), V * K + V * 28);
  EXPECT_EQ(screen->bytes_read(10), screen->bytes() + 10 * K * 2);
}

// The backoff's schedule, closed form: after f >= 2 fallbacks in a row 2^(f-1) - 1 calls skip the
// screen (at most kMaxSkips), a lone fallback skips none, a decided call resets, and each k keeps
// its own count.
TEST(HeadScreenBackoff, SkipsDoubleAfterFallbacksInARow) {
  HeadScreenBackoff b;
  // Runs the calls for k until the next try (consuming skipped calls), returns how many skipped.
  const auto skipped_before_next_try = [&](int k) {
    int64_t skipped = 0;
    while (!b.try_screen(k)) ++skipped;
    return skipped;
  };
  EXPECT_EQ(skipped_before_next_try(1), 0);
  b.record(1, true);
  EXPECT_EQ(skipped_before_next_try(1), 0);
  for (int f = 1; f <= 10; ++f) {
    b.record(1, false);
    const int64_t want = std::min<int64_t>(HeadScreenBackoff::kMaxSkips, (int64_t(1) << (f - 1)) - 1);
    EXPECT_EQ(skipped_before_next_try(1), want) << f << " fallbacks in a row";
    EXPECT_EQ(skipped_before_next_try(5), 0) << "another k is not held back";
  }
  b.record(1, true);  // decided: no more skips, and the count starts over
  EXPECT_EQ(skipped_before_next_try(1), 0);
  b.record(1, false);
  EXPECT_EQ(skipped_before_next_try(1), 0);
  b.record(1, false);
  EXPECT_EQ(skipped_before_next_try(1), 1);
  // A decided call while calls are being skipped (another sequence's) ends the skipping.
  b.record(1, false);
  b.record(1, true);
  EXPECT_TRUE(b.try_screen(1));
  // k the screen never serves is always tried (the screen refuses it itself).
  for (int i = 0; i < 5; ++i) b.record(HeadScreen::kMaxTopK + 1, false);
  EXPECT_TRUE(b.try_screen(HeadScreen::kMaxTopK + 1));
  EXPECT_TRUE(b.try_screen(0));
}

}  // namespace
}  // namespace ds41
