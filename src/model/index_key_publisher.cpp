// Which kv source's index keys an indexer reads under the reference's reading (spec backbone.md
// §5.5 pitfall; model.h ForwardOptions::corrected_index_keys). The reference only has one call
// shape after the prefill, single-token decode; our calls at start_pos > 0 with several rows
// (chunked prefill, speculative verification) reproduce that decode row by row, so a chunk gives
// exactly the bits token-by-token decoding gives whatever the reading.
#include <algorithm>

#include "model/forward_context.h"

namespace ds41 {

namespace {

bool publishes(const LayerPlan& lp, int64_t p) { return lp.kv_source && lp.ratio > 0 && (p + 1) % lp.ratio == 0; }

}  // namespace

int reference_publisher_at(const ModelPlan& plan, int before, int64_t p, int layer) {
  // In the decode call of position p, kv source l publishes when its group completes; the
  // indexer of `layer` reads the latest publication so far: this call's up to `layer` (its own
  // compressor runs first), else whatever was published last before the call.
  for (int l = layer; l >= 0; --l)
    if (publishes(plan.layers[size_t(l)], p)) return l;
  return before;
}

int reference_publisher_after(const ModelPlan& plan, int before, int64_t p) {
  return reference_publisher_at(plan, before, p, plan.n_layers - 1);
}

int64_t reference_rowwise_rows(const ModelPlan& plan, int before, int64_t start, int64_t S) {
  // A row reading the keys of a kv source l that comes after the indexer (a publication from an
  // earlier position) needs l's entries as they were after that position; within one layer pass
  // only the entries from before the call exist. Rows count from the first that would need more.
  int pub = before;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t p = start + s;
    for (const LayerPlan& lp : plan.layers) {
      if (lp.is_dspark || !lp.index_source || lp.ratio <= 0) continue;
      const int l = reference_publisher_at(plan, pub, p, lp.id);
      if (l <= lp.id || s == 0) continue;
      const int64_t m = plan.layers[size_t(l)].ratio;
      const int64_t needed = std::min((p + 1) / lp.ratio, p / m);  // rows row s reads that exist in decode
      if (needed > start / m) return s;
    }
    pub = reference_publisher_after(plan, pub, p);
  }
  return S;
}

}  // namespace ds41
