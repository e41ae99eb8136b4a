// Per-layer window validity (ring_start), CED prefill and bounded replay on the tiny model
// (decoder = layers 4..7, window 128):
// - ring_start = 0 changes nothing (the consistency tests cover the numbers); slots before it are
//   never read;
// - a CED prefill no longer than the window is a full prefill, bit for bit; a longer one builds the
//   global caches and the encoder rings exactly, and equals — bit for bit — an independent
//   construction: the decoder layers replayed over the last window from a full prefill's exact
//   encoder output (hooks) with the global caches reused;
// - a bounded replay of a sequence no longer than the window rebuilds the rings exactly.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/engram_hash.h"
#include "state_compare.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed, int64_t vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  t[0] = 0;
  return t;
}

const Model& tiny(bool engram) {
  static std::map<bool, std::unique_ptr<Model>> models;
  auto& m = models[engram];
  if (!m) m = Model::load(test::tiny_model_dir(engram));
  return *m;
}

bool same_logits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

void clear_rings(SequenceState& st) {
  for (LayerState& l : st.layers) {
    std::fill(l.ring_codes.begin(), l.ring_codes.end(), uint8_t(0));
    std::fill(l.ring_scales.begin(), l.ring_scales.end(), uint8_t(127));
  }
}

ForwardOptions ced_options() {
  ForwardOptions o;
  o.prefill = PrefillMode::Ced;
  return o;
}

TEST(RingStart, PositionsBeforeItAreNeverRead) {
  const Model& m = tiny(false);
  const int64_t V = m.config().vocab_size;
  SequenceState base = m.new_sequence();
  m.forward(base, random_tokens(90, 1, V), {}, &pool());
  const std::vector<int32_t> more = random_tokens(20, 2, V);

  SequenceState whole = base;  // every window position valid
  const auto l_whole = m.forward(whole, more, {}, &pool());
  SequenceState cut = base;    // the window starts at the new tokens
  for (LayerState& l : cut.layers) l.ring_start = cut.pos;
  const auto l_cut = m.forward(cut, more, {}, &pool());
  SequenceState garbage = base;  // same, with the invisible slots scrambled
  std::mt19937 g(3);
  for (LayerState& l : garbage.layers) {
    l.ring_start = garbage.pos;
    for (auto& b : l.ring_codes) b = uint8_t(g() % 0x7f);  // finite E4M3 codes, not the real values
  }
  const auto l_garbage = m.forward(garbage, more, {}, &pool());
  EXPECT_TRUE(same_logits(l_cut, l_garbage)) << "a slot before ring_start was read";
  EXPECT_FALSE(same_logits(l_cut, l_whole)) << "ring_start had no effect";
}

TEST(CedPrefill, NoLongerThanTheWindowIsAFullPrefillBitForBit) {
  const Model& m = tiny(true);
  const int W = int(m.config().window_size);
  for (int n : {W}) {
    const auto prompt = random_tokens(n, uint32_t(n), m.config().vocab_size);
    SequenceState full = m.new_sequence(), ced = m.new_sequence();
    const auto lf = m.forward(full, prompt, {}, &pool());
    const auto lc = m.forward(ced, prompt, ced_options(), &pool());
    EXPECT_TRUE(same_logits(lf, lc)) << n;
    EXPECT_TRUE(test::same_state(full, ced)) << n;
    // A later call of at most a window (a chat turn) is a full call too.
    const auto turn = random_tokens(40, 5, m.config().vocab_size);
    EXPECT_TRUE(same_logits(m.forward(full, turn, {}, &pool()), m.forward(ced, turn, ced_options(), &pool()))) << n;
    EXPECT_TRUE(test::same_state(full, ced)) << n;
  }
}

class CedLong : public ::testing::TestWithParam<int> {};

TEST_P(CedLong, GlobalCachesExactAndEqualToReplayingTheDecoderOverExactEncoderOutput) {
  const Model& m = tiny(false);
  const ModelPlan& plan = m.plan();
  const ModelConfig& c = m.config();
  const int n = GetParam(), W = int(c.window_size), dec = plan.decoder_start;
  ASSERT_LT(dec, plan.n_layers);
  const auto prompt = random_tokens(n, uint32_t(n) + 11, c.vocab_size);

  // Full prefill, keeping the stream and pre-mix that enter the first decoder layer.
  const int64_t row = int64_t(c.hc_mult) * c.dim;
  std::vector<uint16_t> enc_X;
  std::vector<float> enc_a;
  ForwardHooks capture;
  capture.after_block = [&](int layer, int S, const uint16_t* X, const float* a) {
    if (layer != dec - 1) return;
    enc_X.assign(X, X + S * row);
    enc_a.assign(a, a + S * c.hc_mult);
  };
  SequenceState full = m.new_sequence();
  const auto l_full = m.forward(full, prompt, {}, &pool(), &capture);

  SequenceState ced = m.new_sequence();
  const auto l_ced = m.forward(ced, prompt, ced_options(), &pool());
  ASSERT_TRUE(all_finite(l_ced));
  EXPECT_FALSE(same_logits(l_ced, l_full)) << "the decoder was not narrowed";
  EXPECT_EQ(ced.pos, n);
  EXPECT_EQ(ced.index_k_publisher, full.index_k_publisher);
  EXPECT_EQ(ced.token_history, full.token_history);
  for (const LayerPlan& lp : plan.layers) {
    if (lp.is_dspark) continue;
    const LayerState& a = ced.layers[size_t(lp.id)];
    const LayerState& b = full.layers[size_t(lp.id)];
    EXPECT_TRUE(test::same_global_cache(a, b)) << "layer " << lp.id;  // every kv source, decoder's too
    if (lp.id < dec) {
      EXPECT_TRUE(test::same_ring(a, b)) << "encoder layer " << lp.id;
    } else {
      EXPECT_EQ(a.ring_start, n - W) << "decoder layer " << lp.id;
    }
  }

  // Independent construction: from the full prefill's state (exact caches), replay the last
  // window with the decoder's input replaced by the exact encoder output of those positions.
  SequenceState rep = full;
  const int s = n - W;
  rep.pos = s;
  rep.token_history.resize(size_t(s));
  ForwardHooks inject;
  inject.before_block = [&](int layer, int S, uint16_t* X, float* a) {
    if (layer != dec) return;
    ASSERT_EQ(S, W);
    std::memcpy(X, enc_X.data() + s * row, size_t(W * row) * 2);
    std::memcpy(a, enc_a.data() + s * c.hc_mult, size_t(W * c.hc_mult) * 4);
  };
  ForwardOptions ro;
  ro.bounded_replay = true;
  const auto l_rep = m.forward(rep, std::vector<int32_t>(prompt.end() - W, prompt.end()), ro, &pool(), &inject);
  EXPECT_TRUE(same_logits(l_ced, l_rep));
  for (int l = dec; l < plan.n_layers; ++l) EXPECT_TRUE(test::same_ring(ced.layers[size_t(l)], rep.layers[size_t(l)])) << l;

  // Decoding goes on from the CED state; the window has moved past the replay start.
  std::vector<float> lg = l_ced;
  for (int step = 0; step < 4; ++step) {
    lg = m.forward(ced, {argmax(lg)}, {}, &pool());
    ASSERT_TRUE(all_finite(lg));
  }
  EXPECT_EQ(ced.pos, n + 4);
}

// 200: the replay start is even; 201: odd, a ratio-2 group is left open across the split.
INSTANTIATE_TEST_SUITE_P(Ced, CedLong, ::testing::Values(200, 201));

TEST(CedPrefill, RefusesWhatANarrowedCallCannotGive) {
  const Model& m = tiny(false);
  const auto prompt = random_tokens(int(m.config().window_size) + 1, 9, m.config().vocab_size);
  SequenceState st = m.new_sequence();
  ForwardOptions o = ced_options();
  o.all_logits = true;
  EXPECT_THROW(m.forward(st, prompt, o, &pool()), Error);
  ForwardHooks hooks;
  hooks.after_block = [](int, int, const uint16_t*, const float*) {};
  EXPECT_THROW(m.forward(st, prompt, ced_options(), &pool(), &hooks), Error);
  o = ced_options();
  o.bounded_replay = true;
  EXPECT_THROW(m.forward(st, prompt, o, &pool()), Error);
  EXPECT_TRUE(test::same_state(st, m.new_sequence()));  // refused calls change nothing
}

TEST(BoundedReplay, WithinTheWindowRebuildsTheRingsExactly) {
  for (bool engram : {false, true}) {
    const Model& m = tiny(engram);
    SequenceState full = m.new_sequence();
    const auto lf = m.forward(full, random_tokens(101, 21, m.config().vocab_size), {}, &pool());
    SequenceState restored = full;
    clear_rings(restored);
    const auto lr = m.replay_window(restored, {}, &pool());
    EXPECT_TRUE(same_logits(lf, lr)) << engram;
    EXPECT_TRUE(test::same_state(full, restored)) << engram;
  }
  // Fed in chunks, the replay (one call) is exact with the corrected index-key reading.
  const Model& m = tiny(false);
  ForwardOptions corrected;
  corrected.corrected_index_keys = true;
  const auto toks = random_tokens(101, 22, m.config().vocab_size);
  SequenceState chunked = m.new_sequence();
  std::vector<float> lc;
  for (size_t i = 0; i < toks.size(); i += 7)
    lc = m.forward(chunked, std::vector<int32_t>(toks.begin() + long(i), toks.begin() + long(std::min(toks.size(), i + 7))),
                   corrected, &pool());
  SequenceState restored = chunked;
  clear_rings(restored);
  EXPECT_TRUE(same_logits(lc, m.replay_window(restored, corrected, &pool())));
  EXPECT_TRUE(test::same_state(chunked, restored));
}

TEST(BoundedReplay, BeyondTheWindowKeepsTheGlobalCachesAndNeedsOnlyTheLastTokens) {
  const Model& m = tiny(true);
  const ModelConfig& c = m.config();
  const int n = 190, W = int(c.window_size);
  SequenceState full = m.new_sequence();
  m.forward(full, random_tokens(n, 31, c.vocab_size), {}, &pool());
  // What a compact session keeps: the last window and the Engram look-back before it.
  SequenceState restored = full;
  clear_rings(restored);
  const int64_t keep = W + c.engram_max_ngram_size - 1;
  restored.history_start = n - keep;
  restored.token_history.erase(restored.token_history.begin(), restored.token_history.end() - keep);
  restored.engram_history.erase(restored.engram_history.begin(), restored.engram_history.end() - keep);
  ASSERT_TRUE(all_finite(m.replay_window(restored, {}, &pool())));
  EXPECT_EQ(restored.pos, n);
  EXPECT_EQ(restored.history_start, n - keep);
  EXPECT_EQ(restored.index_k_publisher, full.index_k_publisher);
  for (size_t l = 0; l < full.layers.size(); ++l) {
    EXPECT_TRUE(test::same_global_cache(full.layers[l], restored.layers[l])) << l;
    if (!m.plan().layers[l].is_dspark) { EXPECT_EQ(restored.layers[l].ring_start, n - W) << l; }
  }
  // Layer 0's window KV is a function of each token alone: exact whatever the window.
  EXPECT_TRUE(full.layers[0].ring_codes == restored.layers[0].ring_codes);
  EXPECT_FALSE(full.layers[2].ring_codes == restored.layers[2].ring_codes);  // approximate deeper

  // Decoding continues on both; one look-back position less and Engram hashing must refuse.
  std::vector<float> lg = m.forward(restored, {5}, {}, &pool());
  ASSERT_TRUE(all_finite(lg));
  SequenceState short_history = restored;
  const int64_t drop = int64_t(short_history.token_history.size()) - (c.engram_max_ngram_size - 2);
  short_history.history_start += drop;
  short_history.token_history.erase(short_history.token_history.begin(), short_history.token_history.begin() + drop);
  short_history.engram_history.erase(short_history.engram_history.begin(), short_history.engram_history.begin() + drop);
  const SequenceState before = short_history;
  EXPECT_THROW(m.forward(short_history, {5}, {}, &pool()), Error);
  EXPECT_TRUE(test::same_state(short_history, before));
}

TEST(BoundedReplay, RefusesCachesThatDoNotEndWhereTheReplayEnds) {
  const Model& m = tiny(false);
  SequenceState st = m.new_sequence();
  m.forward(st, random_tokens(40, 41, m.config().vocab_size), {}, &pool());
  ForwardOptions o;
  o.bounded_replay = true;
  const SequenceState before = st;
  EXPECT_THROW(m.forward(st, {7, 8}, o, &pool()), Error);  // the caches stop at 40, the call at 42
  EXPECT_TRUE(test::same_state(st, before));
  SequenceState empty = m.new_sequence();
  EXPECT_THROW(m.replay_window(empty, {}, &pool()), Error);
}

}  // namespace
}  // namespace ds41
