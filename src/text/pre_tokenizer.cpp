#include "text/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

}  // namespace

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& label) {
  PreTokenizer p;
  if (!j.is_object()) {
    throw Error(label + ": pre_tokenizer is " + (j.is_null() ? std::string("missing") : "not an object") +
                "; a byte-level BPE tokenizer needs at least its ByteLevel step");
  }
  std::vector<const json*> steps;
  if (j.value("type", "") == "Sequence") {
    const auto list = j.find("pretokenizers");
    if (list == j.end() || !list->is_array()) throw Error(label + ": pre_tokenizer Sequence has no pretokenizers array");
    for (const json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(&j);
  }
  bool byte_level_seen = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    const std::string where = label + ": pre_tokenizer step " + std::to_string(i);
    if (!s.is_object()) throw Error(where + " is not an object");
    const std::string type = s.value("type", "");
    if (type == "Split") {
      if (byte_level_seen) throw Error(where + ": a Split after ByteLevel is not supported");
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false)) {
        throw Error(where + ": Split with behavior \"" + s.value("behavior", "") + "\"" +
                    (s.value("invert", false) ? " and invert" : "") + " is not supported (only Isolated)");
      }
      const auto pattern = s.find("pattern");
      if (pattern == s.end() || !pattern->is_object()) throw Error(where + ": Split has no pattern object");
      if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
        p.splits_.emplace_back(r->get<std::string>(), where);
      } else {
        throw Error(where + ": Split pattern is not {\"Regex\": ...} (literal String patterns are not supported)");
      }
    } else if (type == "ByteLevel") {
      if (s.value("add_prefix_space", false) || s.value("use_regex", true)) {
        throw Error(where + ": ByteLevel with add_prefix_space or use_regex is not supported "
                    "(DeepSeek tokenizers split with their own regexes first)");
      }
      byte_level_seen = true;
    } else {
      throw Error(where + ": pre-tokenizer type \"" + type + "\" is not supported");
    }
  }
  if (!byte_level_seen) throw Error(label + ": the pre_tokenizer has no ByteLevel step; not a byte-level BPE tokenizer");
  return p;
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& p) {
  matchers.reserve(p.splits_.size());
  for (const Regex& r : p.splits_) matchers.push_back(std::make_unique<RegexMatcher>(r));
}

void PreTokenizer::split_from(size_t step, std::string_view piece, Scratch& scratch,
                              const std::function<void(std::string_view)>& on_piece) const {
  if (step == splits_.size()) {
    on_piece(piece);
    return;
  }
  size_t previous_end = 0;
  scratch.matchers[step]->for_each_match(piece, [&](size_t begin, size_t end) {
    if (begin > previous_end) split_from(step + 1, piece.substr(previous_end, begin - previous_end), scratch, on_piece);
    if (end > begin) split_from(step + 1, piece.substr(begin, end - begin), scratch, on_piece);
    previous_end = end;
  });
  if (previous_end < piece.size()) split_from(step + 1, piece.substr(previous_end), scratch, on_piece);
}

void PreTokenizer::split(std::string_view text, Scratch& scratch,
                         const std::function<void(std::string_view)>& on_piece) const {
  if (!text.empty()) split_from(0, text, scratch, on_piece);
}

}  // namespace ds41
