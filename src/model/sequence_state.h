// Everything one sequence carries between forward calls (spec backbone.md §5.3-§5.5, §11):
// per layer its sliding-window ring; per kv-source layer the compressor's partial group, the
// compressed main KV and the index keys. The length-proportional caches are stored packed —
// FP4 codes + E4M3 scales per 16 (main KV) and FP4 codes + E8M0 scales per 32 (index K) — and
// dequantize to exactly the bf16 values the reference holds after its QDQ; the window ring keeps
// FP8 E4M3 codes + E8M0 scales per 32 for the same reason.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layer_plan.h"

namespace ds41 {

struct LayerState {
  // Sliding-window ring: slot p % window holds position p.
  std::vector<uint8_t> ring_codes;   // [window][head_dim] E4M3
  std::vector<uint8_t> ring_scales;  // [window][head_dim/32] E8M0
  // First position this layer has a window entry for. A CED prefill or a bounded replay runs a
  // layer only from some position on; the positions before it were never computed here, so their
  // slots are invisible: a query at i sees window positions max(ring_start, i-W+1) .. i.
  int64_t ring_start = 0;
  // Compressor partial group (ratio > 1): fp32 projections of the group's tokens so far.
  std::vector<float> group_kv, group_score;  // [ratio][head_dim]
  // Compressed main KV (kv sources): entry j = group j, stored packed.
  std::vector<uint8_t> ckv_codes;    // [entries][head_dim/2] E2M1 pairs
  std::vector<uint8_t> ckv_scales;   // [entries][head_dim/16] E4M3
  // Index keys (kv sources).
  std::vector<uint8_t> ik_codes;     // [entries][index_head_dim/2]
  std::vector<uint8_t> ik_scales;    // [entries][index_head_dim/32] E8M0
  int64_t entries = 0;
};

// Undo log of the in-place writes a forward call makes to fixed-size state (window-ring slots,
// ratio>1 compressor partial groups). Everything else a call changes is append-only (compressed
// KV, index keys, histories) and rolls back by truncation. With a journal attached, a speculative
// verify chunk can be cut back to any prefix of its rows exactly (spec §B.8): undoing the writes
// of the rejected positions in reverse order leaves each slot with the value the last accepted
// position (or an earlier call) wrote, even when several rows of the chunk share a slot.
struct StateJournal {
  struct Write {
    int64_t pos;    // position whose row made the write
    uint8_t* dst;   // into a fixed-size buffer of the state (never reallocated)
    size_t offset;  // the bytes before the write: old[offset, offset + bytes)
    size_t bytes;
  };
  std::vector<Write> writes;
  // The replaced bytes of all writes back to back: one buffer whose capacity a speculative loop
  // keeps from cycle to cycle (a vector per write allocated on every journaled row).
  std::vector<uint8_t> old;
  int64_t start = -1;        // position of the first journaled call (set by Model::forward)
  int publisher_before = -1; // the index-key publisher before it
  void record(int64_t pos, void* dst, size_t bytes) {
    auto* p = static_cast<uint8_t*>(dst);
    writes.push_back({pos, p, old.size(), bytes});
    old.insert(old.end(), p, p + bytes);
  }
  void clear() {
    writes.clear();
    old.clear();
    start = -1;
    publisher_before = -1;
  }
};

struct SequenceState {
  int64_t pos = 0;                   // tokens consumed so far
  int64_t reserved_tokens = 0;       // capacity planned by reserve_sequence (0 = none)
  std::vector<LayerState> layers;    // indexed like ModelPlan::layers (backbone only used here)
  // Reference behaviour (spec pitfall, §5.5): index keys are "published" by a kv source only in a
  // call where its compressor emitted a latent; other index sources read the last published cache.
  int index_k_publisher = -1;
  // Both histories hold positions history_start .. pos-1: every token consumed, except after a
  // compact session restore, which keeps only the last window (and the Engram look-back before it).
  int64_t history_start = 0;
  std::vector<int32_t> token_history;  // tokens (sessions, sampler penalties)
  // Engram: compressed id of every position held (-1 = image position, "dead" for n-grams).
  std::vector<int64_t> engram_history;
  // DSpark draft rings (the LayerState rings of the DSpark stages) hold the main-KV rows of
  // positions [dspark_start, dspark_pos); drafting needs dspark_pos == pos.
  int64_t dspark_start = 0, dspark_pos = 0;
  // When set, forward calls log their in-place writes here (speculative verification).
  StateJournal* journal = nullptr;

  // Bytes held by the length-proportional caches (compressed KV + index K), for the 890 B/token
  // arithmetic check.
  int64_t compressed_cache_bytes() const;
};

SequenceState make_sequence_state(const ModelConfig& c, const ModelPlan& plan);

// Reserves capacity for a sequence of `total_tokens` positions in every per-token cache and
// history, so that forward calls up to that length never reallocate them (no heap allocation in
// the decode loop, issue #10). Capacity is virtual until written: reserving the planned context
// costs no resident memory.
void reserve_sequence(SequenceState& s, const ModelConfig& c, const ModelPlan& plan, int64_t total_tokens);

}  // namespace ds41
