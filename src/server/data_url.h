// `data:` URLs (RFC 2397) as API clients send images: "data:image/png;base64,iVBORw0...". The
// server fetches nothing, so this is the only way an image reaches it over HTTP.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds41 {

struct DataUrl {
  std::string media_type;  // lowercased, parameters dropped ("image/png")
  std::vector<uint8_t> bytes;
};

// Strict RFC 4648 base64 (standard alphabet; padding optional but, when present, correct;
// ASCII whitespace ignored as in MIME-wrapped payloads). Throws ds41::Error naming the offset of the
// first bad character.
std::vector<uint8_t> base64_decode(std::string_view text);

// Parses a base64 data URL; throws ds41::Error for anything else (percent-encoded payloads
// included: no client sends images that way).
DataUrl parse_data_url(std::string_view url);

}  // namespace ds41
