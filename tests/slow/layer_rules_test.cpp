// One test per layer-plan rule, observed on the tiny model through the forward hooks:
// window-only layers have no global branch; Reuse layers attend exactly their index source's
// top-k; the Reindex layer stays inside the candidate pool; a ratio-2 entry is invisible until
// its whole group is; a ratio-1 entry is visible to its own token.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "base/thread_pool.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

struct Observed {
  std::map<int, std::vector<std::vector<int32_t>>> topk, entries;  // layer -> per position
  std::map<int, std::vector<std::vector<uint8_t>>> pool;
};

Observed run(const Model& m, int n, int chunk) {
  Observed o;
  ForwardHooks h;
  int64_t base = 0;
  auto put = [&](auto& map, int layer, int s, const auto& v) {
    auto& rows = map[layer];
    if (int64_t(rows.size()) <= base + s) rows.resize(size_t(base + s + 1));
    rows[size_t(base + s)] = v;
  };
  h.on_topk = [&](int l, int s, const std::vector<int32_t>& e) { put(o.topk, l, s, e); };
  h.on_attention_entries = [&](int l, int s, const std::vector<int32_t>& e) { put(o.entries, l, s, e); };
  h.on_candidates = [&](int l, int s, const std::vector<uint8_t>& k) { put(o.pool, l, s, k); };
  std::mt19937 g(99);
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (auto& t : prompt) t = int32_t(g() % 129280);
  SequenceState st = m.new_sequence();
  ThreadPool pool(2);
  for (int i = 0; i < n; i += chunk) {
    std::vector<int32_t> part(prompt.begin() + i, prompt.begin() + std::min(n, i + chunk));
    base = i;
    m.forward(st, part, ForwardOptions{}, &pool, &h);
  }
  return o;
}

class LayerRules : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::tiny_model_dir(false)).release();
    prefill_ = new Observed(run(*model_, 200, 200));
    decode_ = new Observed(run(*model_, 200, 1));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete prefill_;
    delete decode_;
  }
  static Model* model_;
  static Observed *prefill_, *decode_;
};
Model* LayerRules::model_ = nullptr;
Observed* LayerRules::prefill_ = nullptr;
Observed* LayerRules::decode_ = nullptr;

TEST_F(LayerRules, WindowOnlyLayersHaveNoGlobalBranch) {
  for (const Observed* o : {prefill_, decode_}) {
    for (const LayerPlan& lp : model_->plan().layers) {
      if (lp.is_dspark) continue;
      EXPECT_EQ(o->entries.count(lp.id) > 0, lp.ratio > 0) << "layer " << lp.id;
      EXPECT_EQ(o->topk.count(lp.id) > 0, lp.index_source) << "layer " << lp.id;
    }
  }
}

TEST_F(LayerRules, ReuseLayersAttendTheirIndexSourcesTopK) {
  for (const Observed* o : {prefill_, decode_})
    for (const LayerPlan& lp : model_->plan().layers) {
      if (lp.ratio == 0 || lp.is_dspark) continue;
      ASSERT_TRUE(o->topk.count(lp.index_source_layer)) << lp.id;
      EXPECT_EQ(o->entries.at(lp.id), o->topk.at(lp.index_source_layer)) << "layer " << lp.id;
    }
}

TEST_F(LayerRules, ReindexLayerStaysInsideTheCandidatePool) {
  const auto& plan = model_->plan();
  int checked = 0, restricted = 0;
  for (const Observed* o : {prefill_, decode_})
    for (const LayerPlan& lp : plan.layers) {
      if (!lp.uses_candidates) continue;
      const auto& pool = o->pool.at(model_->config().candidate_source_layer);
      const auto& topk = o->topk.at(lp.id);
      // The reference masks scores outside the pool to -inf and then takes the top-k, so when the
      // pool holds fewer visible entries than index_topk (a partial newest block, small pools)
      // the remaining picks are visible entries outside it. Hence: a pool at least top-k large
      // contains every pick; a smaller pool is contained in the picks.
      const size_t k = size_t(model_->config().index_topk);
      for (size_t s = 0; s < topk.size(); ++s) {
        const std::set<int32_t> picks(topk[s].begin(), topk[s].end());
        std::set<int32_t> in_pool;
        for (size_t e = 0; e < pool[s].size(); ++e)
          if (pool[s][e]) in_pool.insert(int32_t(e));
        if (in_pool.size() >= k) {
          for (int32_t e : picks) EXPECT_TRUE(in_pool.count(e)) << "layer " << lp.id << " position " << s << " entry " << e;
          restricted += in_pool.size() < pool[s].size();
        } else {
          for (int32_t e : in_pool) EXPECT_TRUE(picks.count(e)) << "layer " << lp.id << " position " << s << " entry " << e;
        }
        checked += int(picks.size());
      }
      // Once more blocks are visible than the pool keeps, the pool really restricts.
      const auto& last = pool.back();
      EXPECT_LT(std::count(last.begin(), last.end(), 1), int64_t(last.size()));
    }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(restricted, 100) << "the pool rarely excluded visible entries: the test would not see a violation";
}

TEST_F(LayerRules, RatioTwoEntryInvisibleUntilItsGroupIsComplete) {
  const int topk = model_->config().index_topk;
  for (const Observed* o : {prefill_, decode_}) {
    const auto& rows = o->entries.at(3);  // ratio-2 Reuse layer
    for (size_t p = 0; p < rows.size(); ++p) {
      for (int32_t e : rows[p]) EXPECT_LE(2 * (e + 1), int64_t(p) + 1) << "position " << p;
      // While fewer entries than top-k are visible, all of them are used: exactly (p+1)/2.
      if ((p + 1) / 2 <= size_t(topk)) {
        EXPECT_EQ(rows[p].size(), (p + 1) / 2) << "position " << p;
      }
    }
  }
}

TEST_F(LayerRules, RatioOneEntryVisibleToItsOwnToken) {
  const int topk = model_->config().index_topk;
  for (const Observed* o : {prefill_, decode_}) {
    const auto& rows = o->entries.at(5);  // ratio-1 Reuse layer
    for (size_t p = 0; p < size_t(topk); ++p) {
      std::vector<int32_t> all(p + 1);
      for (size_t e = 0; e <= p; ++e) all[e] = int32_t(e);
      EXPECT_EQ(rows[p], all) << "position " << p;  // entry p is its own token's
    }
  }
}

}  // namespace
}  // namespace ds41
