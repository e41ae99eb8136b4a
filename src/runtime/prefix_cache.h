// Prefix cache for the server: complete sequence states saved at a prompt boundary, keyed by the
// token ids they hold. A request whose prompt starts with a saved prefix starts from a copy of
// that state and prefills only the rest. The states are exact copies (window rings included), so
// a hit changes only the time to first token, never the output: prefill in pieces gives the same
// numbers as prefill in one call (tests/slow/forward_consistency_test.cpp).
// Bounded by bytes, least recently used entry evicted first. With a disk tier (enable_disk), an
// entry evicted from memory is written to a directory as an exact session file (runtime/session.h:
// checksummed, config-fingerprinted, atomic) beside a small file of its token ids, and a lookup
// whose best prefix is on disk loads it back; the disk tier has its own byte bound (LRU) and is
// found again by a server restarted on the same directory. Not thread-safe (the engine thread
// owns it).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "model/sequence_state.h"

namespace ds41 {

class Model;

int64_t sequence_state_bytes(const SequenceState& s);

class PrefixCache {
 public:
  explicit PrefixCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The longest saved prefix of `prompt` that is strictly shorter than it (the caller still has
  // to feed at least one token to get logits); nullopt on a miss.
  std::optional<SequenceState> lookup(const std::vector<int32_t>& prompt);
  // Saves `state` (which must hold exactly `ids`); replaces an entry with the same ids.
  void insert(const std::vector<int32_t>& ids, const SequenceState& state);

  // Spills evicted entries to `dir` (created if needed) up to `disk_bytes`, and indexes the
  // entries a previous run left there (files that do not load for `model` are dropped when a
  // lookup reaches them). Throws ds41::Error when the directory cannot be created or read.
  void enable_disk(const Model& model, const std::string& dir, int64_t disk_bytes);
  // Writes every memory entry the disk tier lacks (at shutdown: a restart then starts warm).
  void flush_to_disk();

  int64_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t hit_tokens() const { return hit_tokens_; }
  size_t disk_entries() const { return disk_.size(); }
  int64_t disk_bytes() const { return disk_bytes_; }
  int64_t disk_hits() const { return disk_hits_; }
  int64_t disk_errors() const { return disk_errors_; }  // spills that failed, files that did not load

 private:
  struct Entry {
    std::vector<int32_t> ids;
    SequenceState state;
    int64_t bytes = 0;
    bool on_disk = false;  // a copy is in the disk tier: eviction need not write it again
  };
  struct DiskEntry {
    std::vector<int32_t> ids;
    std::string stem;  // <dir>/prefix-<hash>: .session and .ids
    int64_t bytes = 0;
  };
  void evict_to(int64_t limit);
  void spill(const Entry& e);
  void drop_disk(std::list<DiskEntry>::iterator it);
  void evict_disk_to(int64_t limit);
  const Model* model_ = nullptr;
  std::string dir_;
  int64_t disk_capacity_ = 0, disk_bytes_ = 0;
  std::list<DiskEntry> disk_;  // most recently used first
  int64_t disk_hits_ = 0, disk_errors_ = 0;
  int64_t capacity_;
  int64_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
  int64_t hits_ = 0, misses_ = 0, hit_tokens_ = 0;
};

}  // namespace ds41
