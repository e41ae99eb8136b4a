// GPT-2's byte <-> character table, which byte-level BPE tokenizers use to spell arbitrary bytes
// as visible characters: the printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF)
// stand for themselves, and the other 68 bytes, in increasing order, are spelled U+0100,
// U+0101, ... (so a space is "Ġ" U+0120 and a newline "Ċ" U+010A).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds41 {

// The character that spells byte b (a code point below U+0144).
char32_t byte_level_char(uint8_t b);
// The byte a character spells, or -1 when the character is not in the table.
int byte_level_byte(char32_t c);

// Bytes -> their byte-level spelling (UTF-8 of the table characters).
std::string byte_level_encode(std::string_view bytes);

// HF ByteLevel decoding of one token spelling to raw bytes: every character maps back through the
// table; if any character is outside the table (added tokens such as "<｜User｜>"), the whole token
// stands for its own UTF-8 bytes instead.
std::string byte_level_decode(std::string_view token);

}  // namespace ds41
