#include "text/byte_level.h"

#include "text/utf8.h"

namespace ds41 {
namespace {

constexpr int kTableChars = 256 + 68;  // code points U+0000..U+0143 can appear in the table

struct ByteLevelTable {
  std::array<char32_t, 256> char_of{};
  std::array<int16_t, kTableChars> byte_of{};
  ByteLevelTable() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const int c = printable ? b : next++;
      char_of[size_t(b)] = char32_t(c);
      byte_of[size_t(c)] = int16_t(b);
    }
  }
};

const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

}  // namespace

char32_t byte_level_char(uint8_t b) { return table().char_of[b]; }

int byte_level_byte(char32_t c) { return c < char32_t(kTableChars) ? table().byte_of[c] : -1; }

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(out, byte_level_char(uint8_t(b)));
  return out;
}

std::string byte_level_decode(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const Utf8Sequence seq = utf8_sequence_at(token, i);
    if (seq.kind != Utf8Sequence::kComplete) return std::string(token);
    const int b = byte_level_byte(decode_utf8_at(token, i, seq.length));
    if (b < 0) return std::string(token);
    bytes += char(b);
    i += size_t(seq.length);
  }
  return bytes;
}

}  // namespace ds41
