// Cutting a sequence back to a prefix of the positions it consumed (spec engram_dspark_vision.md
// §B.8): what a speculative verify chunk wrote for its rejected rows is taken back exactly.
//
// State a call changes, and how each part is restored:
//  * window-ring slots and ratio>1 compressor partial groups are overwritten in place: the
//    journal holds the bytes each write replaced, and undoing the writes of the dropped
//    positions newest first restores, slot by slot, what the last kept position (or an earlier
//    call) left there — also when one slot was written by several rows of the call;
//  * compressed KV and index keys only grow: a kv source holds exactly pos / ratio entries, so
//    truncating to keep_pos / ratio drops the groups the dropped rows completed;
//  * the Engram and token histories only grow: truncated;
//  * the index-key publisher is a function of the positions consumed (index_key_publisher.cpp).
// The DSpark rings are written only for accepted positions, so they never need restoring.
#include <algorithm>

#include "base/error.h"
#include "model/forward_context.h"

namespace ds41 {

void Model::rollback(SequenceState& st, int64_t keep_pos) const {
  if (keep_pos == st.pos) {
    if (st.journal) st.journal->clear();
    return;
  }
  StateJournal* j = st.journal;
  if (!j || j->start < 0 || keep_pos < j->start || keep_pos > st.pos)
    throw Error("rollback: position " + std::to_string(keep_pos) + " is not inside the journaled calls (" +
                (j && j->start >= 0 ? std::to_string(j->start) : std::string("none")) + ".." + std::to_string(st.pos) + ")");
  if (j->start == 0 && keep_pos > 0)
    throw Error("rollback: a prefill call can only be undone as a whole");
  if (st.dspark_pos > keep_pos)
    throw Error("rollback: the DSpark rings already hold position " + std::to_string(st.dspark_pos - 1) +
                ", beyond the rollback point " + std::to_string(keep_pos));

  for (auto it = j->writes.rbegin(); it != j->writes.rend(); ++it)
    if (it->pos >= keep_pos) std::copy_n(j->old.begin() + long(it->offset), it->bytes, it->dst);

  const ModelConfig& c = config_;
  for (const LayerPlan& lp : plan_.layers) {
    if (!lp.kv_source || lp.ratio <= 0) continue;
    LayerState& ls = st.layers[size_t(lp.id)];
    const int64_t entries = keep_pos / lp.ratio;
    if (entries > ls.entries) throw Error("rollback: layer " + std::to_string(lp.id) + " holds fewer entries than its position implies");
    ls.ckv_codes.resize(size_t(entries * (c.head_dim / 2)));
    ls.ckv_scales.resize(size_t(entries * (c.head_dim / 16)));
    if (lp.owns_index_k) {
      ls.ik_codes.resize(size_t(entries * (c.index_head_dim / 2)));
      ls.ik_scales.resize(size_t(entries * (c.index_head_dim / 32)));
    }
    ls.entries = entries;
  }
  const int64_t dropped = st.pos - keep_pos;
  if (!st.engram_history.empty()) st.engram_history.resize(st.engram_history.size() - size_t(dropped));
  if (int64_t(st.token_history.size()) >= dropped) st.token_history.resize(st.token_history.size() - size_t(dropped));
  int publisher = j->publisher_before;
  for (int64_t p = j->start; p < keep_pos; ++p) publisher = reference_publisher_after(plan_, publisher, p);
  st.index_k_publisher = publisher;
  st.pos = keep_pos;
  j->clear();
}

}  // namespace ds41
