// Sequence assembly of image prompts (spec §C.3, §C.6): placeholder expansion, span token types,
// the rows of each span, slicing for chunked calls, and the errors for prompts and images that do
// not pair up. No checkpoint needed (tests/slow/vision_forward_test.cpp runs the model).
#include <gtest/gtest.h>

#include <functional>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "vision/image_prompt.h"

namespace ds41 {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ImageGrid grid(int64_t lh, int64_t lw) {
  ImageGrid g;
  g.n_llm_h = lh;
  g.n_llm_w = lw;
  g.n_vit_h = 3 * lh;
  g.n_vit_w = 3 * lw;
  g.best_height = 14 * g.n_vit_h;
  g.best_width = 14 * g.n_vit_w;
  return g;
}

TEST(VisionPrompt, SpanTypesAreStartRowsOfImagesWithNewlineThenEnd) {
  const std::vector<int8_t> t = image_span_types(grid(2, 3));
  const std::vector<int8_t> want = {0, 1, 1, 1, 2, 1, 1, 1, 2, 3};
  EXPECT_EQ(t, want);
  EXPECT_EQ(grid(2, 3).span_length(), 10);
  EXPECT_EQ(grid(31, 31).span_length(), 994);  // spec §C.2: 1344 x 1344 -> 994 tokens
}

TEST(VisionPrompt, PlaceholdersExpandInPlaceAndKeepTheImageId) {
  const int32_t img = 511;
  const ImagePrompt p = expand_image_placeholders({0, 7, img, 8, img, 9}, img, {grid(2, 3), grid(2, 1)});
  const std::vector<int32_t> ids = {0, 7, img, img, img, img, img, img, img, img, img, img, 8,
                                    img, img, img, img, img, img, 9};
  EXPECT_EQ(p.tokens, ids);
  ASSERT_EQ(p.spans.size(), 2u);
  EXPECT_EQ(p.spans[0].start, 2);
  EXPECT_EQ(p.spans[0].length(), 10);
  EXPECT_EQ(p.spans[1].start, 13);
  EXPECT_EQ(p.spans[1].length(), 6);
  const std::vector<int8_t> types = {-1, -1, 0, 1, 1, 1, 2, 1, 1, 1, 2, 3, -1, 0, 1, 2, 1, 2, 3, -1};
  EXPECT_EQ(p.inputs.token_types, types);
}

TEST(VisionPrompt, SpanRowsAreDelimitersAndAlignerRowsInReadingOrder) {
  const int64_t D = 4;
  std::vector<uint16_t> start(D, f32_to_bf16(-1)), end(D, f32_to_bf16(-3)), newline(D, f32_to_bf16(-2));
  VisionWeights w;
  w.image_start = start.data();
  w.image_end = end.data();
  w.image_newline = newline.data();
  ImagePrompt p = expand_image_placeholders({5, 1, 1, 6}, 1, {grid(1, 2), grid(2, 1)});
  std::vector<uint16_t> a0 = {f32_to_bf16(10), 0, 0, 0, f32_to_bf16(11), 0, 0, 0};
  std::vector<uint16_t> a1 = {f32_to_bf16(20), 0, 0, 0, f32_to_bf16(21), 0, 0, 0};
  fill_image_span_rows(p, 1, a1.data(), w, D);  // any order
  fill_image_span_rows(p, 0, a0.data(), w, D);
  // Span 0: start, 10, 11, newline, end; span 1: start, 20, newline, 21, newline, end.
  const std::vector<float> first = {-1, 10, 11, -2, -3, -1, 20, -2, 21, -2, -3};
  ASSERT_EQ(p.inputs.rows.size(), first.size() * D);
  for (size_t r = 0; r < first.size(); ++r) EXPECT_EQ(bf16_to_f32(p.inputs.rows[r * D]), first[r]) << r;
  // A slice keeps exactly the rows of its own non-text positions.
  const InputEmbeddings s = p.inputs.slice(3, 9, D);  // positions 3..8: 11, nl, end, start(2nd), 20, nl
  EXPECT_EQ(s.token_types.size(), 6u);
  ASSERT_EQ(s.rows.size(), 6u * D);
  EXPECT_EQ(bf16_to_f32(s.rows[0]), 11.0f);
  EXPECT_EQ(bf16_to_f32(s.rows[4 * D]), 20.0f);
  EXPECT_TRUE(p.inputs.slice(0, 1, D).all_text());
  EXPECT_FALSE(s.all_text());
  EXPECT_NE(error_of([&] { p.inputs.slice(3, 99, D); }).find("out of range"), std::string::npos);
}

TEST(VisionPrompt, PlaceholderAndImageCountsMustAgree) {
  EXPECT_NE(error_of([] { expand_image_placeholders({0, 9, 9}, 9, {grid(1, 1)}); })
                .find("2 image placeholder tokens (id 9) but 1 image was given"),
            std::string::npos);
  EXPECT_NE(error_of([] { expand_image_placeholders({0, 3}, 9, {grid(1, 1)}); }).find("0 image placeholder tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace ds41
