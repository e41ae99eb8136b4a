#include "vision/image_prompt.h"

#include <cstring>
#include <string>

#include "base/error.h"
#include "vision/image_preprocess.h"
#include "vision/vision_tower.h"

namespace ds41 {

std::vector<int8_t> image_span_types(const ImageGrid& g) {
  std::vector<int8_t> t;
  t.reserve(size_t(g.span_length()));
  t.push_back(int8_t(TokenType::ImageStart));
  for (int64_t r = 0; r < g.n_llm_h; ++r) {
    t.insert(t.end(), size_t(g.n_llm_w), int8_t(TokenType::Image));
    t.push_back(int8_t(TokenType::ImageNewline));
  }
  t.push_back(int8_t(TokenType::ImageEnd));
  return t;
}

ImagePrompt expand_image_placeholders(const std::vector<int32_t>& prompt, int64_t image_token_id,
                                      const std::vector<ImageGrid>& grids) {
  size_t placeholders = 0;
  for (int32_t t : prompt) placeholders += t == image_token_id;
  if (placeholders != grids.size())
    throw Error("the prompt has " + std::to_string(placeholders) + " image placeholder token" +
                (placeholders == 1 ? "" : "s") + " (id " + std::to_string(image_token_id) + ") but " +
                std::to_string(grids.size()) + " image" + (grids.size() == 1 ? " was" : "s were") +
                " given: put one placeholder where each image goes");
  ImagePrompt p;
  size_t next = 0;
  for (int32_t t : prompt) {
    if (t != image_token_id) {
      p.tokens.push_back(t);
      p.inputs.token_types.push_back(int8_t(TokenType::Text));
      continue;
    }
    const ImageGrid& g = grids[next++];
    p.spans.push_back({int64_t(p.tokens.size()), g});
    const std::vector<int8_t> types = image_span_types(g);
    p.tokens.insert(p.tokens.end(), types.size(), int32_t(image_token_id));
    p.inputs.token_types.insert(p.inputs.token_types.end(), types.begin(), types.end());
  }
  return p;
}

void fill_image_span_rows(ImagePrompt& p, size_t index, const uint16_t* aligner_rows, const VisionWeights& w,
                          int64_t dim) {
  if (index >= p.spans.size()) throw Error("image prompt: no span " + std::to_string(index));
  int64_t span_rows = 0, first = 0;
  for (size_t k = 0; k < p.spans.size(); ++k) {
    if (k == index) first = span_rows;
    span_rows += p.spans[k].length();
  }
  p.inputs.rows.resize(size_t(span_rows * dim));
  const ImageSpan& sp = p.spans[index];
  uint16_t* out = p.inputs.rows.data() + first * dim;
  const uint16_t* image = aligner_rows;
  for (int64_t i = 0; i < sp.length(); ++i, out += dim) {
    const auto type = TokenType(p.inputs.token_types[size_t(sp.start + i)]);
    const uint16_t* src = type == TokenType::ImageStart     ? w.image_start
                          : type == TokenType::ImageEnd     ? w.image_end
                          : type == TokenType::ImageNewline ? w.image_newline
                                                            : image;
    std::memcpy(out, src, size_t(dim) * 2);
    if (type == TokenType::Image) image += dim;
  }
}

ImagePrompt build_image_prompt(const Model& model, const std::vector<int32_t>& prompt,
                               const std::vector<RgbImage>& images, ThreadPool* pool) {
  const ModelConfig& c = model.config();
  if (!c.vision_enabled()) {
    size_t placeholders = 0;
    for (int32_t t : prompt) placeholders += t == c.image_token_id;
    if (!images.empty() || placeholders)
      throw Error("this model has no vision tower (vision_n_layers is 0), so it cannot take images");
    ImagePrompt p;
    p.tokens = prompt;
    p.inputs.token_types.assign(prompt.size(), int8_t(TokenType::Text));
    return p;
  }
  std::vector<PreparedImage> prepared;
  std::vector<ImageGrid> grids;
  for (const RgbImage& im : images) {
    prepared.push_back(prepare_image(im, c));
    grids.push_back(prepared.back().grid);
  }
  ImagePrompt p = expand_image_placeholders(prompt, c.image_token_id, grids);
  for (size_t i = 0; i < prepared.size(); ++i) {
    const ImageGrid& g = prepared[i].grid;
    const std::vector<uint16_t> rows = encode_image_patches(model.weights().vision, c, prepared[i].patches.data(),
                                                            g.n_vit_h, g.n_vit_w, pool);
    fill_image_span_rows(p, i, rows.data(), model.weights().vision, c.dim);
  }
  return p;
}

}  // namespace ds41
