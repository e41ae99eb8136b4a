#include <gtest/gtest.h>

#include "model/layer_plan.h"
#include "model/presets.h"

namespace ds41 {
namespace {

TEST(LayerPlan, ReleasedScheduleMatchesTheSpecTable) {
  ModelPlan p = build_model_plan(released_config());
  ASSERT_EQ(p.layers.size(), 43u);
  EXPECT_EQ(p.decoder_start, 20);
  auto mode = [&](int l) { return p.layers[l].mode; };
  // spec backbone.md §1.2 released schedule
  for (int l : {0, 1}) EXPECT_EQ(mode(l), AttnMode::WindowOnly) << l;
  for (int l : {2, 8, 14, 20}) EXPECT_EQ(mode(l), AttnMode::Full) << l;
  for (int l : {24, 28, 32, 36}) EXPECT_EQ(mode(l), AttnMode::Reindex) << l;
  for (int l : {3, 7, 9, 13, 15, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 38, 39}) EXPECT_EQ(mode(l), AttnMode::Reuse) << l;
  EXPECT_EQ(p.layers[38].ratio, 1);  // pitfall 18: not window-only
  EXPECT_EQ(p.layers[7].kv_source_layer, 2);
  EXPECT_EQ(p.layers[13].kv_source_layer, 8);
  EXPECT_EQ(p.layers[39].kv_source_layer, 20);
  EXPECT_EQ(p.layers[39].index_source_layer, 36);
  EXPECT_EQ(p.layers[23].index_source_layer, 20);
  EXPECT_TRUE(p.layers[20].candidate_source);
  for (int l : {24, 28, 32, 36}) EXPECT_TRUE(p.layers[l].uses_candidates) << l;
  for (int l : {2, 8, 14, 20}) EXPECT_FALSE(p.layers[l].uses_candidates) << l;
  for (int l = 0; l < 40; ++l) EXPECT_EQ(p.layers[l].decoder, l >= 20) << l;
  // RoPE: window-only layers plain 10000, compressed layers 160000 + YaRN (pitfall 3).
  for (int l : {0, 1, 40, 41, 42}) {
    EXPECT_EQ(p.layers[l].rope.theta, 10000.0) << l;
    EXPECT_FALSE(p.layers[l].rope.yarn) << l;
  }
  for (int l : {2, 19, 20, 39}) {
    EXPECT_EQ(p.layers[l].rope.theta, 160000.0) << l;
    EXPECT_TRUE(p.layers[l].rope.yarn) << l;
  }
  EXPECT_TRUE(p.layers[1].engram);
  EXPECT_TRUE(p.layers[14].engram);
  EXPECT_EQ(p.layers[14].engram_index, 1);
  EXPECT_FALSE(p.layers[2].engram);
  for (int l : {37, 38, 39}) EXPECT_TRUE(p.layers[l].dspark_target) << l;
  for (int l = 40; l < 43; ++l) {
    EXPECT_TRUE(p.layers[l].is_dspark);
    EXPECT_EQ(p.layers[l].prefix, "mtp." + std::to_string(l - 40) + ".");
    EXPECT_EQ(p.layers[l].routed_experts, 128);
    EXPECT_EQ(p.layers[l].activated_experts, 3);
    EXPECT_EQ(p.layers[l].mode, AttnMode::WindowOnly);
  }
  EXPECT_EQ(p.layers[5].routed_experts, 384);
}

TEST(LayerPlan, ReleasedPackedCacheCosts890BytesPerToken) {
  // spec §11: main KV 512/2 + 32 E4M3 scales = 288 B, index K 128/2 + 4 = 68 B per entry;
  // three ratio-2 sources and one ratio-1 source: 3 * 356 / 2 + 356 = 890.
  ModelPlan p = build_model_plan(released_config());
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 890.0);
  EXPECT_EQ(p.swa_bytes_per_sequence, int64_t(43) * 128 * (512 + 16));
}

// The wide preset: the released widths (every per-layer shape as released) on a 6-layer plan with
// the release's mix of modes.
TEST(LayerPlan, WidePresetHasTheReleasedWidths) {
  const ModelConfig w = preset_config("wide"), r = released_config();
  EXPECT_TRUE(config_problems(w).empty());
  EXPECT_EQ(w.dim, r.dim);
  EXPECT_EQ(w.moe_inter_dim, r.moe_inter_dim);
  EXPECT_EQ(w.n_heads, r.n_heads);
  EXPECT_EQ(w.head_dim, r.head_dim);
  EXPECT_EQ(w.q_lora_rank, r.q_lora_rank);
  EXPECT_EQ(w.o_groups, r.o_groups);
  EXPECT_EQ(w.o_lora_rank, r.o_lora_rank);
  EXPECT_EQ(w.n_activated_experts, r.n_activated_experts);
  EXPECT_EQ(w.index_n_heads, r.index_n_heads);
  EXPECT_EQ(w.index_topk, r.index_topk);
  EXPECT_EQ(w.candidate_topk_blocks, r.candidate_topk_blocks);
  EXPECT_EQ(w.engram_n_heads, r.engram_n_heads);
  ModelPlan p = build_model_plan(w);
  ASSERT_EQ(p.layers.size(), 7u);
  EXPECT_EQ(p.layers[0].mode, AttnMode::WindowOnly);
  EXPECT_EQ(p.layers[1].mode, AttnMode::Full);
  EXPECT_EQ(p.layers[1].ratio, 2);
  EXPECT_EQ(p.layers[2].mode, AttnMode::Reuse);
  EXPECT_EQ(p.layers[3].mode, AttnMode::Full);
  EXPECT_TRUE(p.layers[3].candidate_source);
  EXPECT_EQ(p.layers[4].mode, AttnMode::Reuse);
  EXPECT_EQ(p.layers[5].mode, AttnMode::Reindex);
  EXPECT_TRUE(p.layers[5].uses_candidates);
  EXPECT_EQ(p.decoder_start, 3);
  EXPECT_TRUE(p.layers[1].engram && p.layers[2].engram);
  EXPECT_TRUE(p.layers[6].is_dspark);
}

TEST(LayerPlan, TinyPresetExercisesEveryMode) {
  ModelPlan p = build_model_plan(preset_config("tiny"));
  ASSERT_EQ(p.layers.size(), 11u);
  EXPECT_EQ(p.layers[0].mode, AttnMode::WindowOnly);
  EXPECT_EQ(p.layers[2].mode, AttnMode::Full);
  EXPECT_EQ(p.layers[2].ratio, 2);
  EXPECT_EQ(p.layers[3].mode, AttnMode::Reuse);
  EXPECT_EQ(p.layers[4].mode, AttnMode::Full);
  EXPECT_TRUE(p.layers[4].candidate_source);
  EXPECT_EQ(p.layers[6].mode, AttnMode::Reindex);
  EXPECT_TRUE(p.layers[6].uses_candidates);
  EXPECT_EQ(p.layers[7].index_source_layer, 6);
  EXPECT_EQ(p.decoder_start, 4);
  EXPECT_TRUE(p.layers[1].engram && p.layers[3].engram);
  EXPECT_TRUE(p.layers[8].is_dspark && p.layers[10].is_dspark);
}

}  // namespace
}  // namespace ds41
