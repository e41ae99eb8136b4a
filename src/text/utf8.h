// UTF-8 helpers shared by the tokenizer and the Engram compressed token map: well-formedness per
// Unicode Table 3-7 (no overlong forms, surrogates or code points above U+10FFFF), lossy decoding
// with the "substitution of maximal subparts" practice (what Rust's String::from_utf8_lossy and
// therefore HF tokenizers do), and code point encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds41 {

inline constexpr std::string_view kReplacementCharUtf8 = "\xEF\xBF\xBD";  // U+FFFD

// What the bytes at s[i] are.
struct Utf8Sequence {
  enum Kind : uint8_t {
    kComplete,    // a well-formed character of `length` bytes
    kIllFormed,   // `length` bytes (>= 1) form a maximal ill-formed subpart: one U+FFFD
    kTruncated,   // `length` bytes are a well-formed prefix that the end of `s` cuts short
  } kind;
  int length;
};
Utf8Sequence utf8_sequence_at(std::string_view s, size_t i);

// The code point of the complete sequence of `length` bytes at s[i].
char32_t decode_utf8_at(std::string_view s, size_t i, int length);

void append_utf8(std::string& out, char32_t c);

// Bytes -> valid UTF-8: every maximal ill-formed subpart (a truncated sequence at the end
// included) becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Offset of the first byte that is not part of a well-formed character, or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// Well-formedness one byte at a time (the token-level constraints follow text as it is written).
struct Utf8Stepper {
  uint8_t due = 0;   // continuation bytes the character still needs
  uint8_t lead = 0;  // its lead byte while the first continuation is due (that one's range is narrower)
  // False when `b` cannot come next in well-formed UTF-8 (the stepper is then unchanged).
  bool step(uint8_t b);
  bool at_boundary() const { return due == 0; }
  // The smallest bytes that finish the character in progress ("" at a boundary).
  std::string completion() const;
};

}  // namespace ds41
