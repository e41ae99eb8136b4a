// The pre-tokenizer of a HF tokenizer.json: a sequence of Split steps, each cutting every piece
// of the previous step at the matches of its regex and keeping the matches as pieces of their own
// (behavior "Isolated"), then ByteLevel (bytes -> GPT-2 characters; here the BPE model works on
// the raw bytes directly, so that step only has to be recognised).
//
// DeepSeek V3 / V4 / V4.1 use three Split regexes: \p{N}{1,3} (numbers in groups of up to
// three digits), the CJK run [一-龥぀-ゟ゠-ヿ]+, and a GPT-style word / punctuation / space regex.
// Each regex runs on each piece as a separate string, so its lookahead stops at the piece end.
// Supported: Split with a Regex pattern, behavior Isolated, invert false; ByteLevel
// with add_prefix_space false and use_regex false. Anything else is refused at load.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace ds41 {

class PreTokenizer {
 public:
  // `j` is the tokenizer.json "pre_tokenizer" value.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& label);

  // Matching state for one thread / one call.
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& p);

   private:
    friend class PreTokenizer;
    std::vector<std::unique_ptr<RegexMatcher>> matchers;
  };

  // Calls on_piece for every non-empty piece of `text` (valid UTF-8), in order.
  void split(std::string_view text, Scratch& scratch, const std::function<void(std::string_view)>& on_piece) const;

  size_t split_count() const { return splits_.size(); }

 private:
  void split_from(size_t step, std::string_view piece, Scratch& scratch,
                  const std::function<void(std::string_view)>& on_piece) const;
  std::vector<Regex> splits_;
};

}  // namespace ds41
