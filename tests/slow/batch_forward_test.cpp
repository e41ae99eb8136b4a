// Model::forward_batch: one decode step of several sequences together gives, row for row, the
// logits and the state of each sequence stepped on its own (bit for bit), with Engram, sequences
// past the window and a compressor group boundary, in both index-key readings and with the head
// screen; bad batches are refused before anything changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/thread_pool.h"
#include "../state_compare.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

using test::tokens_for;

TEST(BatchForward, EveryRowEqualsItsSequenceSteppedAlone) {
  auto model = Model::load(test::tiny_model_dir(true));
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  for (int variant = 0; variant < 3; ++variant) {
    // Both index-key readings, and the head screen (greedy steps: head_screen.h) on the rows.
    const bool corrected = variant == 1, screened = variant == 2;
    ForwardOptions opt;
    opt.corrected_index_keys = corrected;
    opt.head_top_k = screened ? 2 : 0;
    // Prompt lengths: short, odd (a partial compressor group), past the window.
    const std::vector<int> lengths = {3, 57, int(c.window_size) + 21};
    std::vector<SequenceState> alone, batched;
    for (size_t i = 0; i < lengths.size(); ++i) {
      SequenceState s = model->new_sequence();
      model->forward(s, tokens_for(lengths[i], int(i), c.vocab_size), opt, &pool);
      alone.push_back(s);
      batched.push_back(s);
    }
    std::vector<SequenceState*> ptrs;
    for (auto& s : batched) ptrs.push_back(&s);
    std::vector<float> logits, one;
    for (int step = 0; step < 4; ++step) {
      std::vector<int32_t> next;
      for (size_t i = 0; i < lengths.size(); ++i) next.push_back(int32_t((step * 31 + int(i) * 1000 + 5) % c.vocab_size));
      model->forward_batch(logits, ptrs, next, opt, &pool);
      ASSERT_EQ(logits.size(), lengths.size() * size_t(c.vocab_size));
      for (size_t i = 0; i < lengths.size(); ++i) {
        model->forward_into(one, alone[i], {next[i]}, opt, &pool);
        EXPECT_EQ(0, std::memcmp(one.data(), logits.data() + i * size_t(c.vocab_size), one.size() * sizeof(float)))
            << "corrected " << corrected << " step " << step << " sequence " << i;
        EXPECT_TRUE(test::same_state(alone[i], batched[i])) << "corrected " << corrected << " step " << step << " sequence " << i;
        if (screened) {  // the screen decided: all but its candidates are -inf
          EXPECT_GT(std::count(one.begin(), one.end(), -std::numeric_limits<float>::infinity()), c.vocab_size / 2);
        }
      }
    }
  }
}

TEST(BatchForward, RefusesBadBatchesBeforeChangingAnything) {
  auto model = Model::load(test::tiny_model_dir(true));
  ThreadPool pool(1);
  SequenceState a = model->new_sequence(), b = model->new_sequence();
  model->forward(a, {1, 2, 3}, {}, &pool);
  model->forward(b, {4, 5}, {}, &pool);
  const SequenceState a0 = a, b0 = b;
  std::vector<float> logits;
  EXPECT_THROW(model->forward_batch(logits, {&a, &b}, {1}, {}, &pool), Error);
  EXPECT_THROW(model->forward_batch(logits, {&a, &a}, {1, 2}, {}, &pool), Error);
  EXPECT_THROW(model->forward_batch(logits, {&a, &b}, {1, -3}, {}, &pool), Error);
  EXPECT_THROW(model->forward_batch(logits, {}, {}, {}, &pool), Error);
  ForwardOptions all;
  all.all_logits = true;
  EXPECT_THROW(model->forward_batch(logits, {&a, &b}, {1, 2}, all, &pool), Error);
  EXPECT_TRUE(test::same_state(a, a0));
  EXPECT_TRUE(test::same_state(b, b0));
}

}  // namespace
}  // namespace ds41
