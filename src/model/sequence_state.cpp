#include "model/sequence_state.h"

#include <algorithm>

namespace ds41 {

SequenceState make_sequence_state(const ModelConfig& c, const ModelPlan& plan) {
  SequenceState s;
  s.layers.resize(plan.layers.size());
  for (const LayerPlan& lp : plan.layers) {
    LayerState& ls = s.layers[lp.id];
    ls.ring_codes.assign(size_t(c.window_size) * c.head_dim, 0);
    ls.ring_scales.assign(size_t(c.window_size) * (c.head_dim / 32), 127);
    if (lp.kv_source && lp.ratio > 1) {
      ls.group_kv.assign(size_t(lp.ratio) * c.head_dim, 0.f);
      ls.group_score.assign(size_t(lp.ratio) * c.head_dim, 0.f);
    }
  }
  return s;
}

void reserve_sequence(SequenceState& s, const ModelConfig& c, const ModelPlan& plan, int64_t total_tokens) {
  const size_t n = size_t(std::max<int64_t>(total_tokens, 0));
  s.reserved_tokens = std::max<int64_t>(s.reserved_tokens, int64_t(n));
  s.token_history.reserve(n);
  if (!c.engram_layer_ids.empty()) s.engram_history.reserve(n);
  for (const LayerPlan& lp : plan.layers) {
    if (!lp.kv_source || lp.ratio <= 0 || size_t(lp.id) >= s.layers.size()) continue;
    LayerState& ls = s.layers[lp.id];
    const size_t entries = n / size_t(lp.ratio);
    ls.ckv_codes.reserve(entries * size_t(c.head_dim / 2));
    ls.ckv_scales.reserve(entries * size_t(c.head_dim / 16));
    if (lp.owns_index_k) {
      ls.ik_codes.reserve(entries * size_t(c.index_head_dim / 2));
      ls.ik_scales.reserve(entries * size_t(c.index_head_dim / 32));
    }
  }
}

int64_t SequenceState::compressed_cache_bytes() const {
  int64_t b = 0;
  for (const LayerState& l : layers)
    b += int64_t(l.ckv_codes.size() + l.ckv_scales.size() + l.ik_codes.size() + l.ik_scales.size());
  return b;
}

}  // namespace ds41
