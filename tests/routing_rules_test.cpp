// Unit tests of the selection rules: torch-CPU top-k (routing and indexer ties), the candidate
// block pool (newest block pinned, unreachable blocks dropped), and the SwiGLU clamps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "kernels/topk.h"
#include "kernels/vector_exp.h"
#include "model/forward_context.h"

namespace ds41 {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

TEST(TorchTopK, SelectsTheLargestAndSortsWhenAsked) {
  // Both library paths: nth_element (k * 64 > n) and partial_sort (k * 64 <= n).
  std::mt19937 g(5);
  for (int n : {10, 64, 200, 640}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(g);
    for (int k : {1, 3, 10}) {
      auto got = torch_topk_largest(v.data(), n, k, true);
      std::vector<float> sorted = v;
      std::sort(sorted.rbegin(), sorted.rend());
      ASSERT_EQ(got.size(), size_t(k));
      for (int i = 0; i < k; ++i) EXPECT_EQ(v[size_t(got[size_t(i)])], sorted[size_t(i)]) << n << " " << k << " " << i;
    }
  }
}

TEST(TorchTopK, TiesGiveAValidDeterministicSetAndNaNRanksFirst) {
  const std::vector<float> v = {1, 3, 3, 3, 0, 3, 2};
  auto a = torch_topk_largest(v.data(), int64_t(v.size()), 2, false);
  auto b = torch_topk_largest(v.data(), int64_t(v.size()), 2, false);
  EXPECT_EQ(a, b);
  for (int32_t i : a) EXPECT_EQ(v[size_t(i)], 3.0f);
  EXPECT_NE(a[0], a[1]);
  const std::vector<float> w = {1, NAN, 5};
  auto c = torch_topk_largest(w.data(), 3, 1, true);
  EXPECT_EQ(c[0], 1);  // torch sorts NaN as the largest
  EXPECT_TRUE(torch_topk_largest(w.data(), 3, 0, true).empty());
  EXPECT_EQ(torch_topk_largest(w.data(), 3, 9, true).size(), 3u);  // k clipped to n
}

TEST(CandidatePool, NewestBlockIsPinnedAndTheBestOthersKept) {
  // 12 entries in blocks of 4; the query sees 10 (blocks 0, 1 full, block 2 partial).
  std::vector<float> s = {5, 1, 1, 1, /**/ 9, 0, 0, 0, /**/ -3, -2, -kInf, -kInf};
  auto keep = candidate_pool_row(s.data(), 12, 10, 2, 4);
  // Block 2 (newest, lowest scores) is pinned; block 1 (max 9) beats block 0 (max 5).
  const std::vector<uint8_t> want = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(keep, want);
  // With room for every block, everything reachable is kept.
  auto all = candidate_pool_row(s.data(), 12, 10, 8, 4);
  EXPECT_EQ(std::count(all.begin(), all.end(), 1), 12);
}

TEST(CandidatePool, UnreachableBlocksAreDroppedAndEmptyQueriesPinNothing) {
  std::vector<float> s = {2, 1, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  auto keep = candidate_pool_row(s.data(), 8, 2, 2, 4);  // block 1 is all -inf: picked to fill k, dropped
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  std::vector<float> none(8, -kInf);
  auto empty = candidate_pool_row(none.data(), 8, 0, 2, 4);  // (0 - 1) // 4 = -1: nothing pinned
  EXPECT_EQ(std::count(empty.begin(), empty.end(), 1), 0);
}

TEST(SelectTopK, PicksAreAscendingAndOnlyVisibleEntries) {
  std::vector<float> s = {0.5f, 4, 1, 3, 2};
  EXPECT_EQ(select_topk_row(s.data(), 5, 5, 3), (std::vector<int32_t>{1, 3, 4}));
  // Entries the query cannot see carry -inf (as the reference masks them); picked only to fill k,
  // they are dropped (the reference's -1).
  std::vector<float> masked = {0.5f, 4, -kInf, -kInf, -kInf};
  EXPECT_EQ(select_topk_row(masked.data(), 5, 2, 3), (std::vector<int32_t>{0, 1}));
}

TEST(Swiglu, UpClampedBothSidesGateOnlyFromAbove) {
  // F.silu's vector path: x / (1 + exp(-x)) with PyTorch's vectorized exp.
  auto silu = [](float x) { return x / (1.f + torch_vec_expf(-x)); };
  EXPECT_EQ(swiglu(20.f, 20.f, 10.f), silu(10.f) * 10.f);     // both clamped to 10
  EXPECT_EQ(swiglu(-20.f, -20.f, 10.f), silu(-20.f) * -10.f); // gate not clamped below, up is
  EXPECT_EQ(swiglu(3.f, -4.f, 10.f), silu(3.f) * -4.f);       // inside: untouched
  EXPECT_EQ(swiglu(20.f, 20.f, 0.f), silu(20.f) * 20.f);      // limit 0: no clamps
}

}  // namespace
}  // namespace ds41
