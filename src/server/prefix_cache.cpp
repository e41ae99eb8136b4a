#include "server/prefix_cache.h"

#include <algorithm>

namespace ds41 {

int64_t sequence_state_bytes(const SequenceState& s) {
  int64_t n = int64_t(sizeof(SequenceState));
  for (const LayerState& l : s.layers)
    n += int64_t(l.ring_codes.size() + l.ring_scales.size() + l.ckv_codes.size() + l.ckv_scales.size() +
                 l.ik_codes.size() + l.ik_scales.size()) +
         int64_t(l.group_kv.size() + l.group_score.size()) * 4;
  n += int64_t(s.token_history.size()) * 4 + int64_t(s.engram_history.size()) * 8;
  return n;
}

std::optional<SequenceState> PrefixCache::lookup(const std::vector<int32_t>& prompt) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->ids.size() >= prompt.size()) continue;
    if (best != entries_.end() && it->ids.size() <= best->ids.size()) continue;
    if (std::equal(it->ids.begin(), it->ids.end(), prompt.begin())) best = it;
  }
  if (best == entries_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  hit_tokens_ += int64_t(best->ids.size());
  entries_.splice(entries_.begin(), entries_, best);
  return entries_.front().state;
}

void PrefixCache::insert(const std::vector<int32_t>& ids, const SequenceState& state) {
  if (capacity_ <= 0 || ids.empty()) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->ids == ids) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  Entry e{ids, state, 0};
  e.bytes = sequence_state_bytes(state) + int64_t(ids.size()) * 4;
  if (e.bytes > capacity_) return;
  evict_to(capacity_ - e.bytes);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
}

void PrefixCache::evict_to(int64_t limit) {
  while (!entries_.empty() && bytes_ > limit) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

}  // namespace ds41
