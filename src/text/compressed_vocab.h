// The Engram compressed token map (spec engram_dspark_vision.md §A.2): raw token id -> compressed
// id, where tokens whose decoded text normalizes to the same key share one compressed id.
//
// The reference builds this map at model construction from the HF tokenizer object and asserts
// the number of distinct keys equals the config's engram_compressed_vocab_size. It is not shipped
// with the checkpoint, and a wrong map silently re-keys every Engram hash, so the engine either
// re-derives it from tokenizer.json (derive_compressed_vocab) or reads a precomputed map file, and
// in both cases checks the distinct count against the config (load_compressed_vocab).
//
// Derivation, for every raw id 0 .. len(tokenizer)-1 (len = max id + 1 over model.vocab and
// added_tokens), in raw-id order:
//   1. text = HF byte-level decode of the single token (added tokens override the vocabulary for
//      their id; the decoder turns every character of the token spelling back into its byte via
//      the GPT-2 byte<->unicode table, and if any character is outside that table it uses the
//      spelling's own UTF-8 bytes instead; then bytes -> text with invalid UTF-8 replaced by
//      U+FFFD). An id that no token has decodes to "".
//   2. text contains U+FFFD -> key = the raw spelling (the GPT-2 byte-mapped vocabulary string);
//      else key = normalize_engram_key(text), or text itself when that is empty.
//   3. a key seen for the first time gets the next compressed id 0, 1, 2, ...
//
// Precomputed map file format (all integers little-endian):
//   offset 0   8 bytes  magic "DS41CVM\0"
//   offset 8   uint32   format version, 1
//   offset 12  uint32   reserved, 0
//   offset 16  int64    n, number of raw ids (entries)
//   offset 24  int64    compressed size (number of distinct compressed ids)
//   offset 32  int32[n] compressed id of raw id 0 .. n-1
//   then       uint64   FNV-1a 64 hash of every preceding byte (header and ids)
// The file is exactly 40 + 4n bytes. A map is valid when every id is in [0, compressed size) and
// the ids appear in first-appearance order (map[i] <= 1 + max(map[0..i-1]), map[0] == 0), which
// every derived map satisfies; this makes "distinct count == max id + 1" hold by construction.
// tools/make_compressed_vocab_reference.py writes the same format from the HF tokenizers library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/byte_level.h"  // byte_level_decode (step 1), used by the tests through this header
#include "text/utf8.h"        // utf8_lossy (step 1)

namespace ds41 {

inline constexpr char kCompressedVocabMagic[8] = {'D', 'S', '4', '1', 'C', 'V', 'M', '\0'};
inline constexpr uint32_t kCompressedVocabVersion = 1;

struct CompressedVocab {
  std::vector<int32_t> map;      // raw token id -> compressed id
  int64_t compressed_size = 0;   // number of distinct compressed ids (= max id + 1)
  std::string source;            // the file it came from, or "synthetic", for messages

  int64_t size() const { return int64_t(map.size()); }
  // Compressed id of a raw token id; throws ds41::Error when the id is outside the map.
  int32_t at(int64_t raw_id) const;
};

// Derives the map from a HF tokenizer.json (byte-level BPE). *distinct_keys (if not null) receives
// the number of distinct keys. Throws ds41::Error for unreadable or malformed files and for
// decoders other than ByteLevel.
std::vector<int32_t> derive_compressed_vocab(const std::string& tokenizer_json_path,
                                             int64_t* distinct_keys);
// Same, from an already parsed tokenizer.json; `label` names it in error messages.
std::vector<int32_t> derive_compressed_vocab(const nlohmann::json& tokenizer, const std::string& label,
                                             int64_t* distinct_keys);

// Map for random-weight models that have no tokenizer: id < compressed ? id : id % compressed.
// It uses exactly `compressed` distinct values (for vocab >= compressed), maps 0, 1, 2 to
// themselves like every real derivation (the specials come first) and is in first-appearance
// order. Requires 1 <= compressed <= vocab.
std::vector<int32_t> synthetic_compressed_vocab(int64_t vocab, int64_t compressed);

// Checks the first-appearance invariant above and returns the compressed size (max id + 1);
// throws ds41::Error naming `label` otherwise.
int64_t validate_compressed_vocab(const std::vector<int32_t>& map, const std::string& label);

// Writes / reads the precomputed map file. Reading verifies the size, magic, version, checksum
// and the map invariant, each with its own error message; *compressed_size (if not null)
// receives the header's compressed size.
void write_compressed_vocab_file(const std::string& path, const std::vector<int32_t>& map);
std::vector<int32_t> read_compressed_vocab_file(const std::string& path, int64_t* compressed_size);

// Loads the map from `path`: a precomputed map file (recognised by its magic) or otherwise a
// tokenizer.json to derive it from. Throws ds41::Error naming the file and both numbers when the
// distinct count differs from expected_compressed_size (the config's engram_compressed_vocab_size).
CompressedVocab load_compressed_vocab(const std::string& path, int64_t expected_compressed_size);

// The pieces of the derivation, exposed for tests.
// The reference normalizer on valid UTF-8: NFKC -> NFD -> drop General_Category Mark -> full
// lowercase per character -> collapse [ \t\r\n]+ to " " -> a lone " " becomes U+E000 -> strip
// White_Space at both ends -> U+E000 becomes " ". Like HF tokenizers, the normalization forms and
// the mark test use Unicode 9.0 data, lowercase and White_Space current data (see the .cpp).
std::string normalize_engram_key(std::string_view utf8);

}  // namespace ds41
