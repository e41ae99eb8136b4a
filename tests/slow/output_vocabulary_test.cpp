// Ids without a token are never produced (a padded vocabulary killed `ds41 serve`). The released
// model has 129,280 head rows for a tokenizer of fewer ids; Model::restrict_output_ids gives every
// id without a token -inf in every head product, and the head screen never picks one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "model/model.h"
#include "test_command.h"
#include "test_paths.h"
#include "test_tokenizer_files.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

int32_t argmax_of(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// With the unrestricted argmax (and every id past it) disallowed, and a gap below it, the full
// product and the head screen (greedy) give the best allowed id, and -inf at every other.
TEST(OutputVocabulary, NoHeadProductProducesAnIdPastTheLimit) {
  auto model = Model::load(test::tiny_model_dir(false));
  const int64_t V = model->config().vocab_size;
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = {0, 17, 4242, 99, 31000, 7};
  ForwardOptions all;
  all.head_top_k = -1;
  SequenceState a = model->new_sequence();
  const std::vector<float> free_logits = model->forward(a, prompt, all, &pool);
  const int32_t best = argmax_of(free_logits.data(), V);
  ASSERT_GT(best, 0) << "pick another prompt: the unlimited argmax must leave ids below it";
  // Allowed: ids below `best`, except the best of those (a gap, as a tokenizer may have).
  std::vector<uint8_t> allowed(size_t(best), 1);
  const int32_t gap = argmax_of(free_logits.data(), best);
  allowed[size_t(gap)] = 0;
  model->restrict_output_ids(allowed);
  EXPECT_FALSE(model->output_id_allowed(best));
  EXPECT_FALSE(model->output_id_allowed(gap));
  std::vector<float> allowed_logits = free_logits;
  allowed_logits[size_t(gap)] = -std::numeric_limits<float>::infinity();
  const int32_t expected = argmax_of(allowed_logits.data(), best);

  SequenceState b = model->new_sequence();
  const std::vector<float> full = model->forward(b, prompt, all, &pool);
  for (int64_t v = best; v < V; ++v) ASSERT_EQ(full[size_t(v)], -std::numeric_limits<float>::infinity()) << v;
  EXPECT_TRUE(std::equal(full.begin(), full.begin() + best, allowed_logits.begin()));  // the rest untouched
  EXPECT_EQ(argmax_of(full.data(), V), expected);

  ForwardOptions greedy;
  greedy.head_top_k = 1;  // the head screen
  SequenceState c = model->new_sequence();
  const std::vector<float> screened = model->forward(c, prompt, greedy, &pool);
  EXPECT_EQ(argmax_of(screened.data(), V), expected);
  EXPECT_EQ(screened[size_t(expected)], free_logits[size_t(expected)]);

  model->restrict_output_ids({});  // every id again
  EXPECT_TRUE(model->output_id_allowed(best));
  SequenceState d = model->new_sequence();
  EXPECT_EQ(argmax_of(model->forward(d, prompt, greedy, &pool).data(), V), best);
}

TEST(OutputVocabulary, DraftsStayBelowTheLimit) {
  auto model = Model::load(test::tiny_model_dir(false));
  if (!model->has_dspark()) GTEST_SKIP() << "the tiny preset has no draft head";
  const int64_t V = model->config().vocab_size, limit = V / 2;
  model->restrict_output_ids(std::vector<uint8_t>(size_t(limit), 1));
  ThreadPool pool(2);
  for (int32_t start : {3, 500, 77777}) {
    SequenceState st = model->new_sequence();
    std::vector<uint16_t> main_hidden;
    ForwardOptions fo;
    fo.main_hidden_out = &main_hidden;
    model->forward(st, {0, 5, start}, fo, &pool);
    model->dspark_commit(st, main_hidden.data(), 3, &pool);
    DSparkDraft d = model->dspark_draft(st, start, model->config().dspark_block_size, {}, &pool);
    for (int32_t t : d.drafts) EXPECT_LT(t, limit);
    for (int64_t k = 0; k < int64_t(d.drafts.size()); ++k)
      for (int64_t v = limit; v < V; ++v) ASSERT_EQ(d.logits[size_t(k * V + v)], -std::numeric_limits<float>::infinity());
  }
}

// `ds41 run -p` with a tokenizer of fewer ids than the model's rows (the V3 file: 128,815 ids for
// the tiny preset's 129,280 rows), sampled at temperature 1 and greedy: every run completes with
// its JSON (it used to stop on "token id ... is outside the vocabulary" for ~2 seeds in 3).
TEST(OutputVocabulary, RunWithAPaddedVocabularyAlwaysCompletes) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string m = "-m " + test::tiny_model_dir(false) + " --tokenizer " + test::v3_tokenizer_path() + " --threads 2";
  for (const char* sampling : {"--temp 1 --seed 1", "--temp 1 --seed 4", "--temp 1 --seed 6", "--temp 1.5 --seed 9", ""}) {
    auto r = test::run_ds41("run " + m + " -p Hello --max-tokens 120 --json " + sampling);
    ASSERT_EQ(r.status, 0) << sampling << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j.contains("generated")) << r.out.substr(0, 200);
    for (const auto& t : j["generated"]) EXPECT_LT(t.get<int64_t>(), 128815) << sampling;
  }
}

}  // namespace
}  // namespace ds41
