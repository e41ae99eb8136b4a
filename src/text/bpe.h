// The byte-level BPE model of a HF tokenizer.json ("model": {"type": "BPE", ...}).
//
// A pre-tokenized piece (raw bytes) starts as one symbol per byte (the vocabulary id of the
// byte's GPT-2 spelling, see byte_level.h); then, repeatedly, the adjacent pair with the lowest
// merge rank is merged, the leftmost one among equal ranks, until no adjacent pair has a merge.
// That is exactly what HF's BPE::merge_word / Word::merge_all compute (a min-heap on (rank,
// position) with lazy invalidation); the rank of a merge is its index in model.merges, and a
// pair listed twice keeps its last index, as HF's map construction does.
//
// Here short pieces are merged by a linear scan and long ones with a segment tree over positions;
// both pick the same pair as HF at every step (the tests compare them with the naive definition).
// Results for pieces shorter than kCacheMaxPieceBytes are cached, since natural text repeats the
// same words over and over: thread-safe, at most kCacheMaxEntries pieces (then no new ones).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds41 {

class BpeModel {
 public:
  static constexpr size_t kCacheMaxPieceBytes = 256;
  static constexpr size_t kCacheMaxEntries = size_t(1) << 16;
  // Pieces up to this many bytes are merged by a linear scan, longer ones with a segment tree
  // (same result).
  static constexpr size_t kScanMaxPieceBytes = 48;

  // Reads model.vocab, model.merges (either "a b" strings or ["a", "b"] pairs) and the options.
  // Throws ds41::Error naming `label` for anything missing, malformed or unsupported (dropout,
  // subword prefixes/suffixes, a vocabulary that lacks one of the 256 byte spellings).
  static BpeModel from_json(const nlohmann::json& model, const std::string& label);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one pre-tokenized piece (raw bytes, non-empty).
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;
  // Same without the cache (for tests and the cache itself).
  void encode_piece_uncached(std::string_view bytes, std::vector<int32_t>& out) const;
  // The two merge algorithms, for tests (any length >= 2; no ignore_merges shortcut).
  void merge_by_scan(std::string_view bytes, std::vector<int32_t>& out) const;  // up to kScanMaxPieceBytes
  void merge_by_tree(std::string_view bytes, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view spelling) const;
  // The spelling of an id (byte-level characters), or nullopt when no vocabulary entry has it.
  std::optional<std::string_view> spelling(int32_t id) const;
  int32_t max_id() const { return int32_t(vocab_.begin.size()) - 1; }
  size_t vocab_entries() const { return vocab_.entries; }
  size_t merge_count() const { return merge_count_; }

 private:
  BpeModel();
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  // Open-addressing table from a pair of ids to its merge; the pair key is (left << 32 | right).
  struct MergeTable {
    std::vector<uint64_t> keys;  // kEmpty where unused
    std::vector<Merge> values;
    uint64_t mask = 0;
    int shift = 64;
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(int32_t left, int32_t right) const;
  };
  struct Cache;

  // Spelling <-> id: the spellings in one buffer, found through an open-addressing table of ids
  // (a node-based map of the 128k entries made loading several times slower).
  struct Vocabulary {
    static constexpr uint32_t kAbsent = ~uint32_t(0);
    std::string arena;
    std::vector<uint32_t> begin, length;  // per id; length kAbsent when no entry has the id
    std::vector<int32_t> slots;           // -1 where empty
    size_t mask = 0, entries = 0;
    int32_t find(std::string_view spelling) const;  // -1 when absent
  };

  Vocabulary vocab_;
  std::array<int32_t, 256> byte_id_{};              // id of each single-byte token
  MergeTable merges_;
  size_t merge_count_ = 0;
  bool ignore_merges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace ds41
