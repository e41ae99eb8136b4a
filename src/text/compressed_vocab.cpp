// Engram compressed token map: derivation from tokenizer.json, map file I/O and validation.
// See compressed_vocab.h for the algorithm and the file format.
#include "text/compressed_vocab.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/error.h"
#include "base/hash.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

constexpr size_t kHeaderBytes = 32;
constexpr size_t kTrailerBytes = 8;

// ---------------------------------------------------------------- UTF-8 helpers

std::string to_utf8(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// ---------------------------------------------------------------- ICU pieces

// HF tokenizers normalizes (NFKC, NFD) and recognises combining marks (StripAccents) with the
// tables of its unicode-normalization-alignments crate, which are Unicode 9.0; ICU is newer. A
// code point assigned after 9.0 is unassigned for those tables: no decomposition, canonical
// class 0, not a mark. Restricting ICU to the code points of Unicode <= 9.0 reproduces that
// (normalization is stable for characters once assigned). Lowercase and White_Space come from
// the Rust standard library instead, which tracks current Unicode, so they use ICU unfiltered.
// Known residual: Debian's ICU 72 is Unicode 15.0, so capital letters encoded in Unicode 16.0
// and later (55 of them, e.g. Garay U+10D50..U+10D65) stay as they are here, while a tokenizers
// build whose Rust knows them lowercases them. The DeepSeek-V3 vocabulary has none (its map
// matches HF tokenizers entry for entry).
const icu::UnicodeSet& unicode_9_0() {
  // Built once and never destroyed (no static destruction order issue); frozen sets are safe to
  // query from several threads.
  static const icu::UnicodeSet* set = [] {
    UErrorCode status = U_ZERO_ERROR;
    auto* s = new icu::UnicodeSet(icu::UnicodeString(u"[:age=9.0:]"), status);
    if (U_FAILURE(status)) throw Error(std::string("ICU: cannot build the Unicode 9.0 set: ") + u_errorName(status));
    s->freeze();
    return s;
  }();
  return *set;
}

struct Normalizers {
  std::unique_ptr<const icu::Normalizer2> nfkc, nfd;  // FilteredNormalizer2 behind the base interface
};

const Normalizers& normalizers() {
  static const Normalizers n = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(status);
    const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
    if (U_FAILURE(status) || !nfkc || !nfd) {
      throw Error(std::string("ICU: cannot load the normalization data: ") + u_errorName(status));
    }
    Normalizers r;
    r.nfkc = std::make_unique<icu::FilteredNormalizer2>(*nfkc, unicode_9_0());
    r.nfd = std::make_unique<icu::FilteredNormalizer2>(*nfd, unicode_9_0());
    return r;
  }();
  return n;
}

// General_Category Mark as of Unicode 9.0 (see above). Three code points changed category
// since then: U+1CF2 and U+1CF3 (Vedic signs ardhavisarga) were spacing marks (Mc) until Unicode
// 10.0 made them letters (Lo), so the reference still strips them; U+111C9 (Sharada sandhi mark)
// was punctuation and became Mn later, so the reference keeps it. These were found by comparing
// every code point with HF tokenizers (tools/make_compressed_vocab_reference.py --codepoints).
bool is_unicode_9_mark(UChar32 c) {
  if (c == 0x1CF2 || c == 0x1CF3) return true;
  if (c == 0x111C9) return false;
  return (U_GET_GC_MASK(c) & U_GC_M_MASK) != 0 && unicode_9_0().contains(c);
}

// Full (not simple) lowercase of one code point, as Rust's char::to_lowercase: the unconditional
// SpecialCasing mappings apply (U+0130 -> "i\u0307"), the context-dependent ones do not. Calling
// ICU on the code point alone with the root locale gives exactly that: no language-specific
// rules, and Final_Sigma needs a preceding cased letter, which a one-character string lacks.
void append_full_lowercase(std::u32string& out, char32_t c) {
  UChar src[2];
  int32_t src_len = 0;
  U16_APPEND_UNSAFE(src, src_len, UChar32(c));
  UChar dst[16];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t n = u_strToLower(dst, 16, src, src_len, "", &status);
  if (U_FAILURE(status)) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "U+%04X", unsigned(c));
    throw Error(std::string("ICU: lowercasing ") + hex + " failed: " + u_errorName(status));
  }
  for (int32_t i = 0; i < n;) {
    UChar32 cp;
    U16_NEXT(dst, i, n, cp);
    out += char32_t(cp);
  }
}

bool is_collapsible_space(char32_t c) { return c == U' ' || c == U'\t' || c == U'\r' || c == U'\n'; }

// ---------------------------------------------------------------- file helpers

template <class T>
void put_le(std::string& out, T v) {
  using U = std::make_unsigned_t<T>;
  auto u = U(v);
  for (size_t i = 0; i < sizeof(T); ++i) out += char(uint8_t(u >> (8 * i)));
}

template <class T>
T get_le(const std::string& in, size_t offset) {
  using U = std::make_unsigned_t<T>;
  U u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u |= U(uint8_t(in[offset + i])) << (8 * i);
  return T(u);
}

std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error("cannot read " + path);
  return data;
}

bool starts_with_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
  char head[sizeof(kCompressedVocabMagic)] = {};
  f.read(head, sizeof head);
  return f.gcount() == std::streamsize(sizeof head) && std::memcmp(head, kCompressedVocabMagic, sizeof head) == 0;
}

}  // namespace

// ---------------------------------------------------------------- public pieces

int32_t CompressedVocab::at(int64_t raw_id) const {
  if (raw_id < 0 || raw_id >= size()) {
    throw Error("token id " + std::to_string(raw_id) + " is outside the compressed token map of " +
                source + " (" + std::to_string(size()) + " ids)");
  }
  return map[size_t(raw_id)];
}

std::string normalize_engram_key(std::string_view utf8) {
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(utf8.data(), int32_t(utf8.size())));
  s = normalizers().nfkc->normalize(s, status);
  if (U_SUCCESS(status)) s = normalizers().nfd->normalize(s, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU normalization failed: ") + u_errorName(status));

  // StripAccents, then Lowercase, one code point at a time.
  std::u32string lowered;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    i += U16_LENGTH(c);
    if (is_unicode_9_mark(c)) continue;  // Mn, Mc, Me
    append_full_lowercase(lowered, char32_t(c));
  }

  // Runs of [ \t\r\n] become one space (other White_Space characters are left alone here).
  std::u32string t;
  bool in_run = false;
  for (char32_t c : lowered) {
    const bool space = is_collapsible_space(c);
    if (!space) t += c;
    else if (!in_run) t += U' ';
    in_run = space;
  }

  // A whitespace-only token would strip to "" and fall back to its raw text; the reference
  // protects the lone-space result with a private-use sentinel so all of them key to " ".
  if (t == U" ") t = U"\uE000";
  size_t b = 0, e = t.size();
  while (b < e && u_hasBinaryProperty(UChar32(t[b]), UCHAR_WHITE_SPACE)) ++b;
  while (e > b && u_hasBinaryProperty(UChar32(t[e - 1]), UCHAR_WHITE_SPACE)) --e;
  t = t.substr(b, e - b);
  // Every U+E000 becomes a space, including any that was in the text to begin with.
  std::replace(t.begin(), t.end(), U'\uE000', U' ');
  return to_utf8(t);
}

// ---------------------------------------------------------------- derivation

std::vector<int32_t> derive_compressed_vocab(const json& tok, const std::string& label, int64_t* distinct_keys) {
  if (!tok.is_object()) throw Error(label + ": not a tokenizer.json (top level is not an object)");
  const auto model = tok.find("model");
  if (model == tok.end() || !model->is_object() || !model->contains("vocab") || !(*model)["vocab"].is_object()) {
    throw Error(label + ": tokenizer.json has no model.vocab object");
  }
  // The keys depend on the decoder; only the byte-level one (every DeepSeek tokenizer) is
  // implemented, and guessing for another would silently re-key the Engram tables.
  const auto decoder = tok.find("decoder");
  if (decoder == tok.end() || !decoder->is_object() || decoder->value("type", "") != "ByteLevel") {
    const std::string type = decoder != tok.end() && decoder->is_object() ? decoder->value("type", "?") : "none";
    throw Error(label + ": tokenizer decoder is " + type +
                "; the compressed token map needs the ByteLevel decoder");
  }

  constexpr int64_t kMaxIds = int64_t(1) << 31;
  std::vector<std::string> spelling;  // raw id -> token string ("" for ids that no token has)
  std::vector<bool> present;
  auto assign = [&](int64_t id, const std::string& content, const std::string& what) {
    if (id < 0 || id >= kMaxIds) throw Error(label + ": " + what + " \"" + content + "\" has invalid id " + std::to_string(id));
    if (size_t(id) >= spelling.size()) {
      spelling.resize(size_t(id) + 1);
      present.resize(size_t(id) + 1, false);
    }
    spelling[size_t(id)] = content;
    present[size_t(id)] = true;
  };
  for (const auto& [token, id] : (*model)["vocab"].items()) {
    if (!id.is_number_integer()) throw Error(label + ": model.vocab entry \"" + token + "\" has a non-integer id");
    assign(id.get<int64_t>(), token, "model.vocab entry");
  }
  // Added tokens after the vocabulary: for an id in both, the added token's content is what
  // the HF tokenizer decodes and reports from id_to_token.
  if (auto added = tok.find("added_tokens"); added != tok.end() && !added->is_null()) {
    if (!added->is_array()) throw Error(label + ": added_tokens is not an array");
    for (const auto& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        throw Error(label + ": added_tokens entry without an integer id and a string content: " + a.dump());
      }
      assign(a["id"].get<int64_t>(), a["content"].get<std::string>(), "added token");
    }
  }
  if (spelling.empty()) throw Error(label + ": tokenizer.json has no tokens");

  std::unordered_map<std::string, int32_t> ids_of_key;
  ids_of_key.reserve(spelling.size());
  std::vector<int32_t> map(spelling.size());
  for (size_t id = 0; id < spelling.size(); ++id) {
    std::string key;
    if (present[id]) {
      const std::string text = utf8_lossy(byte_level_decode(spelling[id]));
      if (text.find("\xEF\xBF\xBD") != std::string::npos) {  // U+FFFD
        key = spelling[id];
      } else {
        key = normalize_engram_key(text);
        if (key.empty()) key = text;
      }
    }
    const auto [it, inserted] = ids_of_key.try_emplace(std::move(key), int32_t(ids_of_key.size()));
    map[id] = it->second;
  }
  if (distinct_keys) *distinct_keys = int64_t(ids_of_key.size());
  return map;
}

std::vector<int32_t> derive_compressed_vocab(const std::string& tokenizer_json_path, int64_t* distinct_keys) {
  json tok;
  try {
    tok = json::parse(read_whole_file(tokenizer_json_path));
  } catch (const json::exception& e) {
    throw Error(tokenizer_json_path + ": not valid JSON: " + e.what());
  }
  return derive_compressed_vocab(tok, tokenizer_json_path, distinct_keys);
}

std::vector<int32_t> synthetic_compressed_vocab(int64_t vocab, int64_t compressed) {
  if (compressed < 1 || compressed > vocab || vocab > (int64_t(1) << 31)) {
    throw Error("synthetic compressed token map: need 1 <= compressed size (" + std::to_string(compressed) +
                ") <= vocabulary size (" + std::to_string(vocab) + ") <= 2^31");
  }
  std::vector<int32_t> map(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) map[size_t(id)] = int32_t(id < compressed ? id : id % compressed);
  return map;
}

// ---------------------------------------------------------------- validation and files

int64_t validate_compressed_vocab(const std::vector<int32_t>& map, const std::string& label) {
  if (map.empty()) throw Error(label + ": the compressed token map is empty");
  int64_t next = 0;  // the id a new key would get = max so far + 1
  for (size_t i = 0; i < map.size(); ++i) {
    if (map[i] < 0 || map[i] > next) {
      throw Error(label + ": compressed token map entry " + std::to_string(i) + " is " + std::to_string(map[i]) +
                  ", but ids must be assigned in order of first appearance (expected 0.." + std::to_string(next) + ")");
    }
    if (map[i] == next) ++next;
  }
  return next;
}

void write_compressed_vocab_file(const std::string& path, const std::vector<int32_t>& map) {
  const int64_t compressed = validate_compressed_vocab(map, "write_compressed_vocab_file(" + path + ")");
  std::string out(kCompressedVocabMagic, sizeof kCompressedVocabMagic);
  put_le<uint32_t>(out, kCompressedVocabVersion);
  put_le<uint32_t>(out, 0);
  put_le<int64_t>(out, int64_t(map.size()));
  put_le<int64_t>(out, compressed);
  out.reserve(kHeaderBytes + 4 * map.size() + kTrailerBytes);
  for (int32_t v : map) put_le<int32_t>(out, v);
  put_le<uint64_t>(out, fnv1a64(reinterpret_cast<const uint8_t*>(out.data()), out.size()));

  // Written beside the target and renamed, so a crash never leaves a half-written map that
  // a later load would have to diagnose.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
    f.write(out.data(), std::streamsize(out.size()));
    f.flush();
    if (!f) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

std::vector<int32_t> read_compressed_vocab_file(const std::string& path, int64_t* compressed_size) {
  const std::string data = read_whole_file(path);
  const std::string what = path + ": compressed token map file";
  if (data.size() >= sizeof kCompressedVocabMagic &&
      std::memcmp(data.data(), kCompressedVocabMagic, sizeof kCompressedVocabMagic) != 0) {
    throw Error(path + ": not a compressed token map file (bad magic; expected \"DS41CVM\")");
  }
  if (data.size() < kHeaderBytes + kTrailerBytes) {
    throw Error(what + " is truncated: " + std::to_string(data.size()) + " bytes, less than the " +
                std::to_string(kHeaderBytes + kTrailerBytes) + " of an empty map");
  }
  const auto version = get_le<uint32_t>(data, 8);
  if (version != kCompressedVocabVersion) {
    throw Error(what + " has version " + std::to_string(version) + "; this build reads version " +
                std::to_string(kCompressedVocabVersion));
  }
  const auto n = get_le<int64_t>(data, 16);
  const auto header_compressed = get_le<int64_t>(data, 24);
  const uint64_t available = (data.size() - kHeaderBytes - kTrailerBytes) / 4;
  if (n < 0 || uint64_t(n) != available || (data.size() - kHeaderBytes - kTrailerBytes) % 4 != 0) {
    const bool short_file = n < 0 || uint64_t(n) > available;
    const std::string needed = n < 0 || n > (int64_t(1) << 40)
                                   ? " (impossible)"
                                   : " (" + std::to_string(kHeaderBytes + kTrailerBytes + 4 * uint64_t(n)) + " bytes)";
    throw Error(what + (short_file ? " is truncated" : " has trailing bytes") + ": the header says " +
                std::to_string(n) + " entries" + needed + " but the file has " + std::to_string(data.size()) +
                " bytes");
  }
  const size_t body = data.size() - kTrailerBytes;
  const auto stored = get_le<uint64_t>(data, body);
  const uint64_t actual = fnv1a64(reinterpret_cast<const uint8_t*>(data.data()), body);
  if (stored != actual) throw Error(what + " is corrupt: FNV-1a checksum mismatch");

  std::vector<int32_t> map(static_cast<size_t>(n));
  for (size_t i = 0; i < map.size(); ++i) map[i] = get_le<int32_t>(data, kHeaderBytes + 4 * i);
  const int64_t compressed = validate_compressed_vocab(map, what);
  if (compressed != header_compressed) {
    throw Error(what + ": the header says " + std::to_string(header_compressed) +
                " compressed ids but the map uses " + std::to_string(compressed));
  }
  if (compressed_size) *compressed_size = compressed;
  return map;
}

CompressedVocab load_compressed_vocab(const std::string& path, int64_t expected_compressed_size) {
  CompressedVocab v;
  v.source = path;
  const bool map_file = starts_with_magic(path);
  if (map_file) {
    v.map = read_compressed_vocab_file(path, &v.compressed_size);
  } else {
    v.map = derive_compressed_vocab(path, &v.compressed_size);
  }
  if (v.compressed_size != expected_compressed_size) {
    throw Error(path + (map_file ? ": the compressed token map file has " : ": the tokenizer gives ") +
                std::to_string(v.compressed_size) + " distinct compressed token keys, but the config's "
                "engram_compressed_vocab_size is " + std::to_string(expected_compressed_size) +
                (map_file ? "" : " (a different tokenizer, or Unicode tables that differ from the reference's)"));
  }
  return v;
}

}  // namespace ds41
