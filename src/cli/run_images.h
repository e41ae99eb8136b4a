// `ds41 run --image FILE ...`: the images of a prompt given as token ids. Each --image (in order)
// goes to the next image placeholder id (config image_token_id, <｜deepseek_image｜> = 129264 in
// the release) in --tokens; the placeholders are expanded into image spans whose rows come from
// the vision tower (vision/image_prompt.h). Text prompts reach this path once the prompt encoder
// emits the placeholder for an image.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model.h"
#include "vision/image_prompt.h"

namespace ds41 {
class ThreadPool;
}

namespace ds41::cli {

struct RunImages {
  ImagePrompt prompt;           // expanded ids, token types and span rows
  std::vector<std::string> files;
  double seconds = 0;           // decoding, preprocessing and the vision tower
  bool any() const { return !files.empty(); }
  // Inputs of the prefill call over tokens [begin, end) of the expanded prompt (nullptr when the
  // prompt has no images, so text-only runs take the plain path).
  const InputEmbeddings* inputs_for(int64_t begin, int64_t end, int64_t dim, InputEmbeddings& storage) const;
  nlohmann::json describe() const;  // per image: file, size, grids, span position and length
};

// Decodes and encodes the images; the expanded prompt equals `prompt` when there are none. Errors
// name the file (decoding), or say how placeholders and images fail to pair up.
RunImages prepare_run_images(const Model& model, const std::vector<int32_t>& prompt,
                             const std::vector<std::string>& image_files, ThreadPool* pool);

}  // namespace ds41::cli
