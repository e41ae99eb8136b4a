// Token log-probabilities (runtime/logprobs.h) against closed forms: log-softmax of small
// vectors, impossible ids, ties, the alternatives' order and count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"
#include "runtime/logprobs.h"

namespace ds41 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Logprobs, LogSoftmaxOfTheChosenToken) {
  // logits ln 1, ln 2, ln 3, ln 4: probabilities 0.1 .. 0.4.
  const std::vector<float> logits = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  for (int32_t t = 0; t < 4; ++t) {
    const TokenLogprob lp = token_logprob(logits.data(), 4, t, 0);
    EXPECT_EQ(lp.token, t);
    EXPECT_NEAR(lp.logprob, std::log(0.1 * (t + 1)), 1e-6);
    EXPECT_TRUE(lp.top.empty());
  }
  // A shift of every logit changes nothing (the sum is taken relative to the maximum).
  std::vector<float> shifted = logits;
  for (float& x : shifted) x += 80.f;  // exp(80+) overflows fp32: a naive sum would give inf
  EXPECT_NEAR(token_logprob(shifted.data(), 4, 2, 0).logprob, std::log(0.3), 1e-5);
}

TEST(Logprobs, AlternativesAreTheLikeliestInOrderTiesByLowerId) {
  const std::vector<float> logits = {1.f, 3.f, -kInf, 3.f, 2.f, 0.f};
  const TokenLogprob lp = token_logprob(logits.data(), 6, 5, 4);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].first, 1);  // 3.0, lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 4);
  EXPECT_EQ(lp.top[3].first, 0);
  double z = 0;
  for (float x : logits)
    if (x > -kInf) z += std::exp(double(x));
  for (const auto& [id, v] : lp.top) EXPECT_NEAR(v, logits[size_t(id)] - std::log(z), 1e-6);
  EXPECT_NEAR(lp.logprob, 0.0 - std::log(z), 1e-6);
  // More alternatives asked for than possible ids: only the possible ones.
  EXPECT_EQ(token_logprob(logits.data(), 6, 0, 20).top.size(), 5u);
  // At most kMaxTopLogprobs.
  std::vector<float> many(100, 0.f);
  EXPECT_EQ(token_logprob(many.data(), 100, 7, 50).top.size(), size_t(kMaxTopLogprobs));
}

TEST(Logprobs, ImpossibleTokensAndBadIds) {
  const std::vector<float> logits = {0.f, -kInf, 0.f};
  EXPECT_EQ(token_logprob(logits.data(), 3, 1, 2).logprob, -kInf);
  EXPECT_NEAR(token_logprob(logits.data(), 3, 0, 0).logprob, std::log(0.5), 1e-7);
  const std::vector<float> none = {-kInf, -kInf};
  EXPECT_EQ(token_logprob(none.data(), 2, 0, 3).logprob, -kInf);
  EXPECT_THROW(token_logprob(logits.data(), 3, 3, 0), Error);
  EXPECT_THROW(token_logprob(logits.data(), 3, -1, 0), Error);
}

}  // namespace
}  // namespace ds41
