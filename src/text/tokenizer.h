// The text tokenizer: HF tokenizer.json files of the DeepSeek V3 / V4 / V4.1 family (byte-level
// BPE), with ids identical to the HF `tokenizers` library (tests/tokenizer_parity_test.cpp).
//
//   auto tok = Tokenizer::load("/models/DeepSeek-V4.1-Flash");      // or .../tokenizer.json
//   std::vector<int32_t> ids = tok.encode("<｜User｜>Hello");         // [128803, ...]
//   std::string text = tok.decode(ids);                              // "<｜User｜>Hello"
//   int32_t eos = *tok.token_to_id("<｜end▁of▁sentence｜>");           // 1
//
// encode(text) = HF `Tokenizer.encode(text, add_special_tokens=False).ids`:
//   1. added tokens ("<｜User｜>", "<think>", ...) are cut out of the raw text first, so special
//      strings typed in the text become their ids (added_vocabulary.h);
//   2. the rest is pre-tokenized by the file's Split regexes (pre_tokenizer.h);
//   3. each piece's UTF-8 bytes are BPE-merged (bpe.h).
// Nothing is prepended or appended: the prompt text carries BOS itself (spec §D.2, §D.4). The
// post-processor, truncation and padding of the file are not applied. Text must be valid UTF-8
// (ds41::Error otherwise: Python strings, and so HF, cannot hold anything else).
//
// decode(ids) = HF `Tokenizer.decode(ids, skip_special_tokens)`: the ByteLevel decoder turns
// every token spelling back into bytes and the whole byte string into UTF-8, each ill-formed
// part replaced by U+FFFD. StreamDecoder (stream_decoder.h) does the same incrementally.
//
// Unicode data: the regexes run on PCRE2 10.42 (Debian 12), which carries Unicode 14.0; HF
// tokenizers 0.23.3 runs them on its bundled Oniguruma, which knows Unicode 16.0. Every code point
// assigned in Unicode 14.0 tokenizes identically in every context of the code point sweep
// (tools/make_tokenizer_reference.py codepoints); 10,168 of the 1,112,064 scalar values differ,
// all of them unassigned in 14.0 (scripts and symbols encoded in 15.0-16.0, e.g. Todhri U+105C0).
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal, locked BPE cache; all
// const methods may be called from several threads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/added_vocabulary.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"

namespace ds41 {

class Tokenizer {
 public:
  // A tokenizer.json file, or a directory that contains one. Throws ds41::Error naming the file
  // (and directory) when it is missing, unreadable, not JSON, or not a supported tokenizer.
  static Tokenizer load(const std::string& path_or_dir);
  // From an already parsed tokenizer.json; `label` names it in error messages.
  static Tokenizer from_json(const nlohmann::json& j, const std::string& label);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `out`.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // Same, except that inside the byte ranges `literal` (ascending, disjoint) added tokens are not
  // recognised: their text is tokenized as ordinary text (HF's split_special_tokens, limited to
  // those ranges: client text in a prompt, EncodedPrompt::text_spans).
  std::vector<int32_t> encode(std::string_view text, std::span<const std::pair<size_t, size_t>> literal) const;

  // Ids -> text. Ids in [0, vocab_size()) that no token has are skipped (as HF does); ids outside
  // that range are an error. With skip_special_tokens, added tokens marked special are left out.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Token spelling <-> id, as HF token_to_id / id_to_token (added tokens first, then the BPE
  // vocabulary; vocabulary spellings are byte-level characters, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;

  // Largest id + 1 over the vocabulary and the added tokens (HF len(tokenizer)).
  int32_t vocab_size() const { return vocab_size_; }
  bool is_added(int32_t id) const { return added_.find_id(id) != nullptr; }
  bool is_special(int32_t id) const;
  // The raw bytes id stands for in decoding (not necessarily valid UTF-8 on their own; empty for
  // ids no token has). Throws ds41::Error for ids outside [0, vocab_size()).
  std::string_view token_bytes(int32_t id) const;

  // For ids 0..n-1: 1 where the id has a token (an added token or a vocabulary entry), 0 for gaps
  // and ids past the tokenizer (a model's padding rows): what a model may produce for this
  // tokenizer (Model::restrict_output_ids).
  std::vector<uint8_t> ids_with_a_token(int64_t n) const;

  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }
  const std::string& source() const { return source_; }

 private:
  Tokenizer(BpeModel bpe, PreTokenizer pre) : bpe_(std::move(bpe)), pre_(std::move(pre)) {}
  void check_id(int32_t id) const;
  void encode_segments(std::string_view text, std::span<const std::pair<size_t, size_t>> literal,
                       std::vector<int32_t>& out) const;

  BpeModel bpe_;
  PreTokenizer pre_;
  AddedVocabulary added_;
  int32_t vocab_size_ = 0;
  std::string bytes_;                   // decoded bytes of every id, concatenated
  std::vector<uint32_t> bytes_offset_;  // id -> offset in bytes_ (vocab_size + 1 entries)
  std::string source_;
};

}  // namespace ds41
