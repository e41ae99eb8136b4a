// The SIMD attention-side kernels (kernels/simd_attention.inc) against their scalar twins (the same
// public functions at SimdLevel::Scalar), bit for bit, at every ISA level this CPU supports:
// sparse attention with sink, indexer scores, hyper-connection mixes. Shapes cover head counts
// that are not multiples of the vector width, odd head dimensions, block boundaries of the
// online softmax (63/64/65 rows), invalid rows and empty inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/hyper_connection.h"
#include "kernels/indexer_score.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/simd_level.h"
#include "simd_levels.h"
#include "kernels/sparse_attention.h"

namespace ds41 {
namespace {

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = f32_to_bf16(dist(rng));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  // memcmp on empty vectors would pass null pointers (undefined, flagged by UBSan)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

struct AttnCase {
  int H;
  int64_t Dh;
  int n;
  float sigma;  // of q and k: large values make exp underflow for most rows
};

std::vector<uint16_t> attention(const std::vector<uint16_t>& q, int H, int64_t Dh,
                                const std::vector<const uint16_t*>& rows, const std::vector<float>& sink) {
  std::vector<uint16_t> out(static_cast<size_t>(H * Dh), 0xdead);
  std::vector<float> scratch(static_cast<size_t>(sparse_attention_scratch_floats(Dh)));
  sparse_attention_row(q.data(), H, Dh, rows.data(), int(rows.size()), sink.data(), float(std::pow(double(Dh), -0.5)),
                       out.data(), scratch.data());
  return out;
}

TEST(SimdAttention, SparseAttentionMatchesTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(11);
  const AttnCase cases[] = {{1, 32, 1, 1.0f},  {3, 7, 5, 1.0f},   {4, 64, 63, 1.0f},  {8, 512, 64, 0.5f},
                            {8, 512, 65, 4.0f}, {5, 100, 200, 1.0f}, {13, 33, 130, 2.0f}, {2, 16, 0, 1.0f},
                            {8, 512, 256, 1.0f}, {4, 513, 20, 1.0f}, {9, 1024, 40, 1.0f},  // rows past 512: run-time stride
                            // heads by 16, 8 and 4 (512-bit logit passes and their tails), 32-element
                            // PV chunks with 16-element and scalar tails
                            {16, 512, 70, 1.0f}, {20, 100, 65, 1.0f}, {64, 512, 40, 0.5f}, {12, 48, 30, 1.0f}};
  for (const AttnCase& c : cases) {
    const std::vector<uint16_t> q = random_bf16(rng, c.H * c.Dh, c.sigma);
    const std::vector<uint16_t> kv = random_bf16(rng, int64_t(c.n) * c.Dh, c.sigma);
    std::vector<const uint16_t*> rows;
    std::uniform_int_distribution<int> pick(0, 9);
    for (int j = 0; j < c.n; ++j) rows.push_back(pick(rng) == 0 ? nullptr : kv.data() + j * c.Dh);
    std::vector<float> sink(static_cast<size_t>(c.H));
    for (float& s : sink) s = std::normal_distribution<float>(0.0f, 2.0f)(rng);
    std::vector<uint16_t> twin;
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      twin = attention(q, c.H, c.Dh, rows, sink);
    }
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      EXPECT_TRUE(same_bits(attention(q, c.H, c.Dh, rows, sink), twin))
          << simd_level_name(l) << " H=" << c.H << " Dh=" << c.Dh << " n=" << c.n;
    }
  }
}

// PV sums that round and then cancel: every row has the same logit (q only sees dim 0, where all
// rows agree), and in the other dims rows alternate a big value B (2^20 times the small ones), a
// small value and -B. The small values keep only the bits that survive next to B in the fp32
// running sum, so the bf16 output shows the order in which the rows were summed.
TEST(SimdAttention, SparseAttentionKeepsTheRowOrder) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(14);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int H = 2, n = 130;
  const int64_t Dh = 40;
  std::vector<uint16_t> q(static_cast<size_t>(H * Dh), 0);
  q[0] = f32_to_bf16(1.0f);
  q[size_t(Dh)] = f32_to_bf16(-0.5f);
  std::vector<uint16_t> kv(static_cast<size_t>(n * Dh));
  for (int64_t d = 0; d < Dh; ++d) {
    float big = 0.0f;
    for (int j = 0; j < n; ++j) {
      float v;
      if (d == 0) v = 0.75f;
      else if (j % 3 == 0) v = big = j + 2 < n ? round_bf16(normal(rng) * std::ldexp(1.0f, 20)) : normal(rng);
      else if (j % 3 == 1) v = normal(rng);
      else v = -big;
      kv[size_t(j * Dh + d)] = f32_to_bf16(v);
    }
  }
  std::vector<const uint16_t*> rows;
  for (int j = 0; j < n; ++j) rows.push_back(kv.data() + j * Dh);
  const std::vector<float> sink = {0.0f, 1.0f};
  std::vector<uint16_t> twin;
  {
    ScopedSimdLevel scalar(SimdLevel::Scalar);
    twin = attention(q, H, Dh, rows, sink);
  }
  for (SimdLevel l : levels) {
    ScopedSimdLevel level(l);
    EXPECT_TRUE(same_bits(attention(q, H, Dh, rows, sink), twin)) << simd_level_name(l);
  }
  // The construction is order-sensitive: the same rows in reverse give other bits.
  std::vector<const uint16_t*> reversed(rows.rbegin(), rows.rend());
  ScopedSimdLevel scalar(SimdLevel::Scalar);
  EXPECT_FALSE(same_bits(attention(q, H, Dh, reversed, sink), twin));
}

TEST(SimdAttention, IndexerScoresMatchTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(12);
  struct Case {
    int NH;
    int64_t IH, count;
  };
  const Case cases[] = {{1, 8, 1}, {4, 32, 5}, {8, 128, 100}, {9, 33, 7}, {32, 128, 37}, {4, 32, 0}, {17, 64, 64}};
  for (const Case& c : cases) {
    const std::vector<uint16_t> q = random_bf16(rng, c.NH * c.IH, 1.0f);
    const std::vector<uint16_t> w = random_bf16(rng, c.NH, 0.3f);
    std::vector<uint16_t> keys = random_bf16(rng, c.count * c.IH, 1.0f);
    if (c.count > 3) {  // a zero key (every dot +0) and a NaN key
      std::fill(keys.begin() + 2 * c.IH, keys.begin() + 3 * c.IH, uint16_t{0});
      keys[size_t(3 * c.IH + 1)] = 0x7fc1;
    }
    std::vector<float> twin(static_cast<size_t>(c.count)), fast(static_cast<size_t>(c.count));
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      indexer_scores(q.data(), w.data(), c.NH, c.IH, keys.data(), c.count, twin.data());
    }
    if (c.count == 37) {  // order-sensitive variant: q rows alternate B (~2^16), small, -B; keys +-1
      std::vector<uint16_t> qc(q.size()), kc(keys.size());
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int h = 0; h < c.NH; ++h) {
        float big = 0.0f;
        for (int64_t d = 0; d < c.IH; ++d) {
          float v = d % 3 == 0 ? (big = d + 2 < c.IH ? round_bf16(normal(rng) * 65536.0f) : normal(rng))
                    : d % 3 == 1 ? normal(rng) : -big;
          qc[size_t(h * c.IH + d)] = f32_to_bf16(v);
        }
      }
      for (int64_t t = 0; t < c.count; ++t) {
        const float sign = rng() % 2 ? -1.0f : 1.0f;  // keys +-1, the big terms still cancel
        for (int64_t d = 0; d < c.IH; ++d) kc[size_t(t * c.IH + d)] = f32_to_bf16(d % 3 == 1 ? (rng() % 2 ? -1.0f : 1.0f) : sign);
      }
      std::vector<float> twin_c(twin.size()), fast_c(twin.size());
      {
        ScopedSimdLevel scalar(SimdLevel::Scalar);
        indexer_scores(qc.data(), w.data(), c.NH, c.IH, kc.data(), c.count, twin_c.data());
      }
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        indexer_scores(qc.data(), w.data(), c.NH, c.IH, kc.data(), c.count, fast_c.data());
        EXPECT_TRUE(same_bits(fast_c, twin_c)) << simd_level_name(l) << " cancelling keys";
      }
    }
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      std::fill(fast.begin(), fast.end(), -1.0f);
      indexer_scores(q.data(), w.data(), c.NH, c.IH, keys.data(), c.count, fast.data());
      EXPECT_TRUE(same_bits(fast, twin)) << simd_level_name(l) << " NH=" << c.NH << " IH=" << c.IH << " count=" << c.count;
    }
  }
}

// Scores against MXFP4 keys equal the bf16 kernel's against the keys' dequantized values (the
// scalar twin's definition), at every level, over ragged key counts (the AVX-512 kernel takes 16
// keys a tile, AVX2 8) and scale codes outside the lookup's range (0, 1, 253, 254, NaN 255).
TEST(SimdAttention, IndexerScoresOfMxfp4KeysMatchDequantizedKeys) {
  std::mt19937 rng(31);
  struct Case {
    int NH;
    int64_t IH, count;
  };
  const Case cases[] = {{8, 128, 1}, {8, 128, 17}, {8, 128, 100}, {4, 32, 3}, {32, 128, 37}, {8, 64, 0}, {12, 96, 33}};
  std::uniform_int_distribution<int> code(0, 255), scale(110, 140);
  for (const Case& c : cases) {
    const std::vector<uint16_t> q = random_bf16(rng, c.NH * c.IH, 1.0f);
    const std::vector<uint16_t> w = random_bf16(rng, c.NH, 0.3f);
    std::vector<uint8_t> codes(static_cast<size_t>(c.count * c.IH / 2)), scales(static_cast<size_t>(c.count * c.IH / 32));
    for (auto& v : codes) v = uint8_t(code(rng));
    for (auto& v : scales) v = uint8_t(scale(rng));
    const uint8_t edge[] = {0, 1, 253, 254, 255, 2, 252};
    for (size_t i = 0; i < scales.size() && i < 3 * std::size(edge); i += 3) scales[i] = edge[i / 3];
    // The reference: every key dequantized (quant.h), then scored as bf16 by the scalar twin.
    std::vector<uint16_t> keys(static_cast<size_t>(c.count * c.IH));
    std::vector<float> expected(static_cast<size_t>(c.count)), got(static_cast<size_t>(c.count));
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      if (c.count > 0) mxfp4_dequant_row(codes.data(), scales.data(), c.count * c.IH, keys.data());
      indexer_scores(q.data(), w.data(), c.NH, c.IH, keys.data(), c.count, expected.data());
      indexer_scores_mxfp4(q.data(), w.data(), c.NH, c.IH, codes.data(), scales.data(), c.count, got.data());
      EXPECT_TRUE(same_bits(got, expected)) << "scalar NH=" << c.NH << " count=" << c.count;
    }
    for (SimdLevel l : supported_simd_levels()) {
      ScopedSimdLevel level(l);
      std::fill(got.begin(), got.end(), -1.0f);
      indexer_scores_mxfp4(q.data(), w.data(), c.NH, c.IH, codes.data(), scales.data(), c.count, got.data());
      EXPECT_TRUE(same_bits(got, expected)) << simd_level_name(l) << " NH=" << c.NH << " IH=" << c.IH
                                            << " count=" << c.count;
    }
  }
  // Keys that are not whole MXFP4 blocks are refused.
  const std::vector<uint16_t> q(16), w(1);
  const std::vector<uint8_t> codes(8), scales(1);
  float score = 0;
  EXPECT_THROW(indexer_scores_mxfp4(q.data(), w.data(), 1, 16, codes.data(), scales.data(), 1, &score), Error);
}

// The sum over heads is sequential (h ascending): heads whose terms are +B, -B, 1, 1 in turn
// (B = 2^30: what was summed before a +B is lost in it) sum to 2 in that order and to other
// values in most others (descending: 0). A key with -1 at d = 0 has every dot negative (score 0).
TEST(SimdAttention, IndexerScoresSumHeadsInOrder) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(21);
  for (int NH : {4, 8, 12, 32}) {
    const int64_t IH = 16, count = 21;
    std::vector<uint16_t> q(static_cast<size_t>(NH * IH), 0), w(static_cast<size_t>(NH));
    for (int h = 0; h < NH; ++h) {
      q[size_t(h * IH)] = f32_to_bf16(h % 4 < 2 ? 0x1p30f : 1.0f);
      w[size_t(h)] = f32_to_bf16(h % 4 == 1 ? -1.0f : 1.0f);
    }
    std::vector<uint16_t> keys = random_bf16(rng, count * IH, 1.0f);
    for (int64_t t = 0; t < count; ++t) keys[size_t(t * IH)] = f32_to_bf16(t % 5 == 3 ? -1.0f : 1.0f);
    std::vector<float> twin(static_cast<size_t>(count)), fast(static_cast<size_t>(count));
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      indexer_scores(q.data(), w.data(), NH, IH, keys.data(), count, twin.data());
    }
    for (int64_t t = 0; t < count; ++t)  // the closed form
      EXPECT_EQ(twin[size_t(t)], t % 5 == 3 ? 0.0f : 2.0f) << "NH=" << NH << " key " << t;
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      indexer_scores(q.data(), w.data(), NH, IH, keys.data(), count, fast.data());
      EXPECT_TRUE(same_bits(fast, twin)) << simd_level_name(l) << " NH=" << NH;
    }
  }
}

// hc_pre and rmsnorm_row (the per-element steps of both in lanes) against their scalar twins:
// ragged lengths, every bf16 bit pattern in part of the row (NaN, inf, subnormals), and sums that
// cancel (copies of +-x weighted alike: the order of the adds decides the bits).
TEST(SimdAttention, HcPreAndRmsNormMatchTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> any(0, 0xffff);
  for (int hc : {1, 2, 4}) {
    for (int64_t D : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{29}, int64_t{1024}, int64_t{1030}}) {
      std::vector<uint16_t> X = random_bf16(rng, hc * D, 3.0f);
      for (int64_t d = 0; d < D; d += 5) X[size_t(d)] = uint16_t(any(rng));
      if (hc > 1)
        for (int64_t d = 1; d < D; d += 3) X[size_t(D + d)] = X[size_t(d)] ^ 0x8000;  // copy 1 = -copy 0
      const float a[4] = {0.75f, 0.75f, 1e-3f, -2.5f};
      const std::vector<uint16_t> w = random_bf16(rng, D, 1.0f);
      // rmsnorm: a NaN anywhere makes the statistic NaN, and which NaN payload a product of two
      // NaNs carries is the compiler's operand order, in the twin as well: that row is checked
      // for all-NaN; a copy without NaN (inf, subnormals and big values kept) bit for bit.
      std::vector<uint16_t> finite = X;
      for (auto& v : finite)
        if ((v & 0x7fff) > 0x7f80) v = 0x4000;
      std::vector<uint16_t> pre_twin(size_t(D), 0), pre(size_t(D), 0), norm_twin(size_t(D), 0), norm(size_t(D), 0);
      {
        ScopedSimdLevel scalar(SimdLevel::Scalar);
        hc_pre(X.data(), a, hc, D, pre_twin.data());
        rmsnorm_row(finite.data(), w.data(), D, 1e-6f, norm_twin.data());
      }
      const bool has_nan = finite != X;
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        std::fill(pre.begin(), pre.end(), uint16_t{0x1234});
        std::fill(norm.begin(), norm.end(), uint16_t{0x1234});
        hc_pre(X.data(), a, hc, D, pre.data());
        rmsnorm_row(finite.data(), w.data(), D, 1e-6f, norm.data());
        EXPECT_TRUE(same_bits(pre, pre_twin)) << simd_level_name(l) << " hc_pre hc=" << hc << " D=" << D;
        EXPECT_TRUE(same_bits(norm, norm_twin)) << simd_level_name(l) << " rmsnorm D=" << D;
        if (has_nan) {
          rmsnorm_row(X.data(), w.data(), D, 1e-6f, norm.data());
          for (uint16_t v : norm) ASSERT_GT(v & 0x7fff, 0x7f80) << simd_level_name(l) << " a NaN row, D=" << D;
        }
      }
    }
  }
}

TEST(SimdAttention, HcMixesMatchTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(13);
  struct Case {
    int hc;
    int64_t D;
  };
  const Case cases[] = {{1, 1}, {2, 7}, {3, 64}, {4, 1024}, {5, 33}, {4, 130}};
  for (bool generic : {false, true}) {
    for (const Case& c : cases) {
      const int64_t n = c.hc * c.D;
      const int nmix = hc_mix_count(c.hc);
      // Stream values +-2^[-3, 3], so that the weight cancelling a big term exactly is representable;
      // `generic`: full bf16 mantissas and plain weights, so products round (an FMA would show).
      std::vector<uint16_t> X(static_cast<size_t>(n));
      std::uniform_int_distribution<int> e(-3, 3), sign(0, 1);
      for (auto& x : X) x = f32_to_bf16(std::ldexp(sign(rng) ? -1.0f : 1.0f, e(rng)));
      if (generic)
        for (auto& x : X) x = f32_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
      // Each projection row alternates a big weight B_t (~2^40), a normal one and -B_t: the normal
      // terms keep only the bits that survive next to B in the double running sum, so the result
      // shows the order in which each mix took its terms.
      std::vector<float> fn(static_cast<size_t>(nmix * n));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int k = 0; k < nmix; ++k) {
        float big = 0.0f;
        for (int64_t t = 0; t < n; ++t) {
          float& v = fn[size_t(k * n + t)];
          if (generic) {
            v = normal(rng);
            continue;
          }
          switch ((t + k) % 3) {
            case 0: v = big = t + 2 < n ? normal(rng) * std::ldexp(1.0f, 40) : normal(rng); break;
            case 1: v = normal(rng); break;
            // (t < 2: no big weight yet in this row, and X[t - 2] would be out of bounds)
            default: v = t >= 2 ? -big * bf16_to_f32(X[size_t(t - 2)]) / bf16_to_f32(X[size_t(t)]) : -big; break;
          }
        }
      }
      std::vector<float> twin(static_cast<size_t>(nmix)), fast(static_cast<size_t>(nmix));
      {
        ScopedSimdLevel scalar(SimdLevel::Scalar);
        hc_mixes(X.data(), c.hc, c.D, fn.data(), 1e-20f, twin.data());
      }
      std::vector<float> twin_dots(static_cast<size_t>(nmix));
      {
        ScopedSimdLevel scalar(SimdLevel::Scalar);
        hc_mix_dots(X.data(), c.hc, c.D, fn.data(), nullptr, 0, nmix, twin_dots.data());
      }
      std::vector<float> fn_t(size_t(transposed_hc_projection_size(nmix, n)));
      transpose_hc_projection(fn.data(), nmix, n, fn_t.data());
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        // The model's path: dot products from the transposed projection, then the rms factor.
        std::vector<float> all_dots(static_cast<size_t>(nmix));
        hc_mix_dots(X.data(), c.hc, c.D, fn.data(), fn_t.data(), 0, nmix, all_dots.data());
        hc_mixes_from_dots(X.data(), c.hc, c.D, all_dots.data(), 1e-20f, fast.data());
        EXPECT_TRUE(same_bits(fast, twin)) << simd_level_name(l) << " hc=" << c.hc << " D=" << c.D;
        // From the transposed projection, whole and in the ranges threads take (ragged splits).
        for (int parts : {1, 2, 3}) {
          std::vector<float> dots(static_cast<size_t>(nmix), -1.0f);
          for (int part = 0; part < parts; ++part) {
            const int k0 = nmix * part / parts, k1 = nmix * (part + 1) / parts;
            hc_mix_dots(X.data(), c.hc, c.D, fn.data(), fn_t.data(), k0, k1, dots.data() + k0);
          }
          EXPECT_TRUE(same_bits(dots, twin_dots))
              << simd_level_name(l) << " hc=" << c.hc << " D=" << c.D << " parts=" << parts;
        }
      }
    }
  }
}

// hc_post with columns in lanes: D with ragged tails, a column range, in place and out of place,
// comb/post weights that make products round, and inputs that overflow bf16, NaN and -0.
TEST(SimdAttention, HcPostMatchesTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    int hc;
    int64_t D, d0, d1;
  };
  const Case cases[] = {{1, 5, 0, 5}, {4, 1024, 0, 1024}, {4, 130, 3, 127}, {3, 37, 0, 37}, {16, 24, 8, 24}};
  for (const Case& c : cases) {
    std::vector<uint16_t> y(size_t(c.D)), X(size_t(c.hc * c.D));
    for (auto& v : y) v = f32_to_bf16(normal(rng) * 8.0f);
    for (auto& v : X) v = f32_to_bf16(normal(rng));
    X[0] = 0x7fc1;                                  // NaN in copy 0, column 0
    if (c.D > 9) X[size_t(c.D - 2)] = 0x8000;       // -0
    if (c.D > 9) y[9] = f32_to_bf16(3.0e38f);       // post * y overflows to inf
    std::vector<float> post(size_t(c.hc)), comb(size_t(c.hc * c.hc));
    for (auto& v : post) v = 2.0f / (1.0f + std::exp(-normal(rng)));
    for (auto& v : comb) v = std::abs(normal(rng)) / float(c.hc) + 1e-6f;
    if (c.hc >= 2 && c.D >= 64) {
      // Columns 16..63: copies 0 and 1 equal (the others zero), comb[1][j] = -comb[0][j] a few ulps
      // off and y tiny, so the mix is what is left after cancellation — the products' own rounding
      // errors, which show in bf16 whether each product was rounded before the add (the twin) or
      // fused with it (an FMA here fails this test).
      for (int64_t d = 16; d < 64; ++d) {
        X[size_t(c.D + d)] = X[size_t(d)];
        for (int i = 2; i < c.hc; ++i) X[size_t(i * c.D + d)] = 0;  // the other copies add nothing
        y[size_t(d)] = f32_to_bf16(normal(rng) * 1e-30f);
      }
      for (int j = 0; j < c.hc; ++j) {
        const float c0 = comb[size_t(j)] * (1.0f + normal(rng) * 0x1p-4f);
        comb[size_t(j)] = c0;
        comb[size_t(c.hc + j)] = -std::nextafter(std::nextafter(c0, 1e30f), 1e30f);
      }
    }
    for (bool in_place : {false, true}) {
      std::vector<uint16_t> twin = X, fast = X;
      std::vector<uint16_t> twin_out(X.size(), 0xdead), fast_out(X.size(), 0xdead);
      {
        ScopedSimdLevel scalar(SimdLevel::Scalar);
        hc_post_columns(y.data(), twin.data(), post.data(), comb.data(), c.hc, c.D, c.d0, c.d1,
                        in_place ? twin.data() : twin_out.data());
      }
      for (SimdLevel l : levels) {
        ScopedSimdLevel level(l);
        std::vector<uint16_t> res = fast, out = fast_out;
        hc_post_columns(y.data(), res.data(), post.data(), comb.data(), c.hc, c.D, c.d0, c.d1,
                        in_place ? res.data() : out.data());
        EXPECT_TRUE(same_bits(in_place ? res : out, in_place ? twin : twin_out))
            << simd_level_name(l) << " hc=" << c.hc << " D=" << c.D << " in_place=" << in_place;
      }
    }
  }
}

// Cache dequantizers over every byte pattern: FP4 codes, E8M0 scales including 0 (2^-127, so
// products are fp32 subnormals) and 255 (NaN), E4M3 scales including NaN, FP8 codes including NaN.
TEST(SimdAttention, CacheDequantizersMatchTwinBitForBit) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  std::mt19937 rng(15);
  const int64_t K = 32 * 64;
  std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), codes(static_cast<size_t>(K));
  std::vector<uint8_t> e8m0(static_cast<size_t>(K / 32)), e4m3(static_cast<size_t>(K / 16));
  for (auto& b : packed) b = uint8_t(rng());
  for (auto& b : codes) b = uint8_t(rng());
  for (size_t i = 0; i < e8m0.size(); ++i) e8m0[i] = i == 0 ? 0 : i == 1 ? 255 : i == 2 ? 1 : i == 3 ? 254 : uint8_t(rng());
  for (size_t i = 0; i < e4m3.size(); ++i) e4m3[i] = i == 0 ? 0x7f : i == 1 ? 0 : i == 2 ? 0x80 : uint8_t(rng());
  codes[5] = 0x7f;
  codes[100] = 0xff;
  using Fn = void (*)(const uint8_t*, const uint8_t*, int64_t, uint16_t*);
  const std::pair<const char*, std::pair<Fn, const std::vector<uint8_t>*>> cases[] = {
      {"mxfp4", {&mxfp4_dequant_row, &e8m0}}, {"nvfp4", {&nvfp4_dequant_row, &e4m3}}, {"fp8", {&fp8_dequant_row, &e8m0}}};
  for (const auto& [name, c] : cases) {
    const uint8_t* data = std::string(name) == "fp8" ? codes.data() : packed.data();
    std::vector<uint16_t> twin(static_cast<size_t>(K)), fast(static_cast<size_t>(K));
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      c.first(data, c.second->data(), K, twin.data());
    }
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      std::fill(fast.begin(), fast.end(), uint16_t{0xdead});
      c.first(data, c.second->data(), K, fast.data());
      EXPECT_TRUE(same_bits(fast, twin)) << name << " " << simd_level_name(l);
    }
  }
}

using DequantRow = void (*)(const uint8_t*, const uint8_t*, int64_t, uint16_t*);

// The K values `dequant` writes at the active SIMD level (the buffer starts as 0xdead, so a value
// left unwritten shows).
std::vector<uint16_t> dequantized(DequantRow dequant, const uint8_t* data, const uint8_t* scales, int64_t K) {
  std::vector<uint16_t> out(static_cast<size_t>(K), uint16_t{0xdead});
  dequant(data, scales, K, out.data());
  return out;
}

// Index of the first value where `fast` differs from twin[offset ..], or -1.
int64_t first_difference(const std::vector<uint16_t>& fast, const std::vector<uint16_t>& twin, int64_t offset = 0) {
  for (size_t i = 0; i < fast.size(); ++i)
    if (fast[i] != twin[i + size_t(offset)]) return int64_t(i) + offset;
  return -1;
}

// MXFP4 with every scale code as a block's scale (the lookup paths take codes 2..252, the fp32
// path the others: 2^-127 and 2^-126 give subnormals, 253 and 254 overflow, 255 is NaN), each
// block holding every FP4 code at every nibble position, in one call over the blocks.
TEST(SimdAttention, Mxfp4DequantEveryScaleAndCodeMatchesTwin) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  const int64_t blocks = 256 * 2, K = 32 * blocks;
  std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), e8m0(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    e8m0[size_t(b)] = uint8_t(b % 256);
    for (int i = 0; i < 16; ++i)  // byte i: code i in the low nibble, code 15 - i (or i) in the high
      packed[size_t(b * 16 + i)] = uint8_t(i | ((b < 256 ? 15 - i : i) << 4));
  }
  std::vector<uint16_t> twin;
  {
    ScopedSimdLevel scalar(SimdLevel::Scalar);
    twin = dequantized(&mxfp4_dequant_row, packed.data(), e8m0.data(), K);
  }
  for (SimdLevel l : levels) {
    ScopedSimdLevel level(l);
    // All the blocks, then all but the first (the AVX-512 kernel pairs blocks: other pairs, an odd
    // block at the end).
    for (const int64_t skip : {int64_t{0}, int64_t{1}}) {
      const int64_t i = first_difference(
          dequantized(&mxfp4_dequant_row, packed.data() + skip * 16, e8m0.data() + skip, K - skip * 32), twin, skip * 32);
      ASSERT_EQ(i, -1) << simd_level_name(l) << " scale code " << (i / 32) % 256 << " value " << i % 32 << " skip "
                       << skip;
    }
  }
}

// FP8 with every E8M0 scale code as a block's scale (the AVX-512 lookup takes codes 10..246 -
// products normal in bf16 - the fp32 path the others: subnormal and overflowing products, NaN
// scale 255) and every E4M3 code (zeros, subnormals, 448, NaN 0x7f and 0xff) under each.
TEST(SimdAttention, Fp8DequantEveryScaleAndCodeMatchesTwin) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  const int64_t blocks = 256 * 8, K = 32 * blocks;  // block 8 sc + q: codes 32 q .. 32 q + 31, scale sc
  std::vector<uint8_t> codes(static_cast<size_t>(K)), e8m0(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    e8m0[size_t(b)] = uint8_t(b / 8);
    for (int i = 0; i < 32; ++i) codes[size_t(b * 32 + i)] = uint8_t((b % 8) * 32 + (i * 7 + b) % 32);
  }
  std::vector<uint16_t> twin;
  {
    ScopedSimdLevel scalar(SimdLevel::Scalar);
    twin = dequantized(&fp8_dequant_row, codes.data(), e8m0.data(), K);
  }
  for (SimdLevel l : levels) {
    ScopedSimdLevel level(l);
    const int64_t i = first_difference(dequantized(&fp8_dequant_row, codes.data(), e8m0.data(), K), twin);
    ASSERT_EQ(i, -1) << simd_level_name(l) << " scale code " << int(e8m0[size_t(i / 32)]) << " code "
                     << int(codes[size_t(i)]);
  }
}

// NVFP4 with every E4M3 scale code (subnormal, negative, NaN at 0x7f and 0xff) as a block's
// scale, each block holding every FP4 code, in calls over an even and an odd number of blocks
// (the AVX-512 kernel takes blocks two at a time).
TEST(SimdAttention, Nvfp4DequantEveryScaleAndCodeMatchesTwin) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  for (const int64_t blocks : {int64_t{256}, int64_t{255}, int64_t{1}}) {
    const int64_t K = 16 * blocks;
    std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), scales(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      scales[size_t(b)] = uint8_t(blocks == 1 ? 0x7f : b);
      for (int i = 0; i < 8; ++i)  // byte i: codes 2i and 2i + 1, turned by the block index
        packed[size_t(b * 8 + i)] = uint8_t(((2 * i + b) % 16) | (((2 * i + 1 + 3 * b) % 16) << 4));
    }
    std::vector<uint16_t> twin;
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      twin = dequantized(&nvfp4_dequant_row, packed.data(), scales.data(), K);
    }
    for (SimdLevel l : levels) {
      ScopedSimdLevel level(l);
      const int64_t i = first_difference(dequantized(&nvfp4_dequant_row, packed.data(), scales.data(), K), twin);
      ASSERT_EQ(i, -1) << simd_level_name(l) << " blocks " << blocks << " scale code " << int(scales[size_t(i / 16)])
                       << " value " << i % 16;
    }
  }
}

}  // namespace
}  // namespace ds41
