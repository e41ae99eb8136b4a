// Where the buffers made at load live (model/weights.cpp, Loader::own): every one on a mapping of
// its own with huge pages advised (base/byte_buffer.h), the small ones carved from shared slabs,
// 64-byte aligned, none overlapping another; and the resident accounting leaves out the slab
// bytes never handed out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/hyper_connection.h"
#include "model/tensor_table.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

// The rows16 copies the loader handed to a block's FP8 and FP4 matrices: [begin, end) each, and
// their bytes per format.
struct CopyBytes {
  int64_t fp8 = 0, fp4 = 0;
};
void collect_copies(const BlockWeights& b, const ExpertWeights& expert, const BlockTensor& t,
                    std::vector<std::pair<const uint8_t*, const uint8_t*>>& out, CopyBytes& bytes) {
  auto add = [&](const auto& v) {
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<T, Fp8Matrix>) {
      if (v.rows16) out.emplace_back(v.rows16, v.rows16 + fp8_rows16_bytes(v));
      if (v.rows16) bytes.fp8 += fp8_rows16_bytes(v);
    } else if constexpr (std::is_same_v<T, Fp4Matrix>) {
      if (v.rows16) out.emplace_back(v.rows16, v.rows16 + fp4_rows16_bytes(v));
      if (v.rows16) bytes.fp4 += fp4_rows16_bytes(v);
    }
  };
  std::visit(
      [&](auto m) {
        if constexpr (requires { b.*m; }) add(b.*m);
        else if constexpr (requires { expert.*m; }) add(expert.*m);
        else if constexpr (requires { b.shared.*m; }) add(b.shared.*m);
      },
      t.slot);
}

TEST(ModelWeights, BuffersMadeAtLoadLieOnHugePageMappingsWithoutOverlap) {
  auto model = Model::load(test::tiny_model_dir(true));
  const ModelWeights& w = model->weights();
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
  CopyBytes copies;
  for (const LayerPlan& lp : model->plan().layers) {
    const BlockWeights& b = w.blocks[size_t(lp.id)];
    for (const BlockTensor& t : block_tensors()) {
      if (t.when == TensorWhen::RoutedExpert) {
        for (const ExpertWeights& e : b.experts) collect_copies(b, e, t, ranges, copies);
      } else {
        collect_copies(b, ExpertWeights{}, t, ranges, copies);
      }
    }
    // Buffers derived at load (transposed hc projections: mixes in blocks of kHcMixBlock).
    const ModelConfig& c = model->config();
    const int64_t fn_t_bytes =
        transposed_hc_projection_size(hc_mix_count(c.hc_mult), int64_t(c.hc_mult) * c.dim) * int64_t(sizeof(float));
    for (const float* fn_t : {b.hc_attn_fn_t, b.hc_ffn_fn_t}) {
      ASSERT_NE(fn_t, nullptr);
      const auto* p = reinterpret_cast<const uint8_t*>(fn_t);
      ranges.emplace_back(p, p + fn_t_bytes);
    }
  }
  // The tiny preset's copies are all far below a huge page: the slabs' case (on a CPU whose
  // kernels read no rows16 copy there are none, and only the mix projections are checked).
  ASSERT_GT(ranges.size(), 2 * model->plan().layers.size());
  for (const auto& range : ranges) {
    const uint8_t* begin = range.first;  // (not a structured binding: the lambda captures them)
    const uint8_t* end = range.second;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(begin) % 64, 0u);
    const auto holder = std::find_if(w.owned.begin(), w.owned.end(), [&](const ByteBuffer& buf) {
      return buf.data() <= begin && end <= buf.data() + buf.size();
    });
    ASSERT_NE(holder, w.owned.end()) << "a buffer made at load outside every owned buffer";
    EXPECT_TRUE(holder->mapped()) << "a buffer of " << (end - begin) << " bytes on the heap's small pages";
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "overlap";

  int64_t owned = 0;
  for (const ByteBuffer& buf : w.owned) owned += int64_t(buf.size());
  EXPECT_GE(w.owned_unused_bytes, 0);
  EXPECT_LT(w.owned_unused_bytes, owned);
  int64_t handed_out = 0;
  for (const auto& [begin, end] : ranges) handed_out += end - begin;
  EXPECT_GE(owned - w.owned_unused_bytes, handed_out);
  // The load's memory plan counted at least what the copies take.
  EXPECT_LE(copies.fp8, fp8_decode_copy_bytes(*w.store));
  EXPECT_LE(copies.fp4, fp4_decode_copy_bytes(*w.store));
  if (fp4_decode_reads_rows16()) EXPECT_GT(copies.fp4, 0) << "the tiny preset's experts got no copies";
}

}  // namespace
}  // namespace ds41
