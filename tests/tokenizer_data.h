// Reader for the tokenizer parity data written by tools/make_tokenizer_reference.py (format in
// that script's docstring): documents with the ids HF tokenizers gives them, and decode cases.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds41::test {

struct TokenizerParityData {
  struct Document {
    std::string text;
    std::vector<int32_t> ids;
  };
  struct DecodeCase {
    bool skip_special_tokens;
    std::vector<int32_t> ids;
    std::string text;
  };
  nlohmann::json meta;
  std::vector<Document> documents;
  std::vector<DecodeCase> decode_cases;
};

inline std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  const bool failed = n < 0;
  gzclose(f);
  if (failed) throw std::runtime_error("cannot decompress " + path);
  return out;
}

inline TokenizerParityData read_tokenizer_parity_data(const std::string& path) {
  const std::string data = gunzip_file(path);
  size_t pos = 0;
  auto need = [&](size_t n) {
    if (data.size() - pos < n) throw std::runtime_error(path + ": truncated at byte " + std::to_string(pos));
  };
  auto u32 = [&] {
    need(4);
    uint32_t v;
    std::memcpy(&v, data.data() + pos, 4);  // little-endian host assumed (x86-64, aarch64)
    pos += 4;
    return v;
  };
  auto bytes = [&](size_t n) {
    need(n);
    std::string s = data.substr(pos, n);
    pos += n;
    return s;
  };
  auto ids = [&](size_t n) {
    need(4 * n);
    std::vector<int32_t> v(n);
    if (n) std::memcpy(v.data(), data.data() + pos, 4 * n);
    pos += 4 * n;
    return v;
  };
  if (bytes(8) != "DS41TOKP") throw std::runtime_error(path + ": bad magic");
  if (u32() != 1) throw std::runtime_error(path + ": unsupported version");
  TokenizerParityData d;
  d.meta = nlohmann::json::parse(bytes(u32()));
  for (uint32_t n = u32(), i = 0; i < n; ++i) {
    TokenizerParityData::Document doc;
    doc.text = bytes(u32());
    doc.ids = ids(u32());
    d.documents.push_back(std::move(doc));
  }
  for (uint32_t n = u32(), i = 0; i < n; ++i) {
    TokenizerParityData::DecodeCase c;
    need(1);
    c.skip_special_tokens = data[pos++] != 0;
    c.ids = ids(u32());
    c.text = bytes(u32());
    d.decode_cases.push_back(std::move(c));
  }
  if (pos != data.size()) throw std::runtime_error(path + ": trailing bytes");
  return d;
}

}  // namespace ds41::test
