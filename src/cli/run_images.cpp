#include "cli/run_images.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/dsml_tokens.h"
#include "text/tokenizer.h"
#include "vision/image_decode.h"

namespace ds41::cli {

RunImages prepare_run_images(const Model& model, const std::vector<int32_t>& prompt,
                             const std::vector<std::string>& image_files, ThreadPool* pool) {
  const auto t0 = std::chrono::steady_clock::now();
  RunImages r;
  r.files = image_files;
  std::vector<RgbImage> images;
  for (const std::string& f : image_files) images.push_back(read_image_file(f));
  const int64_t id = model.config().image_token_id;
  bool placeholders = false;
  for (int32_t t : prompt) placeholders |= t == id;
  if (images.empty() && !placeholders) {
    r.prompt.tokens = prompt;
    return r;
  }
  try {
    r.prompt = build_image_prompt(model, prompt, images, pool);
  } catch (const Error& e) {
    throw Error(std::string("--image / --tokens: ") + e.what());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void check_tokenizer_image_token(const Tokenizer& tok, const ModelConfig& c) {
  const std::vector<int32_t> ids = tok.encode(dsml::kImage);
  if (ids.size() != 1 || ids[0] != c.image_token_id)
    throw Error("--image with -p: this tokenizer does not encode " + std::string(dsml::kImage) + " as the model's image token id " +
                std::to_string(c.image_token_id) + " (use the model's own tokenizer.json, or give --tokens with the id)");
}

nlohmann::ordered_json user_content_with_images(const std::string& text, const std::vector<std::string>& files) {
  if (files.empty()) return text;
  nlohmann::ordered_json content = nlohmann::ordered_json::array();
  for (const std::string& f : files) content.push_back({{"type", "image_url"}, {"image_url", {{"url", f}}}});
  content.push_back({{"type", "text"}, {"text", text}});
  return content;
}

nlohmann::json RunImages::describe() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < prompt.spans.size(); ++i) {
    const ImageSpan& s = prompt.spans[i];
    out.push_back({{"file", i < files.size() ? files[i] : ""},
                   {"resized", {s.grid.best_width, s.grid.best_height}},
                   {"vit_grid", {s.grid.n_vit_h, s.grid.n_vit_w}},
                   {"token_grid", {s.grid.n_llm_h, s.grid.n_llm_w}},
                   {"span_start", s.start},
                   {"span_length", s.length()}});
  }
  return out;
}

}  // namespace ds41::cli
