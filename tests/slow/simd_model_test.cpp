// The whole model at every kernel level: prefill logits of every position, then greedy decode,
// must be bit-identical between the portable scalar kernels and each SIMD level this CPU runs
// (the per-kernel twin tests are in tests/simd_*_test.cpp; this checks that nothing in between,
// e.g. a call site or a thread split, depends on the level). Output tokens therefore match too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/thread_pool.h"
#include "kernels/simd_level.h"
#include "../simd_levels.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

struct Generation {
  std::vector<float> logits;  // prefill (all positions) then one row per decode step
  std::vector<int32_t> tokens;
};

Generation generate(const Model& m, const std::vector<int32_t>& prompt, int steps, ThreadPool* pool) {
  Generation g;
  ForwardOptions all;
  all.all_logits = true;
  SequenceState st = m.new_sequence();
  std::vector<float> logits = m.forward(st, prompt, all, pool);
  g.logits = logits;
  const int64_t V = m.config().vocab_size;
  std::vector<float> last(logits.end() - V, logits.end());
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    g.tokens.push_back(tok);
    last = m.forward(st, {tok}, ForwardOptions{}, pool);
    g.logits.insert(g.logits.end(), last.begin(), last.end());
  }
  return g;
}

TEST(SimdModel, EveryLevelGivesTheScalarLogitsAndTokens) {
  if (simd_level_supported() == SimdLevel::Scalar) GTEST_SKIP() << "no SIMD level on this CPU";
  auto model = Model::load(test::tiny_model_dir(true));
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(150);
  for (auto& t : prompt) t = int32_t(rng() % 129280);
  prompt[0] = 0;
  ThreadPool pool(2);
  Generation twin;
  {
    ScopedSimdLevel scalar(SimdLevel::Scalar);
    twin = generate(*model, prompt, 12, &pool);
  }
  for (SimdLevel l : supported_simd_levels()) {
    ScopedSimdLevel level(l);
    const Generation g = generate(*model, prompt, 12, &pool);
    EXPECT_EQ(g.tokens, twin.tokens) << simd_level_name(l);
    ASSERT_EQ(g.logits.size(), twin.logits.size());
    EXPECT_EQ(0, std::memcmp(g.logits.data(), twin.logits.data(), twin.logits.size() * sizeof(float)))
        << simd_level_name(l);
  }
}

}  // namespace
}  // namespace ds41
