// The demo model's tokenizer (text/demo_tokenizer.h) is a valid byte-level BPE tokenizer.json:
// ids as Hugging Face `tokenizers` 0.x gives them for the same file, and any bytes round-trip.
#include <gtest/gtest.h>

#include <random>

#include "test_paths.h"
#include "text/demo_tokenizer.h"
#include "text/tokenizer.h"

namespace ds41 {
namespace {

TEST(DemoTokenizer, EncodesAsHuggingFaceTokenizersDoesAndRoundTripsBytes) {
  test::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  write_demo_tokenizer(path);
  const Tokenizer tok = Tokenizer::load(path);
  // Expected: `tokenizers.Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids`
  // (tokenizers 0.23.3, run once on this file): special tokens at the released ids, a byte b at 3 + b.
  const std::string text = "<｜begin▁of▁sentence｜><｜User｜>Hello 123456 wörld!<｜Assistant｜></think>";
  const std::vector<int32_t> expected = {0, 128803, 75, 104, 111, 111, 114, 35, 52, 53, 54, 55, 56, 57,
                                         35, 122, 198, 185, 117, 111, 103, 36, 128804, 128822};
  EXPECT_EQ(tok.encode(text), expected);
  EXPECT_EQ(tok.decode(expected), text);
  // Text of every script width (ASCII, Latin-1, CJK, emoji), a token per UTF-8 byte.
  std::mt19937 rng(7);
  const char32_t ranges[][2] = {{0x20, 0x7e}, {0xa0, 0x24f}, {0x4e00, 0x9fa5}, {0x1f600, 0x1f64f}};
  for (int i = 0; i < 50; ++i) {
    std::string text;
    for (int k = int(rng() % 24); k > 0; --k) {
      const auto& r = ranges[rng() % 4];
      const char32_t c = r[0] + char32_t(rng() % (r[1] - r[0] + 1));
      if (c < 0x80) text += char(c);
      else if (c < 0x800) text += {char(0xc0 | (c >> 6)), char(0x80 | (c & 0x3f))};
      else if (c < 0x10000) text += {char(0xe0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3f)), char(0x80 | (c & 0x3f))};
      else text += {char(0xf0 | (c >> 18)), char(0x80 | ((c >> 12) & 0x3f)), char(0x80 | ((c >> 6) & 0x3f)), char(0x80 | (c & 0x3f))};
    }
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids.size(), text.size()) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
}

}  // namespace
}  // namespace ds41
