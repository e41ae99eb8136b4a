// The shared generation loop on the tiny model: its tokens equal a hand-written forward/argmax
// loop; chunking, the pending token and sessions-style continuation do not change them; the stop,
// length, context and cancel exits behave as documented.
#include "runtime/generation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "base/error.h"
#include "base/thread_pool.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

class GenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::tiny_model_dir(true)).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
  const std::vector<int32_t> prompt_ = {0, 128803, 63006, 44388, 305, 4575, 13, 900, 1201};
};
Model* GenerationTest::model_ = nullptr;

std::vector<int32_t> collect(Generation& g, int64_t n, std::vector<int32_t> stop = {}) {
  std::vector<int32_t> out;
  GenerationLimits lim;
  lim.max_tokens = n;
  lim.stop_ids = std::move(stop);
  g.generate(lim, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  return out;
}

TEST_F(GenerationTest, GreedyTokensEqualAPlainForwardLoop) {
  ThreadPool pool(2);
  ForwardOptions fo;
  SequenceState st = model_->new_sequence();
  auto logits = model_->forward(st, prompt_, fo, &pool);
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) {
    want.push_back(argmax_token(logits.data(), model_->config().vocab_size));
    logits = model_->forward(st, {want.back()}, fo, &pool);
  }
  Sampler greedy(SamplerOptions{});
  for (int64_t chunk : {0, 1, 4}) {
    Generation g(*model_, model_->new_sequence(), greedy, &pool);
    g.feed(prompt_, chunk);
    EXPECT_EQ(collect(g, 12), want) << "chunk " << chunk;
    EXPECT_EQ(g.pending(), want.back());
    EXPECT_EQ(g.length(), int64_t(prompt_.size() + want.size()));
  }
}

// The greedy loop's head screen (model/head_screen.h) against the full head product on the same
// steps: every screened call decides, its top-5 logits are the full product's bit for bit, and
// Generation uses it for greedy sampling without penalties only.
TEST_F(GenerationTest, ScreenedHeadGivesTheFullProductsTopLogits) {
  ThreadPool pool(2);
  const int64_t V = model_->config().vocab_size;
  SequenceState full = model_->new_sequence(), screened = model_->new_sequence();
  ForwardOptions all, top5;
  top5.head_top_k = 5;
  int64_t decided = 0, calls = 0, candidates = 0;
  ForwardHooks hooks;
  hooks.on_head_screen = [&](HeadScreenOutcome o, int64_t n) {
    decided += o == HeadScreenOutcome::Decided;
    ++calls;
    candidates += n;
  };
  std::vector<float> a = model_->forward(full, prompt_, all, &pool);
  std::vector<float> b = model_->forward(screened, prompt_, top5, &pool, &hooks);
  const auto top = [&](const std::vector<float>& v) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int32_t i = 0; i < V; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t x, int32_t y) {
      return v[size_t(x)] > v[size_t(y)] || (v[size_t(x)] == v[size_t(y)] && x < y);
    });
    std::vector<std::pair<int32_t, float>> out;
    for (int i = 0; i < 5; ++i) out.push_back({idx[size_t(i)], v[size_t(idx[size_t(i)])]});
    return out;
  };
  for (int step = 0; step < 10; ++step) {
    ASSERT_EQ(top(a), top(b)) << "step " << step;
    const int32_t t = top(a)[0].first;
    a = model_->forward(full, {t}, all, &pool);
    b = model_->forward(screened, {t}, top5, &pool, &hooks);
  }
  EXPECT_EQ(calls, 11);
  EXPECT_EQ(decided, calls) << "the screen fell back to the full product";
  EXPECT_LT(candidates, calls * 2000);
  // Generation: screened logits (-inf outside the top) for greedy, every logit otherwise.
  const auto minus_inf_count = [&](const std::vector<float>& v) {
    return std::count(v.begin(), v.end(), -std::numeric_limits<float>::infinity());
  };
  Generation greedy(*model_, model_->new_sequence(), Sampler(SamplerOptions{}), &pool);
  greedy.feed(prompt_);
  EXPECT_GT(minus_inf_count(greedy.last_logits()), V / 2);
  SamplerOptions penalised;
  penalised.repetition_penalty = 1.2;
  Generation pen(*model_, model_->new_sequence(), Sampler(penalised), &pool);
  pen.feed(prompt_);
  EXPECT_EQ(minus_inf_count(pen.last_logits()), 0);
  ForwardOptions keep_all;
  keep_all.head_top_k = -1;
  Generation full_gen(*model_, model_->new_sequence(), Sampler(SamplerOptions{}), &pool, keep_all);
  full_gen.feed(prompt_);
  EXPECT_EQ(minus_inf_count(full_gen.last_logits()), 0);
}

// Top-k sampling without penalties can take the head screen when asked to (its softmax sees only
// the k largest logits: runtime/sampler.h): the same tokens as from every logit, with and without
// top-p. Not by default (head_top_k_for).
TEST_F(GenerationTest, TopKSamplingWithTheHeadScreenDrawsThePlainTokens) {
  ThreadPool pool(2);
  const int64_t V = model_->config().vocab_size;
  const auto minus_inf_count = [&](const std::vector<float>& v) {
    return std::count(v.begin(), v.end(), -std::numeric_limits<float>::infinity());
  };
  ForwardOptions keep_all;
  keep_all.head_top_k = -1;
  for (double top_p : {1.0, 0.9}) {
    SamplerOptions so;
    so.temperature = 0.9;
    so.top_k = 40;
    so.top_p = top_p;
    so.seed = 11;
    ForwardOptions top40;
    top40.head_top_k = 40;
    Generation screened(*model_, model_->new_sequence(), Sampler(so), &pool, top40);
    Generation full(*model_, model_->new_sequence(), Sampler(so), &pool, keep_all);
    Generation by_default(*model_, model_->new_sequence(), Sampler(so), &pool);
    by_default.feed(prompt_);
    EXPECT_EQ(minus_inf_count(by_default.last_logits()), 0);
    screened.feed(prompt_);
    full.feed(prompt_);
    EXPECT_GT(minus_inf_count(screened.last_logits()), V / 2) << "the screen did not run";
    EXPECT_EQ(minus_inf_count(full.last_logits()), 0);
    EXPECT_EQ(collect(screened, 12), collect(full, 12)) << "top_p " << top_p;
  }
}

TEST_F(GenerationTest, ContinuingAfterAnAnswerFeedsThePendingTokenFirst) {
  SamplerOptions so;
  so.temperature = 0.9;
  so.seed = 5;
  Sampler s(so);
  // One run of 10 tokens vs two runs of 4 + 6 with an empty feed between: same tokens, because
  // the draw for a position depends only on the seed and the position.
  Generation a(*model_, model_->new_sequence(), s, nullptr);
  a.feed(prompt_);
  auto whole = collect(a, 10);
  Generation b(*model_, model_->new_sequence(), s, nullptr);
  b.feed(prompt_, 3);
  auto first = collect(b, 4);
  b.feed({});  // commits the pending token
  EXPECT_FALSE(b.pending());
  EXPECT_EQ(b.state().token_history.back(), first.back());
  auto second = collect(b, 6);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, whole);
}

TEST_F(GenerationTest, StopTokenLengthContextAndCancel) {
  Sampler greedy(SamplerOptions{});
  Generation g(*model_, model_->new_sequence(), greedy, nullptr);
  g.feed(prompt_);
  const auto free_run = collect(g, 6);
  // Stop at the third token: it is returned and the loop ends there.
  Generation h(*model_, model_->new_sequence(), greedy, nullptr);
  h.feed(prompt_);
  GenerationLimits lim;
  lim.max_tokens = 6;
  lim.stop_ids = {free_run[2]};
  std::vector<int32_t> got;
  auto st = h.generate(lim, [&](int32_t t) { got.push_back(t); return true; });
  ASSERT_GE(got.size(), 1u);
  EXPECT_EQ(got.back(), free_run[2]);
  EXPECT_LE(got.size(), 3u);
  EXPECT_EQ(st.finish, FinishReason::Stop);
  EXPECT_EQ(st.generated_tokens, int64_t(got.size()));
  // Length.
  Generation l(*model_, model_->new_sequence(), greedy, nullptr);
  l.feed(prompt_);
  lim.stop_ids.clear();
  lim.max_tokens = 2;
  EXPECT_EQ(l.generate(lim).finish, FinishReason::Length);
  // Cancelled before the first token.
  std::atomic<bool> cancel{true};
  lim.cancel = &cancel;
  Generation k(*model_, model_->new_sequence(), greedy, nullptr);
  k.feed(prompt_);
  auto ks = k.generate(lim);
  EXPECT_EQ(ks.finish, FinishReason::Cancelled);
  EXPECT_EQ(ks.generated_tokens, 0);
  // Context: on a copy of the model with a 16-token context, a 14-token prompt gets exactly 2
  // more tokens.
  test::TempDir dir;
  ModelConfig small_ctx = test::tiny_config(false);
  small_ctx.max_seq_len = 16;
  RandomCheckpointOptions ro;
  ro.seed = 1;
  write_random_checkpoint(small_ctx, dir.path(), ro);
  auto short_model = Model::load(dir.path());
  std::vector<int32_t> longp(14, 5);
  longp[0] = 0;
  Generation m(*short_model, short_model->new_sequence(), greedy, nullptr);
  m.feed(longp, 5);
  lim.cancel = nullptr;
  lim.max_tokens = 10;
  auto ms = m.generate(lim);
  EXPECT_EQ(ms.finish, FinishReason::ContextFull);
  EXPECT_EQ(ms.generated_tokens, 2);
  EXPECT_THROW(m.feed({1, 2}), Error);  // pending + 2 would overflow
}

}  // namespace
}  // namespace ds41
