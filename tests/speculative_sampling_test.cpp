// Speculative rejection sampling is lossless (spec engram_dspark_vision.md §B.7 step 5): on
// synthetic small-vocabulary target/draft distributions, the tokens a cycle emits are
// distributed exactly as plain sampling from the target, checked with chi-square tests at a
// fixed seed; the same tests reject the naive "accept every draft" rule (so they have power).
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"

namespace ds41 {
namespace {

using Dist = std::vector<float>;

Dist random_dist(std::mt19937& rng, int V, int zeros) {
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  Dist d(static_cast<size_t>(V));
  for (auto& v : d) v = u(rng);
  for (int i = 0; i < zeros; ++i) d[size_t(i * 3 % V)] = 0.f;  // top-p style holes
  return d;  // unnormalised on purpose: the sampler hands out weights
}

double prob(const Dist& d, int i) {
  double s = 0;
  for (float v : d) s += v;
  return d[size_t(i)] / s;
}

// Pearson chi-square of observed counts against expected probabilities (cells with zero
// probability must stay empty).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected, int64_t n, int* dof) {
  double x2 = 0;
  *dof = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      if (counts[i] != 0) return INFINITY;
      continue;
    }
    const double e = expected[i] * double(n);
    x2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++*dof;
  }
  return x2;
}

// 0.999 quantiles of chi-square (tables): a fixed-seed run passes with room to spare when the
// law is right, and a wrong law with these sample sizes lands far above.
double chi2_999(int dof) {
  switch (dof) {
    case 4: return 18.467;
    case 5: return 20.515;
    case 11: return 31.264;
    case 14: return 36.123;
    case 15: return 37.697;
    case 19: return 43.820;
  }
  ADD_FAILURE() << "no quantile for " << dof << " degrees of freedom";
  return 0;
}

TEST(SpeculativeSampling, UniformsAreReproducibleAndInRange) {
  EXPECT_EQ(speculative_uniform(1, 2, 3, 4), speculative_uniform(1, 2, 3, 4));
  EXPECT_NE(speculative_uniform(1, 2, 3, 4), speculative_uniform(1, 2, 3, 5));
  EXPECT_NE(speculative_uniform(1, 2, 3, 4), speculative_uniform(1, 3, 3, 4));
  EXPECT_NE(speculative_uniform(1, 2, 3, 4), speculative_uniform(2, 2, 3, 4));
  double lo = 1, hi = 0, mean = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = speculative_uniform(7, uint64_t(i), 0, 1);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    mean += u / 10000;
  }
  EXPECT_GE(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  EXPECT_NEAR(mean, 0.5, 0.01);  // sd of the mean ~0.003
}

TEST(SpeculativeSampling, DrawFollowsTheWeightsAndSkipsZeros) {
  const Dist w = {0.f, 2.f, 0.f, 1.f, 1.f};
  EXPECT_EQ(draw_from_weights(w, 0.0), 1);
  EXPECT_EQ(draw_from_weights(w, 0.49), 1);
  EXPECT_EQ(draw_from_weights(w, 0.5), 3);
  EXPECT_EQ(draw_from_weights(w, 0.76), 4);
  EXPECT_EQ(draw_from_weights(w, 0.999999), 4);
  EXPECT_THROW(draw_from_weights(Dist{0.f, 0.f}, 0.5), Error);
}

TEST(SpeculativeSampling, FirstTokenFollowsTheTargetNotTheDraft) {
  const int V = 6;
  const int64_t N = 40000;
  std::mt19937 rng(3);
  const Dist p0 = random_dist(rng, V, 1), p1 = random_dist(rng, V, 0), q0 = random_dist(rng, V, 0);
  std::vector<int64_t> counts(V, 0), naive(V, 0);
  for (int64_t t = 0; t < N; ++t) {
    const int32_t d = draw_from_weights(q0, speculative_uniform(5, uint64_t(t), 0, 1));
    const SampledAcceptance a = accept_sampled({d}, {q0}, {p0, p1}, 5, uint64_t(t));
    ++counts[size_t(a.accepted == 1 ? d : a.next)];
    ++naive[size_t(d)];
  }
  std::vector<double> expected(V);
  for (int i = 0; i < V; ++i) expected[size_t(i)] = prob(p0, i);
  int dof = 0;
  const double x2 = chi_square(counts, expected, N, &dof);
  EXPECT_LT(x2, chi2_999(dof)) << "emitted tokens do not follow the target";
  int dof_naive = 0;
  const double x2_naive = chi_square(naive, expected, N, &dof_naive);
  EXPECT_GT(x2_naive, 10 * chi2_999(dof)) << "the test cannot tell q from p";
}

TEST(SpeculativeSampling, TwoTokenChainFollowsTheTargetJointLaw) {
  // Conditional target p1[x] and draft q1[x]: the pair (x1, x2) a speculative run emits — both
  // from one cycle, or x2 from the next cycle (plain sampling) after an early rejection — must
  // follow p0(x1) p1[x1](x2).
  const int V = 4;
  const int64_t N = 60000;
  std::mt19937 rng(4);
  const Dist p0 = random_dist(rng, V, 0), q0 = random_dist(rng, V, 1);
  std::vector<Dist> p1, q1;
  for (int x = 0; x < V; ++x) {
    p1.push_back(random_dist(rng, V, x == 2 ? 1 : 0));
    q1.push_back(random_dist(rng, V, 0));
  }
  const Dist p2 = random_dist(rng, V, 0);  // the bonus row (a third token, not tallied)
  std::vector<int64_t> counts(size_t(V * V), 0);
  int64_t full = 0;
  for (int64_t t = 0; t < N; ++t) {
    const int32_t d1 = draw_from_weights(q0, speculative_uniform(9, uint64_t(t), 0, 1));
    const int32_t d2 = draw_from_weights(q1[size_t(d1)], speculative_uniform(9, uint64_t(t), 1, 1));
    const SampledAcceptance a = accept_sampled({d1, d2}, {q0, q1[size_t(d1)]}, {p0, p1[size_t(d1)], p2}, 9, uint64_t(t));
    int32_t x1 = 0, x2 = 0;
    if (a.accepted == 0) {
      x1 = a.next;
      x2 = draw_from_weights(p1[size_t(x1)], speculative_uniform(10, uint64_t(t), 0, 6));  // next cycle, plain
    } else {
      x1 = d1;
      x2 = a.accepted == 1 ? a.next : d2;
    }
    full += a.accepted == 2;
    ++counts[size_t(x1 * V + x2)];
  }
  std::vector<double> expected(size_t(V * V));
  for (int x = 0; x < V; ++x)
    for (int y = 0; y < V; ++y) expected[size_t(x * V + y)] = prob(p0, x) * prob(p1[size_t(x)], y);
  int dof = 0;
  const double x2 = chi_square(counts, expected, N, &dof);
  EXPECT_EQ(dof, 14);  // 16 cells, one impossible pair (a hole in p1[2])
  EXPECT_LT(x2, chi2_999(dof));
  EXPECT_GT(full, N / 10);  // the chain path (both drafts accepted) is exercised
}

TEST(SpeculativeSampling, MismatchedRowsAreAnError) {
  EXPECT_THROW(accept_sampled({1}, {}, {Dist{1.f, 1.f}, Dist{1.f, 1.f}}, 0, 0), Error);
  EXPECT_THROW(accept_sampled({1}, {Dist{1.f, 1.f}}, {Dist{1.f, 1.f}}, 0, 0), Error);
}

}  // namespace
}  // namespace ds41
