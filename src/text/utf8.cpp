#include "text/utf8.h"

namespace ds41 {

Utf8Sequence utf8_sequence_at(std::string_view s, size_t i) {
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) return {Utf8Sequence::kComplete, 1};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {Utf8Sequence::kIllFormed, 1};  // continuation bytes, C0, C1, F5..FF never start one
  }
  for (int k = 1; k <= need; ++k) {
    if (i + size_t(k) >= s.size()) return {Utf8Sequence::kTruncated, k};
    const auto b = uint8_t(s[i + size_t(k)]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8Sequence::kIllFormed, k};
  }
  return {Utf8Sequence::kComplete, need + 1};
}

char32_t decode_utf8_at(std::string_view s, size_t i, int length) {
  const auto b0 = uint8_t(s[i]);
  if (length == 1) return b0;
  char32_t c = b0 & (0x7F >> length);
  for (int k = 1; k < length; ++k) c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Sequence seq = utf8_sequence_at(bytes, i);
    if (seq.kind == Utf8Sequence::kComplete) {
      out.append(bytes.substr(i, size_t(seq.length)));
    } else {
      out.append(kReplacementCharUtf8);
    }
    i += size_t(seq.length);
  }
  return out;
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {  // ASCII fast path
      ++i;
      continue;
    }
    const Utf8Sequence seq = utf8_sequence_at(s, i);
    if (seq.kind != Utf8Sequence::kComplete) return i;
    i += size_t(seq.length);
  }
  return std::string_view::npos;
}

bool Utf8Stepper::step(uint8_t b) {
  if (due > 0) {
    uint8_t lo = 0x80, hi = 0xBF;  // Table 3-7: the first continuation of some leads is narrower
    if (lead == 0xE0) lo = 0xA0;
    else if (lead == 0xED) hi = 0x9F;
    else if (lead == 0xF0) lo = 0x90;
    else if (lead == 0xF4) hi = 0x8F;
    if (b < lo || b > hi) return false;
    lead = 0;
    --due;
    return true;
  }
  if (b < 0x80) return true;
  if (b >= 0xC2 && b <= 0xDF) due = 1;
  else if (b >= 0xE0 && b <= 0xEF) due = 2;
  else if (b >= 0xF0 && b <= 0xF4) due = 3;
  else return false;
  lead = b;
  return true;
}

std::string Utf8Stepper::completion() const {
  std::string out;
  for (int k = 0; k < due; ++k)
    out += char(k == 0 && lead == 0xE0 ? 0xA0 : k == 0 && lead == 0xF0 ? 0x90 : 0x80);
  return out;
}

}  // namespace ds41
