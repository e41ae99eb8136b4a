#include "model/sequence_state.h"

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

int64_t SequenceState::compressed_cache_bytes() const {
  int64_t b = 0;
  for (const LayerState& l : layers)
    b += int64_t(l.ckv_codes.size() + l.ckv_scales.size() + l.ik_codes.size() + l.ik_scales.size());
  return b;
}

}  // namespace ds41
