// `ds41 run --image FILE ...`: each --image (in order) goes to the next image placeholder id
// (config image_token_id, <｜deepseek_image｜> = 129264 in the release) of the prompt's ids — those
// the prompt encoder writes for the image blocks of a -p message, or ones given in --tokens. The
// placeholders are expanded into image spans whose rows come from the vision tower
// (vision/image_prompt.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model.h"
#include "vision/image_prompt.h"

namespace ds41 {
class ThreadPool;
class Tokenizer;
}

namespace ds41::cli {

struct RunImages {
  ImagePrompt prompt;           // expanded ids, token types and span rows
  std::vector<std::string> files;
  double seconds = 0;           // decoding, preprocessing and the vision tower
  bool any() const { return !files.empty(); }
  // The token types and span rows of the whole expanded prompt; nullptr when it has no images,
  // so text-only runs take the plain path.
  const InputEmbeddings* inputs() const { return prompt.spans.empty() ? nullptr : &prompt.inputs; }
  nlohmann::json describe() const;  // per image: file, size, grids, span position and length
};

// The content of a user message for the prompt encoder: `text` alone, or with images one
// {"type": "image_url", "image_url": {"url": FILE}} block per file before the text block (the
// encoder turns each into the image placeholder).
nlohmann::ordered_json user_content_with_images(const std::string& text, const std::vector<std::string>& files);

// With -p and images: the prompt encoder writes <｜deepseek_image｜> per image, which the tokenizer
// must turn into the model's image token id, else the images would have no placeholders. Throws a
// clear error when the tokenizer lacks that token (e.g. an older DeepSeek tokenizer.json).
void check_tokenizer_image_token(const Tokenizer& tok, const ModelConfig& c);

// Decodes and encodes the images; the expanded prompt equals `prompt` when there are none. Errors
// name the file (decoding), or say how placeholders and images fail to pair up.
RunImages prepare_run_images(const Model& model, const std::vector<int32_t>& prompt,
                             const std::vector<std::string>& image_files, ThreadPool* pool);

}  // namespace ds41::cli
