// Prefix cache for the server: complete sequence states saved at a prompt boundary, keyed by the
// token ids they hold. A request whose prompt starts with a saved prefix starts from a copy of
// that state and prefills only the rest. The states are exact copies (window rings included), so
// a hit changes only the time to first token, never the output: prefill in pieces gives the same
// numbers as prefill in one call (tests/slow/forward_consistency_test.cpp).
// Bounded by bytes, least recently used entry evicted first. Not thread-safe (the engine thread
// owns it).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "model/sequence_state.h"

namespace ds41 {

int64_t sequence_state_bytes(const SequenceState& s);

class PrefixCache {
 public:
  explicit PrefixCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The longest saved prefix of `prompt` that is strictly shorter than it (the caller still has
  // to feed at least one token to get logits); nullopt on a miss.
  std::optional<SequenceState> lookup(const std::vector<int32_t>& prompt);
  // Saves `state` (which must hold exactly `ids`); replaces an entry with the same ids.
  void insert(const std::vector<int32_t>& ids, const SequenceState& state);

  int64_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t hit_tokens() const { return hit_tokens_; }

 private:
  struct Entry {
    std::vector<int32_t> ids;
    SequenceState state;
    int64_t bytes = 0;
  };
  void evict_to(int64_t limit);
  int64_t capacity_;
  int64_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
  int64_t hits_ = 0, misses_ = 0, hit_tokens_ = 0;
};

}  // namespace ds41
