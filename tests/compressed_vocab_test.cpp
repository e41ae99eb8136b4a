#include "text/compressed_vocab.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "base/error.h"
#include "model/config.h"
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

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), std::streamsize(data.size()));
}

// A tiny byte-level tokenizer.json with the given vocabulary and added tokens.
json tokenizer(const std::vector<std::pair<std::string, int>>& vocab,
               const std::vector<std::pair<std::string, int>>& added = {}) {
  json j;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", json::object()}};
  for (auto& [t, id] : vocab) j["model"]["vocab"][t] = id;
  j["added_tokens"] = json::array();
  for (auto& [t, id] : added) j["added_tokens"].push_back({{"id", id}, {"content", t}, {"special", true}});
  return j;
}

const char* kFffd = "\xEF\xBF\xBD";

// ---------------------------------------------------------------- pieces

TEST(CompressedVocab, ByteLevelDecodeUsesTheGpt2TableAndFallsBackPerToken) {
  EXPECT_EQ(byte_level_decode("Ġhello"), " hello");
  EXPECT_EQ(byte_level_decode("ĊĉĠ"), "\n\t ");
  EXPECT_EQ(byte_level_decode("Ā"), std::string(1, '\0'));  // U+0100 is byte 0
  EXPECT_EQ(byte_level_decode("ŃĀ"), "\xAD" + std::string(1, '\0'));  // U+0143 is byte 0xAD, the last remapped
  EXPECT_EQ(byte_level_decode("Ã©"), "\xC3\xA9");            // "é" spelled as its two UTF-8 bytes
  EXPECT_EQ(byte_level_decode("é"), "\xE9");                  // a lone Latin-1 byte
  // '｜' and ' ' are outside the table: the whole token keeps its own bytes.
  EXPECT_EQ(byte_level_decode("<｜User｜>"), "<｜User｜>");
  EXPECT_EQ(byte_level_decode("aĠ b"), "aĠ b");
  EXPECT_EQ(byte_level_decode(""), "");
}

TEST(CompressedVocab, Utf8LossyReplacesMaximalIllFormedSubparts) {
  EXPECT_EQ(utf8_lossy("plain ascii é ｜ 😀"), "plain ascii é ｜ 😀");
  EXPECT_EQ(utf8_lossy("\xE9"), kFffd);
  EXPECT_EQ(utf8_lossy("a\xE2\x82"), std::string("a") + kFffd);  // truncated 3-byte sequence: one
  EXPECT_EQ(utf8_lossy("\xE2\x82z"), std::string(kFffd) + "z");
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), std::string(kFffd) + kFffd);  // overlong lead: each byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);  // surrogate
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), std::string(kFffd) + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), kFffd);  // truncated 4-byte sequence: one
  EXPECT_EQ(utf8_lossy("\xFF\x80"), std::string(kFffd) + kFffd);
}

TEST(CompressedVocab, NormalizerFollowsTheReferenceSequence) {
  EXPECT_EQ(normalize_engram_key("Hello"), "hello");
  EXPECT_EQ(normalize_engram_key(" Hello  World\t\n"), "hello world");
  EXPECT_EQ(normalize_engram_key("Café"), "cafe");               // NFD + strip Mn
  EXPECT_EQ(normalize_engram_key("e\u0301"), "e");
  EXPECT_EQ(normalize_engram_key("\uFB01"), "fi");               // NFKC compatibility ligature
  EXPECT_EQ(normalize_engram_key("\u2460"), "1");                // circled digit
  // NFD splits U+0130 into I + U+0307 and StripAccents drops the dot before Lowercase runs, so
  // its full lowercase "i\u0307" (the only multi-character lowercase mapping) never shows.
  EXPECT_EQ(normalize_engram_key("\u0130"), "i");
  EXPECT_EQ(normalize_engram_key("\u03A3"), "\u03C3");           // no final-sigma rule...
  EXPECT_EQ(normalize_engram_key("\u0391\u03A3"), "\u03B1\u03C3");  // ...even at the end of a word
  EXPECT_EQ(normalize_engram_key("\u1E9E"), "\u00DF");           // capital sharp s
  EXPECT_EQ(normalize_engram_key("\u0915\u093E"), "\u0915");     // Devanagari vowel sign (Mc) stripped
  EXPECT_EQ(normalize_engram_key("\u20DD"), "");                 // enclosing mark (Me) stripped
  // Whitespace-only inputs key to " " through the sentinel, NFKC spaces included.
  EXPECT_EQ(normalize_engram_key(" "), " ");
  EXPECT_EQ(normalize_engram_key("\n\n"), " ");
  EXPECT_EQ(normalize_engram_key("\u00A0"), " ");
  EXPECT_EQ(normalize_engram_key("\u3000"), " ");
  // Other White_Space is not collapsed, only stripped at the ends.
  EXPECT_EQ(normalize_engram_key("\x0C"), "");
  EXPECT_EQ(normalize_engram_key("\u0085"), "");
  EXPECT_EQ(normalize_engram_key(" \x0C"), "");
  EXPECT_EQ(normalize_engram_key("a\x0C\x0C" "b"), "a\x0C\x0C" "b");
  EXPECT_EQ(normalize_engram_key("\u3000x"), "x");
  // Every U+E000 ends as a space, also one that was in the text.
  EXPECT_EQ(normalize_engram_key("a\uE000"), "a ");
  EXPECT_EQ(normalize_engram_key(""), "");
}

// HF tokenizers normalizes and finds marks with Unicode 9.0 tables (expected values from HF
// tokenizers 0.23.3); newer ICU data must not leak in.
TEST(CompressedVocab, NormalizerUsesTheUnicode9TablesOfTheReference) {
  EXPECT_EQ(normalize_engram_key("a\u08D4"), "a");                      // Mn since 9.0: stripped
  EXPECT_EQ(normalize_engram_key("\u07FD"), "\u07FD");                  // Mn since 11.0: kept
  EXPECT_EQ(normalize_engram_key("\u1CF7"), "\u1CF7");                  // Mc since 10.0: kept
  EXPECT_EQ(normalize_engram_key("\u1CF2"), "");                        // Mc in 9.0, Lo now: stripped
  EXPECT_EQ(normalize_engram_key("\U000111C9"), "\U000111C9");          // Mn now, not in 9.0: kept
  EXPECT_EQ(normalize_engram_key("\u32FF"), "\u32FF");                  // <square> since 12.1: kept
  EXPECT_EQ(normalize_engram_key("\U0001FBF0"), "\U0001FBF0");          // <font> digit since 13.0
  EXPECT_EQ(normalize_engram_key("\uA7F2"), "\uA7F2");                  // <super> since 14.0
  EXPECT_EQ(normalize_engram_key("e\u07FD\u0301"), "e\u07FD");           // no reordering across it
  EXPECT_EQ(normalize_engram_key("\u1E9B\u0323"), "s");                 // long s with dots -> s
}

// Exhaustive comparison with HF tokenizers over every code point, alone and after "A". The table
// (~60 MB) is not committed: generate it with
//   tools/make_compressed_vocab_reference.py --codepoints /tmp/cp.txt
// and run with DS41_CODEPOINT_TABLE=/tmp/cp.txt. The only differences allowed are letters that
// ICU's Unicode version does not have yet (see compressed_vocab.cpp), which HF may lowercase.
TEST(CompressedVocab, NormalizerMatchesHfOnEveryCodePoint) {
  const char* table = std::getenv("DS41_CODEPOINT_TABLE");
  if (!table) GTEST_SKIP() << "set DS41_CODEPOINT_TABLE (see the comment above this test)";
  std::ifstream f(table);
  ASSERT_TRUE(f) << table;
  auto unhex = [](const std::string& h) {
    std::string o;
    for (size_t i = 0; i + 1 < h.size(); i += 2) o += char(std::stoi(h.substr(i, 2), nullptr, 16));
    return o;
  };
  std::string line;
  int64_t lines = 0, unknown_to_icu = 0;
  int failures = 0;
  while (std::getline(f, line)) {
    const size_t sp = line.find(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    const std::string in = unhex(line.substr(0, sp)), expected = unhex(line.substr(sp + 1));
    ++lines;
    if (normalize_engram_key(in) == expected) continue;
    // The last code point of the input decides; decode it from the UTF-8.
    UChar32 c = 0;
    for (int32_t i = 0; i < int32_t(in.size());) U8_NEXT(in.data(), i, int32_t(in.size()), c);
    if (u_charType(c) == U_UNASSIGNED) {
      ++unknown_to_icu;
    } else if (++failures <= 20) {
      ADD_FAILURE() << "input " << line.substr(0, sp) << ": HF " << line.substr(sp + 1) << ", derived differs";
    }
  }
  EXPECT_EQ(lines, 2 * (0x110000 - 0x800));
  EXPECT_EQ(failures, 0);
  EXPECT_LE(unknown_to_icu, 2 * 64);  // 55 letters with tokenizers 0.23.3
}

// ---------------------------------------------------------------- derivation

TEST(CompressedVocab, DerivationKeysByNormalizedTextInFirstAppearanceOrder) {
  // ids: 0 <s>, 1 Hello, 2 hello, 3 Ġhello, 4 é-byte (invalid alone), 5 gap, 6 Ċ, 7 Ġ, 8 ĠĠ,
  //      9 the form feed byte (Č = 0x0C), 10 <｜User｜> (added), 11 another lone byte,
  //      12 "é" spelled as UTF-8 bytes
  json j = tokenizer({{"<s>", 0}, {"Hello", 1}, {"hello", 2}, {"Ġhello", 3}, {"é", 4}, {"Ċ", 6},
                      {"Ġ", 7}, {"ĠĠ", 8}, {"Č", 9}, {"ê", 11}, {"Ã©", 12}, {"e", 13}},
                     {{"<s>", 0}, {"<｜User｜>", 10}});
  int64_t distinct = 0;
  std::vector<int32_t> map = derive_compressed_vocab(j, "inline", &distinct);
  ASSERT_EQ(map.size(), 14u);
  EXPECT_EQ(map[0], 0);
  EXPECT_EQ(map[1], 1);
  EXPECT_EQ(map[2], 1);   // same key as "Hello"
  EXPECT_EQ(map[3], 1);   // leading space stripped
  EXPECT_EQ(map[4], 2);   // U+FFFD: keyed by its spelling "é"
  EXPECT_EQ(map[5], 3);   // no token: decodes to "", keyed ""
  EXPECT_EQ(map[6], 4);   // "\n" -> " "
  EXPECT_EQ(map[7], 4);
  EXPECT_EQ(map[8], 4);
  EXPECT_EQ(map[9], 5);   // "\f" normalizes to "" and falls back to "\f"; differs from the gap's ""
  EXPECT_EQ(map[10], 6);
  EXPECT_EQ(map[11], 7);  // another invalid byte, another spelling
  EXPECT_EQ(map[12], 8);  // "é" -> "e" ...
  EXPECT_EQ(map[13], 8);  // ... shared with "e"
  EXPECT_EQ(distinct, 9);
  EXPECT_EQ(validate_compressed_vocab(map, "inline"), distinct);
}

TEST(CompressedVocab, AddedTokensOverrideTheVocabularyAndPassThroughTheDecoder) {
  // The HF decoder sees the added token's content for its id, and byte-maps it like any token:
  // "aĠb" decodes to "a b", a content with a space keeps its own bytes.
  json j = tokenizer({{"x", 0}, {"y", 1}, {"a b", 4}}, {{"aĠb", 1}, {"A b", 2}, {"é", 3}});
  int64_t distinct = 0;
  std::vector<int32_t> map = derive_compressed_vocab(j, "inline", &distinct);
  ASSERT_EQ(map.size(), 5u);
  EXPECT_EQ(map[1], 1);  // "a b"
  EXPECT_EQ(map[2], 1);  // "A b" -> "a b"
  EXPECT_EQ(map[3], 2);  // U+FFFD: keyed by the content "é"
  EXPECT_EQ(map[4], 1);  // vocab spelling "a b" has a space: decodes to itself
  EXPECT_EQ(distinct, 3);
}

TEST(CompressedVocab, DerivationRejectsMalformedTokenizers) {
  int64_t d;
  json j = tokenizer({{"a", 0}});
  j["decoder"] = {{"type", "Metaspace"}};
  EXPECT_NE(error_of([&] { derive_compressed_vocab(j, "tok.json", &d); }).find("Metaspace"), std::string::npos);
  j.erase("decoder");
  EXPECT_NE(error_of([&] { derive_compressed_vocab(j, "tok.json", &d); }).find("ByteLevel"), std::string::npos);
  EXPECT_NE(error_of([&] { derive_compressed_vocab(json{{"model", 1}}, "tok.json", &d); }).find("model.vocab"),
            std::string::npos);
  json neg = tokenizer({{"a", -1}});
  EXPECT_NE(error_of([&] { derive_compressed_vocab(neg, "tok.json", &d); }).find("invalid id -1"), std::string::npos);
  test::TempDir dir;
  write_bytes(dir / "bad.json", "{ not json");
  EXPECT_NE(error_of([&] { derive_compressed_vocab(dir / "bad.json", &d); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { derive_compressed_vocab(dir / "missing.json", &d); }).find("cannot open"), std::string::npos);
}

TEST(CompressedVocab, GoldenEngramTokenizerGivesTheConfiguredSize) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string dir = test::shared_dir() + "/goldens/engram-a/model";
  const ModelConfig c = load_model_dir_config(dir);
  ASSERT_EQ(c.engram_compressed_vocab_size, 260);
  int64_t distinct = 0;
  std::vector<int32_t> map = derive_compressed_vocab(dir + "/tokenizer.json", &distinct);
  EXPECT_EQ(distinct, c.engram_compressed_vocab_size);
  EXPECT_EQ(int64_t(map.size()), c.vocab_size);
  CompressedVocab v = load_compressed_vocab(dir + "/tokenizer.json", c.engram_compressed_vocab_size);
  EXPECT_EQ(v.map, map);
  EXPECT_EQ(v.compressed_size, 260);
  EXPECT_EQ(v.at(0), 0);
  EXPECT_EQ(v.at(1), 1);
  EXPECT_EQ(v.at(c.engram_pad_id), 2);  // the pad value is map[pad id]
  EXPECT_NE(error_of([&] { v.at(c.vocab_size); }).find("outside the compressed token map"), std::string::npos);
}

// The HF `tokenizers` library (tools/make_compressed_vocab_reference.py) is the oracle: every
// entry of the map derived here with ICU must equal the one it produced.
TEST(CompressedVocab, MatchesHfTokenizersOnTheDeepSeekV3Tokenizer) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string tok = test::shared_dir() + "/assets/deepseek_v3_tokenizer/tokenizer.json";
  const std::string ref = std::string(DS41_SOURCE_DIR) + "/tests/data/deepseek_v3_compressed_vocab.bin";
  int64_t ref_distinct = 0;
  const std::vector<int32_t> expected = read_compressed_vocab_file(ref, &ref_distinct);
  EXPECT_EQ(expected.size(), 128815u);  // max id 128814 (added tokens end there)
  EXPECT_EQ(ref_distinct, 98627);

  int64_t distinct = 0;
  const std::vector<int32_t> map = derive_compressed_vocab(tok, &distinct);
  EXPECT_EQ(distinct, 98627);
  ASSERT_EQ(map.size(), expected.size());
  int mismatches = 0;
  for (size_t i = 0; i < map.size(); ++i) {
    if (map[i] != expected[i] && ++mismatches <= 20) {
      ADD_FAILURE() << "raw id " << i << ": derived " << map[i] << ", HF tokenizers " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(map[0], 0);
  EXPECT_EQ(map[1], 1);
  EXPECT_EQ(map[2], 2);
}

// ---------------------------------------------------------------- synthetic map

TEST(CompressedVocab, SyntheticMapUsesExactlyTheCompressedSize) {
  std::vector<int32_t> m = synthetic_compressed_vocab(10, 4);
  EXPECT_EQ(m, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(validate_compressed_vocab(m, "synthetic"), 4);
  for (auto [vocab, compressed] : {std::pair<int64_t, int64_t>{129280, 99092}, {512, 260}, {3, 3}, {7, 7}}) {
    m = synthetic_compressed_vocab(vocab, compressed);
    ASSERT_EQ(int64_t(m.size()), vocab);
    EXPECT_EQ(int64_t(std::set<int32_t>(m.begin(), m.end()).size()), compressed);
    EXPECT_EQ(validate_compressed_vocab(m, "synthetic"), compressed);
    EXPECT_EQ(m[0], 0);
    EXPECT_EQ(m[1], 1);
    EXPECT_EQ(m[2], 2);
  }
  EXPECT_NE(error_of([] { synthetic_compressed_vocab(10, 11); }).find("compressed size (11)"), std::string::npos);
  EXPECT_NE(error_of([] { synthetic_compressed_vocab(10, 0); }).find("compressed size (0)"), std::string::npos);
}

TEST(CompressedVocab, ValidationRequiresFirstAppearanceOrder) {
  EXPECT_EQ(validate_compressed_vocab({0, 1, 0, 2, 1}, "m"), 3);
  EXPECT_NE(error_of([] { validate_compressed_vocab({0, 2, 1}, "m"); }).find("entry 1 is 2"), std::string::npos);
  EXPECT_NE(error_of([] { validate_compressed_vocab({1}, "m"); }).find("entry 0 is 1"), std::string::npos);
  EXPECT_NE(error_of([] { validate_compressed_vocab({0, -1}, "m"); }).find("entry 1 is -1"), std::string::npos);
  EXPECT_NE(error_of([] { validate_compressed_vocab({}, "m"); }).find("empty"), std::string::npos);
}

// ---------------------------------------------------------------- map files

TEST(CompressedVocab, FileRoundTripsAndLoadsByMagic) {
  test::TempDir dir;
  const std::vector<int32_t> m = synthetic_compressed_vocab(1000, 300);
  write_compressed_vocab_file(dir / "map.bin", m);
  EXPECT_EQ(std::filesystem::file_size(dir / "map.bin"), 40u + 4u * 1000u);
  EXPECT_FALSE(std::filesystem::exists(dir / "map.bin.tmp"));
  int64_t compressed = 0;
  EXPECT_EQ(read_compressed_vocab_file(dir / "map.bin", &compressed), m);
  EXPECT_EQ(compressed, 300);
  CompressedVocab v = load_compressed_vocab(dir / "map.bin", 300);
  EXPECT_EQ(v.map, m);
  EXPECT_EQ(v.compressed_size, 300);
  EXPECT_EQ(v.source, dir / "map.bin");

  // The header is the documented layout, little-endian.
  const std::string bytes = read_bytes(dir / "map.bin");
  EXPECT_EQ(bytes.substr(0, 8), std::string("DS41CVM\0", 8));
  EXPECT_EQ(bytes.substr(8, 8), std::string("\x01\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(16, 8), std::string("\xE8\x03\0\0\0\0\0\0", 8));  // 1000
  EXPECT_EQ(bytes.substr(24, 8), std::string("\x2C\x01\0\0\0\0\0\0", 8));  // 300
  EXPECT_EQ(bytes.substr(32 + 4 * 301, 4), std::string("\x01\0\0\0", 4));  // m[301] = 1

  EXPECT_NE(error_of([&] { write_compressed_vocab_file(dir / "bad.bin", {0, 2}); }).find("first appearance"),
            std::string::npos);
}

TEST(CompressedVocab, CorruptOrTruncatedFilesAreRejected) {
  test::TempDir dir;
  write_compressed_vocab_file(dir / "map.bin", synthetic_compressed_vocab(100, 50));
  const std::string good = read_bytes(dir / "map.bin");
  auto error_for = [&](const std::string& bytes) {
    write_bytes(dir / "x.bin", bytes);
    return error_of([&] { read_compressed_vocab_file(dir / "x.bin", nullptr); });
  };
  EXPECT_NE(error_for(good.substr(0, good.size() - 1)).find("is truncated"), std::string::npos);
  EXPECT_NE(error_for(good.substr(0, 100)).find("is truncated"), std::string::npos);
  EXPECT_NE(error_for(good.substr(0, 20)).find("is truncated: 20 bytes"), std::string::npos);
  EXPECT_NE(error_for(good.substr(0, 5)).find("is truncated: 5 bytes"), std::string::npos);
  EXPECT_NE(error_for(good + "xxxx").find("trailing bytes"), std::string::npos);

  std::string flipped = good;
  flipped[32 + 4 * 60] ^= 0x01;
  EXPECT_NE(error_for(flipped).find("checksum mismatch"), std::string::npos);
  flipped = good;
  flipped[good.size() - 1] ^= 0x40;  // the checksum itself
  EXPECT_NE(error_for(flipped).find("checksum mismatch"), std::string::npos);

  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(error_for(magic).find("bad magic"), std::string::npos);
  std::string version = good;
  version[8] = 2;
  EXPECT_NE(error_for(version).find("version 2"), std::string::npos);
  std::string count = good;
  count[16] = char(200);  // header claims 200 entries
  EXPECT_NE(error_for(count).find("says 200 entries"), std::string::npos);
  count[23] = char(0x80);  // negative count
  EXPECT_NE(error_for(count).find("is truncated"), std::string::npos);

  // Errors name the file.
  EXPECT_NE(error_for(magic).find(dir / "x.bin"), std::string::npos);

  // Well-formed files (valid checksum) whose content breaks the map's invariants.
  auto resealed = [](std::string bytes) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i + 8 < bytes.size(); ++i) h = (h ^ uint8_t(bytes[i])) * 0x100000001B3ull;
    for (int i = 0; i < 8; ++i) bytes[bytes.size() - 8 + i] = char(uint8_t(h >> (8 * i)));
    return bytes;
  };
  EXPECT_EQ(error_for(resealed(good)), "");
  std::string header = good;
  header[24] = 49;
  EXPECT_NE(error_for(resealed(header)).find("header says 49 compressed ids but the map uses 50"), std::string::npos);
  std::string order = good;
  order[32 + 4 * 10] = 60;  // entry 10 jumps ahead of first-appearance order
  EXPECT_NE(error_for(resealed(order)).find("entry 10 is 60"), std::string::npos);
}

TEST(CompressedVocab, SizeMismatchNamesBothNumbersAndTheFile) {
  test::TempDir dir;
  write_compressed_vocab_file(dir / "map.bin", synthetic_compressed_vocab(100, 50));
  std::string e = error_of([&] { load_compressed_vocab(dir / "map.bin", 51); });
  EXPECT_NE(e.find(dir / "map.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("50 distinct"), std::string::npos) << e;
  EXPECT_NE(e.find("engram_compressed_vocab_size is 51"), std::string::npos) << e;

  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string tok = test::shared_dir() + "/goldens/engram-a/model/tokenizer.json";
  e = error_of([&] { load_compressed_vocab(tok, 99092); });
  EXPECT_NE(e.find(tok), std::string::npos) << e;
  EXPECT_NE(e.find("260 distinct"), std::string::npos) << e;
  EXPECT_NE(e.find("engram_compressed_vocab_size is 99092"), std::string::npos) << e;
}

}  // namespace
}  // namespace ds41
