// Tokenizer building blocks, one feature at a time: UTF-8, the byte-level table, the Oniguruma ->
// PCRE2 regex translation, Split semantics, BPE merging, added-token matching (with its flags),
// decoding, the streaming decoder and load errors. Small synthetic tokenizers keep these fast;
// expected ids marked "HF" were produced by HF tokenizers 0.23.3 on the same tokenizer.json.
// The whole-corpus comparison with HF is tests/tokenizer_parity_test.cpp.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "base/error.h"
#include "text/byte_level.h"
#include "text/regex.h"
#include "text/stream_decoder.h"
#include "text/utf8.h"
#include "test_paths.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string utf8(char32_t c) {
  std::string s;
  append_utf8(s, c);
  return s;
}

// ---------------------------------------------------------------- a tiny tokenizer

// 256 byte tokens (id = byte), then the merge results in order, then added tokens from id 263.
// The "HF" ids below are HF tokenizers' output for tiny_tokenizer_json().dump() saved to a file:
// Tokenizer.from_file(f).encode(text, add_special_tokens=False).ids.
const std::vector<std::pair<std::string, std::string>> kTinyMerges = {
    {"a", "b"}, {"ab", "c"}, {"b", "c"}, {"Ġ", "a"}, {"a", "a"}, {"aa", "a"}, {"c", "c"}};

json added_token(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
                 bool single_word = false, bool normalized = false) {
  return {{"id", id},         {"content", content},       {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, char(b)))] = b;
  json merges = json::array();
  for (const auto& [a, b] : kTinyMerges) {
    if (!vocab.contains(a + b)) vocab[a + b] = int(vocab.size());
    merges.push_back(a + " " + b);
  }
  const int v = int(vocab.size());  // 263
  json added = json::array({
      added_token(v, "<s>", true),
      added_token(v + 1, "<s>x", true),
      added_token(v + 2, "[L]", false, /*lstrip=*/true, false, false, /*normalized=*/true),
      added_token(v + 3, "[R]", false, false, /*rstrip=*/true, false, true),
      added_token(v + 4, "[W]", false, false, false, /*single_word=*/true, true),
      added_token(v + 5, "s>y", false, false, false, false, true),
      added_token(v + 6, "zz<", false, false, false, false, true),
      added_token(v + 7, "[LR]", false, true, true),
  });
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", " ?\\p{L}+|\\p{N}+|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
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
        {"merges", merges}}},
  };
}

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny tokenizer");
  return t;
}

// ---------------------------------------------------------------- UTF-8 and byte level

TEST(Utf8, ClassifiesSequences) {
  EXPECT_EQ(utf8_sequence_at("a", 0).kind, Utf8Sequence::kComplete);
  EXPECT_EQ(utf8_sequence_at("\xE4\xB8\xAD", 0).length, 3);
  EXPECT_EQ(utf8_sequence_at("\xE4\xB8", 0).kind, Utf8Sequence::kTruncated);
  EXPECT_EQ(utf8_sequence_at("\xE4\xB8", 0).length, 2);
  EXPECT_EQ(utf8_sequence_at("\xE4x", 0).kind, Utf8Sequence::kIllFormed);
  EXPECT_EQ(utf8_sequence_at("\xE4x", 0).length, 1);
  EXPECT_EQ(utf8_sequence_at("\xC0\xAF", 0).kind, Utf8Sequence::kIllFormed);  // overlong
  EXPECT_EQ(utf8_sequence_at("\xED\xA0\x80", 0).kind, Utf8Sequence::kIllFormed);  // surrogate
  EXPECT_EQ(utf8_sequence_at("\xF0\x9F\x98\x80", 0).length, 4);
  EXPECT_EQ(decode_utf8_at("\xF0\x9F\x98\x80", 0, 4), U'\U0001F600');
  EXPECT_EQ(find_invalid_utf8("plain é 中 😀"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("ab\xE4\xB8"), 2u);  // a truncated character is invalid text
}

// The incremental check against the whole-string one (find_invalid_utf8): on random byte strings
// the first byte it refuses is where the string stops being well-formed, a string it takes whole
// is valid exactly when it ends at a character boundary, and its completion finishes the last
// character validly.
TEST(Utf8, StepperAgreesWithTheWholeStringCheck) {
  std::mt19937 rng(3);
  const std::string pieces[] = {"a", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xED\x9F\xBF",
                                "\xE0", "\xED", "\xF0", "\xF4", "\x80", "\xBF", "\xC0", "\xFF", "\xA0", "\x90"};
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    for (int k = int(rng() % 6); k >= 0; --k) s += pieces[rng() % std::size(pieces)];
    Utf8Stepper st;
    size_t refused = std::string::npos;
    for (size_t i = 0; i < s.size() && refused == std::string::npos; ++i)
      if (!st.step(uint8_t(s[i]))) refused = i;
    const size_t invalid = find_invalid_utf8(s);
    if (refused != std::string::npos) {
      ASSERT_NE(invalid, std::string::npos) << s;
      ASSERT_LE(invalid, refused) << s;  // the ill-formed sequence starts at or before the refused byte
      // Everything it took is well-formed once its character is finished.
      ASSERT_EQ(find_invalid_utf8(s.substr(0, refused) + st.completion()), std::string::npos) << s;
    } else {
      ASSERT_EQ(invalid == std::string::npos, st.at_boundary()) << s;
      ASSERT_EQ(find_invalid_utf8(s + st.completion()), std::string::npos) << s;
    }
  }
}

TEST(ByteLevel, EveryByteHasOneVisibleCharacter) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  std::set<char32_t> chars;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_level_char(uint8_t(b));
    chars.insert(c);
    EXPECT_EQ(byte_level_byte(c), b);
    EXPECT_GT(c, U' ');  // never a control or space character
  }
  EXPECT_EQ(chars.size(), 256u);
  EXPECT_EQ(byte_level_encode(" \n"), "ĠĊ");
  EXPECT_EQ(byte_level_byte(U'｜'), -1);
}

// ---------------------------------------------------------------- regex translation

bool full_match(const std::string& pattern, const std::string& text) {
  Regex re(pattern, "test");
  RegexMatcher m(re);
  bool whole = false;
  m.for_each_match(text, [&](size_t b, size_t e) { whole = whole || (b == 0 && e == text.size()); });
  return whole;
}

TEST(Regex, TranslatesOnigurumaEscapes) {
  EXPECT_EQ(onig_to_pcre2("\\s+(?!\\S)", "t"), "\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_EQ(onig_to_pcre2("[^\\s\\p{L}]", "t"), "[^\\p{White_Space}\\p{L}]");
  EXPECT_EQ(onig_to_pcre2("\\h[\\h]", "t"), "[0-9a-fA-F][0-9a-fA-F]");
  EXPECT_EQ(onig_to_pcre2("\\u4e00", "t"), "\\x{4e00}");
  EXPECT_EQ(onig_to_pcre2("[]a]\\[", "t"), "[]a]\\[");  // a leading ']' is a member
  EXPECT_EQ(onig_to_pcre2("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]", "t"),
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]");
  for (const char* bad : {"\\w+", "\\bx", "[a[b]]", "[[:alpha:]]", "[a-z&&[^q]]", "[abc", "x\\"}) {
    EXPECT_NE(error_of([&] { onig_to_pcre2(bad, "file.json: step 2"); }).find("file.json: step 2"), std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of([] { Regex("(unclosed", "tok.json"); }).find("tok.json: cannot compile"), std::string::npos);
}

TEST(Regex, SpaceIsTheWhiteSpacePropertyLikeOniguruma) {
  // HF (Oniguruma) \s is White_Space: NEL yes, MONGOLIAN VOWEL SEPARATOR (PCRE2's \h) no.
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u1680', U'\u2000', U'\u2028',
                     U'\u2029', U'\u202F', U'\u205F', U'\u3000'}) {
    EXPECT_TRUE(full_match("\\s", utf8(c))) << unsigned(c);
    EXPECT_FALSE(full_match("\\S", utf8(c))) << unsigned(c);
  }
  for (char32_t c : {U'\u180E', U'\u200B', U'\u001C', U'\uFEFF', U'a'}) {
    EXPECT_FALSE(full_match("\\s", utf8(c))) << unsigned(c);
    EXPECT_TRUE(full_match("\\S", utf8(c))) << unsigned(c);
  }
}

TEST(Regex, UnicodeCategories) {
  EXPECT_TRUE(full_match("\\p{S}", "~"));  // a symbol for HF/Oniguruma (some ports use their own table)
  EXPECT_TRUE(full_match("\\p{P}", "-"));
  EXPECT_TRUE(full_match("\\p{L}+", "Ωжא中ｶ한"));
  EXPECT_TRUE(full_match("\\p{M}", "\xCC\x81"));      // U+0301 combining acute
  EXPECT_TRUE(full_match("\\p{N}{3}", "٣①Ⅻ"));        // Nd, No, Nl
  EXPECT_TRUE(full_match("\\p{S}", "😀"));
  EXPECT_FALSE(full_match("[\\p{L}\\p{P}\\p{S}]", "\xE2\x80\x8B"));  // U+200B is Cf
}

TEST(Regex, InterpreterAndJitAgreeAndDeepBacktrackingGetsAHeapStack) {
  const std::string word_regex =
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
      " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
  Regex jit(word_regex, "jit"), interpreted(word_regex, "interpreter", Regex::Engine::kInterpreter);
  EXPECT_TRUE(jit.jit_compiled());
  EXPECT_FALSE(interpreted.jit_compiled());
  RegexMatcher a(jit), b(interpreted);
  std::mt19937 rng(5);
  const std::vector<std::string> alphabet = {"a", "Z", " ", "  ", "\n", "\r", ".", "'", "#", "中", "é", "\xCC\x81",
                                             "\t", "\u00a0", "1", "~", "😀", "\u200b"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int k = 0; k < 40; ++k) s += alphabet[rng() % alphabet.size()];
    std::vector<std::pair<size_t, size_t>> ma, mb;
    a.for_each_match(s, [&](size_t x, size_t y) { ma.emplace_back(x, y); });
    b.for_each_match(s, [&](size_t x, size_t y) { mb.emplace_back(x, y); });
    EXPECT_EQ(ma, mb) << s;
  }
  // A pattern that backtracks through a long run needs more than the default JIT stack.
  Regex deep("(a|aa)+$", "deep");
  RegexMatcher m(deep);
  std::vector<std::pair<size_t, size_t>> matches;
  m.for_each_match("aaa", [&](size_t x, size_t y) { matches.emplace_back(x, y); });
  EXPECT_FALSE(m.uses_heap_stack());
  const std::string run(100000, 'a');
  matches.clear();
  m.for_each_match(run, [&](size_t x, size_t y) { matches.emplace_back(x, y); });
  EXPECT_TRUE(m.uses_heap_stack());
  EXPECT_EQ(matches, (std::vector<std::pair<size_t, size_t>>{{0, run.size()}}));
}

// Split pieces where the regex can match the empty string, as HF (the Rust onig crate's
// find_iter) produces them: an empty match splits, except right after the previous match.
TEST(Regex, EmptyMatchesSplitLikeHf) {
  struct Case {
    const char* pattern;
    const char* text;
    std::vector<std::string> hf_pieces;
  } cases[] = {
      {"x*|a", "xxab", {"xx", "a", "b"}},   {"x*", "axxb", {"a", "xx", "b"}},
      {"(?=b)|a", "aab", {"a", "a", "b"}},  {"x*", "ab", {"a", "b"}},
      {"a|(?=c)", "abc", {"a", "b", "c"}},  {"(?=c)", "bcbc", {"b", "cb", "c"}},
      {"a|(?=c)", "abcbc", {"a", "b", "cb", "c"}},
  };
  for (const Case& c : cases) {
    const json j = {{"type", "Sequence"},
                    {"pretokenizers",
                     json::array({{{"type", "Split"}, {"pattern", {{"Regex", c.pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
    const PreTokenizer p = PreTokenizer::from_json(j, "test");
    PreTokenizer::Scratch scratch(p);
    std::vector<std::string> pieces;
    p.split(c.text, scratch, [&](std::string_view s) { pieces.emplace_back(s); });
    EXPECT_EQ(pieces, c.hf_pieces) << c.pattern << " on " << c.text;
  }
}

// ---------------------------------------------------------------- the released pre-tokenizer

std::vector<std::string> released_pieces(const PreTokenizer& p, const std::string& text) {
  PreTokenizer::Scratch scratch(p);
  std::vector<std::string> pieces;
  p.split(text, scratch, [&](std::string_view s) { pieces.emplace_back(s); });
  return pieces;
}

TEST(PreTokenizer, DeepSeekRegexesSplitLikeHf) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  std::ifstream f(test::shared_dir() + "/assets/deepseek_v3_tokenizer/tokenizer.json");
  const json j = json::parse(f);
  const PreTokenizer p = PreTokenizer::from_json(j["pre_tokenizer"], "v3");
  ASSERT_EQ(p.split_count(), 3u);
  // Expected pieces: HF pre_tokenize_str on the same file.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      // numbers: groups of at most three, any Unicode number
      {"1234567", {"123", "456", "7"}},
      {"3.14159", {"3", ".", "141", "59"}},
      {"x2024y", {"x", "202", "4", "y"}},
      {"١٢٣٤", {"١٢٣", "٤"}},
      {"①②③④", {"①②③", "④"}},
      // the CJK run: U+4E00..U+9FA5 and U+3040..U+30FF only
      {"abc中文def", {"abc", "中文", "def"}},
      {"漢字かなカナ한글", {"漢字かなカナ", "한글"}},
      {"中文，标点。", {"中文", "，", "标点", "。"}},
      {"\u4e00\u9fa5\u9fa6\u3040\u30ff\u3400", {"\u4e00\u9fa5", "\u9fa6", "\u3040\u30ff", "\u3400"}},
      {"ｶﾀｶﾅ", {"ｶﾀｶﾅ"}},
      // words, punctuation, spaces
      {"Hello, world!", {"Hello", ",", " world", "!"}},
      {"don't stop", {"don", "'t", " stop"}},
      {"(foo)", {"(foo", ")"}},
      {"#include", {"#include"}},
      {".Net", {".Net"}},
      {"--flag", {"--", "flag"}},
      {"a~b", {"a", "~b"}},
      {"naïve café", {"naïve", " café"}},
      {"e\u0301x", {"e\u0301x"}},
      {"😀😀 ok", {"😀😀", " ok"}},
      {"a   b", {"a", "  ", " b"}},
      {"a\n\n  b", {"a", "\n\n", " ", " b"}},
      {"x  \n", {"x", "  \n"}},
      {"x\r\ny", {"x", "\r\n", "y"}},
      {"\t\tindent", {"\t", "\tindent"}},
      {"end   ", {"end", "   "}},
      {"  ...", {" ", " ..."}},
      {"\u00a0\u00a0a", {"\u00a0", "\u00a0a"}},
      {"Hi!\n\nOk", {"Hi", "!\n\n", "Ok"}},      // punctuation takes the newlines after it
      {"a \u200bb", {"a", " ", "\u200bb"}},       // \s+ (the lookahead alternative fails)
      {"x \t", {"x", " \t"}},
      {"\u3000\u3000\u4e2d", {"\u3000\u3000", "\u4e2d"}},
  };
  for (const auto& [text, expected] : cases) EXPECT_EQ(released_pieces(p, text), expected) << text;
}

// ---------------------------------------------------------------- BPE

// The definition, naively: merge the lowest-rank adjacent pair (leftmost among equals) until none.
std::vector<int32_t> naive_bpe(const std::vector<int32_t>& initial,
                               const std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>>& merges) {
  std::vector<int32_t> s = initial;
  while (true) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = merges.find({s[i], s[i + 1]});
      if (it != merges.end() && (best_rank < 0 || it->second.first < best_rank)) {
        best_rank = it->second.first;
        best = i;
      }
    }
    if (best_rank < 0) return s;
    s[best] = merges.at({s[best], s[best + 1]}).second;
    s.erase(s.begin() + std::ptrdiff_t(best) + 1);
  }
}

TEST(Bpe, MergesLowestRankFirstLeftmostOnTies) {
  // HF ids for the tiny tokenizer (ids 256.. are ab, abc, bc, Ġa, aa, aaa, cc).
  EXPECT_EQ(tiny().encode("abc"), (std::vector<int32_t>{257}));      // "a b" (rank 0) before "b c" (rank 2)
  EXPECT_EQ(tiny().encode("aaaa"), (std::vector<int32_t>{260, 260}));  // "a a" twice before "aa a"
  EXPECT_EQ(tiny().encode("aaaaa"), (std::vector<int32_t>{260, 261}));
  EXPECT_EQ(tiny().encode("abcc"), (std::vector<int32_t>{257, 99}));
}

TEST(Bpe, ScanTreeAndNaiveAgreeOnRandomPieces) {
  // A random merge table over a 4-letter alphabet (ranks in random order, results chained), and
  // random pieces: the two production algorithms must equal the naive definition.
  std::mt19937 rng(7);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, char(b)))] = b;
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  json merges = json::array();
  std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>> table;
  std::set<std::pair<std::string, std::string>> used;
  for (int r = 0; r < 120; ++r) {
    const std::string x = tokens[rng() % tokens.size()], y = tokens[rng() % tokens.size()];
    if (x.size() + y.size() > 10 || !used.insert({x, y}).second) continue;
    if (!vocab.contains(x + y)) {
      vocab[x + y] = int(vocab.size());
      tokens.push_back(x + y);
    }
    table[{vocab[x].get<int32_t>(), vocab[y].get<int32_t>()}] = {int(merges.size()), vocab[x + y].get<int32_t>()};
    merges.push_back(x + " " + y);
  }
  const BpeModel bpe = BpeModel::from_json({{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}, "random");
  for (int trial = 0; trial < 400; ++trial) {
    std::string piece;
    const size_t n = 2 + rng() % (trial < 300 ? BpeModel::kScanMaxPieceBytes - 1 : 300);
    for (size_t i = 0; i < n; ++i) piece += "abcd"[rng() % (trial % 3 == 0 ? 2 : 4)];
    std::vector<int32_t> initial;
    for (char ch : piece) initial.push_back(int32_t(uint8_t(ch)));
    const auto expected = naive_bpe(initial, table);
    std::vector<int32_t> tree, scan;
    bpe.merge_by_tree(piece, tree);
    EXPECT_EQ(tree, expected) << piece;
    if (n <= BpeModel::kScanMaxPieceBytes) {
      bpe.merge_by_scan(piece, scan);
      EXPECT_EQ(scan, expected) << piece;
    }
  }
}

TEST(Bpe, IgnoreMergesTakesWholeVocabularyWords) {
  // HF: with model.ignore_merges a piece that is a vocabulary entry is that token, merges or not.
  json j = tiny_tokenizer_json();
  j["model"]["vocab"]["ca"] = 263;  // no merge builds it
  for (auto& a : j["added_tokens"]) a["id"] = a["id"].get<int>() + 1;
  const std::vector<std::string> texts = {"ca", "cab", "abc", "aaa"};
  const std::vector<std::vector<int32_t>> hf_without = {{99, 97}, {99, 256}, {257}, {261}};
  const std::vector<std::vector<int32_t>> hf_with = {{263}, {99, 256}, {257}, {261}};
  const Tokenizer without = Tokenizer::from_json(j, "without");
  j["model"]["ignore_merges"] = true;
  const Tokenizer with = Tokenizer::from_json(j, "with");
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(without.encode(texts[i]), hf_without[i]) << texts[i];
    EXPECT_EQ(with.encode(texts[i]), hf_with[i]) << texts[i];
  }
}

TEST(Bpe, RefusesMalformedModels) {
  json j = tiny_tokenizer_json();
  auto model_error = [&](const std::function<void(json&)>& edit) {
    json m = j["model"];
    edit(m);
    return error_of([&] { BpeModel::from_json(m, "m.json"); });
  };
  EXPECT_NE(model_error([](json& m) { m["merges"].push_back("a zz"); }).find("\"zz\", which is not in model.vocab"),
            std::string::npos);
  EXPECT_NE(model_error([](json& m) { m["merges"].push_back("abc"); }).find("not two tokens"), std::string::npos);
  EXPECT_NE(model_error([](json& m) { m["vocab"].erase("Ġ"); }).find("no token for byte 32"), std::string::npos);
  EXPECT_NE(model_error([](json& m) { m["dropout"] = 0.1; }).find("dropout"), std::string::npos);
  EXPECT_NE(model_error([](json& m) { m["type"] = "WordPiece"; }).find("model type is \"WordPiece\""), std::string::npos);
  EXPECT_NE(model_error([](json& m) { m["vocab"]["x"] = "seven"; }).find("invalid id"), std::string::npos);
  // Both merge spellings load to the same model.
  json pairs = j;
  pairs["model"]["merges"] = json::array();
  for (const auto& [a, b] : kTinyMerges) pairs["model"]["merges"].push_back({a, b});
  EXPECT_EQ(Tokenizer::from_json(pairs, "pairs").encode("aaaaa abcc"), tiny().encode("aaaaa abcc"));
}

// ---------------------------------------------------------------- added tokens

TEST(AddedTokens, MatchLikeHfIncludingFlags) {
  // HF ids: 263 <s>, 264 <s>x, 265 [L] (lstrip), 266 [R] (rstrip), 267 [W] (single_word),
  // 268 s>y and 269 zz< (normalized), 270 [LR].
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"<s>", {263}},
      {"<s>xy", {264, 121}},              // longest match
      {"<s>y", {263, 121}},               // non-normalized tokens are cut out first: not "s>y"
      {"zz<s>", {122, 122, 263}},         // ... even when a normalized token starts further left
      {"a [L] b", {97, 265, 32, 98}},     // lstrip takes the space before
      {"a  \t[L]b", {97, 265, 98}},
      {"[L][L]", {265, 265}},
      {"a[R]  b", {97, 266, 98}},         // rstrip takes the spaces after
      {"a [R]\n\nb", {97, 32, 266, 98}},
      {"x[W]y", {120, 91, 87, 93, 121}},  // single_word: not inside a word
      {"x [W] y", {120, 32, 267, 32, 121}},
      {"[W]", {267}},
      {"a[W]", {97, 91, 87, 93}},
      {"é[W]", {195, 169, 91, 87, 93}},
      {"x\u00a0[L]", {120, 265}},         // Unicode white space
      {"[R][L]", {266, 265}},
      {"  [LR]  ", {270}},
      {"a  [R]  [L]  b", {97, 32, 32, 266, 265, 32, 32, 98}},  // lstrip stops at the previous match
      {"a[R] [LR] b", {97, 266, 270, 98}},
      {"[R]\u3000\u3000x", {266, 120}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(tiny().encode(text), ids) << text;
}

TEST(AddedTokens, IdsMustBeThoseHfAssigns) {
  json j = tiny_tokenizer_json();
  j["added_tokens"][1]["id"] = 300;  // HF would number it 264
  EXPECT_NE(error_of([&] { Tokenizer::from_json(j, "t.json"); }).find("\"<s>x\" has id 300 in the file, but HF"),
            std::string::npos);
  json k = tiny_tokenizer_json();
  k["added_tokens"][0].erase("special");
  EXPECT_NE(error_of([&] { Tokenizer::from_json(k, "t.json"); }).find("added_tokens[0] has no boolean \"special\""),
            std::string::npos);
  // An added token that is a vocabulary entry keeps the vocabulary id.
  json v = tiny_tokenizer_json();
  v["added_tokens"].push_back(added_token(256, "ab", true));
  const Tokenizer t = Tokenizer::from_json(v, "v");
  EXPECT_TRUE(t.is_special(256));
  EXPECT_EQ(t.encode("xab"), (std::vector<int32_t>{120, 256}));
}

// ---------------------------------------------------------------- lookups and decoding

TEST(Tokenizer, LookupsAndVocabularySize) {
  const Tokenizer& t = tiny();
  EXPECT_EQ(t.vocab_size(), 271);  // HF get_vocab_size(with_added_tokens=True)
  EXPECT_EQ(t.token_to_id("<s>"), 263);
  EXPECT_EQ(t.token_to_id("Ġa"), 259);
  EXPECT_EQ(t.token_to_id("nope"), std::nullopt);
  EXPECT_EQ(t.id_to_token(259), "Ġa");
  EXPECT_EQ(t.id_to_token(270), "[LR]");
  EXPECT_EQ(t.id_to_token(271), std::nullopt);
  EXPECT_EQ(t.id_to_token(-1), std::nullopt);
  EXPECT_TRUE(t.is_special(263));
  EXPECT_FALSE(t.is_special(265));
  EXPECT_TRUE(t.is_added(265));
  EXPECT_EQ(t.token_bytes(259), " a");
  EXPECT_EQ(t.token_bytes(264), "<s>x");
}

TEST(Tokenizer, DecodeSkipsSpecialsOnRequestAndRejectsBadIds) {
  const Tokenizer& t = tiny();
  const std::vector<int32_t> ids = {264, 97, 265, 260};
  EXPECT_EQ(t.decode(ids), "<s>xa[L]aa");
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "a[L]aa");  // HF: "<s>x" is special, "[L]" is not
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xE4, 0xB8, 0xAD}), "中");
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xE4, 0xB8}), "\xEF\xBF\xBD");  // one U+FFFD, as HF
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xFF, 97}), "\xEF\xBF\xBD" "a");
  EXPECT_NE(error_of([&] { t.decode(std::vector<int32_t>{97, 271}); }).find("token id 271 is outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.decode(std::vector<int32_t>{-5}); }).find("token id -5"), std::string::npos);
}

TEST(Tokenizer, RejectsInvalidUtf8Text) {
  EXPECT_NE(error_of([] { tiny().encode("ab\xC3("); }).find("not valid UTF-8 (byte 2 of 4)"), std::string::npos);
  EXPECT_TRUE(tiny().encode("").empty());
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "abc aa <s> [L] x" + std::to_string(i % 97) + "\n";
  const auto expected = tiny().encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = tiny().encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

// ---------------------------------------------------------------- streaming decoder

TEST(StreamDecoder, HoldsBackSplitCharactersAtEveryByteBoundary) {
  const Tokenizer& t = tiny();  // ids 0..255 are the single bytes
  for (const std::string ch : {"é", "中", "😀", "\xF4\x8F\xBF\xBF"}) {
    for (size_t cut = 1; cut < ch.size(); ++cut) {
      // Any split of the character's bytes over tokens; here token = one byte, preceded by "a".
      StreamDecoder d(t);
      EXPECT_EQ(d.push('a'), "a");
      for (size_t i = 0; i + 1 < ch.size(); ++i) {
        EXPECT_EQ(d.push(int32_t(uint8_t(ch[i]))), "") << "byte " << i << " of " << ch;
        EXPECT_EQ(d.pending_bytes(), i + 1);
      }
      EXPECT_EQ(d.push(int32_t(uint8_t(ch.back()))), ch);
      EXPECT_EQ(d.pending_bytes(), 0u);
      // Cut short at `cut` bytes: flush gives one U+FFFD, as the whole decode does.
      StreamDecoder e(t);
      for (size_t i = 0; i < cut; ++i) EXPECT_EQ(e.push(int32_t(uint8_t(ch[i]))), "");
      EXPECT_EQ(e.flush(), "\xEF\xBF\xBD");
      EXPECT_EQ(e.flush(), "");
    }
  }
}

TEST(StreamDecoder, ConcatenationEqualsDecodeOnRandomByteStreams) {
  const Tokenizer& t = tiny();
  std::mt19937 rng(11);
  const std::vector<std::string> pool = {"a", "é", "中", "😀", "\x80", "\xFF", "\xE4\xB8", "\xF0\x9F", "\xC3", "<s>"};
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids;
    for (int k = 0; k < 12; ++k) {
      const std::string& s = pool[rng() % pool.size()];
      if (s == "<s>") {
        ids.push_back(263);
      } else {
        for (char c : s) ids.push_back(int32_t(uint8_t(c)));
      }
    }
    StreamDecoder d(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = d.push(id);
      EXPECT_EQ(find_invalid_utf8(piece), std::string::npos);  // never half a character
      streamed += piece;
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, t.decode(ids));
    StreamDecoder skip(t, true);
    std::string skipped;
    for (int32_t id : ids) skipped += skip.push(id);
    skipped += skip.flush();
    EXPECT_EQ(skipped, t.decode(ids, true));
  }
  StreamDecoder d(t);
  EXPECT_NE(error_of([&] { d.push(99999); }).find("outside the vocabulary"), std::string::npos);
}

// ---------------------------------------------------------------- loading

TEST(Tokenizer, LoadErrorsNameTheFile) {
  test::TempDir dir;
  EXPECT_NE(error_of([&] { Tokenizer::load(dir.path()); }).find("no tokenizer.json in " + dir.path()),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::load(dir / "missing.json"); }).find(dir / "missing.json"), std::string::npos);
  {
    std::ofstream(dir / "tokenizer.json") << "{\"model\": [";
  }
  EXPECT_NE(error_of([&] { Tokenizer::load(dir.path()); }).find(dir / "tokenizer.json" + ": not valid JSON"),
            std::string::npos);
  auto variant_error = [&](const std::function<void(json&)>& edit) {
    json j = tiny_tokenizer_json();
    edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    return error_of([&] { Tokenizer::load(dir / "tokenizer.json"); });
  };
  EXPECT_EQ(variant_error([](json&) {}), "");
  EXPECT_NE(variant_error([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }).find("has a normalizer"),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["decoder"] = nullptr; }).find("decoder is not ByteLevel"), std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; })
                .find("Split with behavior \"Removed\" is not supported"),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; })
                .find("ByteLevel with add_prefix_space or use_regex"),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }).find("\"Whitespace\""),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["pre_tokenizer"] = nullptr; }).find("pre_tokenizer is missing"),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }).find("no ByteLevel step"),
            std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["version"] = "2.0"; }).find("version \"2.0\""), std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j.erase("model"); }).find("no \"model\""), std::string::npos);
  EXPECT_NE(variant_error([](json& j) { j["added_tokens"][2]["content"] = ""; }).find("non-empty string"),
            std::string::npos);
  // Loading the directory and the file give the same tokenizer.
  std::ofstream(dir / "tokenizer.json") << tiny_tokenizer_json().dump();
  EXPECT_EQ(Tokenizer::load(dir.path()).encode("aaaaa [L] <s>x"), tiny().encode("aaaaa [L] <s>x"));
}

// ---------------------------------------------------------------- the released tokenizer

class ReleasedTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (test::have_shared()) tok_ = new Tokenizer(Tokenizer::load(test::shared_dir() + "/assets/deepseek_v3_tokenizer"));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "shared assets not found";
  }
  static Tokenizer* tok_;
};
Tokenizer* ReleasedTokenizer::tok_ = nullptr;

TEST_F(ReleasedTokenizer, SpecialStringsInTextBecomeTheirIds) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.vocab_size(), 128815);
  EXPECT_EQ(t.token_to_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(t.token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(t.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(t.token_to_id("<｜Assistant｜>"), 128804);
  // HF: [128803, 6366, 128804] for "<｜User｜>hi<｜Assistant｜>"; BOS/EOS (special) in text too.
  EXPECT_EQ(t.encode("<｜User｜>hi<｜Assistant｜>"), (std::vector<int32_t>{128803, 6366, 128804}));
  const auto ids = t.encode("<｜begin▁of▁sentence｜>x<｜end▁of▁sentence｜>");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 1);
  // A near miss is ordinary text.
  const auto near = t.encode("<｜User>");
  EXPECT_EQ(std::count(near.begin(), near.end(), 128803), 0);
  EXPECT_EQ(t.decode(near), "<｜User>");
}

TEST_F(ReleasedTokenizer, NumbersCjkEmojiAndSpaces) {
  const Tokenizer& t = *tok_;
  // Numbers are BPE-encoded in groups of three digits: the ids are those of the groups.
  auto concat = [&](std::initializer_list<const char*> parts) {
    std::vector<int32_t> all;
    for (const char* p : parts) {
      const auto ids = t.encode(p);
      all.insert(all.end(), ids.begin(), ids.end());
    }
    return all;
  };
  EXPECT_EQ(t.encode("1234567"), concat({"123", "456", "7"}));
  EXPECT_EQ(t.encode("1234567").size(), 3u);
  EXPECT_EQ(t.encode("abc中文def"), concat({"abc", "中文", "def"}));
  // HF ids for a Chinese sentence.
  EXPECT_EQ(t.encode("你好世界，今天天气很好。"), (std::vector<int32_t>{30594, 3427, 303, 5237, 16652, 12210, 320}));
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{19923, 2058}));
  for (const std::string s : {"😀 👨‍👩‍👧‍👦 🇯🇵", "    indented\n\n\n\t\tcode  ", "\x01\x02\x7f\xc2\x85", "한국어 テスト ｶﾀｶﾅ"}) {
    EXPECT_EQ(t.decode(t.encode(s)), s);
  }
}

TEST_F(ReleasedTokenizer, LongRunsStayFastAndExact) {
  const Tokenizer& t = *tok_;
  for (const std::string unit : {"a", " ", "1", "\n", "中", "ab", "😀"}) {
    std::string s;
    while (s.size() < 200000) s += unit;
    // One 200 kB piece for most units: the regex JIT and the segment-tree merger must cope.
    EXPECT_EQ(t.decode(t.encode(s)), s) << unit;
  }
}

TEST_F(ReleasedTokenizer, RandomCodePointsRoundTrip) {
  // Any valid text (all planes, controls, unassigned and private-use code points, special-token
  // fragments) encodes without error and decodes back to itself.
  const Tokenizer& t = *tok_;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    for (int k = 0; k < 60; ++k) {
      const uint32_t r = rng() % 10;
      char32_t c = r < 3 ? char32_t(rng() % 0x80) : r < 6 ? char32_t(rng() % 0x3000) : char32_t(rng() % 0x110000);
      if (c >= 0xD800 && c < 0xE000) c = U'x';  // not a scalar value
      if (r == 9) {
        s += k % 2 ? "<｜User｜>" : "<｜";
        continue;
      }
      append_utf8(s, c);
    }
    const auto ids = t.encode(s);
    ASSERT_EQ(t.decode(ids), s) << "trial " << trial;
  }
}

TEST_F(ReleasedTokenizer, StreamingRealTokensEqualsDecode) {
  const Tokenizer& t = *tok_;
  const std::string text = "中文和日本語のテキスト😀👍🏽 mixed with English, العربية, and emoji 🇳🇿!";
  const auto ids = t.encode(text);
  StreamDecoder d(t);
  std::string streamed;
  int held = 0;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    EXPECT_EQ(find_invalid_utf8(piece), std::string::npos);
    if (d.pending_bytes() > 0) ++held;
    streamed += piece;
  }
  streamed += d.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0);  // some characters really were split across tokens
}

}  // namespace
}  // namespace ds41
