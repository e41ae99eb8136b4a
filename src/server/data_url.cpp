#include "server/data_url.h"

#include <cctype>

#include "base/error.h"

namespace ds41 {
namespace {

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

std::vector<uint8_t> base64_decode(std::string_view text) {
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int have = 0;      // sextets in acc
  int padding = 0;   // '=' seen
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (is_space(c)) continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0) throw Error("base64: invalid character at offset " + std::to_string(i));
    if (padding) throw Error("base64: data after padding at offset " + std::to_string(i));
    acc = (acc << 6) | uint32_t(v);
    if (++have == 4) {
      out.push_back(uint8_t(acc >> 16));
      out.push_back(uint8_t(acc >> 8));
      out.push_back(uint8_t(acc));
      acc = 0;
      have = 0;
    }
  }
  // A final group of 2 or 3 sextets carries 1 or 2 bytes; its unused low bits must be zero
  // (canonical encoding), and any padding must complete the group to 4.
  if (have == 1) throw Error("base64: truncated (a lone character in the last group)");
  if (padding && have + padding != 4) throw Error("base64: wrong padding");
  if (have == 2) {
    if (acc & 0xF) throw Error("base64: non-canonical final group");
    out.push_back(uint8_t(acc >> 4));
  } else if (have == 3) {
    if (acc & 0x3) throw Error("base64: non-canonical final group");
    out.push_back(uint8_t(acc >> 10));
    out.push_back(uint8_t(acc >> 2));
  }
  return out;
}

DataUrl parse_data_url(std::string_view url) {
  if (url.substr(0, 5) != "data:") throw Error("not a data: URL");
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) throw Error("data URL without a comma before its payload");
  std::string_view header = url.substr(5, comma - 5);
  DataUrl d;
  bool base64 = false;
  size_t start = 0;
  for (int part = 0; start <= header.size(); ++part) {
    size_t end = header.find(';', start);
    if (end == std::string_view::npos) end = header.size();
    std::string item(header.substr(start, end - start));
    for (char& ch : item) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (part == 0) d.media_type = item;
    else if (item == "base64") base64 = true;
    start = end + 1;
  }
  if (!base64) throw Error("data URL is not base64-encoded (\";base64,\" expected)");
  try {
    d.bytes = base64_decode(url.substr(comma + 1));
  } catch (const Error& e) {
    throw Error(std::string("data URL payload: ") + e.what());
  }
  return d;
}

}  // namespace ds41
