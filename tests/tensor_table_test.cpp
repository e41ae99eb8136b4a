// The tensor tables (model/tensor_table.h) drive both the catalogue and the loader: these tests
// check that the two walks agree - every tensor a block holds has its view filled at load, and
// nothing else does - and that the table names each tensor once.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <variant>

#include "model/presets.h"
#include "model/tensor_table.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

// Whether the view a block row's slot names was filled.
bool filled(const BlockTensor& t, const BlockWeights& b, const ExpertWeights& expert, const DSparkHeadWeights& d) {
  auto set = [](const auto& v) {
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_pointer_v<T>) return v != nullptr;
    else return v.w != nullptr && v.scale != nullptr && v.N > 0 && v.K > 0;
  };
  return std::visit(
      [&](auto m) -> bool {
        if constexpr (requires { b.*m; }) return set(b.*m);
        else if constexpr (requires { expert.*m; }) return set(expert.*m);
        else if constexpr (requires { b.shared.*m; }) return set(b.shared.*m);
        else return set(d.*m);
      },
      t.slot);
}

TEST(TensorTable, EveryViewOfTheTinyModelIsFilledExactlyWhereTheTableSays) {
  auto model = Model::load(test::tiny_model_dir(true));
  const ModelConfig& c = model->config();
  const ModelWeights& w = model->weights();
  ASSERT_EQ(w.blocks.size(), model->plan().layers.size());
  int checked = 0;
  for (const LayerPlan& lp : model->plan().layers) {
    const BlockWeights& b = w.blocks[size_t(lp.id)];
    ASSERT_EQ(b.experts.size(), size_t(lp.routed_experts));
    for (const BlockTensor& t : block_tensors()) {
      // The draft-head rows land in one shared struct: only the stage that holds them is checked.
      const bool dspark_row = t.when == TensorWhen::DSparkFirst || t.when == TensorWhen::DSparkLast;
      if (dspark_row && !block_has(t, c, lp)) continue;
      if (t.when == TensorWhen::RoutedExpert) {
        for (const ExpertWeights& e : b.experts) EXPECT_TRUE(filled(t, b, e, w.dspark)) << lp.prefix << t.name;
        ++checked;
        continue;
      }
      // The tiny preset has vision on, so bias_vl is required in backbone layers; mkmodel writes it
      // in every layer (as the release does), and the loader reads it where it is present.
      const bool expected = t.when == TensorWhen::GateVisionBias || block_has(t, c, lp);
      EXPECT_EQ(filled(t, b, ExpertWeights{}, w.dspark), expected) << lp.prefix << t.name;
      ++checked;
    }
    // The views derived from table rows at load.
    EXPECT_NE(b.wo_a, nullptr);
    EXPECT_NE(b.hc_attn_fn_t, nullptr);
    EXPECT_NE(b.hc_ffn_fn_t, nullptr);
    if (lp.engram) {
      EXPECT_NE(b.engram_table_scale, nullptr);
      EXPECT_EQ(b.engram_rows, c.engram_num_embeddings[size_t(lp.engram_index)]);
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_NE(w.embed, nullptr);
  EXPECT_NE(w.head_packed.blocks, nullptr);
  ASSERT_EQ(w.vision.blocks.size(), size_t(c.vision_n_layers));
  EXPECT_NE(w.vision.norm, nullptr);
  EXPECT_NE(w.vision.image_newline, nullptr);
  for (const VisionBlockWeights& vb : w.vision.blocks) {
    EXPECT_NE(vb.norm1, nullptr);
    EXPECT_NE(vb.w2, nullptr);
  }
}

TEST(TensorTable, NamesAreUniqueAndTheCatalogueHasNoDuplicates) {
  std::set<std::string> names;
  for (const BlockTensor& t : block_tensors()) EXPECT_TRUE(names.insert(t.name).second) << t.name;
  for (const std::string& preset : preset_names()) {
    std::set<std::string> seen;
    for (const TensorSpec& s : build_weight_catalogue(preset_config(preset)))
      EXPECT_TRUE(seen.insert(s.name).second) << preset << ": " << s.name;
  }
}

}  // namespace
}  // namespace ds41
