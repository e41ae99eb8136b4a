// Added tokens of a HF tokenizer.json ("added_tokens"): strings such as "<｜User｜>" that are
// cut out of the raw text before pre-tokenization and become one id each, special or not.
//
// Matching follows HF tokenizers' AddedVocabulary::extract_and_normalize:
//   1. the tokens with normalized = false are searched in the raw text;
//   2. the tokens with normalized = true are searched in each remaining (unmatched) piece, after
//      normalization -- the identity here, since only tokenizers without a normalizer load.
// Each search is leftmost-longest (at the first position where any token matches, the longest
// token that matches there; then on after it), as HF's Aho-Corasick automaton with
// MatchKind::LeftmostLongest. Per-token flags, as HF applies them to a match:
//   single_word: dropped unless no word character (Rust regex \w) touches it on either side;
//   lstrip: the match also takes the white space (White_Space) before it, down to the previous
//           match; rstrip: and the white space after it.
// A token's id is checked against the id HF would assign on load (the vocabulary's id when the
// content is a vocabulary entry, else the next free id after the largest added id or the
// vocabulary size); a file whose ids disagree is refused rather than silently renumbered.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds41 {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// A contiguous range of the text: either an added token (id >= 0) or text to pre-tokenize (id -1).
struct TextSegment {
  size_t begin, end;
  int32_t id;
};

// A set of strings searched leftmost-longest, as a byte trie.
class LeftmostLongestMatcher {
 public:
  void add(std::string_view pattern, int32_t value);
  // The first match at or after `from`: true and begin/end/value, or false.
  bool find(std::string_view text, size_t from, size_t* begin, size_t* end, int32_t* value) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t value = -1;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  // Adds the tokens in file order; `token_id_in_model` gives a content's id in the model
  // vocabulary (or -1) and `model_size` the number of vocabulary entries, to compute the ids HF
  // assigns.
  // Throws ds41::Error naming `label` on a mismatch.
  template <class ModelLookup>
  void add_all(const std::vector<AddedToken>& tokens, ModelLookup&& token_id_in_model, int64_t model_size,
               const std::string& label);

  // Splits `text` into added-token segments and the text between them (in order, covering it).
  void split(std::string_view text, std::vector<TextSegment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with this id (its latest flags), or nullptr.
  const AddedToken* find_id(int32_t id) const;
  // The id of an added token's content, or -1.
  int32_t find_content(std::string_view content) const;

 private:
  void check_and_index(const std::vector<AddedToken>& tokens, const std::vector<int32_t>& expected_ids,
                       const std::string& label);
  void find_matches(std::string_view sentence, size_t offset, const LeftmostLongestMatcher& matcher,
                    std::vector<TextSegment>& out) const;
  std::vector<AddedToken> tokens_;      // in file order
  std::vector<int32_t> index_of_id_;    // id -> index in tokens_ (-1 when not an added token)
  std::unordered_map<std::string, int32_t> id_of_content_;
  LeftmostLongestMatcher raw_, normalized_;
};

template <class ModelLookup>
void AddedVocabulary::add_all(const std::vector<AddedToken>& tokens, ModelLookup&& token_id_in_model,
                              int64_t model_size, const std::string& label) {
  // HF's AddedVocabulary::add_tokens on load: a content seen before keeps its id, a vocabulary
  // entry keeps the vocabulary's id, anything else takes the next id counting from the
  // vocabulary size (the number of entries).
  std::vector<int32_t> expected;
  std::unordered_map<std::string_view, int32_t> assigned;
  int64_t next_id = model_size;
  expected.reserve(tokens.size());
  for (const AddedToken& t : tokens) {
    int64_t id;
    if (auto it = assigned.find(t.content); it != assigned.end()) {
      id = it->second;
    } else if (const int64_t in_model = token_id_in_model(t.content); in_model >= 0) {
      id = in_model;
    } else {
      id = next_id++;
    }
    assigned.emplace(t.content, int32_t(id));
    expected.push_back(int32_t(id));
  }
  check_and_index(tokens, expected, label);
}

}  // namespace ds41
