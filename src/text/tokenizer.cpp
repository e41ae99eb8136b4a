#include "text/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error("cannot read " + path);
  return data;
}

bool is_identity_normalizer(const json& n) {
  if (n.is_null()) return true;
  return n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
         n["normalizers"].is_array() && n["normalizers"].empty();
}

bool required_bool(const json& a, const char* key, const std::string& where) {
  auto it = a.find(key);
  if (it == a.end() || !it->is_boolean()) throw Error(where + " has no boolean \"" + key + "\"");
  return it->get<bool>();
}

std::vector<AddedToken> parse_added_tokens(const json& j, const std::string& label) {
  std::vector<AddedToken> tokens;
  auto list = j.find("added_tokens");
  if (list == j.end() || list->is_null()) return tokens;
  if (!list->is_array()) throw Error(label + ": added_tokens is not an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& a = (*list)[i];
    const std::string where = label + ": added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object()) throw Error(where + " is not an object");
    AddedToken t;
    auto id = a.find("id");
    auto content = a.find("content");
    if (id == a.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= (int64_t(1) << 31) - 1) {
      throw Error(where + " has no valid integer \"id\"");
    }
    if (content == a.end() || !content->is_string() || content->get_ref<const std::string&>().empty()) {
      throw Error(where + " has no non-empty string \"content\"");
    }
    t.id = id->get<int32_t>();
    t.content = content->get<std::string>();
    if (find_invalid_utf8(t.content) != std::string::npos) throw Error(where + ": content is not valid UTF-8");
    t.special = required_bool(a, "special", where);
    t.single_word = required_bool(a, "single_word", where);
    t.lstrip = required_bool(a, "lstrip", where);
    t.rstrip = required_bool(a, "rstrip", where);
    t.normalized = required_bool(a, "normalized", where);
    tokens.push_back(std::move(t));
  }
  return tokens;
}

}  // namespace

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path_or_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string path = path_or_dir;
  if (fs::is_directory(path_or_dir, ec)) {
    path = (fs::path(path_or_dir) / "tokenizer.json").string();
    if (!fs::exists(path, ec)) {
      throw Error("no tokenizer.json in " + path_or_dir + " (expected " + path +
                  "; copy the checkpoint's tokenizer.json there or pass the file itself)");
    }
  } else if (!fs::exists(path_or_dir, ec)) {
    throw Error("tokenizer file " + path_or_dir + " does not exist");
  }
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return from_json(j, path);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& label) {
  if (!j.is_object()) throw Error(label + ": not a tokenizer.json (the top level is not an object)");
  if (auto v = j.find("version"); v != j.end() && !(v->is_string() && v->get<std::string>() == "1.0")) {
    throw Error(label + ": tokenizer.json version " + v->dump() + " is not supported (expected \"1.0\")");
  }
  if (auto n = j.find("normalizer"); n != j.end() && !is_identity_normalizer(*n)) {
    throw Error(label + ": the tokenizer has a normalizer (" + n->dump().substr(0, 200) +
                "); only tokenizers without one (as DeepSeek's) are supported");
  }
  const auto decoder = j.find("decoder");
  if (decoder == j.end() || !decoder->is_object() || decoder->value("type", "") != "ByteLevel") {
    throw Error(label + ": the tokenizer's decoder is not ByteLevel; only byte-level BPE tokenizers are supported");
  }
  const auto model = j.find("model");
  if (model == j.end()) throw Error(label + ": tokenizer.json has no \"model\"");
  const auto pre = j.find("pre_tokenizer");

  Tokenizer t(BpeModel::from_json(*model, label), PreTokenizer::from_json(pre == j.end() ? json() : *pre, label));
  t.source_ = label;
  const BpeModel& bpe = t.bpe_;
  t.added_.add_all(
      parse_added_tokens(j, label),
      [&](const std::string& content) -> int64_t {
        auto id = bpe.token_to_id(content);
        return id ? *id : -1;
      },
      int64_t(bpe.vocab_entries()), label);

  int32_t max_id = bpe.max_id();
  for (const AddedToken& a : t.added_.tokens()) max_id = std::max(max_id, a.id);
  t.vocab_size_ = max_id + 1;

  // Decoded bytes of every id, computed once: decode is then concatenation plus one UTF-8 pass.
  t.bytes_offset_.assign(size_t(t.vocab_size_) + 1, 0);
  for (int32_t id = 0; id < t.vocab_size_; ++id) {
    t.bytes_offset_[size_t(id)] = uint32_t(t.bytes_.size());
    if (const AddedToken* a = t.added_.find_id(id)) {
      t.bytes_ += byte_level_decode(a->content);
    } else if (const auto s = bpe.spelling(id)) {
      t.bytes_ += byte_level_decode(*s);
    }
  }
  t.bytes_offset_[size_t(t.vocab_size_)] = uint32_t(t.bytes_.size());
  return t;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  encode_segments(text, {}, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, std::span<const std::pair<size_t, size_t>> literal) const {
  std::vector<int32_t> ids;
  encode_segments(text, literal, ids);
  return ids;
}

void Tokenizer::encode_segments(std::string_view text, std::span<const std::pair<size_t, size_t>> literal,
                                std::vector<int32_t>& out) const {
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos) {
    throw Error("cannot tokenize: the text is not valid UTF-8 (byte " + std::to_string(bad) + " of " +
                std::to_string(text.size()) + ")");
  }
  std::vector<TextSegment> segments;
  added_.split(text, segments);
  if (!literal.empty()) {
    // An added token that overlaps a literal range is text again, merged with its neighbours so
    // that the pre-tokenizer sees the text as one piece (as if the token were not in the vocabulary).
    std::vector<TextSegment> merged;
    size_t li = 0;
    for (TextSegment seg : segments) {
      if (seg.id >= 0) {
        while (li < literal.size() && literal[li].second <= seg.begin) ++li;
        if (li < literal.size() && literal[li].first < seg.end) seg.id = -1;
      }
      if (seg.id < 0 && !merged.empty() && merged.back().id < 0 && merged.back().end == seg.begin)
        merged.back().end = seg.end;
      else
        merged.push_back(seg);
    }
    segments = std::move(merged);
  }
  PreTokenizer::Scratch scratch(pre_);
  out.reserve(out.size() + text.size() / 3);
  const auto on_piece = [&](std::string_view piece) { bpe_.encode_piece(piece, out); };
  for (const TextSegment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      pre_.split(text.substr(s.begin, s.end - s.begin), scratch, on_piece);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode_append(text, ids);
  return ids;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size_) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + source_ + " (0.." +
                std::to_string(vocab_size_ - 1) + ")");
  }
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  const uint32_t b = bytes_offset_[size_t(id)], e = bytes_offset_[size_t(id) + 1];
  return std::string_view(bytes_).substr(b, e - b);
}

std::vector<uint8_t> Tokenizer::ids_with_a_token(int64_t n) const {
  std::vector<uint8_t> out(size_t(std::max<int64_t>(n, 0)), 0);
  for (int64_t id = 0; id < std::min<int64_t>(n, vocab_size_); ++id)
    out[size_t(id)] = added_.find_id(int32_t(id)) != nullptr || bpe_.spelling(int32_t(id)).has_value();
  return out;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = added_.find_id(id);
  return a && a->special;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string_view b = token_bytes(id);
    if (skip_special_tokens && is_special(id)) continue;
    bytes.append(b);
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const int32_t id = added_.find_content(token); id >= 0) return id;
  return bpe_.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = added_.find_id(id)) return a->content;
  if (const auto s = bpe_.spelling(id)) return std::string(*s);
  return std::nullopt;
}

}  // namespace ds41
