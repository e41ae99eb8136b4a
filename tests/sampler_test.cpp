#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "base/error.h"
#include "base/hash.h"
#include "kernels/gumbel_draw.h"
#include "kernels/simd_level.h"
#include "kernels/vector_exp.h"
#include "simd_levels.h"

namespace ds41 {
namespace {

std::vector<double> softmax(const std::vector<float>& l, double t) {
  double mx = -INFINITY;
  for (float v : l) mx = std::max(mx, double(v) / t);
  std::vector<double> p;
  double s = 0;
  for (float v : l) s += p.emplace_back(std::exp(double(v) / t - mx));
  for (auto& v : p) v /= s;
  return p;
}

// Pearson chi-square of `n` draws against expected probabilities (cells with p = 0 must get no draws).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    const double e = p[i] * double(n);
    x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return x;
}

std::vector<int64_t> histogram(const Sampler& s, const std::vector<float>& logits, int64_t n) {
  std::vector<int64_t> c(logits.size(), 0);
  for (int64_t i = 0; i < n; ++i) ++c[size_t(s.sample(logits.data(), int64_t(logits.size()), uint64_t(i)))];
  return c;
}

TEST(Sampler, RejectsInvalidOptionsNamingEach) {
  SamplerOptions o;
  o.temperature = -1;
  o.top_p = 0;
  o.min_p = 2;
  o.repetition_penalty = 0;
  o.presence_penalty = 3;
  o.top_k = -1;
  auto problems = sampler_option_problems(o);
  EXPECT_EQ(problems.size(), 6u);
  try {
    Sampler s(o);
    FAIL() << "invalid options accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("repetition_penalty"), std::string::npos);
  }
  EXPECT_TRUE(sampler_option_problems(SamplerOptions{}).empty());
}

// argmax_token against the scan it replaces (move only to a strictly larger value), on lengths
// around its 16-lane blocks, with ties, NaN (first and elsewhere), signed zeros and infinities.
TEST(Sampler, ArgmaxIsTheSequentialScansAnswer) {
  auto scan = [](const std::vector<float>& l) {
    int64_t best = 0;
    for (int64_t i = 1; i < int64_t(l.size()); ++i)
      if (l[size_t(i)] > l[size_t(best)]) best = i;
    return int32_t(best);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {nan, -0.0f, 0.0f, inf, -inf, 1.0f, -1.0f};
  std::mt19937 g(7);
  int cases = 0, moved = 0;
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1000, 129280}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> l(static_cast<size_t>(n));
      // Few distinct values so that ties are common; some trials sprinkle special values.
      for (float& v : l) v = float(int(g() % 7)) - 3.0f;
      const int sprinkle = trial % 4 == 0 ? 0 : int(g() % 5);
      for (int k = 0; k < sprinkle; ++k) l[size_t(g() % uint64_t(n))] = specials[g() % specials.size()];
      if (trial % 10 == 1) l[0] = nan;
      if (trial % 10 == 2) std::fill(l.begin(), l.end(), trial % 20 == 2 ? -0.0f : nan);
      const int32_t expected = scan(l);
      EXPECT_EQ(argmax_token(l.data(), n), expected) << "n " << n << " trial " << trial;
      ++cases;
      moved += expected != 0;
    }
  }
  EXPECT_GT(moved, cases / 2);  // the answer is usually not index 0
}

TEST(Sampler, GreedyTakesLowestIdOnTies) {
  Sampler s(SamplerOptions{});
  std::vector<float> l = {0.5f, 3.f, -1.f, 3.f};
  EXPECT_EQ(s.sample(l.data(), 4, 0), 1);
  auto p = s.distribution(l.data(), 4);
  EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0}));
}

TEST(Sampler, PenaltiesFollowTheirClosedForms) {
  SamplerOptions o;
  o.repetition_penalty = 2.0;
  o.presence_penalty = 0.5;
  o.frequency_penalty = 0.25;
  Sampler s(o);
  std::vector<float> l = {2.f, -2.f, 1.f, 0.f};
  const std::vector<int32_t> hist = {0, 1, 1};
  auto out = s.penalised_logits(l.data(), 4, hist);
  EXPECT_FLOAT_EQ(out[0], 2.f / 2 - 0.5f - 0.25f);      // seen once, positive: divided
  EXPECT_FLOAT_EQ(out[1], -2.f * 2 - 0.5f - 0.5f);      // seen twice, negative: multiplied
  EXPECT_FLOAT_EQ(out[2], 1.f);                          // unseen: untouched
  EXPECT_FLOAT_EQ(out[3], 0.f);
  // Greedy with penalties picks the best penalised logit: token 2 now.
  SamplerOptions g = o;
  g.temperature = 0;
  EXPECT_EQ(Sampler(g).sample(l.data(), 4, 0, hist), 2);
  EXPECT_EQ(Sampler(g).sample(l.data(), 4, 0), 0);  // no history: no penalty
}

// A decode loop passes one scratch to every call: each call must depend on its own history only
// (the dense penalty counts are reset after use), matching the answer of a fresh scratch, in
// greedy and sampled modes, whatever came before.
TEST(Sampler, ReusedScratchGivesTheAnswersOfAFreshOne) {
  SamplerOptions o;
  o.repetition_penalty = 1.5;
  o.presence_penalty = 0.3;
  o.frequency_penalty = 0.2;
  o.temperature = 0.9;
  o.top_k = 5;
  o.top_p = 0.8;
  o.min_p = 0.05;
  o.seed = 11;
  SamplerOptions greedy_o = o;
  greedy_o.temperature = 0;
  const int64_t V = 12;
  std::vector<float> l(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) l[size_t(i)] = float(std::sin(double(i) * 1.7) * 2.0);
  const std::vector<std::vector<int32_t>> histories = {{3, 3, 3, 7, 1}, {}, {0, 11, 11}, {3, 3, 3, 7, 1}, {5, 99, -1, 5}};
  for (const SamplerOptions& opt : {o, greedy_o}) {
    const Sampler s(opt);
    SamplerScratch scratch;
    std::vector<float> p;
    for (size_t h = 0; h < histories.size(); ++h) {
      const auto& hist = histories[h];
      s.distribution_into(p, l.data(), V, hist, scratch);
      EXPECT_EQ(p, s.distribution(l.data(), V, hist)) << "history " << h;
      for (uint64_t step = 0; step < 4; ++step)
        EXPECT_EQ(s.sample(l.data(), V, step, hist, scratch), s.sample(l.data(), V, step, hist)) << "history " << h;
    }
    for (int32_t c : scratch.counts) EXPECT_EQ(c, 0);  // nothing left behind for the next call
  }
}

TEST(Sampler, PenaltyWindowSeesOnlyTheLastTokens) {
  SamplerOptions o;
  o.presence_penalty = 1.0;
  o.penalty_last_n = 2;
  Sampler s(o);
  std::vector<float> l = {1.f, 1.f, 1.f};
  auto out = s.penalised_logits(l.data(), 3, std::vector<int32_t>{0, 1, 2});
  EXPECT_FLOAT_EQ(out[0], 1.f);  // outside the window
  EXPECT_FLOAT_EQ(out[1], 0.f);
  EXPECT_FLOAT_EQ(out[2], 0.f);
}

TEST(Sampler, DistributionIsSoftmaxOfTemperatureScaledLogits) {
  SamplerOptions o;
  o.temperature = 0.7;
  Sampler s(o);
  std::vector<float> l = {1.f, 2.f, 0.5f, -1.f, 3.f};
  auto p = s.distribution(l.data(), 5);
  auto want = softmax(l, 0.7);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(p[i], want[i], 1e-6);
}

TEST(Sampler, TopKTopPMinPKeepTheRightSets) {
  std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplerOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  auto p = Sampler(o).distribution(l.data(), 4);
  EXPECT_NEAR(p[0], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p[1], 0.3 / 0.7, 1e-6);
  EXPECT_EQ(p[2], 0.f);
  EXPECT_EQ(p[3], 0.f);
  o.top_k = 0;
  o.top_p = 0.75;  // 0.4 + 0.3 < 0.75 <= 0.9: three tokens
  p = Sampler(o).distribution(l.data(), 4);
  EXPECT_NEAR(p[2], 0.2 / 0.9, 1e-6);
  EXPECT_EQ(p[3], 0.f);
  o.top_p = 1.0;
  o.min_p = 0.4;  // keeps probabilities >= 0.16
  p = Sampler(o).distribution(l.data(), 4);
  EXPECT_NEAR(p[0], 0.4 / 0.9, 1e-6);
  EXPECT_GT(p[2], 0.f);
  EXPECT_EQ(p[3], 0.f);
}

TEST(Sampler, TopPOverAFlatLargeVocabularyWidensItsSort) {
  // 16384 equal tokens, each exactly 2^-14: the nucleus of 0.5 is exactly the 8192 lowest ids.
  std::vector<float> l(16384, 0.f);
  SamplerOptions o;
  o.temperature = 1.0;
  o.top_p = 0.5;
  auto p = Sampler(o).distribution(l.data(), int64_t(l.size()));
  int64_t kept = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] > 0) {
      ++kept;
      EXPECT_LT(i, 8192u);
    }
  }
  EXPECT_EQ(kept, 8192);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  // chi-square with 5 degrees of freedom: P(X > 20.5) = 0.001; the seed is fixed, so this is
  // deterministic, and a biased generator or a wrong transform lands far above it.
  std::vector<float> l = {1.f, 2.f, 0.5f, -1.f, 3.f, 0.f};
  SamplerOptions o;
  o.temperature = 0.8;
  o.seed = 42;
  Sampler s(o);
  const int64_t n = 60000;
  auto c = histogram(s, l, n);
  EXPECT_LT(chi_square(c, softmax(l, 0.8), n), 20.5);
  // With top-k 3 the three best tokens keep their relative odds, the rest are never drawn.
  o.top_k = 3;
  Sampler sk(o);
  auto ck = histogram(sk, l, n);
  auto pk = sk.distribution(l.data(), int64_t(l.size()));
  std::vector<double> pkd(pk.begin(), pk.end());
  EXPECT_LT(chi_square(ck, pkd, n), 13.8);  // 2 degrees of freedom, P = 0.001
}

TEST(Sampler, SameSeedAndStepSameTokenDifferentSeedDifferentStream) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)));
  SamplerOptions o;
  o.temperature = 1.0;
  o.seed = 7;
  Sampler a(o), b(o);
  o.seed = 8;
  Sampler c(o);
  int differ = 0;
  for (uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(a.sample(l.data(), 1000, step), b.sample(l.data(), 1000, step));
    differ += a.sample(l.data(), 1000, step) != c.sample(l.data(), 1000, step);
  }
  EXPECT_GT(differ, 40);
  // A draw depends only on (seed, step, stream): asking again, in any order, gives the same.
  auto p = a.distribution(l.data(), 1000);
  EXPECT_EQ(a.draw(p, 9, 3), a.draw(p, 9, 3));
  double mean = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    const double u = a.uniform(i, 1);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u;
  }
  EXPECT_NEAR(mean / 20000, 0.5, 0.01);  // sd of the mean = 0.0020
}

TEST(Sampler, DrawFromAllZeroIsAnError) {
  Sampler s(SamplerOptions{});
  EXPECT_THROW(s.draw(std::vector<float>(4, 0.f), 0), Error);
}

// The documented pipeline (sampler.h steps 3-5) written out the plain way - full sorts of the
// vocabulary, a sequential max, the twin's exp, a draw that takes the logarithm of every token -
// as the twin of the sampler's faster forms (a lane max, the SIMD exponentials, histogram-cut
// selections instead of sorts, draws that skip tokens which cannot win).
std::vector<float> reference_distribution(const std::vector<float>& l, const SamplerOptions& o) {
  const size_t n = l.size();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inv_t = float(1.0 / std::max(o.temperature, 1e-5));
  auto by_value = [](const std::vector<float>& v) {  // ids by descending value, ties by lower id
    std::vector<int32_t> ids(v.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
    });
    return ids;
  };
  // Top-k on the logits: the kept ids in order of id.
  std::vector<int32_t> kept(n);
  std::iota(kept.begin(), kept.end(), 0);
  size_t keep = n;
  if (o.top_k > 0 && size_t(o.top_k) < n) {
    for (float v : l)
      if (std::isnan(v) || v == INFINITY) return std::vector<float>(n, nan);
    keep = size_t(o.top_k);
    kept = by_value(l);
    kept.resize(keep);
    std::sort(kept.begin(), kept.end());
  }
  float mx = -INFINITY;
  for (int32_t i : kept) mx = std::max(mx, l[size_t(i)] * inv_t);
  std::vector<float> e(kept.size());
  double lanes[8] = {};
  for (size_t j = 0; j < kept.size(); ++j) {
    const float z = l[size_t(kept[j])] * inv_t;
    e[j] = torch_vec_expf(z - mx);
    lanes[j % 8] += double(e[j]);
  }
  auto combine = [](const double* s) { return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])); };
  const double sum = combine(lanes);
  if (!std::isfinite(sum)) return std::vector<float>(n, nan);
  std::vector<float> p(n, 0.f);
  for (size_t j = 0; j < kept.size(); ++j) p[size_t(kept[j])] = float(double(e[j]) * (1.0 / sum));
  bool dropped = false;
  if (o.top_p < 1.0) {
    const std::vector<int32_t> order = by_value(p);
    double acc = 0;
    size_t m = 0;
    while (m < keep && acc < o.top_p) acc += p[size_t(order[m++])];
    for (size_t i = m; i < n; ++i) {
      dropped = dropped || p[size_t(order[i])] != 0.f;
      p[size_t(order[i])] = 0.f;
    }
  }
  if (o.min_p > 0) {
    const float floor_p = float(o.min_p) * *std::max_element(p.begin(), p.end());
    for (auto& v : p)
      if (v < floor_p) {
        dropped = dropped || v != 0.f;
        v = 0.f;
      }
  }
  if (dropped) {
    double kept_lanes[8] = {};
    for (size_t i = 0; i < n; ++i) kept_lanes[i % 8] += double(p[i]);
    const double kept_sum = combine(kept_lanes);
    for (auto& v : p) v = float(double(v) * (1.0 / kept_sum));
  }
  return p;
}

// argmax of p / Exponential(1) with the sampler's generator keyed by `key`, every token's
// logarithm taken.
int64_t all_logs_argmax(const std::vector<float>& p, uint64_t key) {
  int64_t best = -1;
  float best_v = -1.f;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!(p[i] > 0.f)) continue;
    const double u = (double(splitmix64(key ^ uint64_t(i)) >> 11) + 1.0) * 0x1p-53;
    const float v = p[i] / float(-std::log(u));
    if (v > best_v) {
      best_v = v;
      best = int64_t(i);
    }
  }
  return best;
}

// The draw with runtime/sampler.cpp's key.
int32_t reference_draw(const std::vector<float>& p, uint64_t seed, uint64_t step, uint64_t stream) {
  return int32_t(all_logs_argmax(p, splitmix64(seed ^ splitmix64(step) ^ (stream ? splitmix64(~stream) : 0))));
}

uint32_t float_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(Sampler, DistributionsAndDrawsAreThePlainPipelinesBitForBit) {
  std::mt19937 rng(5);
  struct Filters {
    int64_t top_k;
    double top_p, min_p;
  };
  const std::vector<Filters> filters = {{0, 1.0, 0.0},   {1, 1.0, 0.0},    {40, 1.0, 0.0},  {2000, 1.0, 0.0},
                                        {0, 0.5, 0.0},   {0, 0.9, 0.0},    {0, 0.999, 0.0}, {0, 1.0, 0.05},
                                        {50, 0.9, 0.02}, {3000, 0.99, 0.0}};
  // 1000: the selection on the whole vocabulary; 129280: the histogram's cut first.
  for (int64_t vocab : {int64_t{5}, int64_t{1000}, int64_t{129280}}) {
    for (int shape = 0; shape < 4; ++shape) {
      std::vector<float> l(static_cast<size_t>(vocab));
      std::normal_distribution<float> d(0.f, 2.f);
      for (auto& v : l) v = d(rng);
      if (shape == 1)  // a few clear favourites
        for (int i = 0; i < 5; ++i) l[rng() % size_t(vocab)] += 15.f;
      if (shape == 2)  // many exact ties
        for (auto& v : l) v = std::round(v);
      if (shape == 3) std::fill(l.begin(), l.end(), 0.25f);  // flat
      for (double t : {0.3, 1.0, 1.7}) {
        if (vocab > 1000 && t != 1.0) continue;  // the full sorts of the twin take the time
        for (const Filters& f : filters) {
          SamplerOptions o;
          o.temperature = t;
          o.top_k = f.top_k;
          o.top_p = f.top_p;
          o.min_p = f.min_p;
          o.seed = 99;
          const Sampler s(o);
          const auto want = reference_distribution(l, o);
          const auto got = s.distribution(l.data(), vocab);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(float_bits(got[i]), float_bits(want[i]))
                << "vocab " << vocab << " shape " << shape << " T " << t << " top_k " << f.top_k << " top_p "
                << f.top_p << " min_p " << f.min_p << " token " << i;
          if (vocab > 5 && f.top_k > 0 && f.top_p == 1.0 && f.min_p == 0.0 && shape != 3) {
            // top-k keeps exactly the k most probable, also past the 1024 a first sorted prefix
            // holds (the sampler once kept those 1024 and then arbitrary tokens)
            const auto kept = std::count_if(got.begin(), got.end(), [](float v) { return v > 0.f; });
            EXPECT_EQ(kept, std::min<int64_t>(f.top_k, vocab));
            float least_kept = INFINITY, most_dropped = -INFINITY;
            for (size_t i = 0; i < l.size(); ++i) {
              if (got[i] > 0.f)
                least_kept = std::min(least_kept, l[i]);
              else
                most_dropped = std::max(most_dropped, l[i]);
            }
            EXPECT_GE(least_kept, most_dropped) << "vocab " << vocab << " top_k " << f.top_k;
          }
          for (uint64_t step = 0; step < (vocab > 1000 ? 4u : 40u); ++step)
            for (uint64_t stream : {uint64_t{0}, uint64_t{3}})
              ASSERT_EQ(s.draw(got, step, stream), reference_draw(got, o.seed, step, stream))
                  << "vocab " << vocab << " shape " << shape << " step " << step;
        }
      }
    }
  }
}

// The Gumbel draw at every SIMD level against its scalar twin (index, value bits, NaN flag) and
// against the all-logarithms draw, over ragged lengths and distributions that exercise the skip
// test: zeros, negatives and NaNs among the weights, rising weights (the best changes inside a
// vector of eight), one dominant token, flat and tiny weights.
TEST(Sampler, GumbelDrawKernelsAreTheTwinBitForBit) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const auto levels = supported_simd_levels();
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 100, 1000, 129280}) {
    for (int shape = 0; shape < 7; ++shape) {
      std::vector<float> p(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float r = unit(rng);
        switch (shape) {
          case 0: p[size_t(i)] = r; break;
          case 1: p[size_t(i)] = r < 0.5f ? 0.f : r; break;                       // half zero
          case 2: p[size_t(i)] = r < 0.2f ? -r : r < 0.25f ? NAN : r; break;     // negatives, NaNs
          case 3: p[size_t(i)] = float(i + 1); break;                             // rising
          case 4: p[size_t(i)] = i == n / 3 ? 1000.f : r * 1e-3f; break;          // one dominant
          case 5: p[size_t(i)] = 0.25f; break;                                    // flat (ties of p)
          default: p[size_t(i)] = r * 1e-38f; break;                              // tiny, some subnormal
        }
      }
      for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b97f4a7c15ull}, uint64_t{rng()} << 32 | rng()}) {
        const GumbelBest want = gumbel_argmax_reference(p.data(), n, key);
        const bool has_nan = std::any_of(p.begin(), p.end(), [](float v) { return v != v; });
        ASSERT_EQ(want.index, all_logs_argmax(p, key)) << "n " << n << " shape " << shape;
        ASSERT_EQ(want.nan, has_nan);
        for (SimdLevel l : levels) {
          ScopedSimdLevel level(l);
          const GumbelBest got = gumbel_argmax(p.data(), n, key);
          ASSERT_EQ(got.index, want.index) << simd_level_name(l) << " n " << n << " shape " << shape << " key " << key;
          ASSERT_EQ(float_bits(got.value), float_bits(want.value)) << simd_level_name(l) << " n " << n << " shape " << shape;
          ASSERT_EQ(got.nan, want.nan) << simd_level_name(l) << " n " << n << " shape " << shape;
        }
      }
    }
  }
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU: the twin alone was checked";
}

TEST(Sampler, NonFiniteLogitsGiveANaNDistributionThatCannotBeDrawn) {
  SamplerOptions o;
  o.temperature = 1.0;
  o.top_p = 0.9;
  const Sampler s(o);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> l = {1.f, bad, 0.5f};
    const auto p = s.distribution(l.data(), 3);
    for (float v : p) EXPECT_TRUE(std::isnan(v));
    try {
      s.sample(l.data(), 3, 0);
      ADD_FAILURE() << "no error for a non-finite logit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
    }
  }
  std::vector<float> l(3, -std::numeric_limits<float>::infinity());
  EXPECT_THROW(s.sample(l.data(), 3, 0), Error);
  // The same with top-k, whose softmax sees only the k largest logits: a NaN elsewhere still
  // makes the distribution NaN.
  o.top_k = 2;
  const Sampler k(o);
  std::vector<float> with_nan = {3.f, 2.f, 1.f, std::numeric_limits<float>::quiet_NaN()};
  for (float v : k.distribution(with_nan.data(), 4)) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW(k.sample(with_nan.data(), 4, 0), Error);
  EXPECT_THROW(k.sample(l.data(), 3, 0), Error);
}

TEST(Sampler, TopKSamplingNeedsOnlyTheLargestLogits) {
  // What the head screen returns for top-k sampling: the k largest logits (and their ties)
  // exact, -inf elsewhere. The distribution and the draws are those of the full logits.
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.f, 3.f);
  for (int64_t vocab : {int64_t{300}, int64_t{20000}}) {
    std::vector<float> l(static_cast<size_t>(vocab));
    for (auto& v : l) v = std::round(d(rng) * 4.f) / 4.f;  // ties across the k-th place
    for (int64_t k : {1, 7, 40, 64}) {
      std::vector<float> sorted = l;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      const float kth = sorted[size_t(k - 1)];
      std::vector<float> screened(l.size(), -INFINITY);
      for (size_t i = 0; i < l.size(); ++i)
        if (l[i] >= kth) screened[i] = l[i];
      for (double top_p : {1.0, 0.8}) {
        SamplerOptions o;
        o.temperature = 0.9;
        o.top_k = k;
        o.top_p = top_p;
        o.seed = 3;
        const Sampler s(o);
        const auto full = s.distribution(l.data(), vocab), part = s.distribution(screened.data(), vocab);
        for (size_t i = 0; i < full.size(); ++i)
          ASSERT_EQ(float_bits(full[i]), float_bits(part[i])) << "vocab " << vocab << " k " << k << " id " << i;
        if (top_p == 1.0) {
          EXPECT_EQ(std::count_if(full.begin(), full.end(), [](float v) { return v > 0.f; }), k);
        }
        for (uint64_t step = 0; step < 20; ++step)
          ASSERT_EQ(s.sample(l.data(), vocab, step), s.sample(screened.data(), vocab, step)) << "k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace ds41

namespace ds41 {
namespace {

// Which decode loops may take the head screen (model/head_screen.h): greedy without penalties.
TEST(Sampler, HeadTopKOnlyForGreedyWithoutPenalties) {
  SamplerOptions greedy;
  EXPECT_EQ(head_top_k_for(greedy, 0), 1);
  EXPECT_EQ(head_top_k_for(greedy, 5), 5);
  EXPECT_EQ(head_top_k_for(greedy, -1), 0);
  SamplerOptions sampled;
  sampled.temperature = 0.7;
  EXPECT_EQ(head_top_k_for(sampled, 0), 0);
  EXPECT_EQ(head_top_k_for(sampled, 5), 0);
  // Top-k sampling reads only the k largest logits: the screen when the caller asks for k or more.
  SamplerOptions top_k = sampled;
  top_k.top_k = 40;
  top_k.top_p = 0.9;
  top_k.min_p = 0.05;
  EXPECT_EQ(head_top_k_for(top_k, 0), 0);
  EXPECT_EQ(head_top_k_for(top_k, 5), 0);
  EXPECT_EQ(head_top_k_for(top_k, 40), 40);
  EXPECT_EQ(head_top_k_for(top_k, 50), 50);
  EXPECT_EQ(head_top_k_for(top_k, -1), 0);
  top_k.presence_penalty = 0.5;
  EXPECT_EQ(head_top_k_for(top_k, 40), 0);
  for (int p = 0; p < 3; ++p) {
    SamplerOptions penalised;
    if (p == 0) penalised.repetition_penalty = 1.1;
    if (p == 1) penalised.presence_penalty = 0.5;
    if (p == 2) penalised.frequency_penalty = -0.5;
    EXPECT_EQ(head_top_k_for(penalised, 0), 0) << p;
    EXPECT_EQ(head_top_k_for(penalised, 5), 0) << p;
  }
}

}  // namespace
}  // namespace ds41
