// Bit-level comparison of two sequence states (sessions, CED and replay tests).
#pragma once

#include <cstring>
#include <vector>

#include "model/sequence_state.h"

namespace ds41::test {

// Floats compared by bits: "exact" means the very same bytes.
inline bool same_bits(const std::vector<float>& p, const std::vector<float>& q) {
  return p.size() == q.size() && (p.empty() || std::memcmp(p.data(), q.data(), p.size() * 4) == 0);
}

// The global (length-proportional) caches and the compressor's partial group of one layer.
inline bool same_global_cache(const LayerState& x, const LayerState& y) {
  return x.entries == y.entries && same_bits(x.group_kv, y.group_kv) && same_bits(x.group_score, y.group_score) &&
         x.ckv_codes == y.ckv_codes && x.ckv_scales == y.ckv_scales && x.ik_codes == y.ik_codes &&
         x.ik_scales == y.ik_scales;
}

inline bool same_ring(const LayerState& x, const LayerState& y) {
  return x.ring_start == y.ring_start && x.ring_codes == y.ring_codes && x.ring_scales == y.ring_scales;
}

inline bool same_state(const SequenceState& a, const SequenceState& b) {
  if (a.pos != b.pos || a.index_k_publisher != b.index_k_publisher || a.layers.size() != b.layers.size() ||
      a.history_start != b.history_start || a.token_history != b.token_history || a.engram_history != b.engram_history)
    return false;
  for (size_t i = 0; i < a.layers.size(); ++i)
    if (!same_global_cache(a.layers[i], b.layers[i]) || !same_ring(a.layers[i], b.layers[i])) return false;
  return true;
}

}  // namespace ds41::test
