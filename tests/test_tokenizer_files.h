// Tokenizer files for tests: the DeepSeek-V3 tokenizer.json (the one the project has) with
// <｜deepseek_image｜> added as id 129264, where V4.1 has it, so image prompts can be tested end to
// end. The V4.1 file itself is not available.
#pragma once

#include <algorithm>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace ds41::test {

inline std::string v3_tokenizer_path() { return shared_dir() + "/assets/deepseek_v3_tokenizer/tokenizer.json"; }

inline void write_v3_tokenizer_with_image_token(const std::string& out_path) {
  std::ifstream in(v3_tokenizer_path());
  nlohmann::json t = nlohmann::json::parse(in);
  // Added tokens take consecutive ids after the vocabulary (as in HF tokenizers): fill up to 129264.
  auto added = [&](int64_t id, const std::string& content) {
    t["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  };
  int64_t next = 0;
  for (const auto& a : t["added_tokens"]) next = std::max<int64_t>(next, a["id"].get<int64_t>() + 1);
  next = std::max<int64_t>(next, int64_t(t["model"]["vocab"].size()));
  for (int64_t id = next; id < 129264; ++id) added(id, "<｜filler_" + std::to_string(id) + "｜>");
  added(129264, "<｜deepseek_image｜>");
  std::ofstream(out_path) << t.dump();
}

}  // namespace ds41::test
