// Sequence assembly for image prompts (spec engram_dspark_vision.md §C.3, §C.6; image_processor.py
// prepare_vl_inputs, model.py merge_image_embeddings): every image placeholder token
// (config.image_token_id, <｜deepseek_image｜> = 129264 in the release) in a prompt's ids becomes
// the image's span
//     [IMAGE_START] + ([IMAGE] x n_llm_w + [IMAGE_NEW_LINE]) x n_llm_h + [IMAGE_END]
// whose positions all keep the placeholder id; the span's token types select the rows that
// replace their embeddings: the learned image_start / image_newline / image_end vectors and the
// aligner rows of the image in reading order. Images are matched to placeholders in order.
// The result feeds Model::forward (InputEmbeddings), whole or in chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"
#include "vision/image_decode.h"
#include "vision/image_grid.h"

namespace ds41 {

class ThreadPool;

struct ImageSpan {
  int64_t start = 0;  // position of IMAGE_START in the expanded ids
  ImageGrid grid;
  int64_t length() const { return grid.span_length(); }
};

struct ImagePrompt {
  std::vector<int32_t> tokens;  // expanded ids
  InputEmbeddings inputs;       // token types of every position, rows of every span position
  std::vector<ImageSpan> spans;
};

// The token types of one image's span.
std::vector<int8_t> image_span_types(const ImageGrid& grid);

// Expands the placeholders (ids, types, spans; rows left empty). Throws when the number of
// placeholders differs from the number of grids.
ImagePrompt expand_image_placeholders(const std::vector<int32_t>& prompt, int64_t image_token_id,
                                      const std::vector<ImageGrid>& grids);

// Writes the rows of span `index`: delimiters from the model's learned vectors, IMAGE slots from
// `aligner_rows` ([n_llm_h * n_llm_w][dim] bf16, reading order). Sizes rows on first use.
void fill_image_span_rows(ImagePrompt& p, size_t index, const uint16_t* aligner_rows, const VisionWeights& w,
                          int64_t dim);

// The whole path for decoded images: plan, preprocess, vision tower, expansion, merge. Throws a
// clear error when the model has no vision tower but images or placeholders are given, or when
// placeholders and images do not pair up.
ImagePrompt build_image_prompt(const Model& model, const std::vector<int32_t>& prompt,
                               const std::vector<RgbImage>& images, ThreadPool* pool);

}  // namespace ds41
