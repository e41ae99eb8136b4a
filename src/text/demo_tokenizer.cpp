#include "text/demo_tokenizer.h"

#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/byte_level.h"

namespace ds41 {

namespace {

constexpr int kFirstByteId = 3;  // after begin/end of sentence and padding

// The special tokens of the released vocabulary that the prompt format and the reply parser use,
// at the released ids.
const std::vector<std::pair<int, const char*>>& demo_special_tokens() {
  static const std::vector<std::pair<int, const char*>> tokens = {
      {0, "<｜begin▁of▁sentence｜>"}, {1, "<｜end▁of▁sentence｜>"}, {2, "<｜▁pad▁｜>"},
      {128800, "<｜fim▁hole｜>"}, {128801, "<｜fim▁begin｜>"}, {128802, "<｜fim▁end｜>"},
      {128803, "<｜User｜>"}, {128804, "<｜Assistant｜>"}, {128805, "<|EOT|>"},
      {128806, "<｜tool▁calls▁begin｜>"}, {128807, "<｜tool▁calls▁end｜>"}, {128808, "<｜tool▁call▁begin｜>"},
      {128809, "<｜tool▁call▁end｜>"}, {128810, "<｜tool▁outputs▁begin｜>"}, {128811, "<｜tool▁outputs▁end｜>"},
      {128812, "<｜tool▁output▁begin｜>"}, {128813, "<｜tool▁output▁end｜>"}, {128814, "<｜tool▁sep｜>"},
      {128821, "<think>"}, {128822, "</think>"}, {129264, "<｜deepseek_image｜>"}};
  return tokens;
}

std::string utf8_of(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
  return s;
}

}  // namespace

void write_demo_tokenizer(const std::string& path) {
  using json = nlohmann::ordered_json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8_of(byte_level_char(uint8_t(b)))] = kFirstByteId + b;
  json added = json::array();
  // Each special token is also a vocabulary entry at its id, as in the released file: HF gives an
  // added token the id of its vocabulary entry (else the next id after the vocabulary).
  for (const auto& [id, content] : demo_special_tokens()) vocab[content] = id;
  for (const auto& [id, content] : demo_special_tokens()) {
    // The released tokenizer marks only these three "special" (skipped when decoding).
    const bool special = id <= 2;
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", !special}, {"special", special}});
  }
  // Digits in groups of up to three, then words, punctuation runs and whitespace, as the released
  // pre-tokenizer splits (a simpler word rule: the demo has no merges for the pieces to meet).
  const json split_digits = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}};
  const json split_words = {{"type", "Split"},
                            {"pattern", {{"Regex", " ?\\p{L}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
                            {"behavior", "Isolated"},
                            {"invert", false}};
  json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({split_digits, split_words,
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", json::array()}}}};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << tok.dump(1) << "\n";
  if (!out) throw Error(path + ": cannot write the demo tokenizer");
}

}  // namespace ds41
