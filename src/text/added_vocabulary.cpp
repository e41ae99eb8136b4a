#include "text/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "base/error.h"
#include "text/utf8.h"

namespace ds41 {
namespace {

// Rust regex's Unicode \w, which HF uses for single_word: Alphabetic, marks, decimal digits,
// connector punctuation and the two join controls.
bool is_word_char(char32_t c) {
  const auto cp = UChar32(c);
  return u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(cp) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
         u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL);
}

bool is_white_space(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_WHITE_SPACE); }

// The character that ends at byte `end` of valid UTF-8 text (end > 0): its start and value.
size_t char_start_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t char_at(std::string_view s, size_t i) { return decode_utf8_at(s, i, utf8_sequence_at(s, i).length); }

bool ends_with_word(std::string_view s) { return !s.empty() && is_word_char(char_at(s, char_start_before(s, s.size()))); }
bool starts_with_word(std::string_view s) { return !s.empty() && is_word_char(char_at(s, 0)); }

// Start of the white space run that ends `s` (s.size() when there is none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t b = char_start_before(s, end);
    if (!is_white_space(char_at(s, b))) break;
    end = b;
  }
  return end;
}

// Length of the white space run that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Sequence seq = utf8_sequence_at(s, i);
    if (!is_white_space(decode_utf8_at(s, i, seq.length))) break;
    i += size_t(seq.length);
  }
  return i;
}

}  // namespace

// ---------------------------------------------------------------- leftmost-longest matcher

int32_t LeftmostLongestMatcher::child(int32_t node, uint8_t byte) const {
  const auto& c = nodes_[size_t(node)].children;
  auto it = std::lower_bound(c.begin(), c.end(), byte, [](const auto& e, uint8_t b) { return e.first < b; });
  return it != c.end() && it->first == byte ? it->second : -1;
}

void LeftmostLongestMatcher::add(std::string_view pattern, int32_t value) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char ch : pattern) {
    const auto byte = uint8_t(ch);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_.emplace_back();
      auto& c = nodes_[size_t(node)].children;
      c.insert(std::lower_bound(c.begin(), c.end(), byte, [](const auto& e, uint8_t b) { return e.first < b; }),
               {byte, next});
    }
    node = next;
  }
  nodes_[size_t(node)].value = value;
  first_byte_[uint8_t(pattern[0])] = true;
}

bool LeftmostLongestMatcher::find(std::string_view text, size_t from, size_t* begin, size_t* end,
                                  int32_t* value) const {
  for (size_t p = from; p < text.size(); ++p) {
    if (!first_byte_[uint8_t(text[p])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t q = p; q < text.size(); ++q) {
      node = child(node, uint8_t(text[q]));
      if (node < 0) break;
      if (nodes_[size_t(node)].value >= 0) {
        best = nodes_[size_t(node)].value;
        best_end = q + 1;
      }
    }
    if (best >= 0) {
      *begin = p;
      *end = best_end;
      *value = best;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------- added vocabulary

void AddedVocabulary::check_and_index(const std::vector<AddedToken>& tokens, const std::vector<int32_t>& expected,
                                      const std::string& label) {
  int32_t max_id = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].id != expected[i]) {
      throw Error(label + ": added token \"" + tokens[i].content + "\" has id " + std::to_string(tokens[i].id) +
                  " in the file, but HF tokenizers would give it id " + std::to_string(expected[i]) +
                  " (added tokens take the vocabulary's id for a vocabulary entry, else consecutive ids from the "
                  "vocabulary size, in file order)");
    }
    max_id = std::max(max_id, tokens[i].id);
  }
  tokens_ = tokens;
  index_of_id_.assign(size_t(max_id + 1), -1);
  // A repeated content updates the flags of its id, as HF's map insertion does.
  id_of_content_.clear();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    index_of_id_[size_t(tokens_[i].id)] = int32_t(i);
    id_of_content_[tokens_[i].content] = tokens_[i].id;
  }
  raw_ = LeftmostLongestMatcher();
  normalized_ = LeftmostLongestMatcher();
  for (size_t id = 0; id < index_of_id_.size(); ++id) {
    if (index_of_id_[id] < 0) continue;
    const AddedToken& t = tokens_[size_t(index_of_id_[id])];
    (t.normalized ? normalized_ : raw_).add(t.content, int32_t(id));
  }
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  if (id < 0 || size_t(id) >= index_of_id_.size() || index_of_id_[size_t(id)] < 0) return nullptr;
  return &tokens_[size_t(index_of_id_[size_t(id)])];
}

int32_t AddedVocabulary::find_content(std::string_view content) const {
  auto it = id_of_content_.find(std::string(content));
  return it == id_of_content_.end() ? -1 : it->second;
}

void AddedVocabulary::find_matches(std::string_view sentence, size_t offset, const LeftmostLongestMatcher& matcher,
                                   std::vector<TextSegment>& out) const {
  // HF AddedVocabulary::find_matches, step for step (offsets relative to `sentence`).
  size_t start_offset = 0, search_from = 0, match_begin, match_end;
  int32_t id;
  while (matcher.find(sentence, search_from, &match_begin, &match_end, &id)) {
    search_from = match_end;  // the automaton moves on past every match, kept or not
    const AddedToken& t = *find_id(id);
    if (t.single_word) {
      const bool space_before = match_begin == 0 || !ends_with_word(sentence.substr(0, match_begin));
      const bool space_after = match_end == sentence.size() || !starts_with_word(sentence.substr(match_end));
      if (!space_before || !space_after) continue;
    }
    size_t start = match_begin, stop = match_end;
    if (t.lstrip) start = std::max(trailing_space_start(sentence.substr(0, match_begin)), start_offset);
    if (t.rstrip) stop += leading_space_length(sentence.substr(match_end));
    if (start_offset < start) out.push_back({offset + start_offset, offset + start, -1});
    out.push_back({offset + start, offset + stop, id});
    start_offset = stop;
  }
  if (start_offset < sentence.size()) out.push_back({offset + start_offset, offset + sentence.size(), -1});
}

void AddedVocabulary::split(std::string_view text, std::vector<TextSegment>& out) const {
  out.clear();
  if (text.empty()) return;
  if (raw_.empty()) {
    out.push_back({0, text.size(), -1});
  } else {
    find_matches(text, 0, raw_, out);
  }
  if (normalized_.empty()) return;
  // Second pass over the pieces the first one left (normalization being the identity).
  std::vector<TextSegment> first;
  first.swap(out);
  for (const TextSegment& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
    } else {
      find_matches(text.substr(s.begin, s.end - s.begin), s.begin, normalized_, out);
    }
  }
}

}  // namespace ds41
